"""The schedulers job execution talks to, behind one interface and one registry (as ReFrame's
core/schedulers): adding one is a module here with a Scheduler subclass and a line in SCHEDULERS.

A Scheduler submits a rendered job script (optionally after another job ended, optionally as an
array) and returns its job id; says which of some job ids are still queued or running; and says
how ended ones ended (the scheduler's state word and the exit code). Each module holds all of its
scheduler's command lines and output parsing; the rest of the package names a scheduler only by
its registry key (--scheduler slurm|pbs|local, the first word of a point's job.id)."""

from __future__ import annotations

from .base import Scheduler
from .local import Local
from .pbs import Pbs
from .slurm import Slurm

SCHEDULERS: dict[str, Scheduler] = {s.name: s for s in (Slurm(), Pbs(), Local())}
NAMES = tuple(SCHEDULERS)


def get(name: str) -> Scheduler:
    """The scheduler registered as `name` (KeyError names the known ones)."""
    try:
        return SCHEDULERS[name]
    except KeyError:
        raise KeyError(f"scheduler {name!r}: one of {', '.join(NAMES)}") from None


__all__ = ["NAMES", "SCHEDULERS", "Scheduler", "get"]
