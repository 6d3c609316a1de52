"""Co-allocation executed (issue 27): inputs/coalloc/arrival-cpu.toml on this machine's 2 cores,
one rank per core. The LLM job starts alone; the CV job arrives 8 s later. Equal split: the CV
job's core waits for it. Dynamic: the LLM job runs on both cores, is shrunk to one (checkpoint,
elastic resume) to admit the CV job and grown back when it ends. Checked from the executor's
results.json and the run files of every launch: which job held which core when (never two at
once), the resize sequence the planner chose, and that the resized job ran every iteration
exactly once with the full global batch. Measured vs predicted makespans are printed (-s), not
asserted: timings belong to the acceptance runs (docs/coalloc.md), not to a test.

The calibration runs for real first (--plan-only: each job alone on 1 and 2 ranks, the resize
probe), and its models are checked for sense. The modes then run on given models close to what
it measures here when the machine is idle: which split the planner picks follows from the
measured speeds, and on a loaded 2-core machine 2 ranks can be no faster than 1 (then the
planner rightly never resizes, and there would be no resize to test)."""

import json
import subprocess
import sys

import h5py
import numpy as np

from conftest import BINARY, ROOT
from trainscope_jobs.coalloc import JobModel, load_plan, save_calibration

PLAN = ROOT / "inputs" / "coalloc" / "arrival-cpu.toml"


# per job: seconds per iteration by ranks, start-up, stop, restore (idle, this machine, mpirun)
IDLE = {"llm": ({1: 0.22, 2: 0.125}, 1.3, 0.55, 0.15),
        "cv": ({1: 0.17, 2: 0.11}, 2.0, 0.6, 0.15)}


def segments(run, job):
    return [s for s in run["segments"] if s["job"] == job]


def test_dynamic_coallocation_shrinks_to_admit_and_grows_back(tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text(f'binary = "{BINARY}"\n' + PLAN.read_text())
    out = tmp_path / "out"

    def coalloc(*args, timeout=900):
        proc = subprocess.run([sys.executable, str(ROOT / "jobscripts" / "study"), "coalloc",
                               str(plan), "--out", str(out), *args], capture_output=True,
                              text=True, timeout=timeout, cwd=tmp_path)
        print(proc.stdout[-3000:])
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc

    # 1. calibration, for real: every job alone on 1 and 2 ranks, and the resize probe
    p = coalloc("--plan-only")
    assert "nothing run (--plan-only)" in p.stdout and not (out / "results.json").exists()
    cal = json.loads((out / "calibration.json").read_text())
    assert cal["launcher"] == "mpirun" and [m["name"] for m in cal["models"]] == ["llm", "cv"]
    for m in cal["models"]:
        assert set(m["step_s"]) == {"1", "2"} and all(0 < v < 5 for v in m["step_s"].values())
        assert all(0 <= v < 30 for v in m["startup_s"].values())
        assert 0 < m["stop_s"] < 30 and m["restore_s"] >= 0
    for job in ("llm", "cv"):
        probe = out / "calibration" / job / "probe"
        with h5py.File(probe / "seg0.h5", "r") as f0, h5py.File(probe / "seg1.h5", "r") as f1:
            assert f0.attrs["status"] in ("interrupted", b"interrupted")
            assert f0.attrs["world_size"] == 1 and f1.attrs["world_size"] == 2
            assert f1.attrs["resumed_from_world_size"] == 1

    # 2. the modes, on the idle models (calibration.json replaced: it is reused as measured)
    spec = load_plan(plan)
    save_calibration(out, spec, "mpirun", [
        JobModel(j.name, j.iterations, j.arrive, [1, 2], IDLE[j.name][0],
                 {1: IDLE[j.name][1], 2: IDLE[j.name][1]}, IDLE[j.name][2], IDLE[j.name][3])
        for j in spec.jobs])
    p = coalloc("--modes", "equal,dynamic", "--repeats", "1")
    assert "calibration: reusing" in p.stdout
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
        # completed: 0; stopped with a checkpoint to be resized: 75 (docs/faults.md)
        assert all(s["exit"] == {"completed": 0, "interrupted": 75}[s["status"]]
                   for s in run["segments"]), run["segments"]
        assert abs(run["makespan_s"] - max(s["t_end"] for s in run["segments"])) < 2e-3

    eq = segments(runs["equal"], "llm")
    assert [(s["ranks"], s["resumed"], s["status"]) for s in eq] == [(1, False, "completed")]
    dyn = segments(runs["dynamic"], "llm")
    assert [(s["ranks"], s["resumed"], s["status"]) for s in dyn] == [
        (2, False, "interrupted"), (1, True, "interrupted"), (2, True, "completed")]
    # the resized job: every iteration once, in order, each with the whole global batch: 8 =
    # run.global_batch 4 per micro-batch x llm.gradient_accumulation 2 (inputs/llm/lora-tiny.ini)
    iters, samples = [], []
    for s in dyn:
        with h5py.File(s["run_file"], "r") as f:
            assert f["iterations/iteration"].shape[0] == s["ranks"]
            iters.append(f["iterations/iteration"][0, :])
            samples.append(f["iterations/samples"][...].sum(axis=0))
    total = next(j.iterations for j in spec.jobs if j.name == "llm")
    assert np.array_equal(np.concatenate(iters), np.arange(total))
    assert np.all(np.concatenate(samples) == 8)
    for mode in ("equal", "dynamic"):
        print(f"{mode}: predicted {pred[mode]['makespan_s']:.1f} s, measured "
              f"{runs[mode]['makespan_s']:.1f} s")
    assert (out / "timeline.png").stat().st_size > 10_000
    report = (out / "report.md").read_text()
    assert "| dynamic |" in report and "gain over equal [%]" in report
