"""PBS (PBS Pro, OpenPBS): qsub submissions (afterany dependencies), and qstat -f for a job's
state letter and exit status (qstat -x also lists ended jobs where the server keeps job history;
plain qstat -f the others)."""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import JobError
from .base import Scheduler, query, submit_command

ENDED = ("F", "X")          # finished, expired (array subjobs)
RUNNING = ("R", "E", "B")   # running, exiting, array begun


def qstat(job: str) -> tuple[str | None, int | None]:
    """(job_state letter, Exit_status) of a PBS job, (None, None) when qstat does not know it."""
    for cmd in (["qstat", "-x", "-f", job], ["qstat", "-f", job]):
        q = query(cmd)
        if q is None or q.returncode != 0:
            continue
        m = re.search(r"job_state = (\w)", q.stdout)
        e = re.search(r"Exit_status = (-?\d+)", q.stdout)
        if m:
            return m.group(1), int(e.group(1)) if e else None
    return None, None


class Pbs(Scheduler):
    name = "pbs"
    directive = "#PBS "

    def submit(self, script: Path, after: str | None = None, array: str | None = None,
               env: dict | None = None) -> str:
        if array:
            raise JobError("PBS submissions here are one job per point (job arrays are rendered "
                           "for Slurm only)")
        cmd = ["qsub"]
        if after:
            cmd += ["-W", f"depend=afterany:{after}"]
        return submit_command(self.name, [*cmd, str(script)], script, env)

    def states(self, jobs: list[str]) -> dict[str, str]:
        found = {}
        for j in jobs:
            state, _ = qstat(j)
            if state and state not in ENDED:
                found[j] = "running" if state in RUNNING else "pending"
        return found

    def ended(self, jobs: list[str]) -> dict[str, tuple[str, int | None]]:
        out = {}
        for j in jobs:
            state, code = qstat(j)
            if state in ENDED:
                out[j] = ("FINISHED", code)
        return out

    def where(self, partition, account, qos) -> list[str]:
        # PBS has queues (-q) and accounts (-A) but no QOS.
        return ([f"-q {partition}"] if partition is not None else []) + \
            ([f"-A {account}"] if account is not None else [])
