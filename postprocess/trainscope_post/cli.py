"""trainscope-post: tables, plots and an HTML report from trainscope run files.

Every subcommand takes run files or directories (searched recursively for *.h5). Runs whose status
is not "completed" are listed but left out of aggregates unless --include-incomplete."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import plots
from .report import text_table, write_report
from .study import (Study, StudyError, comm_table, compare_table, imbalance_table, load,
                    long_table, memory_table, phase_table, profile_table, scaling_table,
                    summary_table)


def _emit(df, args, title=None):
    if title:
        print(title)
    print(text_table(df))
    if getattr(args, "csv", None):
        df.to_csv(args.csv, index=False)
        print(f"table written to {args.csv}")


def _warn_study(study: Study, include_incomplete: bool) -> int:
    """Reports files that are not run files (the exit code becomes 1, after the output) and runs
    left out of aggregates."""
    for e in study.errors:
        print(f"trainscope-post: skipped: {e}", file=sys.stderr)
    for r in study.excluded(include_incomplete):
        print(f"trainscope-post: {r.path}: status {r.status}: excluded from aggregates "
              "(--include-incomplete to keep it)", file=sys.stderr)
    return 1 if study.errors else 0


def _outdir(args) -> Path:
    return Path(args.out or ".")


def cmd_summary(args) -> int:
    study = load(args.files)
    for e in study.errors:
        print(f"trainscope-post: {e}", file=sys.stderr)
    _emit(summary_table(study), args)
    return 1 if study.errors else 0


def cmd_scaling(args) -> int:
    study = load(args.files)
    rc = _warn_study(study, args.include_incomplete)
    df = scaling_table(study, args.mode, args.include_incomplete)
    _emit(df, args, f"{args.mode} scaling (speedup and efficiency against the smallest rank count "
                    "of each configuration; min/max over repeats)")
    for p in plots.save(plots.scaling_figure(df, args.mode), _outdir(args) / f"scaling_{args.mode}",
                        args.svg):
        print(f"figure: {p}")
    return rc


def cmd_breakdown(args) -> int:
    study = load(args.files)
    rc = _warn_study(study, args.include_incomplete)
    runs = [r for r in study.usable(args.include_incomplete) if r.workload in ("cv", "llm")]
    if not runs:
        raise StudyError("no training runs (cv or llm workload) to break down")
    for k, r in enumerate(runs):
        ph = phase_table(r)
        _emit(ph, args, f"\n{r.path}: mean seconds per phase over the measured iterations")
        print(text_table(imbalance_table(ph)))
        stem = _outdir(args) / f"breakdown_{r.path.stem}"
        for p in plots.save(plots.breakdown_figure(ph, r.path.name), stem, args.svg):
            print(f"figure: {p}")
        pr = profile_table(r)
        if pr.empty:
            print("profile: no device activity in a profiler window (CPU run, or no "
                  "profile.enabled)")
        else:
            print(text_table(pr))
            for p in plots.save(plots.profile_figure(pr, r.path.name),
                                _outdir(args) / f"profile_{r.path.stem}", args.svg):
                print(f"figure: {p}")
    return rc


def cmd_compare(args) -> int:
    study = load(args.files)
    rc = _warn_study(study, args.include_incomplete)
    by = [k for k in args.by.split(",") if k]
    df = compare_table(study, by, args.metric, args.baseline, args.include_incomplete)
    units = "s" if args.metric.endswith("_s") else ("B" if args.metric.endswith("bytes") else "")
    _emit(df, args)
    for p in plots.save(plots.compare_figure(df, args.metric, units),
                        _outdir(args) / f"compare_{args.metric}", args.svg):
        print(f"figure: {p}")
    return rc


def _table_and_figure(args, table, figure, stem, empty_message, title=None) -> int:
    """Loads the study, prints `table` of it and saves `figure` of that table as <out>/<stem>."""
    study = load(args.files)
    rc = _warn_study(study, args.include_incomplete)
    df = table(study, args.include_incomplete)
    if df.empty:
        raise StudyError(empty_message)
    _emit(df, args, title)
    for p in plots.save(figure(df), _outdir(args) / stem, args.svg):
        print(f"figure: {p}")
    return rc


def cmd_memory(args) -> int:
    return _table_and_figure(
        args, memory_table, plots.memory_figure, "memory", "no completed runs",
        "peak memory by category [MiB] (max over ranks and measured iterations)")


def cmd_comm(args) -> int:
    return _table_and_figure(
        args, comm_table, plots.comm_figure, "comm_busbw",
        "no communication benchmark results (/comm) in these files: run trainscope with "
        "run.workload=comm")


def cmd_export(args) -> int:
    study = load(args.files)
    rc = _warn_study(study, include_incomplete=True)
    df = long_table(study, include_incomplete=True)
    out = Path(args.output)
    if args.format == "csv":
        df.to_csv(out, index=False)
    else:
        try:
            df.to_parquet(out, index=False)
        except ImportError as e:
            raise StudyError(f"--format parquet needs pyarrow ({e}); scripts/setup installs it, "
                             "or use --format csv") from e
    print(f"{len(df)} rows (run, rank, iteration, metric, value, units) written to {out}")
    return rc


def cmd_report(args) -> int:
    root = Path(args.dir)
    study = load([root])
    rc = _warn_study(study, args.include_incomplete)
    out = Path(args.output) if args.output else (root if root.is_dir() else root.parent) / \
        "report.html"
    h, m = write_report(study, root, out, args.mode, args.include_incomplete)
    print(f"report: {h}\nmarkdown: {m}")
    return rc


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="trainscope-post", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name, func, help_, files=True, figures=True):
        p = sub.add_parser(name, help=help_)
        if files:
            p.add_argument("files", nargs="+", help="run files or directories (recursive)")
        p.add_argument("--include-incomplete", action="store_true",
                       help="keep failed/interrupted/running runs in aggregates")
        p.add_argument("--csv", help="also write the table to this CSV file")
        if figures:
            p.add_argument("--out", help="directory for figures (default: current directory)")
            p.add_argument("--svg", action="store_true", help="write SVG beside each PNG")
        p.set_defaults(func=func)
        return p

    add("summary", cmd_summary, "one row per run", figures=False)
    p = add("scaling", cmd_scaling, "speedup and efficiency against the smallest rank count")
    p.add_argument("--mode", choices=["strong", "weak"], required=True)
    add("breakdown", cmd_breakdown, "per-rank phase times, profile shares, stragglers")
    p = add("compare", cmd_compare, "a metric grouped by config keys, relative to a baseline")
    p.add_argument("--by", required=True, help="comma-separated keys, e.g. run.precision,ranks")
    p.add_argument("--metric", default="median_step_s",
                   help="a /summary attribute (default median_step_s)")
    p.add_argument("--baseline", help="the group to compare against (default: the first)")
    add("memory", cmd_memory, "peak memory per run by category")
    add("comm", cmd_comm, "busbw vs message size of comm benchmark runs")
    p = add("export", cmd_export, "tidy long table of /iterations", figures=False)
    p.add_argument("--format", choices=["csv", "parquet"], default="csv")
    p.add_argument("-o", "--output", required=True, help="output file")
    p = add("report", cmd_report, "self-contained HTML report (and Markdown twin) of a study",
            files=False, figures=False)
    p.add_argument("dir", help="study directory (or one run file)")
    p.add_argument("-o", "--output", help="HTML file (default: <dir>/report.html)")
    p.add_argument("--mode", choices=["strong", "weak"], default="strong",
                   help="scaling mode for the report's scaling section")
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except StudyError as e:
        print(f"trainscope-post {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
