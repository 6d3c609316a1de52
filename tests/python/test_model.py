"""`trainscope-post model` and `advise` on run files written from KNOWN laws (synthetic_runs.py):
the model recovers the phase terms (Extra-P) and the network's alpha and beta, predicts a held-out
rank count, marks and widens extrapolations; `advise` picks the optimum the laws imply, refuses
plans that exceed the device memory (ZeRO-3 fits only when sharded enough), co-allocation finds the
brute-force optimal split; bad options and inputs give clear errors. Every expected value is
computed here from the laws, never taken from the code under test."""

import json
import math
import re

import pandas as pd
import pytest
from synthetic_runs import GiB, MiB, Law, Network, write_comm, write_run, write_study

from trainscope_post import cli
from trainscope_post.model import build_models, evaluate_pmnf, extrap_fit
from trainscope_post.study import load

GPN = 4          # GPUs (ranks) per node of the synthetic cluster
NOISE = 0.01     # relative noise per rank and iteration
LAW = Law()      # compute a + b/p per phase, 60 MiB of buckets, half the allreduce overlapped
RANKS = (1, 2, 4, 8, 16)


def nodes(p):
    return math.ceil(p / GPN)


def post(argv, capsys):
    rc = cli.main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture(scope="module")
def scaling(tmp_path_factory):
    """One configuration at 1..32 ranks (2 repeats) and comm runs at 2, 4 (one node), 8 and 16
    ranks (2 and 4 nodes). Tests pass the 1..16 directories; 32 is held out."""
    root = tmp_path_factory.mktemp("scaling")
    return write_study(root, {"a": (LAW, {})}, ranks=(*RANKS, 32), noise=NOISE)


def measured(root):
    return [root / "a" / f"n{p}" for p in RANKS] + [root / "comm"]


def test_model_recovers_the_phase_terms_and_the_network(scaling, tmp_path, capsys):
    out = tmp_path / "model.json"
    rc, stdout, _ = post(["model", *measured(scaling), "--out", out], capsys)
    assert rc == 0
    doc = json.loads(out.read_text())
    (cfg,) = doc["configurations"]
    assert [r["ranks"] for r in cfg["fit"]] == list(RANKS)
    for ph, (a, b) in LAW.phases.items():
        if ph == "control":  # its host allreduce counts as exposed communication: a constant base
            assert cfg["comm"]["sync_base"] == pytest.approx(a, rel=0.05)
            continue
        m = cfg["phases"][ph]
        if b:  # a + b/p: Extra-P's default search must choose p^-1 out of its whole space
            assert [(t["poly"], t["log"]) for t in m["terms"]] == [(-1.0, 0.0)], (ph, m)
            assert m["terms"][0]["coefficient"] == pytest.approx(b, rel=0.03), ph
            assert m["constant"] == pytest.approx(a, abs=0.03 * (a + b / RANKS[-1])), ph
        else:  # a constant phase stays constant
            assert m["terms"] == [], (ph, m)
            assert m["constant"] == pytest.approx(a, rel=0.03), ph
    assert "p^(-1)" in stdout
    assert cfg["comm"]["source"] == "alpha-beta"
    for scope, f in cfg["comm"]["overlap"].items():
        assert f == pytest.approx(LAW.overlap, abs=0.03), scope
    ab = {(c["op"], c["scope"]): c for c in doc["comm"]}
    for scope, (alpha, beta) in (("intra", LAW.network.intra), ("inter", LAW.network.inter)):
        m = ab["allreduce", scope]
        assert m["alpha_s"] == pytest.approx(alpha, rel=0.03), scope
        assert m["busbw_GBps"] == pytest.approx(1e-9 / beta, rel=0.03), scope
    assert max(abs(r["rel_err"]) for r in cfg["fit"]) < 0.02


def test_model_predicts_a_held_out_larger_rank_count(scaling):
    models, comm = build_models(load([scaling]), exclude=lambda r: r.ranks == 32)
    (cm,) = models
    assert cm.rank_counts == list(RANKS) and ("allreduce", "inter") in comm
    held = [r.summary["median_step_s"] for r in load([scaling / "a" / "n32"]).runs]
    pred = cm.predict(32, nodes(32))
    assert not pred["in_range"]
    measured_step = sum(held) / len(held)
    assert pred["step_s"] == pytest.approx(measured_step, rel=0.03)
    assert pred["step_s"] == pytest.approx(LAW.step(32, nodes(32)), rel=0.03)


def test_predict_marks_extrapolation_and_widens_the_band(scaling, tmp_path, capsys):
    out = tmp_path / "model.json"
    rc, stdout, _ = post(["model", *measured(scaling), "--predict", "8,32..128", "--out", out],
                         capsys)
    assert rc == 0
    marks = {}
    for line in stdout.split("prediction (", 1)[1].splitlines()[2:]:
        if not line.split() or not line.split()[0].isdigit():
            break
        marks[int(line.split()[0])] = line.split()[-1]
    assert marks == {8: "measured", 32: "EXTRAPOLATED", 64: "EXTRAPOLATED",
                     128: "EXTRAPOLATED"}
    preds = {p["ranks"]: p for p in json.loads(out.read_text())["predictions"]}
    widths = []
    for p in (8, 32, 64, 128):
        pr, true = preds[p], LAW.step(p, nodes(p))
        assert pr["step_lo_s"] <= true <= pr["step_hi_s"], (p, pr, true)
        widths.append((pr["step_hi_s"] - pr["step_lo_s"]) / pr["step_s"])
    # relative widths: leaving the measured ranks widens the band by far more than the growing
    # share of communication does (its fit error weighs in everywhere), every doubling further
    assert widths[1] > 3 * widths[0], widths
    assert all(w1 > 1.2 * w0 for w0, w1 in zip(widths[1:], widths[2:])), widths


def test_models_are_defined_at_one_rank_when_measured_from_two(scaling, capsys):
    # values exactly 1 + 1/log2(p): Extra-P's own negative exponents would choose log2(p)^-1,
    # infinite at p = 1 (advise at 1 GPU, the leave-one-out fold of p = 1 crashed on it)
    ps = [2, 4, 8, 16, 32]
    series = [{"name": "x", "points": ps, "scaling": "strong",
               "values": [[1.0 + 1.0 / math.log2(p)] * 2 for p in ps]}]
    (m,) = extrap_fit(series)["models"].values()
    assert all(t["log"] >= 0 for t in m["terms"]), m
    assert math.isfinite(evaluate_pmnf(m, 1))
    rc, stdout, _ = post(["model", *(scaling / "a" / f"n{p}" for p in ps), scaling / "comm",
                          "--predict", "1"], capsys)
    assert rc == 0 and "EXTRAPOLATED" in stdout


# --- advise ---------------------------------------------------------------------------------------
HEAVY = Law(bucket_bytes=tuple(4 * b for b in LAW.bucket_bytes))  # 4x the gradient traffic
CONFIGS = {"light": (LAW, {"run.precision": "bf16-mixed"}),
           "heavy": (HEAVY, {"run.precision": "fp32"})}
LABEL = {"light": "run.precision=bf16-mixed", "heavy": "run.precision=fp32"}


def efficiency(law, p):
    return law.step(1, 1) / (p * law.step(p, nodes(p)))


@pytest.fixture(scope="module")
def two_configs(tmp_path_factory):
    return write_study(tmp_path_factory.mktemp("advise"), CONFIGS, ranks=RANKS, noise=NOISE)


def test_advise_picks_the_known_optimum_and_says_why_not_one_node_more(two_configs, capsys):
    min_eff, max_nodes = 0.72, 8
    # the optimum of the laws: highest throughput among (configuration, nodes) above min_eff
    ok = [(law.throughput(GPN * n, n), name, n) for name, (law, _) in CONFIGS.items()
          for n in range(1, max_nodes + 1) if efficiency(law, GPN * n) >= min_eff]
    _, best, n = max(ok)
    law = CONFIGS[best][0]
    nxt = efficiency(law, GPN * (n + 1))
    # the test means something only if the model must tell the neighbours apart
    assert best == "light" and n > 1 and nxt < min_eff - 0.02
    assert efficiency(law, GPN * n) > min_eff + 0.02
    rc, stdout, _ = post(["advise", two_configs, "--gpus-per-node", GPN, "--max-nodes",
                          max_nodes, "--min-efficiency", min_eff], capsys)
    assert rc == 0
    rec = stdout[stdout.index("recommended:"):]
    assert rec.startswith(f"recommended: {LABEL[best]} on {n} node(s) = {GPN * n} ranks")
    m = re.search(rf"\n  {n + 1} node\(s\): efficiency (\d\.\d+) < --min-efficiency {min_eff}",
                  rec)
    assert m, rec
    assert float(m.group(1)) == pytest.approx(nxt, abs=0.02)
    assert f"runner-up configuration: {LABEL['heavy']}" in rec

    # without a floor on efficiency the fastest point wins: the largest node count
    rc, stdout, _ = post(["advise", two_configs, "--gpus-per-node", GPN, "--max-nodes",
                          max_nodes, "--objective", "throughput"], capsys)
    assert rc == 0
    assert f"recommended: {LABEL['light']} on {max_nodes} node(s)" in stdout
    assert f"{max_nodes} node(s) is the largest count considered" in stdout


DENSE = Law(weight=4 * GiB, gradient=4 * GiB, optimizer_state=8 * GiB,
            activation_per_sample=4 * MiB)          # 16 GiB of model state per rank
ZERO3 = Law(weight=4 * GiB, gradient=4 * GiB, optimizer_state=8 * GiB,
            activation_per_sample=4 * MiB, zero=3)  # the same, sharded over the ranks


@pytest.fixture(scope="module")
def memory_study(tmp_path_factory):
    return write_study(tmp_path_factory.mktemp("memory"), {"dense": (DENSE, {}),
                                                           "zero3": (ZERO3, {})},
                       ranks=(1, 2, 4, 8), repeats=1)


def test_memory_plan_follows_zero_sharding(memory_study):
    models, _ = build_models(load([memory_study]))
    by_zero = {cm.runs[0].zero: cm for cm in models}
    for law, cm in ((DENSE, by_zero[0]), (ZERO3, by_zero[3])):
        for p in (1, 3, 8, 32):  # measured and not
            assert cm.memory(p) == pytest.approx(law.memory(p), rel=1e-9), (law.zero, p)
    assert ZERO3.memory(1) > 4 * GiB > ZERO3.memory(8)


def test_memory_follows_the_shards_the_plan_records(tmp_path):
    """The advisor scales a category by what /plan says the run divided over its ranks
    (memory_plan_<category>_shards), not by re-deriving ZeRO's rules from dist.zero: a sharded
    run whose /config claims dist.zero=0 is still modelled as sharded. Files without the shards
    (written before the binary recorded them) fall back to dist.zero."""
    recorded = write_study(tmp_path / "recorded", {"z": (ZERO3, {"dist.zero": "0"})},
                           ranks=(2, 4), repeats=1)
    (cm,) = build_models(load([recorded]))[0]
    for p in (1, 4, 16):
        assert cm.memory(p) == pytest.approx(ZERO3.memory(p), rel=1e-9), p
    older = write_study(tmp_path / "older", {"z": (ZERO3, {})}, ranks=(2, 4), repeats=1,
                        shards=False)
    (cm,) = build_models(load([older]))[0]
    for p in (1, 4, 16):
        assert cm.memory(p) == pytest.approx(ZERO3.memory(p), rel=1e-9), p
    misled = write_study(tmp_path / "misled", {"z": (ZERO3, {"dist.zero": "0"})},
                         ranks=(2, 4), repeats=1, shards=False)
    (cm,) = build_models(load([misled]))[0]
    assert cm.memory(16) > 2 * ZERO3.memory(16)  # without the record, dist.zero=0 reads dense


def test_advise_excludes_plans_beyond_the_device_memory(memory_study, tmp_path, capsys):
    mem, csv = 4 * GiB, tmp_path / "cands.csv"
    rc, stdout, _ = post(["advise", memory_study, "--gpus-per-node", 1, "--max-nodes", 8,
                          "--memory-per-device", "4GiB", "--top", 100, "--csv", csv], capsys)
    assert rc == 0
    rows = pd.read_csv(csv, keep_default_na=False)
    assert len(rows) == 16
    for _, row in rows.iterrows():
        law = ZERO3 if row["configuration"] == "dist.zero=3" else DENSE
        need = law.memory(int(row["ranks"]))
        if need > mem:
            assert row["excluded"] == (f"memory plan {need / GiB:.3g} GiB per device > "
                                       "--memory-per-device 4 GiB"), row.to_dict()
        else:
            assert row["excluded"] == "", row.to_dict()
    assert set(rows[rows["excluded"] == ""]["ranks"]) == {5, 6, 7, 8}  # zero=3 from 5 ranks on
    assert "recommended: dist.zero=3 on 8 node(s)" in stdout
    assert "excluded by memory at some node counts: dist.zero=0; dist.zero=3" in stdout

    rc, stdout, _ = post(["advise", memory_study, "--gpus-per-node", 1, "--max-nodes", 8,
                          "--memory-per-device", "1GiB"], capsys)
    assert rc == 3
    assert "no configuration qualifies: memory plan" in stdout
    assert "recommended" not in stdout


# --- co-allocation ---------------------------------------------------------------------------------
LLM = Law(phases={"data": (1e-4, 1e-3), "h2d": (1e-5, 1e-4), "forward": (0.01, 0.6),
                  "backward": (0.02, 1.2), "optimizer": (0.01, 0.0), "control": (2e-4, 0.0)},
          bucket_bytes=(100 * MiB,) * 4, overlap=0.3, tokens_per_sample=1024)


def test_coallocation_finds_the_brute_force_split(tmp_path_factory, tmp_path, capsys):
    root = tmp_path_factory.mktemp("jobs")
    jobs = {"cv": LAW, "llm": LLM}
    for name, law in jobs.items():
        write_study(root / name, {name: (law, {})}, ranks=RANKS, noise=0.005)
    gpus, work = 8, {"cv": 1500 * 60.0, "llm": 1e8}  # samples, tokens

    def time(name, k):
        return work[name] / jobs[name].throughput(k, nodes(k))

    # every split of 8 GPUs (idle GPUs allowed), by the laws
    splits = sorted((max(time("cv", a), time("llm", b)), a, b)
                    for a in range(1, gpus) for b in range(1, gpus - a + 1))
    (best, a, b), second = splits[0], splits[1][0]
    equal = max(time("cv", 4), time("llm", 4))
    assert (a, b) != (4, 4) and second > 1.05 * best and equal > 1.05 * best  # a real choice

    csv = tmp_path / "alloc.csv"
    rc, stdout, _ = post(["advise", "--jobs", root / "cv", root / "llm", "--gpus", gpus,
                          "--gpus-per-node", GPN, "--work", f"{work['cv']},{work['llm']}",
                          "--csv", csv], capsys)
    assert rc == 0
    alloc = pd.read_csv(csv)
    assert dict(zip(alloc["job"], alloc["GPUs"])) == {"cv": a, "llm": b}
    assert list(alloc["unit"]) == ["samples/s", "tokens/s"]
    m = re.search(r"predicted makespan (\S+) s against (\S+) s for the equal split", stdout)
    assert m, stdout
    makespan, equal_pred = float(m.group(1)), float(m.group(2))
    assert makespan == pytest.approx(best, rel=0.03)
    assert equal_pred == pytest.approx(equal, rel=0.03)
    assert makespan <= equal_pred


# --- errors ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("value, says", [
    ("8,abc", "'abc' is not a rank count"), ("0,8", "give positive rank counts"),
    ("64..8", "runs backwards; write 8..64"), ("8-64", "is not a rank count")])
def test_bad_predict_is_refused(scaling, capsys, value, says):
    rc, stdout, err = post(["model", scaling / "a", "--predict", value], capsys)
    assert rc == 2 and stdout == ""
    assert f"--predict {value!r}" in err and says in err and "e.g." in err


@pytest.mark.parametrize("value, says", [
    ("lots", "not a size"), ("80 XB", "not a size"), ("-1GiB", "must be positive"),
    ("0", "must be positive"), ("nan", "must be positive")])
def test_bad_memory_per_device_is_refused(scaling, capsys, value, says):
    rc, stdout, err = post(["advise", scaling / "a", "--gpus-per-node", 4, "--max-nodes", 2,
                            f"--memory-per-device={value}"], capsys)
    assert rc == 2 and stdout == ""
    assert f"--memory-per-device {value!r}" in err and says in err


@pytest.mark.parametrize("value, bad", [("1e6,many", "many"), ("1e6,0", "0"),
                                        ("1e6,nan", "nan")])
def test_bad_work_is_refused(scaling, capsys, value, bad):
    rc, _, err = post(["advise", "--jobs", scaling, scaling, "--gpus", 8, "--work", value],
                      capsys)
    assert rc == 2 and f"--work {value!r}: {bad!r} is not a positive amount" in err


@pytest.mark.parametrize("option", ["--gpus-per-node=-4", "--max-nodes=0", "--top=x"])
def test_counts_must_be_positive(scaling, capsys, option):
    args = {"--gpus-per-node": "4", "--max-nodes": "2", "--top": "10"}
    args[option.split("=")[0]] = option.split("=")[1]
    with pytest.raises(SystemExit) as e:
        cli.main(["advise", str(scaling / "a"), *(f"{k}={v}" for k, v in args.items())])
    assert e.value.code == 2
    value = option.split("=")[1]
    assert f"argument {option.split('=')[0]}: {value!r} is not a positive count" in \
        capsys.readouterr().err


def test_missing_extrap_names_scripts_setup(scaling, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TRAINSCOPE_EXTRAP_PYTHON", str(tmp_path / "no-venv" / "bin" / "python"))
    rc, _, err = post(["model", scaling / "a" / "n1", scaling / "a" / "n2"], capsys)
    assert rc == 2
    assert "Extra-P is not installed" in err and str(tmp_path / "no-venv") in err
    assert "scripts/setup" in err


def test_a_study_without_training_runs_is_refused(tmp_path, capsys):
    write_comm(tmp_path / "comm" / "c.h5", LAW.network, 2, 1)
    rc, _, err = post(["model", tmp_path], capsys)
    assert rc == 2 and "no completed cv or llm runs" in err
    write_run(tmp_path / "failed" / "f.h5", LAW, 2, 1, status="failed")
    rc, _, err = post(["advise", tmp_path, "--gpus-per-node", 4, "--max-nodes", 2], capsys)
    assert rc == 2 and "no completed cv or llm runs" in err
    assert "status failed: excluded" in err  # says why the training run did not count
    rc, _, err = post(["model", tmp_path / "nothing-here"], capsys)
    assert rc == 2 and "no such file or directory" in err


@pytest.mark.parametrize("option", ["--cores-per-node=0", "--shared-host-cores=-2",
                                    "--shared-host-cores=nan", "--cores-per-node=two"])
def test_core_counts_must_be_positive(scaling, capsys, option):
    name, value = option.split("=")
    with pytest.raises(SystemExit) as e:
        cli.main(["model", str(scaling / "a"), option])
    assert e.value.code == 2
    assert f"argument {name}: {value!r} is not a positive number of cores" in \
        capsys.readouterr().err


# ---- gradient compression as a knob (issue 40 point 4) -------------------------------------------
# A slow inter-node link (1 GB/s busbw): 60 MiB of buckets cost ~110-120 ms across nodes, of
# which 80 % is exposed (overlap 0.2); within a node (100 GB/s) ~1 ms.
SLOW = Law(network=Network(inter=(20e-6, 1 / 1e9)), overlap=0.2)
PSGD_RATIO, PSGD_COST = 0.1, 0.010  # PowerSGD: 10 % of the bytes, 10 ms of computation


@pytest.fixture(scope="module")
def compressed(tmp_path_factory):
    """The SLOW configuration uncompressed at 1..16 ranks (4 per node) with comm runs, and
    PowerSGD runs of it at 2 ranks on one node and 8 ranks on two nodes."""
    root = write_study(tmp_path_factory.mktemp("compress"), {"a": (SLOW, {})}, ranks=RANKS,
                       noise=NOISE)
    for p, n in ((2, 1), (8, 2)):
        write_run(root / "psgd" / f"n{p}.h5", SLOW, p, n, compress="powersgd",
                  compress_ratio=PSGD_RATIO, compress_cost=PSGD_COST, noise=NOISE, seed=p)
    return root


def _knob_table(stdout: str, mode: str) -> pd.DataFrame:
    """The rows of advise's compression table for `mode` (nodes as the index)."""
    head = stdout.index("compression (--compress")
    lines = stdout[head:].splitlines()[1:]
    cols = re.split(r"\s{2,}", lines[0].strip())
    rows = []
    for line in lines[1:]:
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) != len(cols):
            break
        rows.append(dict(zip(cols, cells)))
    df = pd.DataFrame(rows)
    df = df[df["compression"] == mode].copy()
    for c in df.columns:
        if c not in ("configuration", "compression", "pays"):
            df[c] = df[c].astype(float)
    return df.set_index("nodes")


def test_advise_prices_compression_by_the_bytes_ratio(compressed, capsys):
    """`advise --compress all`: bf16 (no run: the nominal ratio 0.5, no cost) halves the
    predicted exposed communication (the overlap is not capped by backward here) and the step
    drops by exactly that; PowerSGD's ratio and cost come from its runs (0.1 and 10 ms) and it
    pays across nodes (the slow link: ~80 ms saved) but not on one node (~1 ms saved < 10 ms);
    fp16 likewise at 0.5."""
    rc, stdout, _ = post(["advise", compressed, "--gpus-per-node", GPN, "--max-nodes", 4,
                          "--compress", "all"], capsys)
    assert rc == 0, stdout
    bf16 = _knob_table(stdout, "bf16")
    for n, r in bf16.iterrows():
        assert r["exposed with [ms]"] == pytest.approx(0.5 * r["exposed without [ms]"], rel=2e-3)
        assert r["step with [ms]"] == pytest.approx(
            r["step without [ms]"] - 0.5 * r["exposed without [ms]"], rel=2e-3)
        assert r["cost [ms]"] == 0
    # at 4 nodes (16 ranks, measured): the law's own exposed communication, with and without
    p, n = 16, 4
    c = SLOW.collective(p, n)
    bw = SLOW.phase("backward", p)
    assert bf16.loc[4.0, "exposed without [ms]"] == pytest.approx(
        1e3 * max(0.8 * c, c - bw), rel=0.05)
    assert bf16.loc[4.0, "exposed with [ms]"] == pytest.approx(
        1e3 * max(0.8 * 0.5 * c, 0.5 * c - bw), rel=0.05)
    assert "dist.compress=bf16: bytes ratio 0.5 (nominal (16-bit against fp32 gradients))" in \
        stdout

    psgd = _knob_table(stdout, "powersgd")
    assert f"dist.compress=powersgd: bytes ratio {PSGD_RATIO:g} (measured (2 run(s) of this " \
        "configuration))" in stdout
    assert psgd["cost [ms]"].iloc[1:].to_numpy() == pytest.approx(1e3 * PSGD_COST, abs=1.5)
    expected = 1e3 * (SLOW.step(p, n) - SLOW.comm_wait(p, n) + max(0.8 * 0.1 * c, 0.1 * c - bw)
                      + PSGD_COST)
    assert psgd.loc[4.0, "step with [ms]"] == pytest.approx(expected, rel=0.05)
    assert list(psgd["pays"]) == ["no", "yes", "yes", "yes"]
    assert "  pays at 2, 3, 4 node(s) (step " in stdout and "does not pay at 1 node(s)" in stdout
    assert "break-even at 4 node(s): it saves" in stdout

    # without --compress: the settings the runs measured (PowerSGD only); --compress none: none
    rc, stdout, _ = post(["advise", compressed, "--gpus-per-node", GPN, "--max-nodes", 2],
                         capsys)
    assert "dist.compress=powersgd: bytes ratio" in stdout and "dist.compress=bf16" not in stdout
    rc, stdout, _ = post(["advise", compressed, "--gpus-per-node", GPN, "--max-nodes", 2,
                          "--compress", "none"], capsys)
    assert "compression" not in stdout
