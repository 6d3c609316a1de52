"""Run files made by the real binary once per session, for the post-processing tests: a small
strong-scaling study (quickstart at 1 and 2 ranks, 2 repeats each, same global batch), a profiled
run, a tiny LLM LoRA run, a comm benchmark run, and a run SIGKILLed after its first flushes."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("TRAINSCOPE_BUILD_DIR", ROOT / "build"))
BINARY = BUILD / "app" / "trainscope"
sys.path.insert(0, str(ROOT / "postprocess"))  # ctest sets PYTHONPATH; a bare pytest does not
from trainscope_jobs.launch import launch_env, mpirun_command  # noqa: E402


def mpirun(np_, *args):
    return mpirun_command(np_, BINARY, *args)


def run(np_, *args, timeout=300):
    env = launch_env(OMP_NUM_THREADS="1")
    proc = subprocess.run(mpirun(np_, *args), cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


CV = ["--config", ROOT / "inputs/quickstart.ini", "--train.max_iters=8",
      "--profile.warmup_iters=2", "--log.every=0", "--telemetry.enabled=false"]
GLOBAL_BATCH = 64


def killed_run(out: Path):
    """A 2-rank run killed with SIGKILL once rank 0 has printed iteration 5: the flush of
    iteration 4 is on disk (output.sync_every_s=0: every flush synced) and the next one (8) has
    not started, so the file holds 4 rows per rank and its status stays 'running'."""
    env = launch_env(OMP_NUM_THREADS="1")
    proc = subprocess.Popen(mpirun(2, *CV[:2], "--train.max_iters=100000", "--log.every=5",
                                   "--output.flush_every=4", "--output.sync_every_s=0",
                                   f"--output.file={out}"),
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    deadline = time.time() + 120
    try:
        for line in proc.stdout:
            if "iter 5/" in line or time.time() > deadline:
                break
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)


@pytest.fixture(scope="session")
def study(tmp_path_factory):
    """Directory of real run files: cv/n<N>/rep<r>.h5, profiled.h5, llm/lora.h5, comm/comm.h5,
    killed/killed.h5."""
    assert BINARY.exists(), f"{BINARY} not built: run scripts/build"
    root = tmp_path_factory.mktemp("study")
    for n in (1, 2):
        for rep in (0, 1):
            out = root / "cv" / f"n{n}" / f"rep{rep}.h5"
            out.parent.mkdir(parents=True, exist_ok=True)
            run(n, *CV, f"--train.batch_size={GLOBAL_BATCH // n}", f"--output.file={out}")
    (root / "profiled").mkdir()
    run(2, *CV, "--profile.enabled=true", "--profile.start_iter=3", "--profile.iters=2",
        f"--output.file={root / 'profiled' / 'profiled.h5'}")
    (root / "llm").mkdir()
    run(2, "--config", ROOT / "inputs/llm/lora-tiny.ini", "--train.max_iters=4", "--log.every=0",
        f"--output.file={root / 'llm' / 'lora.h5'}")
    (root / "comm").mkdir()
    run(2, "--run.workload=comm", "--comm.max_bytes=65536", "--comm.iters=3", "--comm.warmup=1",
        f"--output.file={root / 'comm' / 'comm.h5'}")
    (root / "killed").mkdir()
    killed_run(root / "killed" / "killed.h5")
    return root


def wait_until_gone(pid, after, timeout=15.0):
    """Waits until process `pid` has ended (gone, or a zombie waiting for its reaper); fails naming
    `after` (what should have ended it) when it still runs after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return
        if state == "Z":
            return
        time.sleep(0.1)
    raise AssertionError(f"the launch's process {pid} still runs after {after}")
