"""Co-allocation executed (issue 27): inputs/coalloc/arrival-cpu.toml on this machine's 2 cores,
one rank per core. The LLM job starts alone; the CV job arrives 8 s later. Equal split: the CV
job's core waits for it. Dynamic: the LLM job runs on both cores, is shrunk to one (checkpoint,
elastic resume) to admit the CV job and grown back when it ends. Checked from the executor's
results.json and the run files of every launch: which job held which core when (never two at
once), the resize sequence the planner chose, and that the resized job ran every iteration
exactly once with the full global batch. Measured vs predicted makespans are printed (-s), not
asserted: timings belong to the acceptance runs (docs/coalloc.md), not to a test."""

import json
import subprocess
import sys

import h5py
import numpy as np

from conftest import BINARY, ROOT

PLAN = ROOT / "inputs" / "coalloc" / "arrival-cpu.toml"


def segments(run, job):
    return [s for s in run["segments"] if s["job"] == job]


def test_dynamic_coallocation_shrinks_to_admit_and_grows_back(tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text(f'binary = "{BINARY}"\n' + PLAN.read_text()
                    .replace('"inputs/', f'"{ROOT}/inputs/'))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "jobscripts" / "study"), "coalloc",
                           str(plan), "--out", str(out), "--modes", "equal,dynamic",
                           "--repeats", "1"], capture_output=True, text=True, timeout=900,
                          cwd=tmp_path)
    print(proc.stdout[-3000:])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    runs = {r["mode"]: r for r in res["runs"]}
    assert set(runs) == {"equal", "dynamic"}
    pred = res["predicted"]
    assert pred["dynamic"]["makespan_s"] < pred["equal"]["makespan_s"]
    assert [ph["alloc"] for ph in pred["dynamic"]["phases"]] == [
        {"llm": 2}, {"llm": 1, "cv": 1}, {"llm": 2}]

    for mode, run in runs.items():
        # no unit held by two launches at once
        for u in range(2):
            spans = sorted((s["t_launch"], s["t_end"]) for s in run["segments"] if u in s["units"])
            assert all(a[1] <= b[0] + 1e-3 for a, b in zip(spans, spans[1:])), (mode, u, spans)
        cv = segments(run, "cv")
        assert len(cv) == 1 and cv[0]["status"] == "completed" and cv[0]["t_launch"] >= 6.0
        assert all(s["exit"] == 0 for s in run["segments"])
        assert run["makespan_s"] == max(s["t_end"] for s in run["segments"])

    eq = segments(runs["equal"], "llm")
    assert [(s["ranks"], s["resumed"], s["status"]) for s in eq] == [(1, False, "completed")]
    dyn = segments(runs["dynamic"], "llm")
    assert [(s["ranks"], s["resumed"], s["status"]) for s in dyn] == [
        (2, False, "interrupted"), (1, True, "interrupted"), (2, True, "completed")]
    # the resized job: every iteration once, in order, each with the whole global batch (4)
    iters, samples = [], []
    for s in dyn:
        with h5py.File(s["run_file"], "r") as f:
            assert f["iterations/iteration"].shape[0] == s["ranks"]
            iters.append(f["iterations/iteration"][0, :])
            samples.append(f["iterations/samples"][...].sum(axis=0))
    assert np.array_equal(np.concatenate(iters), np.arange(200))
    assert np.all(np.concatenate(samples) == 4)
    for mode in ("equal", "dynamic"):
        print(f"{mode}: predicted {pred[mode]['makespan_s']:.1f} s, measured "
              f"{runs[mode]['makespan_s']:.1f} s")
    assert (out / "timeline.png").stat().st_size > 10_000
    report = (out / "report.md").read_text()
    assert "| dynamic |" in report and "gain over equal [%]" in report

    # calibration is reused when the plan did not change
    again = subprocess.run([sys.executable, str(ROOT / "jobscripts" / "study"), "coalloc",
                            str(plan), "--out", str(out), "--modes", "equal", "--repeats", "1"],
                           capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "calibration: reusing" in again.stdout
