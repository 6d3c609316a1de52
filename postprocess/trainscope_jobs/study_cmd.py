"""The `trainscope-study` command (console script of `pip install -e postprocess`, and the installed
bin/trainscope-study): the study runner of the trainscope tree that paths.root() names (the clone
or installation this package sits in, or TRAINSCOPE_ROOT), in this interpreter."""

from __future__ import annotations

import os
import sys

from . import paths
from .errors import JobError


def main(argv=None) -> int:
    try:
        root = paths.root()
    except JobError as e:
        print(f"trainscope-study: {e}", file=sys.stderr)
        return 2
    if not (root / "jobscripts").is_dir():
        print(f"trainscope-study: {root} holds no jobscripts/ (TRAINSCOPE_ROOT names the clone "
              "or <prefix>/share/trainscope)", file=sys.stderr)
        return 2
    os.environ["TRAINSCOPE_ROOT"] = str(root)  # the job scripts' own python steps find it too
    from .study_runner import main as run
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
