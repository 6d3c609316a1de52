"""``trainscope-post`` command line (``python -m trainscope_post``). Subcommands grow with the
post-processing issue; ``summary`` prints one aligned row per run file."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from .runfile import RunFile, SchemaError

COLUMNS = [
    ("file", "file", ""),
    ("workload", "workload", ""),
    ("strategy", "strategy", ""),
    ("precision", "precision", ""),
    ("ranks", "ranks", ""),
    ("nodes", "nodes", ""),
    ("status", "status", ""),
    ("iters", "iters", ""),
    ("median_step_s", "median step [s]", ".4f"),
    ("samples_per_s", "throughput [samples/s]", ".1f"),
    ("val_accuracy", "val acc [%]", "pct"),
    ("train_loss", "train loss", ".4f"),
    ("peak_rss_MiB", "peak RSS [MiB]", ".0f"),
    ("wall_s", "wall [s]", ".1f"),
]


def _fmt(value, spec):
    if value is None or value == "":
        return "-"
    if isinstance(value, float) and math.isnan(value):
        return "-"
    if spec == "pct":
        return f"{100.0 * float(value):.2f}"
    if spec:
        return format(float(value), spec)
    return str(value)


def expand(paths):
    for p in map(Path, paths):
        if p.is_dir():
            yield from sorted(p.rglob("*.h5"))
        else:
            yield p


def cmd_summary(args) -> int:
    rows, errors = [], 0
    for path in expand(args.files):
        try:
            with RunFile(path) as rf:
                rows.append(rf.summary_row())
        except (SchemaError, OSError, KeyError) as e:
            print(f"trainscope-post: {e}", file=sys.stderr)
            errors += 1
    table = [[title for _, title, _ in COLUMNS]]
    for r in rows:
        table.append([_fmt(r.get(key), spec) for key, _, spec in COLUMNS])
    widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS))]
    for row in table:
        print("  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))))
    return 1 if errors else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="trainscope-post", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("summary", help="one row per run: workload, ranks, status, step time, accuracy")
    p.add_argument("files", nargs="+", help="run files or directories (searched recursively)")
    p.set_defaults(func=cmd_summary)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
