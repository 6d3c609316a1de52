"""The `trainscope-study` command: jobscripts/study of the trainscope clone this package was
installed from (scripts/setup installs it editable, so the clone is two directories up), run with
this interpreter (which has h5py for `status`). TRAINSCOPE_ROOT names another clone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def find_script() -> Path | None:
    root = os.environ.get("TRAINSCOPE_ROOT")
    cand = Path(root) if root else Path(__file__).resolve().parents[2]
    script = cand / "jobscripts" / "study"
    return script if script.is_file() else None


def main(argv=None) -> int:
    script = find_script()
    if script is None:
        print("trainscope-study: jobscripts/study not found; this package was not installed "
              "editable from a trainscope clone (scripts/setup does that). Set TRAINSCOPE_ROOT "
              "to the clone, or use <clone>/bin/trainscope-study.", file=sys.stderr)
        return 2
    args = sys.argv[1:] if argv is None else argv
    return subprocess.call([sys.executable, str(script), *args])


if __name__ == "__main__":
    sys.exit(main())
