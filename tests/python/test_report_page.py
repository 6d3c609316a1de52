"""The HTML report as a reader sees it: a study of real run files (the session's study of
conftest.py plus five 1-rank LLM runs: LoRA fp32 and bf16-mixed, DPO, QLoRA, QAT) is rendered,
loaded in headless Chromium and screenshotted. The page must draw (a non-blank PNG), hold every
section and figure (each <img> a decodable PNG), and its Findings section must give a verdict per
finding whose numbers are those of the run files (recomputed here with h5py)."""

import base64
import html as htmllib
import io
import os
import re
import shutil
import subprocess

import h5py
import numpy as np
import pytest
from PIL import Image

from conftest import ROOT, run
from trainscope_post.report import SECTIONS, section_id, write_report
from trainscope_post.findings import load_findings
from trainscope_post.study import load

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

# Same model, data, sequence length and batch for every method, so that the report compares
# them; 1 rank, 3 iterations (1 warm-up), one sequence per step: about 4 s each (bf16-mixed is
# emulated on CPUs: about 9 s).
LLM = ["--train.max_iters=3", "--profile.warmup_iters=1", "--log.every=0",
       "--train.batch_size=1", "--llm.gradient_accumulation=1"]
METHODS = [("lora", "fp32"), ("lora", "bf16-mixed"), ("dpo", "fp32"), ("qlora", "fp32"),
           ("qat", "fp32")]


@pytest.fixture(scope="module")
def page_study(study, tmp_path_factory):
    """The session study (links to its files) plus the LLM method runs under llm1/."""
    root = tmp_path_factory.mktemp("page_study")
    for f in study.rglob("*.h5"):
        dst = root / f.relative_to(study)
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.symlink_to(f)
    (root / "llm1").mkdir()
    for method, precision in METHODS:
        run(1, "--config", ROOT / f"inputs/llm/{method}-tiny.ini", *LLM,
            f"--run.precision={precision}",
            f"--output.file={root / 'llm1' / f'{method}-{precision}.h5'}")
    return root


def attrs(path, group="summary"):
    with h5py.File(path, "r") as f:
        return dict(f[group].attrs)


def step(path):
    return float(attrs(path)["median_step_s"])


def peak_mib(path):
    a = attrs(path)
    v = float(a.get("peak_device_allocated_bytes", np.nan))
    return (v if v == v else float(a["peak_host_tensor_bytes"])) / 2**20


def screenshot(page, png, height):
    # --no-sandbox: Chromium refuses to run as root with its sandbox (CI containers); HOME in the
    # test's directory keeps its profile out of the user's.
    proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                           "--hide-scrollbars", "--no-first-run", f"--screenshot={png}",
                           f"--window-size=1400,{height}", page.as_uri()],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HOME": str(png.parent)})
    assert proc.returncode == 0 and png.exists(), proc.stdout + proc.stderr
    return proc


# Skipped before the fixture's runs are made: without a browser the page cannot be looked at.
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary on PATH (Debian package "
                    "chromium, which scripts/setup installs): the page cannot be screenshotted")
def test_report_page_renders_with_every_figure_and_a_verdict_per_finding(page_study, tmp_path):
    out = tmp_path / "report.html"
    write_report(load([page_study]), page_study, out)
    text = out.read_text()

    # Every section, in a <section> with its id, and no script of any kind (no JS to fail).
    for title in SECTIONS:
        assert f"<section id='{section_id(title)}'>" in text and f"<h2>{title}</h2>" in text
    assert "<script" not in text.lower()

    # Every figure: an <img> with an id whose data is a PNG that decodes to a real picture.
    imgs = re.findall(r"<img id='fig-([\w]+)' alt='[\w]+' src='data:image/png;base64,([^']+)'>",
                      text)
    assert len(imgs) == text.count("<img")
    ids = {name for name, _ in imgs}
    for name, b64 in imgs:
        im = Image.open(io.BytesIO(base64.b64decode(b64, validate=True)))
        assert im.format == "PNG" and im.size[0] > 300 and im.size[1] > 150, name
    runs = [r for r in load([page_study]).usable() if r.workload in ("cv", "llm")]
    n = len(runs)
    assert n == 11  # 4 scaling, profiled, lora (2 ranks), 5 x llm1; comm and killed are not
    expected = {"scaling", "execution_cv", "curves_cv", "curves_llm", "memory", "comm",
                "model_0"}  # the one configuration at two rank counts: cv at 1 and 2
    expected |= {f"{kind}_{k}" for kind in ("steps", "heatmap", "breakdown") for k in range(n)}
    llm_with_telemetry = [k for k, r in enumerate(runs) if r.workload == "llm"]
    expected |= {f"telemetry_{k}" for k in llm_with_telemetry}  # the CV runs turned it off
    profiled = [k for k, r in enumerate(runs) if r.path.name == "profiled.h5"]
    expected |= {f"top_ops_{k}" for k in profiled}
    assert expected <= ids, sorted(expected - ids)
    assert len(llm_with_telemetry) == 6 and len(profiled) == 1

    # Findings: one row per finding, each with a verdict; the numbers are the files'.
    sec = text[text.index("<section id='findings'>"):text.index("<section id='runs'>")]
    rows = {key: (verdict, htmllib.unescape(evidence)) for key, verdict, evidence in re.findall(
        r"<tr id='finding-([\w-]+)'><td>.*?</td><td class='verdict \w+'>([\w ]+)</td>"
        r"<td>(.*?)</td></tr>", sec)}
    assert set(rows) == {f["id"] for f in load_findings()}
    assert all(v in ("reproduced", "not reproduced", "not covered") for v, _ in rows.values())
    llm1 = {f"{m}-{p}": page_study / "llm1" / f"{m}-{p}.h5" for m, p in METHODS}

    # DDP-DS: the quickstart study at 1 and 2 ranks; efficiency = speedup / 2.
    x = {nr: np.mean([float(attrs(page_study / f"cv/n{nr}/rep{r}.h5")["throughput_samples_per_s"])
                      for r in (0, 1)]) for nr in (1, 2)}
    eff = 100 * x[2] / x[1] / 2
    verdict, evidence = rows["ddp-ds"]
    assert f"{eff:.1f}% at 2 ranks" in evidence
    assert verdict == ("reproduced" if eff >= 70 else "not reproduced")

    # Precision: LoRA bf16-mixed vs fp32 at 1 rank (the only pair differing in run.precision).
    speedup = step(llm1["lora-fp32"]) / step(llm1["lora-bf16-mixed"])
    verdict, evidence = rows["precision"]
    assert evidence.count("speedup") == 1 and f"speedup {speedup:.2f}x" in evidence
    assert verdict == ("reproduced" if speedup > 1 else "not reproduced")

    # pin_memory: CPU runs ignore it, so nothing tests it.
    assert rows["pin_memory"][0] == "not covered"

    # Methods, compared among the fp32 1-rank runs (the 2-rank LoRA run has no partner).
    t = {m: step(llm1[f"{m}-fp32"]) for m in ("lora", "dpo", "qlora", "qat")}
    mem = {m: peak_mib(llm1[f"{m}-fp32"]) for m in ("lora", "dpo", "qlora", "qat")}
    verdict, evidence = rows["lora-dpo"]
    assert f"LoRA {t['lora'] * 1e3:.4g} ms, {mem['lora']:.4g} MiB" in evidence
    assert f"DPO {t['dpo'] * 1e3:.4g} ms, {mem['dpo']:.4g} MiB" in evidence
    assert verdict == ("reproduced" if t["lora"] < t["dpo"] and mem["lora"] < mem["dpo"]
                       else "not reproduced")
    verdict, evidence = rows["qlora"]
    assert f"qlora {mem['qlora']:.4g} MiB" in evidence
    assert verdict == ("reproduced" if mem["qlora"] < min(mem["lora"], mem["dpo"], mem["qat"])
                       else "not reproduced")
    verdict, evidence = rows["qat"]
    assert f"qat {t['qat'] * 1e3:.4g} ms" in evidence
    assert verdict == ("reproduced" if t["qat"] > max(t["lora"], t["dpo"], t["qlora"])
                       else "not reproduced")

    # Quality: these runs hold out no validation split, so nothing tests it.
    assert rows["quality"] == ("not covered", "no full fine-tuning run with a validation loss "
                               "beside a LoRA, QLoRA or QAT run at the same model, precision, "
                               "sequence length and rank count")

    # LLM overhead: every completed LLM run's share of data + comm_wait + control.
    verdict, evidence = rows["llm-overhead"]
    shares = []
    for path in [page_study / "llm/lora.h5", *llm1.values()]:
        a = attrs(path)
        share = 100 * sum(float(a[f"median_{p}_s"]) for p in ("data", "comm_wait", "control")) \
            / float(a["median_step_s"])
        shares.append(share)
        assert f"{share:.1f}% of {float(a['median_step_s']) * 1e3:.4g} ms" in evidence
    assert verdict == ("reproduced" if min(shares) >= 50 else "not reproduced")

    # Model and advice: the cv configuration's model figure and the recommendation for it.
    sec = text[text.index("<section id='model-and-advice'>"):
               text.index("<section id='training-curves'>")]
    assert [n for n, _ in imgs if f"id='fig-{n}'" in sec] == ["model_0"]
    assert re.search(r"<pre>recommended: cv\b.* on \d+ node\(s\) = \d+ ranks: step ", sec)
    assert "Not modelled: 1 cv, 6 llm configuration(s)" in sec  # profiled; lora 2 ranks, llm1

    # The page as a browser draws it: the top (title, Findings) and the whole page.
    top = tmp_path / "top.png"
    screenshot(out, top, 1600)
    with Image.open(top) as im:
        g = np.asarray(im.convert("L"), dtype=np.float64)
    assert g.shape == (1600, 1400)
    assert g.std() > 20 and (g < 128).mean() > 0.01  # text and tables, not an empty page
    # The verdict cells are coloured (blue / vermillion / grey): the page has colour.
    with Image.open(top) as im:
        rgb = np.asarray(im.convert("RGB"), dtype=np.int16)
    assert (np.abs(rgb[..., 0] - rgb[..., 2]) > 30).mean() > 0.001

    # The Model and advice section alone, with the page's style (headless Chromium does not
    # scroll to a #fragment before its screenshot): text, tables and the coloured model figure.
    alone = tmp_path / "model.html"
    alone.write_text(text[:text.index("<h1>")] + sec + "</body></html>")
    shot = tmp_path / "model.png"
    screenshot(alone, shot, 1800)
    with Image.open(shot) as im:
        rgb = np.asarray(im.convert("RGB"), dtype=np.int16)
    g = rgb.mean(axis=2)
    assert g.std() > 20 and (g < 128).mean() > 0.01
    # The model's blue (#0072B2) and the measured markers' vermillion (#D55E00) are drawn.
    for colour in ((0, 114, 178), (213, 94, 0)):
        assert (np.abs(rgb - colour).max(axis=2) < 30).sum() > 50, colour


# ---- a 200-run study: readable, bounded, and drawn in time (issue 26) ---------------------------

# The page of a 200-run study must stay under this size (measured 2026-11: see the test's print):
# per-run figures are limited to report.MAX_RUN_SECTIONS runs and model figures to
# MAX_MODEL_CONFIGS configurations, so the page grows with the study only by its table rows.
MAX_PAGE_BYTES = 6 * 2**20
# Headless Chromium must load and draw it within this (measured on 2 cores: see the print).
MAX_DRAW_S = 60


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary on PATH (Debian package "
                    "chromium, which scripts/setup installs): the page cannot be screenshotted")
def test_report_of_a_200_run_study_is_folded_bounded_and_draws_within_60_s(tmp_path):
    import time

    from synthetic_runs import Law, write_study
    # 10 configurations (strategy x precision x pin memory x image size) x 5 rank counts x 4
    # repeats.
    configs = {}
    for k in range(10):
        law = Law(phases={**Law().phases, "forward": (5e-3, 0.1 + 0.02 * k)})
        configs[f"c{k:02d}"] = (law, {"run.strategy": ("ddp-ds", "ddp")[k % 2],
                                      "run.precision": ("fp32", "bf16-mixed")[k // 2 % 2],
                                      "data.pin_memory": ("true", "false")[k // 4 % 2],
                                      "cv.image_size": str(32 + 16 * (k // 8))})
    root = write_study(tmp_path / "study", configs, repeats=4, noise=0.01, comm_ranks=())
    files = sorted(root.rglob("*.h5"))
    assert len(files) == 200
    out = tmp_path / "report.html"
    t0 = time.monotonic()
    write_report(load([root]), root, out)
    built = time.monotonic() - t0
    text = out.read_text()
    size = out.stat().st_size
    # Per-configuration aggregates come first; the 200 per-run rows are folded, on demand.
    runs = text[text.index("<section id='runs'>"):text.index("<section id='scaling'>")]
    assert "10 configurations" in runs
    assert re.search(r"<details><summary>200 rows \(select to show\)</summary>", runs)
    overview = runs[:runs.index("<details>")]
    assert overview.count("<tr>") == 10  # one row per configuration (the header has a style)
    # The configuration names are the options that differ, never the output file or run length.
    assert "run.strategy=" in overview and "output.file" not in overview
    assert "train.max_iters" not in overview
    assert "The first 12 of 200 runs." in text
    # Findings over 100 pairs give their first comparisons; the rest are folded too.
    assert re.search(r"<details><summary>\d+ more comparisons</summary>", text)
    # 10 configurations: one legend below the panels rather than over the lines (no
    # assertion on pixels here; the first test looks at a page).
    memory = text[text.index("<section id='memory'>"):text.index("<section id='communication'>")]
    assert "<details><summary>200 rows" in memory
    assert "No memory counters in these runs: no figure." in memory  # synthetic files have none
    assert size < MAX_PAGE_BYTES, f"{size / 2**20:.1f} MiB"
    png = tmp_path / "page.png"
    t0 = time.monotonic()
    screenshot(out, png, 1600)
    drawn = time.monotonic() - t0
    print(f"200-run report: built in {built:.1f} s, {size / 2**20:.2f} MiB, drawn by headless "
          f"Chromium in {drawn:.1f} s")
    assert drawn < MAX_DRAW_S
    with Image.open(png) as im:
        g = np.asarray(im.convert("L"), dtype=np.float64)
    assert g.std() > 20 and (g < 128).mean() > 0.01


@pytest.mark.parametrize("entry, words", [
    ('id = "x"\nrule = "fastest"\ntext = "t"', "rule 'fastest' is not one of"),
    ('id = "x"\nrule = "scales"\ntext = "t"\nparams = { strategy = "ddp" }',
     "rule scales takes params strategy, min_efficiency; given strategy"),
    ('id = "x"\nrule = "overhead_share"\ntext = "{share}"\n'
     'params = { phases = ["data"], min_share = 5.0 }', "text quotes 'share'"),
    ('id = "x"\nrule = "scales"\nverdict = "yes"\ntext = "t"', "unknown: verdict"),
])
def test_findings_table_entries_are_checked(tmp_path, entry, words):
    """A finding is data (findings.toml): a wrong rule, parameter or placeholder is refused
    naming the file and the finding, before any report is made."""
    from trainscope_post.findings import load_findings
    from trainscope_post.study import StudyError
    f = tmp_path / "findings.toml"
    f.write_text("[[finding]]\n" + entry + "\n")
    with pytest.raises(StudyError) as e:
        load_findings(f)
    assert words in str(e.value) and f"{f}: finding 1 (x)" in str(e.value)
    assert len(load_findings()) == 9  # the shipped table
