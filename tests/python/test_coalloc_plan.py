"""The co-allocation planner (trainscope_jobs.coalloc) on jobs whose models are given, so every
predicted makespan can be worked out by hand; and plan files that must be refused by name.
The executor itself runs real jobs in tests/e2e/test_coalloc.py and under Slurm in
tests/jobscripts/test_jobscripts.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import wait_until_gone

from trainscope_jobs.coalloc import (JobModel, best_static, equal_split, load_plan, predict,
                                     simulate, static_policy, DynamicPolicy)
from trainscope_post.study import StudyError

ROOT = Path(__file__).resolve().parents[2]


def job(name, iters, steps, startup=0.0, stop=0.0, restore=0.0, arrive=0.0):
    counts = sorted(steps)
    return JobModel(name, iters, arrive, counts, dict(steps), {u: startup for u in counts},
                    stop, restore)


def test_growing_onto_freed_units_without_costs():
    # a: 10 iterations, b: 30, both 1 s per iteration on 1 unit and 0.5 s on 2.
    # equal: b alone decides, 30 s. Dynamic: a ends at 10 s, b has 20 left at 0.5 s -> 20 s.
    ms = [job("a", 10, {1: 1.0, 2: 0.5}), job("b", 30, {1: 1.0, 2: 0.5})]
    p = predict(ms, 2)
    assert p["equal"]["makespan_s"] == pytest.approx(30.0)
    assert p["static"]["makespan_s"] == pytest.approx(30.0) and p["static"]["same_as_equal"]
    assert p["dynamic"]["makespan_s"] == pytest.approx(20.0)
    assert [ph["alloc"] for ph in p["dynamic"]["phases"]] == [{"a": 1, "b": 1}, {"b": 2}]


def test_resize_costs_are_paid_where_they_fall():
    # start-up 2 s, stop 1 s, restore 0.5 s. equal: a 2 + 10 = 12, b 2 + 30 = 32.
    # dynamic: at 12 s b has done 10 (computing since 2 s); it stops (1 s), restarts on 2 units
    # (2 + 0.5 s) at 15.5 s and needs 20 x 0.5 = 10 s more: 25.5 s.
    ms = [job("a", 10, {1: 1.0, 2: 0.5}, 2.0, 1.0, 0.5),
          job("b", 30, {1: 1.0, 2: 0.5}, 2.0, 1.0, 0.5)]
    p = predict(ms, 2)
    assert p["equal"]["makespan_s"] == pytest.approx(32.0)
    assert p["dynamic"]["makespan_s"] == pytest.approx(25.5)


def test_a_resize_that_costs_more_than_it_gains_is_not_made():
    # Growing b for its last 2 iterations would save 1 s and cost 1 + 2 + 5 s: keep the split.
    ms = [job("a", 28, {1: 1.0, 2: 0.5}, 2.0, 1.0, 5.0),
          job("b", 30, {1: 1.0, 2: 0.5}, 2.0, 1.0, 5.0)]
    p = predict(ms, 2)
    assert p["dynamic"]["makespan_s"] == pytest.approx(p["equal"]["makespan_s"]) == 32.0
    assert len(p["dynamic"]["phases"]) == 1


def test_best_static_split_is_uneven_when_the_work_is():
    # 4 units; a: 10 iterations, b: 60; step = 4 s / units for both (perfect scaling).
    # equal 2 + 2: b 60 x 2 = 120 s. Best static 1 + 3: a 40 s, b 60 x 4/3 = 80 s.
    steps = {u: 4.0 / u for u in (1, 2, 3, 4)}
    ms = [job("a", 10, steps), job("b", 60, steps)]
    assert equal_split(ms, 4) == {0: 2, 1: 2}
    split, ms_static = best_static(ms, 4)
    assert split == {0: 1, 1: 3} and ms_static == pytest.approx(80.0)
    p = predict(ms, 4)
    assert p["equal"]["makespan_s"] == pytest.approx(120.0)
    # dynamic: 1 + 3 until a ends at 40 s (b did 30), then b on 4: 30 x 1 s -> 70 s; and
    # nothing the search can find beats the work conserved: 70 x 4 units = 280 = 10 x 4 + 60 x 4
    assert p["dynamic"]["makespan_s"] == pytest.approx(70.0)
    assert p["dynamic"]["makespan_s"] <= p["static"]["makespan_s"] <= p["equal"]["makespan_s"]


def test_an_arriving_job_is_admitted_by_shrinking_the_running_one():
    # b runs alone on 2 units from 0 s; a arrives at 5 s. Static splits reserve a unit for a
    # from the start (b on 1 unit: 30 s); dynamic: b on 2 until 5 s (10 done), both on 1 until
    # a ends at 15 s (b did 10 more), b on 2 again: 10 x 0.5 -> 20 s.
    ms = [job("a", 10, {1: 1.0, 2: 0.5}, arrive=5.0), job("b", 30, {1: 1.0, 2: 0.5})]
    p = predict(ms, 2)
    assert p["equal"]["makespan_s"] == pytest.approx(30.0)
    assert p["dynamic"]["makespan_s"] == pytest.approx(20.0)
    assert [(ph["t"], ph["alloc"]) for ph in p["dynamic"]["phases"]] == [
        (0.0, {"b": 2}), (5.0, {"a": 1, "b": 1}), (15.0, {"b": 2})]


def test_rank_counts_that_do_not_split_the_global_batch_are_never_planned():
    # b may only run on 1 or 3 units (its global batch is 3): with 4 units it takes 3 from the
    # start (a the fourth), never 2 or 4.
    ms = [job("a", 4, {1: 1.0, 2: 0.5, 4: 0.25}), job("b", 30, {1: 1.0, 3: 1 / 3})]
    _, phases = simulate(ms, 4, DynamicPolicy(ms, 4))
    assert all(ph["alloc"].get("b", 1) in (1, 3) for ph in phases)
    assert phases[0]["alloc"] == {"a": 1, "b": 3} and len(phases) == 1


def test_static_policy_never_changes_the_split():
    ms = [job("a", 10, {1: 1.0, 2: 0.5}), job("b", 30, {1: 1.0, 2: 0.5})]
    _, phases = simulate(ms, 2, static_policy({0: 1, 1: 1}))
    assert len(phases) == 1


# --- plan files ------------------------------------------------------------------------------------
GOOD_JOBS = """
[[job]]
name = "cv"
configs = ["inputs/quickstart.ini"]
iterations = 10
global_batch = 64

[[job]]
name = "llm"
configs = ["inputs/llm/lora-tiny.ini"]
iterations = 10
global_batch = 4
"""


def plan_file(tmp_path, text, jobs=GOOD_JOBS):
    f = tmp_path / "plan.toml"
    f.write_text(text + jobs)
    return f


def test_the_shipped_plans_load():
    for f in (ROOT / "inputs" / "coalloc").glob("*.toml"):
        p = load_plan(f)
        assert p.units >= len(p.jobs) >= 2


@pytest.mark.parametrize("head, jobs, words", [
    ("units = 2\nbogus = 1\n", GOOD_JOBS, "unknown key(s) 'bogus'"),
    ("", GOOD_JOBS, "`units` is missing"),
    ("units = 1\n", GOOD_JOBS, "units = 1 for 2 jobs: every job needs one unit"),
    ("units = true\n", GOOD_JOBS, "`units` = True: give a whole number"),
    ("units = 2\nmodes = ['equal', 'fastest']\n", GOOD_JOBS, "modes ['equal', 'fastest']"),
    ("units = 2\nname = '../x'\n", GOOD_JOBS, "name '../x': letters, digits"),
    ("units = 2\ncalibration = { ranks = [1] }\n", GOOD_JOBS, "calibration.ranks [1]: 2 or more"),
    ("units = 2\ncalibration = { iterations = 2 }\n", GOOD_JOBS, "`iterations` = 2"),
    ("units = 2\n", GOOD_JOBS.replace("inputs/quickstart.ini", "nope.ini"),
     "config nope.ini: not found"),
    ("units = 2\n", GOOD_JOBS.replace('"llm"', '"cv"'), "job cv: two jobs have this name"),
    ("units = 2\n", GOOD_JOBS.replace("global_batch = 4", "global_batch = 3"),
     "global_batch 3 splits evenly over only [1]"),
    ("units = 2\n", GOOD_JOBS + 'options = { "train.max_iters" = 5 }\n',
     "option train.max_iters is set by the executor; use the job's `iterations`"),
    ("units = 2\n", GOOD_JOBS + 'options = { "output.file" = "x.h5" }\n',
     "option output.file is set by the executor"),
    ("units = 2\n", GOOD_JOBS + 'options = { "train.lr" = "1\\n2" }\n', "a one-line value"),
    ("units = 2\n", GOOD_JOBS + "arrive = -1\n", "arrive = -1: seconds after the start"),
    ("units = 2\n", GOOD_JOBS.split("[[job]]\nname = \"llm\"")[0], "give 2 to 8 [[job]] tables"),
    ("units = 2\n", GOOD_JOBS.replace("iterations = 10", "iterations = 0", 1),
     "`iterations` = 0: give a whole number from 1"),
    ("units = [\n", "", "not valid TOML"),
])
def test_bad_plans_are_refused_naming_the_key(tmp_path, head, jobs, words):
    with pytest.raises(StudyError) as e:
        load_plan(plan_file(tmp_path, head, jobs))
    assert words in str(e.value)
    assert str(tmp_path / "plan.toml") in str(e.value)


def test_a_plan_that_is_not_a_regular_file_is_refused(tmp_path):
    import os
    fifo = tmp_path / "plan.toml"
    os.mkfifo(fifo)
    with pytest.raises(StudyError, match="not a regular file"):
        load_plan(fifo)
    with pytest.raises(StudyError, match="no such plan file"):
        load_plan(tmp_path / "missing.toml")


def test_gpu_units_under_mpirun_are_the_launch_s_visible_devices(tmp_path):
    """--gpus with mpirun (here, or inside a PBS chunk): unit u is GPU u, so two jobs launched on
    disjoint units never see the same GPU; the cores are bound the same way as without GPUs."""
    import os
    from trainscope_jobs.coalloc import JobSpec, Launcher, _wait
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores")
    exe = tmp_path / "fake_trainscope"
    exe.write_text("#!/bin/sh\necho \"CVD=$CUDA_VISIBLE_DEVICES cpus=$(taskset -cp $$)\"\n")
    exe.chmod(0o755)
    spec = JobSpec("j", [tmp_path / "x.ini"], 2, 2)
    for gpus, want in ((True, "CVD=1 "), (False, "CVD= ")):
        seg = Launcher("mpirun", exe, 2, gpus=gpus).start(spec, 0, 1, [1], 2, tmp_path / str(gpus),
                                                          resume=False)
        _wait(seg, 60)
        log = seg.log.read_text()
        assert seg.rc == 0 and want in log, log
        assert "--cpu-set 1" in log.splitlines()[0] and log.rstrip().endswith(": 1"), log


def test_out_holding_other_files_is_refused_and_left_alone(tmp_path, capsys):
    from trainscope_jobs.coalloc import main
    out = tmp_path / "home"
    out.mkdir()
    (out / "thesis.tex").write_text("keep me")
    (out / "equal").mkdir()
    plan = ROOT / "inputs" / "coalloc" / "arrival-cpu.toml"
    assert main([str(plan), "--out", str(out), "--plan-only"]) == 2
    err = capsys.readouterr().err
    assert f"--out {out}: holds thesis.tex, which a co-allocation did not write" in err
    assert (out / "thesis.tex").read_text() == "keep me" and (out / "equal").is_dir()
    f = tmp_path / "file"
    f.write_text("x")
    assert main([str(plan), "--out", str(f), "--plan-only"]) == 2
    assert "exists and is not a directory" in capsys.readouterr().err
    assert main([str(plan), "--out", str(tmp_path / "x\ny")]) == 2
    assert "one line" in capsys.readouterr().err


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_an_interrupted_coallocation_leaves_no_launch_running(tmp_path, sig):
    """Each launch runs in a session of its own (the terminal's Ctrl-C does not reach it): when
    the executor is interrupted (Ctrl-C, or a scheduler's SIGTERM) it kills what it started."""
    import os
    import signal
    import subprocess
    import sys
    import time
    pidfile = tmp_path / "fake.pid"
    exe = tmp_path / "fake_trainscope"
    exe.write_text(f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 300\n")
    exe.chmod(0o755)
    plan = tmp_path / "plan.toml"
    plan.write_text(f'binary = "{exe}"\nunits = 2\n' + GOOD_JOBS)
    proc = subprocess.Popen([sys.executable, str(ROOT / "jobscripts" / "study"), "coalloc",
                             str(plan), "--out", str(tmp_path / "out")], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    while not (pidfile.exists() and pidfile.read_text().strip()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() - t0 < 60, "the warm-up launch never started"
        time.sleep(0.05)
    pid = int(pidfile.read_text())
    proc.send_signal(getattr(signal, sig))
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, out + err
    assert "interrupted; the jobs it started were killed" in err
    wait_until_gone(pid, "the interrupt")
