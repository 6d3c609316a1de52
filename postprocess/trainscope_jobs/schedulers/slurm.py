"""Slurm: sbatch submissions (--parsable, afterany dependencies, arrays), squeue for queued and
running jobs, sacct (else `scontrol show job`, where the cluster keeps no accounting) for how an
ended job ended, and the exclusive `srun` job step that co-allocation launches inside one
allocation."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from ..errors import JobError
from .base import QUERY_TIMEOUT_S, Scheduler, query, submit_command


def exit_code(text: str) -> int | None:
    """Slurm's ExitCode "75:0" (code:signal) -> 75."""
    m = re.match(r"(\d+):(\d+)", text.strip())
    return int(m.group(1)) if m else None


class Slurm(Scheduler):
    name = "slurm"
    directive = "#SBATCH "

    def submit(self, script: Path, after: str | None = None, array: str | None = None,
               env: dict | None = None) -> str:
        cmd = ["sbatch", "--parsable"]
        if after:
            cmd.append(f"--dependency=afterany:{after}")
        if array:
            cmd.append(f"--array={array}")
        return submit_command(self.name, [*cmd, str(script)], script, env)

    def states(self, jobs: list[str]) -> dict[str, str]:
        """From squeue (-r: one line per array task); a failing squeue is an error, since ended
        and queued jobs could not be told apart."""
        try:
            q = subprocess.run(["squeue", "-h", "-r", "-o", "%i %T"], capture_output=True,
                               text=True, timeout=QUERY_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise JobError(f"squeue failed ({e}): cannot tell queued from ended Slurm jobs")
        if q.returncode != 0:
            raise JobError(f"squeue failed ({q.returncode}): {q.stderr.strip()}")
        wanted, found = set(jobs), {}
        for line in q.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] in wanted:
                found[parts[0]] = "running" if parts[1] in ("RUNNING", "COMPLETING") \
                    else "pending"
        return found

    def ended(self, jobs: list[str]) -> dict[str, tuple[str, int | None]]:
        """sacct's State (COMPLETED, FAILED, TIMEOUT, OUT_OF_MEMORY, NODE_FAIL, PREEMPTED,
        CANCELLED, ...) and ExitCode; for a job sacct does not know, `scontrol show job`, which
        remembers an ended job for MinJobAge (300 s by default)."""
        out: dict[str, tuple[str, int | None]] = {}
        if not jobs:
            return out
        q = query(["sacct", "-n", "-P", "-X", "-o", "JobID,State,ExitCode", "-j", ",".join(jobs)])
        if q is not None and q.returncode == 0:
            for line in q.stdout.splitlines():
                parts = line.split("|")
                if len(parts) == 3 and parts[0] in jobs and parts[1]:
                    out[parts[0]] = (parts[1].split()[0], exit_code(parts[2]))
        for j in [j for j in jobs if j not in out]:
            q = query(["scontrol", "show", "job", "-o", j])
            if q is None or q.returncode != 0:
                continue
            state = re.search(r"\bJobState=(\S+)", q.stdout)
            code = re.search(r"\bExitCode=(\S+)", q.stdout)
            if state:
                out[j] = (state.group(1), exit_code(code.group(1)) if code else None)
        return out

    def where(self, partition, account, qos) -> list[str]:
        return [f"--{k}={v}" for k, v in (("partition", partition), ("account", account),
                                          ("qos", qos)) if v is not None]

    @staticmethod
    def step_command(ranks: int, gpus: bool, job_name: str, program: list[str]) -> list[str]:
        """An exclusive job step of `ranks` tasks (one core each, one GPU each with `gpus`) inside
        the enclosing allocation, bound to its cores, killed whole when one task fails."""
        return ["srun", "--exclusive", "--exact", "-n", str(ranks), "--cpus-per-task=1",
                *(["--gpus-per-task=1"] if gpus else []),
                "--cpu-bind=cores", "--mpi=pmix", "--kill-on-bad-exit=1",
                f"--job-name={job_name}", *program]
