"""The local runner: a "submission" runs the job script here, now, with bash, its output in
job.log beside it, its pid in job.pid while it runs and its exit code in job.exit when it ends
(how `jobscripts/study status` tells a running, killed or failed local point from a completed
one). Its job ids are "local:<exit code>" from submit and the pid in a point's job.id."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from .. import paths
from .base import Scheduler


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Local(Scheduler):
    name = "local"
    # No directives: a study's partition or extra lines become comments of the script.
    directive = "# "

    def submit(self, script: Path, after: str | None = None, array: str | None = None,
               env: dict | None = None) -> str:
        """Runs the script to its end (`after` holds by construction: one job at a time)."""
        run_dir = script.parent
        (run_dir / "job.exit").unlink(missing_ok=True)
        # The job's output (mpirun's binding report included) goes to job.log beside it, as a
        # scheduler's would: the runner's own output stays one line per point.
        with open(run_dir / "job.log", "wb") as log:
            proc = subprocess.Popen(["bash", str(script)], cwd=paths.root(), stdout=log,
                                    stderr=subprocess.STDOUT, env=env)
        (run_dir / "job.pid").write_text(f"{proc.pid}\n")
        code = proc.wait()
        (run_dir / "job.exit").write_text(f"{code}\n")
        return f"local:{code}"

    def states(self, jobs: list[str]) -> dict[str, str]:
        return {j: "running" for j in jobs if j.isdigit() and pid_alive(int(j))}

    def ended(self, jobs: list[str]) -> dict[str, tuple[str, int | None]]:
        # The exit code is in job.exit beside the script, not known by pid.
        return {}
