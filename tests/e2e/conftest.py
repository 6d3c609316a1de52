"""Shared fixtures for end-to-end tests: the built binary and an mpirun wrapper with timeouts."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("TRAINSCOPE_BUILD_DIR", ROOT / "build"))
BINARY = BUILD / "app" / "trainscope"
sys.path.insert(0, str(ROOT / "postprocess"))  # ctest sets PYTHONPATH; a bare pytest does not
from trainscope_jobs.launch import launch_env, mpirun_command  # noqa: E402


@pytest.fixture(scope="session")
def trainscope():
    assert BINARY.exists(), f"{BINARY} not built: run scripts/test (or scripts/build)"
    return BINARY


def mpirun_cmd(np_, *args):
    return mpirun_command(np_, BINARY, *args)


@pytest.fixture
def run_ts():
    """Runs trainscope under mpirun; returns CompletedProcess. Fails the test on a hang."""

    def run(np_, *args, timeout=300, cwd=ROOT, env=None):
        env = launch_env(OMP_NUM_THREADS="1", **(env or {}))
        return subprocess.run(mpirun_cmd(np_, *args), cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=timeout)

    return run


@pytest.fixture
def h5dump():
    exe = shutil.which("h5dump")
    assert exe, "h5dump missing: scripts/setup installs hdf5-tools"
    return exe
