"""The interface every scheduler implements (schedulers/__init__.py's registry holds one of each),
and the one way they run a scheduler command."""

from __future__ import annotations

import subprocess
from pathlib import Path

from ..errors import JobError

SUBMIT_TIMEOUT_S = 120  # a submission command that has not answered by then is given up on
QUERY_TIMEOUT_S = 60


class Scheduler:
    name = ""
    # How a job script spells a directive line ("#SBATCH ", "#PBS "); "" where there are none.
    directive = ""

    def submit(self, script: Path, after: str | None = None, array: str | None = None,
               env: dict | None = None) -> str:
        """Submits `script`, after job `after` has ended (any way) if given, as an array of the
        tasks `array` ("0-N%K") if given; returns the job id."""
        raise NotImplementedError

    def states(self, jobs: list[str]) -> dict[str, str]:
        """Job id -> "pending" (queued) or "running" for those of `jobs` the scheduler still
        holds; a job left out has ended (or was never known)."""
        raise NotImplementedError

    def ended(self, jobs: list[str]) -> dict[str, tuple[str, int | None]]:
        """Job id -> (how the scheduler says it ended, its exit code or None) for those of
        `jobs` it still remembers; the others are left out."""
        raise NotImplementedError

    def where(self, partition: str | None, account: str | None, qos: str | None) -> list[str]:
        """Directives (without the prefix) that place a job in a partition/queue, charge an
        account and ask for a QOS, as this scheduler spells them."""
        return []


def submit_command(name: str, cmd: list[str], script: Path, env: dict | None = None,
                   timeout: float = SUBMIT_TIMEOUT_S) -> str:
    """Runs a submission command; its first line's first field (`;` separated, as sbatch
    --parsable prints "id;cluster") is the job id. JobError with the reason otherwise."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except FileNotFoundError:
        raise JobError(f"{cmd[0]} not found: is this a {name} login node?") from None
    except subprocess.TimeoutExpired:
        raise JobError(f"{cmd[0]} did not answer within {timeout:g} s; {script} was not "
                       "submitted (or its job id was lost: check the queue)") from None
    if proc.returncode != 0:
        raise JobError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout.strip().split(";")[0]


def query(cmd: list[str]) -> subprocess.CompletedProcess | None:
    """A scheduler query's result, or None when the command is missing or hangs."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
