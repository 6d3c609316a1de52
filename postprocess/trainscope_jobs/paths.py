"""Where job execution finds the trainscope tree (job-script templates, site files, inputs) and
the binary that job scripts run: decided here, once, so that no other module counts directories.

root(): $TRAINSCOPE_ROOT when set (bin/ wrappers, jobscripts/sweep and jobscripts/study, the
installed wrappers and the modulefile set it); else the tree this package sits in, found by
walking up from this file to the first directory that holds jobscripts/sweep: the clone
(<clone>/postprocess/trainscope_jobs, installed editable by scripts/setup) or an installation
(<prefix>/share/trainscope/postprocess/trainscope_jobs, cmake --install). A package installed
without either (a wheel in site-packages) needs TRAINSCOPE_ROOT.

default_binary(): $TRAINSCOPE_BINARY when set (the modulefile and the installed wrappers set it to
<prefix>/bin/trainscope); else <root>/build/app/trainscope when it is built (scripts/build);
else `trainscope` on PATH (an installation whose module is loaded without the variable); else
<root>/build/app/trainscope, which the commands then report as not built. A study file's
[scheduler] binary, a plan's binary and --binary override it; a relative one is taken from root().
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

from .errors import JobError

MARKER = Path("jobscripts") / "sweep"  # what makes a directory a trainscope tree


@functools.cache
def _package_tree() -> Path | None:
    """The trainscope tree this package was loaded from, or None (installed on its own)."""
    for d in Path(__file__).resolve().parents:
        if (d / MARKER).is_file():
            return d
    return None


def root() -> Path:
    """The trainscope tree: $TRAINSCOPE_ROOT, else the clone or installation holding this
    package."""
    env = os.environ.get("TRAINSCOPE_ROOT")
    if env:
        return Path(env)
    tree = _package_tree()
    if tree is None:
        raise JobError("the trainscope tree (its jobscripts/) was not found above "
                       f"{Path(__file__).resolve().parent}: this package was not installed "
                       "from a clone or by cmake --install; set TRAINSCOPE_ROOT to the clone "
                       "(or <prefix>/share/trainscope), or use <clone>/jobscripts/study")
    return tree


def jobscripts() -> Path:
    """The job-script templates and site files: <root>/jobscripts."""
    return root() / "jobscripts"


def default_binary() -> Path:
    """The binary job scripts run unless told otherwise (the order is in the module's doc)."""
    env = os.environ.get("TRAINSCOPE_BINARY")
    if env:
        return Path(env)
    built = root() / "build" / "app" / "trainscope"
    if built.is_file():
        return built
    on_path = shutil.which("trainscope")
    return Path(on_path).resolve() if on_path else built


def under_root(path: str | Path) -> Path:
    """`path` as given when absolute, else relative to root() (how study files, plans and
    --binary name configs and binaries)."""
    p = Path(path)
    return p if p.is_absolute() else root() / p
