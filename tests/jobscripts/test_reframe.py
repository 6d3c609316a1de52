"""The ReFrame test (jobscripts/reframe/) run by ReFrame itself on this machine: the local
scheduler and mpirun launcher of jobscripts/reframe/settings.py, 2 ranks, a short CV run
(quickstart) and a short LLM run (lora-tiny). ReFrame must pass both (sanity: run file status
"completed"; references: the local floors) and its perf log must hold the performance variables
read from the run files' /summary; a run that fails (an unknown option) must fail the check. The
same test on the suite's real Slurm runs when that Slurm starts here (tests/slurm/local_slurm.sh)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import h5py
import pytest

from test_jobscripts import slurm  # noqa: F401  (the suite's real Slurm, a fixture)

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("TRAINSCOPE_BUILD_DIR", ROOT / "build"))
BINARY = BUILD / "app" / "trainscope"
CHECK = ROOT / "jobscripts/reframe/trainscope_check.py"
SETTINGS = ROOT / "jobscripts/reframe/settings.py"
REFRAME = Path(sys.executable).parent / "reframe"
SHORT = "options=--train.max_iters=8,--profile.warmup_iters=2,--log.every=0," \
        "--telemetry.enabled=false,--train.eval=false"


def reframe(prefix, *args, env=None, timeout=300):
    assert REFRAME.exists(), f"{REFRAME} missing: scripts/setup installs reframe-hpc"
    cmd = [str(REFRAME), "--nocolor", "-C", str(SETTINGS), "-c", str(CHECK), "--prefix", str(prefix),
           "-S", f"trainscope={BINARY}", *args, "-r"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=prefix,
                          env=env)


def perflog_lines(prefix, system, partition):
    logs = list((prefix / "perflogs" / system / partition).glob("*.log"))
    assert logs, sorted(str(p) for p in prefix.rglob("*"))
    lines = "".join(p.read_text() for p in logs).splitlines()
    # ReFrame heads each file with the format's field names.
    return [line for line in lines if not line.startswith("job_completion_time|")]


def perf_values(line):
    """{variable: value} of one perf log line (settings.py's format_perfvars)."""
    return {m[0]: float(m[1]) for m in re.findall(r"(\w+)=([-+0-9.eE]+|nan|inf) ", line)}


def test_reframe_local_runs_cv_and_llm(tmp_path):
    # A made-up single-rank baseline of 100 samples/s: efficiency = samples/s / (2 x 100).
    p = reframe(tmp_path, "-P", "config=inputs/quickstart.ini,inputs/llm/lora-tiny.ini",
                "-S", SHORT, "-S", "baseline_samples_per_s=100")
    print(p.stdout[-3000:])
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.search(r"\[\s*PASSED\s*\] Ran 2/2 test case", p.stdout), p.stdout
    # Each case was checked against its own config's references.
    assert "tokens_per_s: " in p.stdout and "(r:3500.0, l:-0.9, u:None)" in p.stdout, p.stdout
    assert "(r:300.0, l:-0.9, u:None)" in p.stdout, p.stdout
    lines = perflog_lines(tmp_path, "trainscope-local", "cpu")
    assert len(lines) == 2, lines
    by_config = {("lora" if "lora-tiny" in line else "cv"): line for line in lines}
    assert set(by_config) == {"cv", "lora"}, lines
    for kind, line in by_config.items():
        assert line.endswith("|pass"), line
        assert "2 ranks" in line, line
        v = perf_values(line)
        assert v["samples_per_s"] > 0 and v["median_step_s"] > 0, line
        assert ("tokens_per_s" in v) == (kind == "lora"), line
        if kind == "lora":
            assert v["tokens_per_s"] > v["samples_per_s"], line
        assert v["scaling_efficiency"] == pytest.approx(v["samples_per_s"] / 200, rel=1e-9), line
        assert "mfu" not in v, line  # no peak FLOPs known for a CPU
    # The logged figures are the run files' /summary values (kept in ReFrame's output directory).
    runs = sorted((tmp_path / "output").rglob("run.h5"))
    assert len(runs) == 2, sorted(str(p) for p in tmp_path.rglob("*.h5"))
    summaries = []
    for r in runs:
        with h5py.File(r, "r") as f:
            assert f.attrs["status"] in ("completed", b"completed")
            summaries.append(float(f["summary"].attrs["throughput_samples_per_s"]))
    logged = [perf_values(line)["samples_per_s"] for line in lines]
    assert sorted(summaries) == pytest.approx(sorted(logged), rel=1e-5)


def test_reframe_fails_a_failed_run(tmp_path):
    p = reframe(tmp_path, "-S", "options=--train.no_such_option=1", timeout=120)
    assert p.returncode != 0, p.stdout
    assert "FAILED" in p.stdout and "sanity" in p.stdout, p.stdout
    assert "no run file" in p.stdout, p.stdout




def test_reframe_on_the_suites_slurm(slurm, tmp_path):
    """The same test through ReFrame's Slurm backend (sbatch, squeue polling) and mpirun inside
    the allocation."""
    p = reframe(tmp_path, "--system", "trainscope-testslurm:batch", "-S", SHORT, env=slurm)
    print(p.stdout[-2000:])
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.search(r"\[\s*PASSED\s*\] Ran 1/1 test case", p.stdout), p.stdout
    (line,) = perflog_lines(tmp_path, "trainscope-testslurm", "batch")
    v = perf_values(line)
    assert v["samples_per_s"] > 0 and v["median_step_s"] > 0 and line.endswith("|pass"), line
    script = next((tmp_path / "output").rglob("rfm_job.sh")).read_text()
    assert "#SBATCH --ntasks=2" in script and "mpirun -np 2 --oversubscribe" in script, script
