"""The `trainscope-study` command: the study runner (study_runner.py) of the trainscope clone this
package was installed from (scripts/setup installs it editable, so the clone is two directories
up; TRAINSCOPE_ROOT names another clone), called in this interpreter."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main(argv=None) -> int:
    root = Path(os.environ.get("TRAINSCOPE_ROOT") or Path(__file__).resolve().parents[2])
    if not (root / "jobscripts").is_dir():
        print("trainscope-study: the trainscope clone (its jobscripts/) was not found; this "
              "package was not installed editable from a clone (scripts/setup does that). Set "
              "TRAINSCOPE_ROOT to the clone, or use <clone>/jobscripts/study.", file=sys.stderr)
        return 2
    os.environ["TRAINSCOPE_ROOT"] = str(root)
    from .study_runner import main as run
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
