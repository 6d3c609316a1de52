"""jobscripts/study: study files expanded into points, rendered through the sweep's templates,
run here (local) and on the test suite's real Slurm as job arrays, their status, and re-runs that
submit only the points that are missing or failed."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import h5py
import pytest

from test_jobscripts import slurm, status, wait_for_jobs  # noqa: F401  (slurm is a fixture)

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("TRAINSCOPE_BUILD_DIR", ROOT / "build"))
STUDY = ROOT / "jobscripts" / "study"
STUDIES = ROOT / "inputs" / "studies"
CV_CPU = STUDIES / "cv-strategies-cpu.toml"


def study(*args, check=True, env=None, timeout=900):
    proc = subprocess.run([sys.executable, str(STUDY), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env=env)
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def with_binary(src: Path, dst: Path, **scheduler) -> Path:
    """A copy of a shipped study file using this build's binary (and other [scheduler] keys)."""
    text = src.read_text()
    keys = {"binary": str(BUILD / "app" / "trainscope"), **scheduler}
    lines = "".join(f"{k} = {json.dumps(v)}\n" for k, v in keys.items())
    text = text.replace("[scheduler]\n", "[scheduler]\n" + lines, 1)
    dst.write_text(text)
    return dst


def states(out: Path, tmp_path: Path) -> dict:
    js = tmp_path / "status.json"
    study("status", out, "--json", js, check=False)
    return {(r["label"], r["count"], r["repeat"]): r["state"]
            for r in json.loads(js.read_text())}


def ran_points(stdout: str) -> list[str]:
    return [line.split()[2] for line in stdout.splitlines() if line.startswith("running point")]


def test_every_shipped_study_renders_at_both_scales(tmp_path):
    """Every study file parses, names what it reproduces, exists at cluster and cpu scale, and
    renders for all three schedulers without submitting anything."""
    files = sorted(STUDIES.glob("*.toml"))
    stems = {f.stem for f in files}
    for kind in ("cv-strategies", "cv-image-size", "cv-precision-pin", "cv-layout-preprocess",
                 "llm-datasets", "llm-methods"):
        assert {f"{kind}-cluster", f"{kind}-cpu"} <= stems, kind
    for f in files:
        for sched in ("slurm", "pbs", "local"):
            out = tmp_path / sched / f.stem
            p = study("run", f, "--scheduler", sched, "--out", out, "--dry-run")
            assert "nothing submitted" in p.stdout
            doc = json.loads((out / "study.json").read_text())
            assert len(doc["reproduces"]) > 40 and doc["points"]
            for pt in doc["points"]:
                assert Path(pt["script"]).is_file()
                assert not (Path(pt["run_dir"]) / "job.id").exists()
                # A GPU point never lets run.device=auto fall back to the CPU (issue 25).
                gpu = "--run.device=cuda" in Path(pt["script"]).read_text()
                assert gpu == bool(pt["gpus_per_node"]), (f, pt["point"])


def test_dry_run_of_a_large_slurm_study_renders_throttled_arrays(tmp_path):
    out = tmp_path / "s"
    study("run", STUDIES / "cv-strategies-cluster.toml", "--scheduler", "slurm", "--out", out,
          "--dry-run")
    doc = json.loads((out / "study.json").read_text())
    pts = doc["points"]
    # 3 strategies x GPUs 1, 2, 4, 8, 16 x 3 repeats, DataParallel only inside a node (1, 2, 4)
    assert len(pts) == (5 + 5 + 3) * 3
    arrays = sorted((out / "arrays").glob("*.sbatch"))
    tasks = []
    for a in arrays:
        text = a.read_text()
        table = a.with_suffix(".tsv").read_text().splitlines()[1:]
        assert f"#SBATCH --array=0-{len(table) - 1}%4" in text
        assert "#SBATCH --partition=gpu" in text and "@@" not in text
        tasks += [int(r.split("\t")[1]) for r in table]
        # every task of an array has the array's allocation
        for row in table:
            job = Path(row.split("\t")[2]).read_text()
            for key in ("--nodes=", "--ntasks-per-node=", "--gpus-per-node=", "--cpus-per-task="):
                line = next(x for x in text.splitlines() if key in x)
                assert line in job, (a, row, line)
    assert sorted(tasks) == list(range(len(pts)))  # every point in exactly one array
    sc = subprocess.run(["shellcheck", "-x", "-S", "warning", str(arrays[0]),
                         str(ROOT / "jobscripts/slurm/array.sbatch"),
                         str(ROOT / "bin/trainscope-post"), str(ROOT / "bin/trainscope-study")],
                        capture_output=True, text=True, cwd=ROOT)
    assert sc.returncode == 0, sc.stdout
    dp4 = (out / "dp_fp32/strong/n04/rep0/job.sbatch").read_text()
    assert "#SBATCH --ntasks-per-node=1" in dp4 and "#SBATCH --gpus-per-node=4" in dp4
    assert "--dp.devices=4" in dp4 and "--run.global_batch=256" in dp4
    assert "--run.device=cuda" in dp4
    assert not (out / "dp_fp32/strong/n08").exists()
    ddp16 = (out / "ddp_fp32/strong/n16/rep2/job.sbatch").read_text()
    assert "#SBATCH --nodes=4" in ddp16 and "--run.precision=fp32" in ddp16
    assert "inputs/cv/strategy-ddp.ini" in ddp16 and "inputs/cv/gpu.ini" in ddp16
    # job records of one scheduler are not mixed with another's
    (out / "ddp_fp32/strong/n16/rep2/job.id").write_text("slurm 99_0\n")
    p = study("run", STUDIES / "cv-strategies-cluster.toml", "--scheduler", "pbs", "--out", out,
              "--dry-run", check=False)
    assert p.returncode == 2 and "submitted with --scheduler slurm" in p.stderr, p.stderr
    # under the threshold: one job script per point, no array
    small = tmp_path / "small.toml"
    with_binary(STUDIES / "cv-strategies-cluster.toml", small, array_threshold=100)
    study("run", small, "--scheduler", "slurm", "--out", tmp_path / "t", "--dry-run")
    assert not (tmp_path / "t" / "arrays").exists()


HEAD = 'name = "t"\nreproduces = "a test"\nconfigs = ["inputs/cv/base.ini"]\n'
SCALE = '[scale]\nranks = [1, 2]\nmode = "strong"\nglobal_batch = 32\n'


@pytest.mark.parametrize("body,message", [
    ("name = ", "not valid TOML"),
    (HEAD + 'colour = "blue"\n' + SCALE, "unknown key(s) ['colour'] in the top level"),
    (HEAD + SCALE.replace("[1, 2]", "[1, 3]"), "global_batch 32 does not divide over 3 ranks"),
    (HEAD + SCALE.replace('"strong"', '"sideways"'), "mode = 'sideways'"),
    (HEAD + SCALE + '[[axes]]\nname = "x"\nvalues = [{ label = "a", configs = ["nope.ini"] }]\n',
     "config 'nope.ini' not found"),
    (HEAD + SCALE + '[[axes]]\nname = "x"\nvalues = [1, 2]\n', "plain values need option"),
    (HEAD.replace('name = "t"\n', ""), 'missing name = "..."'),
])
def test_bad_study_files_are_refused_before_anything_is_written(tmp_path, body, message):
    f = tmp_path / "bad.toml"
    f.write_text(body)
    out = tmp_path / "out"
    p = study("run", f, "--scheduler", "local", "--out", out, check=False)
    assert p.returncode == 2, p.stdout + p.stderr
    assert message in p.stderr and "bad.toml" in p.stderr
    assert not out.exists()


def test_local_cv_strategies_study_and_rerun_of_failed_points(tmp_path):
    """Acceptance 1: the CPU CV strategies study runs here to the end; a point marked failed, and
    one whose job is killed while it runs, are the only points a second and third `run`
    submit."""
    f = with_binary(CV_CPU, tmp_path / "cv.toml")
    out = tmp_path / "study"
    t0 = time.monotonic()
    p = study("run", f, "--scheduler", "local", "--out", out)
    print(f"cv-strategies-cpu locally: {time.monotonic() - t0:.1f} s")
    assert len(ran_points(p.stdout)) == 6
    st = states(out, tmp_path)
    assert len(st) == 6 and set(st.values()) == {"completed"}, st
    rows = json.loads((out / "manifest.json").read_text())
    for r in rows:
        assert status(r["output"]) == "completed"
    with h5py.File(out / "dp_fp32/strong/n02/rep0/run.h5", "r") as h:
        assert int(h.attrs["world_size"]) == 1  # one process driving two replicas
    assert "--dp.devices=2" in (out / "dp_fp32/strong/n02/rep0/job.sh").read_text()

    with h5py.File(out / "ddp_fp32/strong/n02/rep0/run.h5", "r+") as h:
        h.attrs["status"] = "failed"
    assert states(out, tmp_path)[("ddp_fp32", 2, 0)] == "failed"
    p = study("run", f, "--scheduler", "local", "--out", out)
    assert ran_points(p.stdout) == ["3"], p.stdout
    assert p.stdout.count("skip point") == 5
    assert set(states(out, tmp_path).values()) == {"completed"}

    # A point killed while it runs: its mpirun gets SIGKILL during the re-run of that point.
    d = out / "ddp-ds_fp32/strong/n01/rep0"
    for name in ("run.h5", "job.pid", "job.exit"):
        (d / name).unlink()
    runner = subprocess.Popen([sys.executable, str(STUDY), "run", str(f), "--scheduler", "local",
                               "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    mpirun, deadline = None, time.time() + 60
    while mpirun is None and time.time() < deadline:
        pid = (d / "job.pid").read_text().strip() if (d / "job.pid").exists() else ""
        if pid:
            kids = subprocess.run(["pgrep", "-P", pid, "-x", "mpirun"], capture_output=True,
                                  text=True).stdout.split()
            mpirun = int(kids[0]) if kids else None
        time.sleep(0.1)
    assert mpirun, "the re-run point never started mpirun"
    assert states(out, tmp_path)[("ddp-ds_fp32", 1, 0)] == "running"
    os.kill(mpirun, 9)
    log, _ = runner.communicate(timeout=120)
    assert runner.returncode == 1 and ran_points(log) == ["4"], log
    st = study("status", out, check=False)
    assert st.returncode == 3 and "exit 137" in st.stdout, st.stdout
    assert "summary: 0 pending, 0 running, 5 completed, 0 interrupted, 1 failed of 6" in st.stdout
    p = study("run", f, "--scheduler", "local", "--out", out)
    assert ran_points(p.stdout) == ["4"], p.stdout
    st = study("status", out)
    assert "summary: 0 pending, 0 running, 6 completed, 0 interrupted, 0 failed of 6" in st.stdout


def test_real_slurm_study_runs_as_job_arrays(slurm, tmp_path):  # noqa: F811
    """Acceptance 2: the CPU CV strategies study on the real local Slurm: more points than its
    array threshold, so one throttled array per allocation shape, chained; all complete."""
    f = with_binary(CV_CPU, tmp_path / "cv.toml")
    out = tmp_path / "study"
    t0 = time.monotonic()
    p = study("run", f, "--scheduler", "slurm", "--out", out, env=slurm)
    jobs = [line.split()[2] for line in p.stdout.splitlines()
            if line.startswith("submitted array")]
    assert len(jobs) == 3 and all(j.isdigit() for j in jobs), p.stdout
    arrays = sorted((out / "arrays").glob("*.sbatch"))
    assert [a.read_text().count("#SBATCH --array=0-") for a in arrays] == [1, 1, 1]
    assert any("%1\n" in a.read_text() for a in arrays)
    # queued or running now: a second run submits nothing
    again = study("run", f, "--scheduler", "slurm", "--out", out, env=slurm)
    assert "submitted 0 of 6 points" in again.stdout, again.stdout
    wait_for_jobs(slurm, jobs)
    print(f"cv-strategies-cpu on Slurm arrays: {time.monotonic() - t0:.1f} s")
    st = study("status", out, check=False, env=slurm)
    logs = "".join(x.read_text() for x in out.rglob("slurm-*.out"))
    assert "summary: 0 pending, 0 running, 6 completed, 0 interrupted, 0 failed of 6" in st.stdout, \
        st.stdout + logs
    for d in out.glob("*/strong/n*/rep0"):
        assert list(d.glob("slurm-*_*.out")), d  # the task's output beside its run file
        assert (d / "job.id").read_text().startswith("slurm ")


def test_setup_layers_keep_the_test_tools_out_of_the_demo(tmp_path):
    """Issue 35: scripts/setup installs the run layer (what scripts/demo needs) and only
    scripts/setup --tests adds Slurm, munge, Chromium, clang/libFuzzer and the Python test tools;
    scripts/test asks for the test layer, scripts/demo does not; an unknown argument is refused."""
    text = (ROOT / "scripts/setup").read_text()
    arrays = {m.group(1): m.group(2).split()
              for m in re.finditer(r"^(\w+)=\(([^)]*)\)", text, re.MULTILINE)}
    apt, apt_tests = arrays["APT_PACKAGES"], arrays["APT_TEST_PACKAGES"]
    py = [p.strip('"') for p in arrays["PY_PACKAGES"]]
    py_tests = [p.strip('"') for p in arrays["PY_TEST_PACKAGES"]]
    for tool in ("slurmctld", "slurmd", "munge", "chromium", "clang-14", "libclang-rt-14-dev",
                 "shellcheck"):
        assert tool in apt_tests and tool not in apt, tool
    for must in ("openmpi-bin", "libhdf5-openmpi-dev", "dataset-fashion-mnist", "ccache"):
        assert must in apt, must
    assert any(p.startswith("torch==") for p in py) and "h5py" in py
    for tool in ("pytest", "pytest-xdist", "transformers==", "peft==", "tiktoken==", "reframe-hpc=="):
        assert any(p.startswith(tool) for p in py_tests), tool
        assert not any(p.startswith(tool) for p in py), tool
    assert "scripts/setup --tests" in (ROOT / "scripts/test").read_text()
    assert "--tests" not in (ROOT / "scripts/demo").read_text()
    bad = subprocess.run([str(ROOT / "scripts/setup"), "--bogus"], capture_output=True, text=True)
    assert bad.returncode == 2 and "'--bogus'" in bad.stderr and "--tests" in bad.stderr


def test_setup_installs_the_commands_once_and_bin_wrappers_work(tmp_path):
    """scripts/setup installs trainscope-post and trainscope-study into the venv (editable from
    this clone) once, and a second run leaves them alone. Run against a throwaway venv that sees
    the project venv's packages through a .pth file (the real venv is shared, so untouched)."""
    venv_py = Path(sys.executable)
    real_venv = venv_py.parent.parent
    check = subprocess.run(
        ["bash", "-c", """eval "$(sed -n '/^APT_PACKAGES=(/,/)/p' scripts/setup)"
         for p in "${APT_PACKAGES[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null |
         grep -q "install ok installed" || echo "$p"; done"""],
        capture_output=True, text=True, cwd=ROOT)
    if check.stdout.strip() or not (real_venv / ".trainscope-setup").exists():
        pytest.skip("scripts/setup would install packages here: " + check.stdout.strip())
    torch = next(x for x in (ROOT / "scripts/setup").read_text().splitlines()
                 if x.startswith("TORCH_VERSION=")).split("=")[1].split()[0]
    venv = tmp_path / "cache" / f"venv-torch{torch}"
    subprocess.run(["python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    shared = next((real_venv / "lib").glob("python3*/site-packages"))
    (site / "shared.pth").write_text(f"{shared}\n")
    (venv / ".trainscope-setup").write_text((real_venv / ".trainscope-setup").read_text())
    env = dict(os.environ, TRAINSCOPE_CACHE=str(tmp_path / "cache"))
    env.pop("PYTHONPATH", None)
    first = subprocess.run([str(ROOT / "scripts/setup")], capture_output=True, text=True,
                           env=env, timeout=300)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip().splitlines()[-1] == str(venv)
    assert "installing trainscope-post and trainscope-study" in first.stderr
    second = subprocess.run([str(ROOT / "scripts/setup")], capture_output=True, text=True,
                            env=env, timeout=300)
    assert second.returncode == 0 and "installing" not in second.stderr, second.stderr
    post = subprocess.run([str(venv / "bin/trainscope-post"), "--help"], capture_output=True,
                          text=True, env=env)
    assert post.returncode == 0 and "summary" in post.stdout, post.stderr
    st = subprocess.run([str(venv / "bin/trainscope-study"), "run", CV_CPU, "--scheduler",
                         "slurm", "--out", tmp_path / "s", "--dry-run"], capture_output=True,
                        text=True, env=env)
    assert st.returncode == 0 and "nothing submitted" in st.stdout, st.stderr
    # bin/ wrappers: the venv named by TRAINSCOPE_VENV, this clone's sources
    wenv = dict(env, TRAINSCOPE_VENV=str(venv))
    st = subprocess.run([str(ROOT / "bin/trainscope-study"), "status", tmp_path / "s"],
                        capture_output=True, text=True, env=wenv)
    assert st.returncode == 3 and "summary: 6 pending, 0 running, 0 completed, 0 interrupted, 0 failed of 6" \
        in st.stdout, st.stdout + st.stderr
    post = subprocess.run([str(ROOT / "bin/trainscope-post"), "summary", tmp_path / "s"],
                          capture_output=True, text=True, env=wenv)
    assert post.returncode == 2 and "no run files" in post.stderr, post.stdout + post.stderr
    nope = subprocess.run([str(ROOT / "bin/trainscope-post"), "--help"], capture_output=True,
                          text=True, env=dict(env, TRAINSCOPE_VENV=str(tmp_path / "none")))
    assert nope.returncode == 2 and "run " in nope.stderr and "scripts/setup" in nope.stderr


def post(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "trainscope_post", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT / "postprocess")))


def test_shipped_weak_llm_study_runs_end_to_end_without_a_mode_flag(tmp_path):
    """Issue 26: the shipped weak-scaling study (5 LLM methods at 1 and 2 ranks) runs here, and
    report, model and advise take its scaling mode from the runs (run.scaling=weak): no --mode,
    a weak-scaling table per method and a recommendation. The runner prints no MPI binding
    report (each point's launcher output is in its job.log)."""
    f = with_binary(STUDIES / "llm-methods-cpu.toml", tmp_path / "llm.toml")
    out = tmp_path / "study"
    t0 = time.monotonic()
    p = study("run", f, "--scheduler", "local", "--out", out)
    print(f"llm-methods-cpu locally: {time.monotonic() - t0:.1f} s")
    assert len(ran_points(p.stdout)) == 10, p.stdout
    assert "MCW rank" not in p.stdout + p.stderr and "bound to" not in p.stdout + p.stderr
    assert "MCW rank" in (out / "lora/weak/n02/rep0/job.log").read_text()
    assert set(states(out, tmp_path).values()) == {"completed"}

    html = tmp_path / "report.html"
    rep = post("report", out, "-o", html)
    assert rep.returncode == 0, rep.stdout + rep.stderr
    text = html.read_text()
    scaling = text[text.index("<section id='scaling'>"):text.index("<section id='model")]
    assert "llm: weak scaling" in scaling and "no configuration qualifies" not in scaling
    for method in ("full", "lora", "qlora", "dpo", "qat"):
        assert f"llm.method={method}" in scaling, method
    mod = post("model", out)
    assert mod.returncode == 0, mod.stdout + mod.stderr
    assert "no configuration qualifies" not in mod.stdout + mod.stderr
    assert mod.stdout.count("llm.method=") >= 5, mod.stdout
    adv = post("advise", out, "--gpus-per-node", 2, "--max-nodes", 2)
    assert adv.returncode == 0, adv.stdout + adv.stderr
    assert "recommended:" in adv.stdout, adv.stdout


def test_status_says_how_scheduler_jobs_ended(tmp_path, monkeypatch):
    """`status` on ended Slurm and PBS jobs (stub squeue, sacct, scontrol and qstat on PATH):
    sacct's TIMEOUT, OUT_OF_MEMORY, NODE_FAIL and PREEMPTED reach the detail; a run file
    `interrupted` whose job exited 75 (or was pre-empted) is `interrupted`, not failed; where
    sacct has no accounting, scontrol show job answers; PBS's qstat -x gives the exit status."""
    sys.path.insert(0, str(ROOT / "postprocess"))
    from trainscope_jobs import study_runner as sr
    stubs = tmp_path / "bin"
    stubs.mkdir()
    scripts = {
        "squeue": "exit 0",  # nothing queued: every job has ended
        "sacct": "printf '%s\\n' '11|TIMEOUT|0:15' '12|OUT_OF_MEMORY|0:125' '13|NODE_FAIL|0:0' "
                 "'14|PREEMPTED|0:15' '15|FAILED|75:0' '16|CANCELLED by 0|0:15'",
        "scontrol": "echo 'JobId=17 JobName=x JobState=FAILED Reason=NonZeroExitCode "
                    "ExitCode=75:0 RunTime=00:01:00'",
        "qstat": "echo '    job_state = F'; echo '    Exit_status = 75'",
    }
    for name, body in scripts.items():
        (stubs / name).write_text(f"#!/bin/sh\n{body}\n")
        (stubs / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{stubs}:{os.environ['PATH']}")

    def point(i, sched, job, run_status):
        d = tmp_path / f"p{i}"
        d.mkdir()
        (d / "job.id").write_text(f"{sched} {job}\n")
        if run_status:
            with h5py.File(d / "run.h5", "w") as f:
                f.attrs["status"] = run_status
        return {"run_dir": d, "output": d / "run.h5"}

    pts = [point(1, "slurm", "11", "running"), point(2, "slurm", "12", None),
           point(3, "slurm", "13", "running"), point(4, "slurm", "14", "interrupted"),
           point(5, "slurm", "15", "interrupted"), point(6, "slurm", "16", "running"),
           point(7, "pbs", "99.srv", "interrupted")]
    # Job 17 is not in sacct's answer (no accounting for it): scontrol show job is asked.
    pts.append(point(8, "slurm", "17", "interrupted"))
    got = sr.states(pts)
    assert got[0] == ("failed", "slurm job 11 ended TIMEOUT exit 0, run file running")
    assert got[1] == ("failed", "slurm job 12 ended OUT_OF_MEMORY exit 0, run file missing")
    assert got[2][0] == "failed" and "NODE_FAIL" in got[2][1]
    assert got[3][0] == "interrupted" and "PREEMPTED" in got[3][1]
    assert got[4][0] == "interrupted" and "FAILED exit 75" in got[4][1]
    assert got[5][0] == "failed" and "CANCELLED" in got[5][1]
    assert got[6] == ("interrupted", "pbs job 99.srv ended FINISHED exit 75, run file "
                      "interrupted: stopped with a checkpoint; `run` submits it again")
    assert got[7][0] == "interrupted" and "slurm job 17 ended FAILED exit 75" in got[7][1]
