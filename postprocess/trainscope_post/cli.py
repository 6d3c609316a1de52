"""trainscope-post: tables, plots and an HTML report from trainscope run files.

Every subcommand takes run files or directories (searched recursively for *.h5). Runs whose status
is not "completed" are listed but left out of aggregates unless --include-incomplete.

Exit codes: 0 done; 1 done, but some files were skipped (named on stderr); 2 the input or an
option cannot be used (one line on stderr naming the file, key or option); 3 advise found no
candidate."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from . import plots
from .report import text_table, write_report
from .study import (Study, StudyError, close_all, comm_table, compare_table, imbalance_table,
                    load, long_table, memory_table, phase_table, profile_table, scaling_table,
                    summary_table)

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _is_hdf5(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(8) == HDF5_SIGNATURE
    except OSError:
        return False


def check_output_file(path, option: str, inputs=()) -> Path:
    """An output file must be a regular file we may replace: never a directory, FIFO or device,
    never an HDF5 file (a run file would be lost), never one of the inputs, in an existing
    directory."""
    p = Path(path)
    if any(ord(c) < 32 for c in str(p)):
        raise StudyError(f"{option} {str(p)!r} contains a control character; give a plain file "
                         "name")
    if p.is_dir():
        raise StudyError(f"{option} {p}: is a directory; give a file name")
    if p.exists() and not p.is_file():
        raise StudyError(f"{option} {p}: not a regular file (a FIFO or device); give a file name")
    if p.is_file() and _is_hdf5(p):
        raise StudyError(f"{option} {p}: is an HDF5 file (a run file?); it would be "
                         "overwritten: give another file name")
    resolved = p.resolve()
    for i in inputs:
        q = Path(i).resolve()
        if resolved == q or (q.is_dir() and resolved.suffix == ".h5" and
                             resolved.is_relative_to(q)):
            raise StudyError(f"{option} {p}: is one of the inputs; give another file name")
    if not p.parent.exists() and str(p.parent) != "":
        raise StudyError(f"{option} {p}: directory {p.parent} does not exist")
    if p.parent.exists() and not p.parent.is_dir():
        raise StudyError(f"{option} {p}: {p.parent} is not a directory")
    return p


def check_output_dir(path, option: str) -> Path:
    p = Path(path)
    if any(ord(c) < 32 for c in str(p)):
        raise StudyError(f"{option} {str(p)!r} contains a control character; give a plain "
                         "directory name")
    if p.exists() and not p.is_dir():
        raise StudyError(f"{option} {p}: exists and is not a directory; give a directory for "
                         "the figures")
    return p


def resolve_mode(args, study: Study) -> str:
    """--mode, or the scaling mode the runs were made with (run.scaling, which jobscripts/study
    and sweep set): a shipped weak-scaling study needs no flag. Runs of both modes need one."""
    if getattr(args, "mode", None):
        return args.mode
    modes = {str(r.config.get("run.scaling", "none")) for r in study.usable(True)} - {"none"}
    if len(modes) > 1:
        raise StudyError(f"runs of {' and '.join(sorted(modes))} scaling together; give --mode "
                         "strong or --mode weak to choose")
    args.mode = modes.pop() if modes else "strong"
    return args.mode


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
    return check_output_dir(args.out or ".", "--out")


def cmd_summary(args) -> int:
    study = load(args.files)
    for e in study.errors:
        print(f"trainscope-post: skipped: {e}", file=sys.stderr)
    _emit(summary_table(study), args)
    return 1 if study.errors else 0


def cmd_scaling(args) -> int:
    study = load(args.files)
    rc = _warn_study(study, args.include_incomplete)
    resolve_mode(args, study)
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
        print(text_table(imbalance_table(ph, r)))
        stem = _outdir(args) / f"breakdown_{r.path.stem}"
        title = r.path.name + (f" ({len(ph)} of {r.ranks} ranks with per-rank rows)"
                               if len(ph) < r.ranks else "")
        for p in plots.save(plots.breakdown_figure(ph, title), stem, args.svg):
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
    workloads = {r.workload for r in study.usable(args.include_incomplete)}
    if len(workloads) > 1 and "workload" not in by:
        raise StudyError("runs of different workloads (" + ", ".join(sorted(workloads)) +
                         ") would be averaged together; compare one workload's runs at a time, "
                         "or add workload to --by")
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
    if args.format in ("tensorboard", "thicket"):  # a directory of one entry per run
        from . import export_tools
        if args.format == "tensorboard":
            print(export_tools.write_tensorboard(study, args.output))
            return rc
        text, skipped = export_tools.write_thicket(study, args.output)
        for s in skipped:
            print(f"trainscope-post: skipped: {s}", file=sys.stderr)
        print(text)
        return 1 if skipped else rc
    out = check_output_file(args.output, "-o/--output", args.files)
    df = long_table(study, include_incomplete=True)
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
    check_output_file(out, "-o/--output", [root])
    check_output_file(out.with_suffix(".md"), "-o/--output (its Markdown twin)", [root])
    resolve_mode(args, study)
    h, m = write_report(study, root, out, args.mode, args.include_incomplete,
                        {"cores_per_node": args.cores_per_node,
                         "shared_host_cores": args.shared_host_cores})
    print(f"report: {h}\nmarkdown: {m}")
    return rc


def _load_models(args, check=None):
    from .model import build_models
    study = load(list(args.files) + list(args.comm or []))
    if check is not None:  # a refusal first: its one line is the answer
        check(study, args.include_incomplete)
    rc = _warn_study(study, args.include_incomplete)
    resolve_mode(args, study)
    skipped: list[str] = []
    models, comm = build_models(study, args.mode, args.cores_per_node, args.shared_host_cores,
                                args.include_incomplete, skipped=skipped)
    for line in skipped:  # runs or whole configurations without a usable step time
        print(f"trainscope-post {args.command}: {line}", file=sys.stderr)
    return study, models, comm, max(rc, 1 if skipped else 0)


def cmd_model(args) -> int:
    import pandas as pd
    from .model import (comm_model_table, comm_summary, fit_table, leave_one_out,
                        parse_counts, phase_model_table, save)
    predict = parse_counts(args.predict) if args.predict else None
    if args.out:
        check_output_file(args.out, "--out", args.files)
    _, models, comm, rc = _load_models(args)
    if comm:
        _emit(comm_model_table(comm), args, "alpha-beta models of the collectives (t = alpha "
              "* L + bytes * F / busbw with the algorithm's steps L and link bytes F at each "
              "placement, one line over all sizes and placements; messages are priced by the "
              "line of the sizes within 4x, whose error is 'local', each size left out of its "
              "own fit; an unmeasured placement from the nearest measured one)")
    else:
        print("no run.workload=comm runs: communication is modelled empirically per "
              "configuration (Extra-P on comm_wait)")
    predictions = []
    for cm in models:
        print(f"\n== {cm.label} ({cm.workload}, {cm.mode} scaling, {len(cm.runs)} runs at ranks "
              f"{','.join(map(str, cm.rank_counts))}; {cm.ranks_per_node} ranks per node)")
        print(text_table(phase_model_table(cm)))
        line = comm_summary(cm)
        if line:
            print(line)
        for note in cm.notes:
            print(f"note: {note}")
        print("predicted vs measured median step [s] (min-max over repeats):")
        print(text_table(fit_table(cm)))
        if predict:
            rpn = args.ranks_per_node or cm.ranks_per_node
            prow = []
            for p in predict:
                pr = cm.predict(p, max(1, -(-p // rpn)))
                pr["configuration"] = cm.label
                predictions.append(pr)
                prow.append({"ranks": p, "nodes": pr["nodes"], "step [s]": pr["step_s"],
                             "low [s]": pr["step_lo_s"], "high [s]": pr["step_hi_s"],
                             f"throughput [{pr['throughput_unit']}]": pr["throughput"],
                             "efficiency [%]": 100 * pr["efficiency"],
                             "energy [J/sample]": pr["energy_per_sample_j"],
                             "memory [GiB]": pr["memory_bytes"] / 2**30,
                             "contention": pr["contention"], "comm": pr["comm_basis"],
                             "range": pr["range"]})
            print(f"prediction ({rpn} ranks per node; band = +-2 sigma: at a measured point its "
                  "own spread and residual, elsewhere fit, repeats and comm model, widened "
                  "with the distance in ranks and in nodes and by what was assumed):")
            print(text_table(pd.DataFrame(prow)))
            for pr in predictions[-len(predict):]:
                print(f"  at {pr['ranks']} ranks on {pr['nodes']} node(s): {pr['label']}; "
                      f"communication: {pr['comm_source']}")
    loo = None
    if args.loo:
        loo = leave_one_out(models)
        if loo:
            df = pd.DataFrame(loo)
            df["rel_err"] *= 100
            _emit(df.rename(columns={"measured_s": "measured [s]", "predicted_s": "predicted [s]",
                                     "rel_err": "error [%]"}), args,
                  "\nleave-one-out: each measured point predicted by a model fitted without it")
            e = [abs(r["rel_err"]) for r in loo]
            print(f"leave-one-out |error|: mean {100 * sum(e) / len(e):.1f} %, max "
                  f"{100 * max(e):.1f} % over {len(e)} points")
        else:
            print("leave-one-out: no configuration has 3 or more measured points")
    if args.out:
        print(f"model written to {save(models, comm, Path(args.out), predictions or None, loo)}")
    return rc


def _print_model_notes(workload: str, models) -> None:
    """What the models of `workload` rest on (model.comm_summary and each model's notes): the
    notes every configuration shares once, then each configuration's own."""
    from .model import comm_summary
    notes = {id(cm): [x for x in [comm_summary(cm)] + cm.notes if x] for cm in models}
    shared = [n for n in notes[id(models[0])] if all(n in v for v in notes.values())]
    if shared and len(models) > 1:
        print(f"{workload}: model notes (every configuration)")
        for n in shared:
            print(f"  note: {n}")
    for cm in models:
        own = [n for n in notes[id(cm)] if len(models) == 1 or n not in shared]
        if own:
            print(f"{workload}: model notes, {cm.label}")
            for n in own:
                print(f"  note: {n}")


def _print_compression(workload: str, models, args) -> bool:
    """advise's compression knob (--compress): per uncompressed configuration and setting, the
    predicted exposed communication and step with and without it at every node count, and
    where it pays (compression.knob: the communication term x the bytes ratio, plus the
    compression's own cost where its runs measured it). Whether it printed anything."""
    import pandas as pd
    from .compression import bases, knob, knob_modes, knob_rows, knob_summary
    modes = knob_modes(models, args.compress)
    if not modes:
        if args.compress == "auto":
            print(f"{workload}: compression: no run with dist.compress in these files; "
                  "--compress fp16|bf16|powersgd|all prices it (fp16/bf16 at the nominal bytes "
                  "ratio 0.5, powersgd only from a run that recorded its ratio)")
        return args.compress == "auto"
    base = bases(models)
    if not base:
        print(f"{workload}: compression not priced: no configuration measured with "
              "dist.compress=none at two or more rank counts")
        return True
    rows, lines = [], []
    for cm in base:
        for mode in modes:
            k = knob(cm, models, mode)
            if isinstance(k, str):
                lines.append(f"{cm.label}: {k}")
                continue
            r = knob_rows(cm, k, args.gpus_per_node, range(1, args.max_nodes + 1))
            rows += r
            lines += knob_summary(cm, k, r)
    if rows:
        print(f"{workload}: compression (--compress {args.compress}) predicted per node count "
              f"({args.gpus_per_node} GPUs per node): exposed communication and step without and "
              "with it (the communication term x the bytes ratio, plus its own cost where "
              "measured)")
        print(text_table(pd.DataFrame(rows)))
    for line in lines:
        print(line)
    return True


def cmd_advise(args) -> int:
    import pandas as pd
    from .advise import (Job, candidate_table, candidates, check_recorded, coallocate,
                         parse_bytes, rank, recommendation)
    from .model import build_models
    mem = parse_bytes(args.memory_per_device) if args.memory_per_device else None
    if args.min_efficiency is not None and not 0 < args.min_efficiency <= 1:
        raise StudyError(f"--min-efficiency {args.min_efficiency}: give a fraction in (0, 1], "
                         "e.g. 0.8")
    if args.jobs:
        if not args.gpus:
            raise StudyError("--jobs needs --gpus G (the GPUs to split between the jobs)")
        gpn = args.gpus_per_node or args.gpus
        step = gpn if args.whole_nodes else 1
        if args.gpus // step > MAX_SPLIT_UNITS:
            # The split search is quadratic in the allocation units: coarsen it to whole nodes
            # (or groups of nodes) so that it answers in seconds at any --gpus.
            coarse = gpn * max(1, -(-args.gpus // (gpn * MAX_SPLIT_UNITS)))
            print(f"note: {args.gpus} GPUs are split in steps of {coarse} GPUs "
                  f"({coarse // gpn} node(s) of {gpn}) to keep the search bounded "
                  f"({MAX_SPLIT_UNITS} steps at most)")
            step = coarse
        works = []
        for w in (args.work.split(",") if args.work else []):
            try:
                works.append(float(w))
            except ValueError:
                works.append(math.nan)
            if not works[-1] > 0:  # also NaN: a makespan of it would compare false
                raise StudyError(f"--work {args.work!r}: {w!r} is not a positive amount; give "
                                 "samples or tokens per job, e.g. --work 1e6,2e9")
        if works and len(works) != len(args.files):
            raise StudyError(f"--work has {len(works)} value(s) for {len(args.files)} job(s); "
                             "give one amount (samples or tokens) per job, in --jobs order")
        jobs, rc = [], 0
        for i, path in enumerate(args.files):
            study = load([path] + list(args.comm or []))
            check_recorded(study, args.include_incomplete)
            rc = max(rc, _warn_study(study, args.include_incomplete))
            mode = resolve_mode(argparse.Namespace(mode=args.mode), study)
            models, _ = build_models(study, mode, args.cores_per_node,
                                        args.shared_host_cores, args.include_incomplete)
            ref = models[0]
            work = works[i] if works else ref.work_per_step(ref.rank_counts[0]) * float(
                ref.runs[0].plan.get("total_iterations", 1) or 1)
            jobs.append(Job(Path(path).name, models, work, ref.unit))
        objective = "throughput" if args.objective == "throughput" else "makespan"
        best, val, equal, eqval = coallocate(jobs, args.gpus, gpn, step, mem, objective)
        _emit(pd.DataFrame(best), args, f"co-allocation of {args.gpus} GPUs ({gpn} per node) "
              f"minimising the {'makespan' if objective == 'makespan' else 'jobs per second'}"
              + ("" if works else " (work per job: one run of its measured configuration)"))
        print("equal split:")
        print(text_table(pd.DataFrame(equal)))
        if objective == "makespan":
            print(f"predicted makespan {val:.4g} s against {eqval:.4g} s for the equal split "
                  f"({100 * (1 - val / eqval):.1f} % shorter)")
        else:
            print(f"predicted work rate {val:.4g} jobs/s against {eqval:.4g} for the equal split")
        return rc
    if not args.gpus_per_node or not args.max_nodes:
        raise StudyError("advise needs --gpus-per-node G and --max-nodes N (or --jobs ... "
                         "--gpus G for a co-allocation)")
    study, models, _, rc = _load_models(args, check_recorded)
    # Throughputs in samples/s and tokens/s do not compare: one recommendation per workload.
    by_workload: dict[str, list] = {}
    for cm in models:
        by_workload.setdefault(cm.workload, []).append(cm)
    tables, found = [], True
    for workload, group in by_workload.items():
        _print_model_notes(workload, group)
        cands = candidates(group, args.gpus_per_node, args.max_nodes, mem, args.min_efficiency)
        ranked = rank(cands, args.objective)
        tables.append(candidate_table(ranked[: args.top] + [c for c in cands if c.excluded]))
        print(f"{workload}: candidates by --objective {args.objective} ({args.gpus_per_node} GPUs "
              "per node; excluded ones last)")
        print(text_table(tables[-1]))
        for line in recommendation(cands, ranked, args.objective, args.min_efficiency):
            print(line)
        print()
        if _print_compression(workload, group, args):
            print()
        found = found and bool(ranked)
    if getattr(args, "csv", None):
        pd.concat(tables).to_csv(args.csv, index=False)
        print(f"table written to {args.csv}")
    return rc if found else 3


MAX_SPLIT_UNITS = 256  # allocation steps of advise --jobs (its search is quadratic in them)


def _count(text: str) -> int:
    """argparse type of the rank, node and GPU counts: a negative one crashed the predictions
    (log2 of a negative ratio), a zero one silently meant "as measured" or nothing at all."""
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive count, e.g. 4")
    return v


def _cores(text: str) -> float:
    """argparse type of the core counts: 0, a negative number or nan silently meant "no
    contention" (the model tests `if cores`)."""
    try:
        v = float(text)
    except ValueError:
        v = 0.0
    if not v > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of cores, e.g. 2")
    return v


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
    p.add_argument("--mode", choices=["strong", "weak"],
                   help="default: the runs' run.scaling (jobscripts/study and sweep set it)")
    add("breakdown", cmd_breakdown, "per-rank phase times, profile shares, stragglers")
    p = add("compare", cmd_compare, "a metric grouped by config keys, relative to a baseline")
    p.add_argument("--by", required=True, help="comma-separated keys, e.g. run.precision,ranks")
    p.add_argument("--metric", default="median_step_s",
                   help="a /summary attribute (default median_step_s)")
    p.add_argument("--baseline", help="the group to compare against (default: the first)")
    add("memory", cmd_memory, "peak memory per run by category")
    add("comm", cmd_comm, "busbw vs message size of comm benchmark runs")
    p = add("export", cmd_export, "tidy long table of /iterations (csv, parquet), TensorBoard "
            "event files, or the per-rank phase breakdown for Hatchet/Thicket", figures=False)
    p.add_argument("--format", choices=["csv", "parquet", "tensorboard", "thicket"],
                   default="csv")
    p.add_argument("-o", "--output", required=True,
                   help="output file (csv, parquet) or directory (tensorboard, thicket: one "
                        "entry per run)")
    def contention_options(p):
        p.add_argument("--cores-per-node", type=_cores,
                       help="CPU runs: cores per node (default: no contention modelled); "
                            "compute slows by ranks per node x threads / cores when above 1")
        p.add_argument("--shared-host-cores", type=_cores,
                       help="CPU runs on nodes emulated on ONE machine (tests/multinode): its "
                            "cores, shared by all ranks of all nodes (default: not emulated)")

    p = add("report", cmd_report, "self-contained HTML report (and Markdown twin) of a study",
            files=False, figures=False)
    p.add_argument("dir", help="study directory (or one run file)")
    p.add_argument("-o", "--output", help="HTML file (default: <dir>/report.html)")
    p.add_argument("--mode", choices=["strong", "weak"],
                   help="scaling mode for the report's scaling and model sections (default: "
                        "the runs' run.scaling, else strong)")
    contention_options(p)

    def model_options(p):
        p.add_argument("--mode", choices=["strong", "weak"],
                       help="how the runs scale: strong = fixed global batch, weak = fixed "
                            "batch per rank (default: the runs' run.scaling, else strong)")
        contention_options(p)
        p.add_argument("--comm", nargs="+", metavar="PATH",
                       help="run.workload=comm files or directories for the alpha-beta models "
                            "(with --jobs: shared by every job)")
    p = add("model", cmd_model, "performance models (Extra-P phases, alpha-beta comm)",
            figures=False)
    model_options(p)
    p.add_argument("--out", help="write the models (JSON) to this file")
    p.add_argument("--predict", help="rank counts to predict, e.g. 8,16,32 or 8..4096")
    p.add_argument("--ranks-per-node", type=_count,
                   help="ranks per node of the predictions (default: as measured)")
    p.add_argument("--loo", action="store_true", help="leave-one-out validation table")
    p = add("advise", cmd_advise, "recommend configuration and node count, or split GPUs "
            "between jobs (--jobs)", figures=False)
    model_options(p)
    p.add_argument("--gpus-per-node", type=_count,
                   help="GPUs (ranks) per node of the target (with --jobs, default: --gpus)")
    p.add_argument("--max-nodes", type=_count, help="largest node count to consider")
    p.add_argument("--memory-per-device",
                   help="device memory, e.g. 80GiB: larger plans excluded (default: no limit)")
    p.add_argument("--objective", choices=["time", "throughput", "efficiency", "energy"],
                   default="time", help="what to rank by (default time; with --jobs: "
                   "throughput maximises jobs per second, the others minimise the makespan)")
    p.add_argument("--min-efficiency", type=float,
                   help="exclude points below this parallel efficiency, a fraction in (0, 1] "
                        "(default: none)")
    p.add_argument("--top", type=_count, default=10, help="candidates to print (default 10)")
    p.add_argument("--compress", choices=["auto", "none", "fp16", "bf16", "powersgd", "all"],
                   default="auto",
                   help="price gradient compression (dist.compress) on the uncompressed "
                        "configurations: where it pays per node count (default auto: the "
                        "settings the runs measured; none: do not)")
    p.add_argument("--jobs", action="store_true",
                   help="co-allocation: each FILES argument is one job's study directory")
    p.add_argument("--gpus", type=_count, help="--jobs: GPUs to split")
    p.add_argument("--work", help="--jobs: samples or tokens per job, comma-separated "
                   "(default: one run of each job's measured configuration)")
    p.add_argument("--whole-nodes", action="store_true",
                   help="--jobs: allocate whole nodes (--gpus-per-node each)")
    args = parser.parse_args(argv)
    try:
        if getattr(args, "csv", None):
            check_output_file(args.csv, "--csv", getattr(args, "files", None) or
                              [getattr(args, "dir", ".")])
        return args.func(args)
    except StudyError as e:
        print(f"trainscope-post {args.command}: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a file it could not read or write
        where = f"{e.filename}: " if e.filename else ""
        print(f"trainscope-post {args.command}: {where}{e.strerror or e}", file=sys.stderr)
        return 2
    except (ValueError, TypeError, KeyError, IndexError, ZeroDivisionError) as e:
        # A run file whose content passed the structural checks but not a table's: name it.
        from .runfile import last_opened
        where = f" (the last run file read: {last_opened()})" if last_opened() else ""
        print(f"trainscope-post {args.command}: the run files cannot be processed "
              f"({type(e).__name__}: {e}){where}; see docs/run_file_schema.md", file=sys.stderr)
        return 2
    finally:
        close_all()  # the run files the command's study kept open (study.Run.open)


if __name__ == "__main__":
    sys.exit(main())
