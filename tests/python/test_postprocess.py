"""trainscope-post on run files of the real binary (tests/python/conftest.py): every subcommand
runs; the numbers in its tables equal values computed here from the files with h5py; figures have
the expected axis labels; the report has every section; incomplete runs are listed but kept out of
aggregates; bad input gives clear errors and a non-zero exit."""

import base64
import html as htmllib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PolyCollection
from PIL import Image

from trainscope_post import cli, plots
from trainscope_post.model import build_models
from trainscope_post.report import SECTIONS, _model_curve, write_report
from trainscope_post.study import (compare_table, load, long_table, memory_table, phase_table,
                                   scaling_table, summary_table)


def post(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "trainscope_post", *map(str, args)],
                          capture_output=True, text=True, timeout=300, cwd=cwd)


def summary_attrs(path):
    with h5py.File(path, "r") as f:
        return dict(f["summary"].attrs)


def test_summary_lists_every_run_with_its_status(study):
    s = load([study])
    assert not s.errors
    df = summary_table(s)
    assert len(df) == 8  # 4 scaling runs, profiled, llm, comm, killed
    status = dict(zip(df["file"].map(lambda p: p.split("/")[-1]), df["status"]))
    assert status["killed.h5"] == "running"
    assert status["rep0.h5"] == "completed"
    row = df[df["file"].str.endswith("n2/rep0.h5")].iloc[0]
    a = summary_attrs(study / "cv/n2/rep0.h5")
    assert row["median step [s]"] == pytest.approx(float(a["median_step_s"]))
    assert row["throughput [samples/s]"] == pytest.approx(float(a["throughput_samples_per_s"]))
    assert row["ranks"] == 2 and row["dataset"] == "fashion-mnist"
    # The tool's own cost (issue 39): the largest rank's flush time against the wall time.
    io_pct = row["run-file I/O [% of wall]"]
    assert 0 < io_pct < 100
    assert io_pct == pytest.approx(100 * float(a["flush_total_s"]) / float(a["wall_s"]))
    llm = df[df["file"].str.endswith("lora.h5")].iloc[0]
    assert llm["method"] == "lora" and llm["dataset"] == "instruct"
    assert llm["throughput [tokens/s]"] == pytest.approx(
        float(summary_attrs(study / "llm/lora.h5")["throughput_tokens_per_s"]))
    killed = df[df["file"].str.endswith("killed.h5")].iloc[0]
    with h5py.File(study / "killed/killed.h5", "r") as f:
        assert killed["measured iters"] == int(np.min(f["iterations/rank_rows"][()])) > 0
    out = post("summary", study)
    assert out.returncode == 0, out.stderr
    assert "killed.h5" in out.stdout and "running" in out.stdout


def test_strong_scaling_matches_the_files(study, tmp_path):
    s = load([study / "cv", study / "killed"])
    df = scaling_table(s, "strong")
    assert list(df["ranks"]) == [1, 2] and list(df["repeats"]) == [2, 2]
    x = {n: [float(summary_attrs(study / f"cv/n{n}/rep{r}.h5")["throughput_samples_per_s"])
             for r in (0, 1)] for n in (1, 2)}
    speedups = np.array(x[2]) / np.mean(x[1])
    row = df[df["ranks"] == 2].iloc[0]
    assert row["speedup"] == pytest.approx(speedups.mean())
    assert row["speedup min"] == pytest.approx(speedups.min())
    assert row["efficiency [%]"] == pytest.approx(100 * speedups.mean() / 2)
    assert df[df["ranks"] == 1].iloc[0]["speedup"] == pytest.approx(1.0)
    fig = plots.scaling_figure(df, "strong")
    left, right = fig.axes
    assert left.get_ylabel() == "speedup [×]" and "ranks" in left.get_xlabel()
    assert right.get_ylabel() == "median iteration time [s]"
    assert "ideal" in [t.get_text() for t in left.get_legend().get_texts()]
    out = post("scaling", study / "cv", study / "killed", "--mode", "strong", "--out", tmp_path)
    assert out.returncode == 0, out.stderr
    assert "killed.h5: status running: excluded" in out.stderr
    assert (tmp_path / "scaling_strong.png").stat().st_size > 0


def test_weak_scaling_refuses_points_that_keep_the_global_batch(study):
    # The study keeps the global batch (strong scaling), so no configuration has the same
    # per-rank batch at two rank counts.
    out = post("scaling", study / "cv", "--mode", "weak")
    assert out.returncode == 2
    assert "no configuration was run at more than one rank count" in out.stderr
    assert "batch per rank" in out.stderr


def test_scaling_refuses_mixed_workloads(study):
    out = post("scaling", study / "cv", study / "llm", "--mode", "strong")
    assert out.returncode == 2
    assert "different workloads" in out.stderr and "run.workload" in out.stderr


def test_breakdown_is_the_mean_of_measured_iterations(study, tmp_path):
    s = load([study / "cv/n2/rep0.h5"])
    ph = phase_table(s.runs[0])
    with h5py.File(study / "cv/n2/rep0.h5", "r") as f:
        w = int(f["summary"].attrs["warmup_iterations"])
        m = int(f["summary"].attrs["measured_iterations"])
        fwd = f["iterations/forward_s"][:, w:w + m].mean(axis=1)
    assert ph["forward [s]"].to_numpy() == pytest.approx(fwd)
    fig = plots.breakdown_figure(ph, "x")
    ax = fig.axes[0]
    assert ax.get_ylabel() == "mean time per iteration [ms]" and ax.get_xlabel() == "rank"
    assert [t.get_text() for t in ax.get_legend().get_texts()][:3] == ["data", "h2d", "forward"]
    out = post("breakdown", study / "profiled", "--out", tmp_path)
    assert out.returncode == 0, out.stderr
    assert "slowest rank" in out.stdout and "comm_wait" in out.stdout
    assert "profile: no device activity" in out.stdout  # CPU run: no GPU kernels


def test_compare_relative_to_baseline(study, tmp_path):
    s = load([study / "cv"])
    df = compare_table(s, ["ranks"], "median_step_s")
    t = {n: np.mean([float(summary_attrs(study / f"cv/n{n}/rep{r}.h5")["median_step_s"])
                     for r in (0, 1)]) for n in (1, 2)}
    assert list(df["group"]) == ["ranks=1", "ranks=2"]
    assert df.iloc[1]["relative to ranks=1"] == pytest.approx(t[2] / t[1])
    out = post("compare", study / "cv", "--by", "ranks,run.precision", "--out", tmp_path,
               "--csv", tmp_path / "c.csv")
    assert out.returncode == 0, out.stderr
    assert pd.read_csv(tmp_path / "c.csv")["runs"].tolist() == [2, 2]
    bad = post("compare", study / "cv", "--by", "no.such_key")
    assert bad.returncode == 2 and "--by no.such_key: no run has this key" in bad.stderr


def test_memory_per_run(study, tmp_path):
    df = memory_table(load([study / "llm"]))
    with h5py.File(study / "llm/lora.h5", "r") as f:
        w = int(f["summary"].attrs["warmup_iterations"])
        peak = np.nanmax(f["iterations/host_tensor_peak_bytes"][:, w:]) / 2**20
    row = df.iloc[0]
    assert row["method"] == "lora"
    assert row["peak CPU tensors [MiB]"] == pytest.approx(peak)
    assert "peak device allocated [MiB]" not in df.columns  # NaN on CPU: dropped
    fig = plots.memory_figure(df)
    assert fig.axes[0].get_ylabel() == "memory [MiB]"
    assert post("memory", study, "--out", tmp_path).returncode == 0


def test_comm_busbw(study, tmp_path):
    out = post("comm", study, "--out", tmp_path, "--csv", tmp_path / "comm.csv")
    assert out.returncode == 0, out.stderr
    df = pd.read_csv(tmp_path / "comm.csv")
    with h5py.File(study / "comm/comm.h5", "r") as f:
        bus = f["comm/allreduce/busbw_GBps"][...]
    assert df[df["op"] == "allreduce"]["busbw [GB/s]"].to_numpy() == pytest.approx(bus)
    assert (tmp_path / "comm_busbw.png").exists()
    none = post("comm", study / "cv")
    assert none.returncode == 2 and "run.workload=comm" in none.stderr


def test_export_long_table(study, tmp_path):
    out = post("export", study / "cv/n2/rep0.h5", "--format", "csv", "-o", tmp_path / "x.csv")
    assert out.returncode == 0, out.stderr
    df = pd.read_csv(tmp_path / "x.csv")
    assert list(df.columns) == ["run", "rank", "iteration", "metric", "value", "units"]
    step = df[(df["metric"] == "step_s") & (df["rank"] == 1)]
    with h5py.File(study / "cv/n2/rep0.h5", "r") as f:
        assert step["value"].to_numpy() == pytest.approx(f["iterations/step_s"][1])
    assert set(step["units"]) == {"s"}
    pq = post("export", study / "cv/n2/rep0.h5", "--format", "parquet", "-o", tmp_path / "x.pq")
    assert pq.returncode == 0, pq.stderr
    assert pd.read_parquet(tmp_path / "x.pq").equals(df)
    # The killed run's rows are those it flushed.
    killed = long_table(load([study / "killed"]))
    with h5py.File(study / "killed/killed.h5", "r") as f:
        rows = f["iterations/rank_rows"][()]
    assert len(killed[(killed["metric"] == "loss") & (killed["rank"] == 0)]) == rows[0]


def test_export_tensorboard_reads_back_with_tensorboards_reader(study, tmp_path):
    pytest.importorskip("tensorboard", reason="the tensorboard package is not installed "
                        "(scripts/setup installs it)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    cv, llm = study / "cv/n2/rep0.h5", study / "llm/lora.h5"
    out = post("export", cv, llm, "--format", "tensorboard", "-o", tmp_path / "tb")
    assert out.returncode == 0, out.stderr

    def read(run):
        (events,) = (tmp_path / "tb" / run).glob("events.out.tfevents.*")  # one file per run
        ea = EventAccumulator(str(events.parent), size_guidance={"scalars": 0})
        ea.Reload()
        return ea, {t: ea.Scalars(t) for t in ea.Tags()["scalars"]}

    def steps_values(scalars):
        return [e.step for e in scalars], np.array([e.value for e in scalars])

    # Run directories are named by the files' paths below their common directory.
    ea, tags = read("cv/n2/rep0")
    assert {"train/loss", "train/lr", "time/step_s", "time/step_max_s", "time/phase/data_s",
            "time/phase/forward_s", "time/phase/backward_s", "time/phase/comm_wait_s",
            "time/phase/optimizer_s", "throughput/samples_per_s", "memory/host_rss_bytes",
            "memory/parameter_bytes", "epoch/val_accuracy", "epoch/val_loss",
            "epoch/train_loss"} <= set(tags), sorted(tags)
    assert not any(t.startswith("throughput/tokens") for t in tags)  # images have no tokens
    with h5py.File(cv, "r") as f:
        it = f["iterations/iteration"][0]  # every rank's rows, every recorded iteration
        loss, step = f["iterations/loss"][...], f["iterations/step_s"][...]
        rss, samples = f["iterations/host_rss_bytes"][...], f["iterations/samples"][...]
        forward = f["iterations/forward_s"][...]
        epoch, acc = f["epochs/epoch"][0], f["epochs/val_accuracy"][...]
    steps, values = steps_values(tags["train/loss"])
    assert steps == it.astype(int).tolist()  # global step = iteration
    assert values == pytest.approx(loss.mean(axis=0), rel=1e-6)  # float32 in the event file
    assert steps_values(tags["time/step_max_s"])[1] == pytest.approx(step.max(axis=0), rel=1e-6)
    assert steps_values(tags["time/phase/forward_s"])[1] == pytest.approx(forward.mean(axis=0),
                                                                          rel=1e-6)
    assert steps_values(tags["memory/host_rss_bytes"])[1] == pytest.approx(rss.max(axis=0),
                                                                           rel=1e-6)
    assert steps_values(tags["throughput/samples_per_s"])[1] == pytest.approx(
        samples.sum(axis=0) / step.mean(axis=0), rel=1e-6)
    steps, values = steps_values(tags["epoch/val_accuracy"])
    assert steps == epoch.astype(int).tolist() and values == pytest.approx(acc.mean(axis=0))
    # Each tag says its units and how the ranks were combined.
    text = ea.SummaryMetadata("time/step_s").summary_description
    assert "Units: s" in text and "mean over the 2 ranks" in text
    assert "largest of the 2 ranks" in ea.SummaryMetadata(
        "memory/host_rss_bytes").summary_description

    _, tags = read("llm/lora")
    with h5py.File(llm, "r") as f:
        tokens, step = f["iterations/tokens"][...], f["iterations/step_s"][...]
    assert steps_values(tags["throughput/tokens_per_s"])[1] == pytest.approx(
        tokens.sum(axis=0) / step.mean(axis=0), rel=1e-6)
    # Exporting again replaces the run's event file: TensorBoard would show every point twice.
    again = post("export", cv, llm, "--format", "tensorboard", "-o", tmp_path / "tb")
    assert again.returncode == 0 and "replaced 1 earlier event file" in again.stdout, again
    read("cv/n2/rep0")


def thicket_python():
    """The Python of scripts/setup --tests' Hatchet/Thicket venv (Thicket pins pandas < 3):
    $TRAINSCOPE_THICKET_PYTHON, else ${TRAINSCOPE_CACHE:-~/.cache/trainscope}/venv-thicket."""
    py = os.environ.get("TRAINSCOPE_THICKET_PYTHON")
    cache = Path(os.environ.get("TRAINSCOPE_CACHE", Path.home() / ".cache" / "trainscope"))
    return Path(py) if py else cache / "venv-thicket" / "bin" / "python"


# Reads an export with both libraries and prints what they made of it, as JSON.
READ_WITH_THICKET = """
import json, sys
import hatchet as ht, thicket as th
text = open(sys.argv[1]).read()
tk = th.Thicket.from_json(text)
gf = ht.GraphFrame.from_json(text)
rank = tk.metadata["rank"]
print(json.dumps({
    "tree": tk.tree(metric_column="time"),
    "roots": [r.frame["name"] for r in tk.graph.roots],
    "children": [c.frame["name"] for c in tk.graph.roots[0].children],
    "thicket": [[int(rank[p]), n, t] for (node, p), n, t in
                zip(tk.dataframe.index, tk.dataframe["name"], tk.dataframe["time (inc)"])],
    "hatchet": [[n, t] for n, t in zip(gf.dataframe["name"], gf.dataframe["time (inc)"])],
    "world": sorted(set(tk.metadata["world_size"].tolist()))}))
"""


def test_export_thicket_reads_back_with_hatchet_and_thicket(study, tmp_path):
    py = thicket_python()
    if not py.exists():
        pytest.skip(f"Hatchet/Thicket's environment {py} is not installed (scripts/setup "
                    "--tests makes it)")
    cv = study / "cv/n2/rep0.h5"
    out = post("export", cv, "--format", "thicket", "-o", tmp_path / "tk")
    assert out.returncode == 0, out.stderr
    (tmp_path / "read.py").write_text(READ_WITH_THICKET)
    proc = subprocess.run([str(py), str(tmp_path / "read.py"), str(tmp_path / "tk/rep0.json")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.splitlines()[-1])  # Thicket's import prints a note before
    assert got["roots"] == ["step"] and got["world"] == [2]
    # The phases the CPU run recorded, in the recorder's order (h2d is a copy, ~0 on CPU).
    assert got["children"] == ["data", "h2d", "forward", "backward", "comm_wait", "optimizer",
                               "control"]
    assert "forward" in got["tree"] and "comm_wait" in got["tree"]
    a = summary_attrs(cv)
    w, m = int(a["warmup_iterations"]), int(a["measured_iterations"])
    with h5py.File(cv, "r") as f:  # per rank, the mean over the measured iterations
        want = {(r, p): float(np.mean(f[f"iterations/{p}_s"][r, w:w + m]))
                for r in (0, 1) for p in got["children"] + ["step"]}
    thicket = {(r, n): t for r, n, t in got["thicket"]}
    assert thicket.keys() == want.keys()
    for key, value in want.items():
        assert thicket[key] == pytest.approx(value), key
    assert sorted(t for _, t in got["hatchet"]) == pytest.approx(sorted(want.values()))


def test_report_has_every_section_and_embedded_figures(study, tmp_path):
    out = post("report", study, "-o", tmp_path / "report.html")
    assert out.returncode == 0, out.stderr
    html = (tmp_path / "report.html").read_text()
    for section in SECTIONS:
        assert f"<h2>{section}</h2>" in html
    assert html.count("data:image/png;base64,") >= 4  # scaling, breakdowns, memory, comm
    assert "killed.h5 (running)" in html
    md = (tmp_path / "report.md").read_text()
    assert "## Scaling" in md and "report_files/scaling.png" in md
    assert (tmp_path / "report_files" / "scaling.png").exists()


def section(page: str, sid: str) -> str:
    start = page.index(f"<section id='{sid}'>")
    return page[start:page.index("</section>", start)]


def test_report_model_and_advice(study, tmp_path):
    """The report's Model and advice section on the study: the configuration run at 1 and 2 ranks
    is modelled (the 1-rank-count ones are not), its measured points are the files' medians, the
    figure is there, and the recommendation is what `advise` prints with the section's settings
    (2 ranks per node, as measured; 8 x 1 node)."""
    out = tmp_path / "report.html"
    write_report(load([study]), study, out)
    sec = section(out.read_text(), "model-and-advice")
    assert "No models" not in sec
    assert "Not modelled: 1 cv, 1 llm configuration(s) measured at one rank count only" in sec
    # one modelled configuration, one figure, a decodable PNG
    imgs = re.findall(r"<img id='fig-(model_\d+)' alt='\w+' src='data:image/png;base64,([^']+)'>",
                      sec)
    assert [name for name, _ in imgs] == ["model_0"]
    im = Image.open(io.BytesIO(base64.b64decode(imgs[0][1], validate=True)))
    assert im.format == "PNG" and im.size == (800, 420)
    # predicted vs measured: the measured column is the median over the repeats' medians
    for n in (1, 2):
        med = np.median([float(summary_attrs(study / f"cv/n{n}/rep{r}.h5")["median_step_s"])
                         for r in (0, 1)])
        assert re.search(rf"<td>{n}</td>\s*<td>1</td>\s*<td>2</td>\s*<td>{med:.4g}</td>", sec)
    assert "alpha-beta intra at ranks 2" in sec  # the comm run is intra-node, 2 ranks
    assert "<td>allreduce</td>" in sec  # the alpha-beta table of the comm run
    # the recommendation: the lines `advise` prints for the same study and settings; advise exits
    # 3 for the LLM run (one rank count: nothing qualifies), which the section leaves out
    adv = post("advise", study, "--gpus-per-node", 2, "--max-nodes", 8, "--objective", "time")
    assert adv.returncode == 3 and "llm: candidates" in adv.stdout, adv.stdout + adv.stderr
    assert "no configuration qualifies: " in adv.stdout
    assert "no configuration qualifies" not in sec
    start = adv.stdout.index("recommended: ")
    lines = adv.stdout[start:adv.stdout.index("\n\n", start)]
    assert lines.startswith("recommended: cv")
    assert f"<pre>{htmllib.escape(lines)}</pre>" in sec
    assert "--gpus-per-node 2 (the most ranks per node measured) --max-nodes 8 (8x" in sec


def test_model_figure(study):
    """The model figure: measured medians with min-max bars, the model solid over the measured
    ranks 1-2 and dashed from 2 to 16 (8x), its +-2 sigma band, a log2 x axis with units."""
    models, _ = build_models(load([study]), "strong")
    cm = next(m for m in models if m.rank_counts == [1, 2] and m.workload == "cv")
    curve = _model_curve(cm)
    assert curve["ranks"].min() == 1 and curve["ranks"].max() == 16
    fit = pd.DataFrame(cm.fit_rows())
    ax = plots.model_figure(fit, curve, "t", (16, float(curve["step_s"].iloc[-1]))).axes[0]
    assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2
    assert ax.get_xlabel().startswith("ranks") and ax.get_ylabel() == "median iteration time [s]"
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    solid, dashed = lines["model (Extra-P phases + comm)"], lines["model, extrapolated"]
    assert list(solid.get_xdata()) == [1, 2] and solid.get_linestyle() == "-"
    assert dashed.get_xdata()[0] == 2 and dashed.get_xdata()[-1] == 16
    assert dashed.get_linestyle() == "--"
    assert np.allclose(dashed.get_ydata(), curve[curve["ranks"] >= 2]["step_s"])
    assert "recommended: 16 ranks" in lines
    band = [c for c in ax.collections if isinstance(c, PolyCollection)
            and c.get_label() == "model ±2σ band"]
    assert len(band) == 1
    ys = band[0].get_paths()[0].vertices[:, 1]
    assert ys.min() == pytest.approx(curve["step_lo_s"].min())
    assert ys.max() == pytest.approx(curve["step_hi_s"].max())
    # the measured markers: one node count, the medians, bars down to min and up to max
    (bars,) = ax.containers
    assert list(bars.lines[0].get_ydata()) == pytest.approx(list(fit["measured_s"]))
    seg = bars.lines[2][0].get_segments()
    assert [s[0][1] for s in seg] == pytest.approx(list(fit["measured_min_s"]))
    assert [s[1][1] for s in seg] == pytest.approx(list(fit["measured_max_s"]))


def test_report_without_models_says_why(study, tmp_path, monkeypatch):
    """Without Extra-P, or without a configuration at two rank counts, the section says why in a
    sentence and the rest of the report is made."""
    missing = tmp_path / "no-extrap" / "bin" / "python"
    monkeypatch.setenv("TRAINSCOPE_EXTRAP_PYTHON", str(missing))
    out = tmp_path / "cv.html"
    write_report(load([study / "cv"]), study / "cv", out)
    page = out.read_text()
    sec = section(page, "model-and-advice")
    assert f"<p>No models: Extra-P is not installed ({missing} does not exist): run " \
           "scripts/setup" in sec and "<img" not in sec
    assert "id='fig-scaling'" in page and "<section id='communication'>" in page
    monkeypatch.delenv("TRAINSCOPE_EXTRAP_PYTHON")
    write_report(load([study / "llm"]), study / "llm", out)  # one run at 2 ranks
    sec = section(out.read_text(), "model-and-advice")
    assert sec.count("<p>") == 1 and "<p>No models: no configuration was measured at two or " \
        "more rank counts under strong scaling (of 1 configurations)" in sec


def test_bad_inputs(study, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = post("summary", empty)
    assert out.returncode == 2 and "no run files" in out.stderr
    out = post("summary", tmp_path / "missing.h5")
    assert out.returncode == 2 and "missing.h5: no such file" in out.stderr
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f.attrs["schema"] = "trainscope/9"
    out = post("summary", other)
    assert out.returncode == 1 and "schema 'trainscope/9'" in out.stderr
    # In a study directory: the other runs are still processed, the stray file named, exit 1.
    out = post("memory", other, study / "llm", "--out", tmp_path)
    assert out.returncode == 1 and "other.h5: schema 'trainscope/9'" in out.stderr
    assert "lora" in out.stdout


def test_main_returns_codes_without_exiting(study, capsys):
    assert cli.main(["summary", str(study / "cv")]) == 0
    assert "rep1.h5" in capsys.readouterr().out


def test_incidental_options_neither_split_configurations_nor_name_them(tmp_path):
    """Run length, warm-up, checkpoints and options that do not apply to a run's method or
    strategy (llm.qat.group_size under LoRA, pipeline.stages under DDP) leave two runs one
    configuration; an option that applies (llm.lora.rank under LoRA, llm.qat.group_size under
    QAT) splits them and names the configuration (issue 26)."""
    from synthetic_runs import Law, write_run
    from trainscope_post.study import describe_group, group_by_config, load
    law = Law(tokens_per_sample=128.0)
    lora = {"llm.method": "lora", "llm.lora.rank": "8"}
    write_run(tmp_path / "lora/n1.h5", law, 1, 1, {**lora, "llm.qat.group_size": "32"},
              iterations=6)
    write_run(tmp_path / "lora/n2.h5", law, 2, 1,
              {**lora, "train.max_iters": "20", "profile.warmup_iters": "4",
               "llm.qat.group_size": "256", "llm.dpo.beta": "0.5", "pipeline.stages": "4",
               "checkpoint.dir": "/elsewhere", "dist.timeout": "60"}, iterations=20, warmup=4)
    write_run(tmp_path / "rank16/n1.h5", law, 1, 1, {**lora, "llm.lora.rank": "16"})
    for g in ("32", "256"):
        write_run(tmp_path / f"qat{g}/n1.h5", law, 1, 1,
                  {"llm.method": "qat", "llm.qat.group_size": g, "llm.lora.rank": "4"})
    study = load([tmp_path])
    groups = group_by_config(study.runs, mode="strong")
    by_dir = {frozenset(r.path.parent.name for r in g): g for g in groups}
    assert set(by_dir) == {frozenset({"lora"}), frozenset({"rank16"}), frozenset({"qat32"}),
                           frozenset({"qat256"})}, [[str(r.path) for r in g] for g in groups]
    names = {d: describe_group(g, groups, "strong") for d, g in by_dir.items()}
    for name in names.values():
        for incidental in ("train.max_iters", "profile.warmup_iters", "checkpoint.", "dpo",
                           "pipeline", "dist.timeout", "output.file"):
            assert incidental not in name, name
    assert "llm.lora.rank=16" in names[frozenset({"rank16"})]
    assert "llm.qat.group_size=32" in names[frozenset({"qat32"})]
    # QAT without llm.qat.lora trains all weights: its llm.lora.rank does not apply
    assert "llm.lora.rank" not in names[frozenset({"qat256"})]


# ---- gradient compression across runs (issue 40 point 4) ----------------------------------------
def _compression_study(root):
    """none, fp16 and PowerSGD at 2 ranks on one node from one law whose gradient allreduce takes
    ~63 ms (60 MiB at 1 GB/s busbw), half of it hidden behind backward: fp16 halves the bytes
    and the collective; PowerSGD sends 7 % of them but costs 50 ms of computation in comm_wait.
    Best validation accuracy 80 %, 81 % and 79 %."""
    from synthetic_runs import Law, Network, write_run
    law = Law(network=Network(intra=(5e-6, 1 / 1e9)), overlap=0.5)
    write_run(root / "none.h5", law, 2, 1, compress="none", epochs=3, accuracy=0.80)
    write_run(root / "fp16.h5", law, 2, 1, compress="fp16", compress_ratio=0.5, epochs=3,
              accuracy=0.81)
    write_run(root / "powersgd.h5", law, 2, 1, compress="powersgd", compress_ratio=0.07,
              compress_cost=0.05, epochs=3, accuracy=0.79)
    return law


def test_report_compares_compression_settings_with_the_laws_numbers(tmp_path):
    """The Communication optimisation section and the compression finding on a study whose
    numbers are known: fp16 reduces the exposed communication by 50 % (half the bytes, half the
    collective, same overlap) at the uncompressed run's effective rate (its bytes per step /
    collective time) with +1 point of accuracy; PowerSGD does not pay (its 50 ms of computation
    exceed the ~30 ms of exposed communication it saves), and is said so."""
    law = _compression_study(tmp_path / "runs")
    out = tmp_path / "report.html"
    write_report(load([tmp_path / "runs"]), tmp_path / "runs", out)
    page = htmllib.unescape(out.read_text())
    c = law.collective(2, 1)
    e0, e16 = c * 0.5, c * 0.25                      # comm_wait: the unhidden half
    s0 = law.step(2, 1)
    rate = 60 * 2**20 / c / 1e6                      # MB/s through the uncompressed collectives
    sec = section(page, "communication-optimisation")
    assert "<h2>Communication optimisation</h2>" in sec and "id='fig-compression'" in sec
    fp16 = (f"compression (fp16) reduces exposed communication by 50.0 % ({1e3 * e0:.4g} -> "
            f"{1e3 * e16:.4g} ms per step) at an effective link rate of {rate:,.0f} MB/s")
    assert fp16 in sec
    assert "with accuracy change +1.00 points (80.00 % -> 81.00 %)" in sec
    assert f"step {1e3 * s0:.4g} -> {1e3 * (s0 - c * 0.25):.4g} ms (" in sec
    e_psgd = 0.07 * c * 0.5 + 0.05
    assert (f"compression (powersgd, rank 2) does not pay (its exposed communication is not "
            f"lower): exposed communication {1e3 * e0:.4g} -> {1e3 * e_psgd:.4g} ms per step "
            f"({100 * (e_psgd / e0 - 1):+.1f} %)") in sec
    assert "accuracy change -1.00 points" in sec
    # the table: bytes per step and their ratio, PowerSGD's error-feedback trend (0.1 -> 0.2)
    rows = pd.read_html(io.StringIO(sec))[0].set_index("compression")
    assert rows.loc["fp16", "sent / step [MiB]"] == 30 and rows.loc["none", "sent / step [MiB]"] == 60
    assert rows.loc["fp16", "ratio to uncompressed"] == 0.5
    assert rows.loc["powersgd, rank 2", "ratio to uncompressed"] == 0.07
    first, last = rows.loc["powersgd, rank 2", "error norm first -> last"].split(" -> ")
    assert 0.1 <= float(first) < float(last) <= 0.2
    assert rows.loc["fp16", "exposed vs none [%]"] == -50
    # the finding: not reproduced (PowerSGD does not pay), both sentences as its evidence, and
    # it comes first: the other findings are not covered and folded below it
    fsec = section(page, "findings")
    assert re.search(r"<tr id='finding-compression'><td>.*?</td><td class='verdict no'>"
                     r"not reproduced</td>", fsec)
    assert fp16 in fsec and "compression (powersgd, rank 2) does not pay" in fsec
    assert fsec.index("finding-compression") < fsec.index("<details>") < \
        fsec.index("finding-ddp-ds")
    assert "## Communication optimisation" in out.with_suffix(".md").read_text()


def test_compression_that_does_not_lower_the_step_does_not_pay(tmp_path):
    """fp16 that halves the exposed communication (~16 ms saved) but adds 40 ms to backward (as
    slow casts would): the finding says it does not pay because the step is not lower, and the
    verdict is 'not reproduced'."""
    from synthetic_runs import Law, Network, write_run
    from trainscope_post.findings import NOT_REPRODUCED, findings_table
    law = Law(network=Network(intra=(5e-6, 1 / 1e9)), overlap=0.5)
    write_run(tmp_path / "none.h5", law, 2, 1, compress="none")
    fp16 = Law(network=law.network, overlap=0.5,
               phases={**law.phases, "backward": (law.phases["backward"][0] + 0.04,
                                                  law.phases["backward"][1])})
    write_run(tmp_path / "fp16.h5", fp16, 2, 1, compress="fp16", compress_ratio=0.5)
    row = findings_table(load([tmp_path])).set_index("id").loc["compression"]
    assert row["verdict"] == NOT_REPRODUCED
    assert "compression (fp16) does not pay (its step is not lower): exposed communication" \
        in row["evidence"]
    assert "exposed communication" in row["evidence"] and "(-50.0 %)" in row["evidence"]


def test_a_one_run_report_has_no_compression_section_and_does_not_open_with_not_covered(tmp_path):
    """One uncompressed run: no Communication optimisation section, and the Findings section
    opens with one sentence, its not-covered findings folded; one compressed run alone: the
    short section with its ratio and exposed communication. A file written before dist.compress
    (no /plan@compress, no comm_uncompressed_bytes) reads as uncompressed."""
    from synthetic_runs import Law, write_run
    law = Law()
    write_run(tmp_path / "one/old.h5", law, 2, 1)  # the layout before issue 40
    out = tmp_path / "one.html"
    write_report(load([tmp_path / "one"]), tmp_path / "one", out)
    page = out.read_text()
    assert "Communication optimisation" not in page
    fsec = section(page, "findings")
    assert "None of the 9 findings is tested by these runs" in fsec
    assert fsec.index("<details><summary>9 finding(s) not covered") < fsec.index("not covered</td>")

    write_run(tmp_path / "alone/fp16.h5", law, 2, 1, compress="fp16", compress_ratio=0.5)
    out = tmp_path / "alone.html"
    write_report(load([tmp_path / "alone"]), tmp_path / "alone", out)
    sec = section(htmllib.unescape(out.read_text()), "communication-optimisation")
    c = law.collective(2, 1) * 0.5
    assert (f"dist.compress=fp16 (1 run(s)): sent 30 MiB per step of 60 MiB uncompressed (ratio "
            f"0.500); exposed communication {1e3 * c * 0.5:.4g} ms") in sec
    assert "no uncompressed run (dist.compress=none) of the same configuration" in sec

    # an old uncompressed file beside a new fp16 one: compared, old = none, ratio 1
    from trainscope_post import compression
    comps = compression.comparisons(load([tmp_path / "one", tmp_path / "alone"]))
    assert len(comps) == 1 and list(comps[0].by_setting) == ["none", "fp16"]
    assert comps[0].by_setting["none"][0].ratio == 1.0


def test_report_opens_each_run_file_once_and_closes_it(tmp_path, monkeypatch):
    """`trainscope-post report` reads every section from the files load() opened: each run file
    is opened (h5py.File) at most once for the whole report (it was 13 times per training run,
    once per table, section and model), and none is left open after it (the study's files can be
    rewritten at once)."""
    import synthetic_runs as syn
    root = syn.write_study(tmp_path / "s", {"cfg": (syn.Law(), {})}, ranks=(1, 2, 4),
                           repeats=1, comm_ranks=((2, 1), (4, 1)))
    files = sorted(root.rglob("*.h5"))
    assert len(files) == 5
    opens: dict[str, int] = {}
    real = h5py.File

    class Counted(real):
        def __init__(self, name, *args, **kw):
            if isinstance(name, (str, os.PathLike)):
                key = str(Path(name).resolve())
                opens[key] = opens.get(key, 0) + 1
            super().__init__(name, *args, **kw)

    monkeypatch.setattr(h5py, "File", Counted)
    study = load([root])
    html_out, _ = write_report(study, root, tmp_path / "report.html")
    monkeypatch.undo()
    assert "Scaling" in html_out.read_text()
    assert {Path(p) for p in opens} == {f.resolve() for f in files}, opens
    assert max(opens.values()) == 1, opens
    for f in files:  # read-write needs every read-only handle of this process gone
        with h5py.File(f, "r+") as h:
            assert h.attrs["schema"]
    # The study stays usable after the report: a later read opens the file again.
    with study.runs[0].open() as rf:
        assert rf.world_size >= 1
    study.close()
