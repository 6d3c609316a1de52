"""One self-contained HTML page (PNG figures embedded as base64) for a study directory, and a
Markdown twin whose figures are files in `<name>_files/` beside it."""

from __future__ import annotations

import base64
import html
import io
import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd

from . import advise, compression, model, plots
from .findings import NOT_COVERED, NOT_REPRODUCED, REPRODUCED, findings_table
from .study import (Study, StudyError, comm_table,
                    curves_tables, describe_group, execution_table,
                    group_by_config,
                    imbalance_table, label, memory_table, phase_table, profile_table,
                    scaling_table, step_view, summary_table, telemetry_table, top_ops_table)

SECTIONS = ["Findings", "Runs", "Scaling", "Model and advice", "Training curves", "Step times",
            "Telemetry", "Top operators", "Phase breakdown", "Profile", "Memory", "Communication"]
# Sections only a report of such runs has (after "Runs"): runs with dist.compress.
OPTIONAL_SECTIONS = ["Communication optimisation"]


def section_id(title: str) -> str:
    """The HTML id of a section: its title in lower case, words joined by '-'."""
    return "-".join(title.lower().split())


def fmt_table(df: pd.DataFrame) -> pd.DataFrame:
    """Numbers rounded for reading (4 significant digits), NaN as '-'."""
    def f(v):
        if isinstance(v, float):
            if math.isnan(v):
                return "-"
            return f"{v:.4g}" if abs(v) < 1e6 else f"{v:.3e}"
        return v
    return df.apply(lambda col: col.map(f)) if not df.empty else df


def text_table(df: pd.DataFrame) -> str:
    """Aligned plain-text table (terminal)."""
    if df.empty:
        return "(no rows)"
    t = fmt_table(df).astype(str)
    cols = list(t.columns)
    widths = [max(len(c), *(len(v) for v in t[c])) for c in cols]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cols, widths)))]
    for _, row in t.iterrows():
        lines.append("  ".join(str(v).rjust(w) if i else str(v).ljust(w)
                               for i, (v, w) in enumerate(zip(row, widths))))
    return "\n".join(lines)


MAX_RUN_SECTIONS = 12  # per-run breakdowns in a report; the tables above cover every run


class _Section:
    def __init__(self, title):
        # ("p", text) | ("pre", text) | ("table", df) | ("fig", name, png) | ("findings", df)
        # | ("findings", df, summary): folded under `summary`
        self.title, self.parts = title, []


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plots.plt.close(fig)
    return buf.getvalue()


def build_sections(study: Study, root: Path, mode: str, include_incomplete: bool,
                   model_kw: dict | None = None) -> list[_Section]:
    out = []
    s = _Section("Findings")
    s.parts.append(("p", "Each finding of the studies, and whether the runs in this report "
                         "reproduce it, decided from the runs' configuration (run.strategy, "
                         "run.precision, data.pin_memory, llm.method, dist.compress, ranks) and "
                         "measured numbers; 'not covered' when no runs test it."))
    table = findings_table(study, mode, include_incomplete)
    covered = table[table["verdict"] != NOT_COVERED]
    rest = table[table["verdict"] == NOT_COVERED]
    if covered.empty:
        s.parts.append(("p", f"None of the {len(table)} findings is tested by these runs: each "
                             "compares runs that differ in one option (or in ranks); what each "
                             "needs is in the folded table."))
    else:
        s.parts.append(("findings", covered))
    if not rest.empty:
        s.parts.append(("findings", rest, f"{len(rest)} finding(s) not covered by these runs "
                                          "(select to show what each needs)"))
    out.append(s)

    s = _Section("Runs")
    configs = configuration_table(study, mode)
    if len(configs) > 1:
        s.parts += [("p", f"{len(configs)} configurations (the options in which runs differ; "
                          "iteration counts, warm-up, output and options that do not apply "
                          "to a run's method do not count); per run below."),
                    ("table", configs)]
    s.parts.append(("table", summary_table(study)))
    excluded = study.excluded(include_incomplete)
    if excluded:
        s.parts.append(("p", "Excluded from aggregates (not completed): " + ", ".join(
            f"{r.path.name} ({r.status})" for r in excluded)))
    if study.errors:
        s.parts.append(("p", "Not run files: " + "; ".join(study.errors)))
    out.append(s)
    comp = _compression_section(study, include_incomplete)
    if comp is not None:
        out.append(comp)

    s = _Section("Scaling")
    for workload in ("cv", "llm"):
        sub = Study([r for r in study.runs if r.workload == workload])
        if not sub.runs:
            continue
        try:
            df = scaling_table(sub, mode, include_incomplete)
        except StudyError as e:
            s.parts.append(("p", f"{workload}: no scaling figure: {e}."))
            continue
        s.parts += [("p", f"{workload}: {mode} scaling against each configuration's smallest "
                          "rank count; error bars: min and max over repeats."), ("table", df),
                    ("fig", "scaling" if workload == "cv" else f"scaling_{workload}",
                     _png(plots.scaling_figure(df, mode)))]
        ex = execution_table(sub, mode, include_incomplete)
        s.parts += [("p", f"{workload}: the papers' axes: execution time (sum over the recorded "
                          "iterations of the slowest rank's step; validation and setup excluded) "
                          "and parallel efficiency vs GPUs, per configuration."),
                    ("table", ex), ("fig", f"execution_{workload}",
                                    _png(plots.scaling_time_figure(ex, mode)))]
    if not s.parts:
        s.parts.append(("p", "No training runs."))
    out.append(s)
    out.append(_model_section(study, mode, include_incomplete, model_kw or {}))

    usable = [r for r in study.usable(include_incomplete) if r.workload in ("cv", "llm")]
    base = root if root.is_dir() else root.parent
    out += _run_sections(usable, base)

    s = _Section("Phase breakdown")
    p = _Section("Profile")
    if len(usable) > MAX_RUN_SECTIONS:
        s.parts.append(("p", f"Per-run breakdowns of the first {MAX_RUN_SECTIONS} of "
                             f"{len(usable)} runs (trainscope-post breakdown gives any run's)."))
    for k, r in enumerate(usable[:MAX_RUN_SECTIONS]):
        name = label(r, base)
        ph = phase_table(r)
        with r.open() as rf:
            world, agg = rf.world_size, rf.has_aggregate()
        if ph.empty and not agg:
            continue
        rows = (" The file holds no per-rank rows (output.per_rank=none)." if ph.empty else
                f" The file holds per-rank rows of {len(ph)} of {world} ranks "
                f"(output.per_rank): the first table shows those {len(ph)}."
                if len(ph) < world else "")
        over = (f" Imbalance over all {world} ranks from the per-iteration aggregates: mean = "
                "mean over the measured iterations of the mean over ranks, max = of the slowest "
                "rank's time, slowest rank = the rank slowest in the most iterations."
                if agg else " Imbalance = max / mean over ranks of the per-rank means.")
        s.parts += [("p", f"{name}: mean seconds per phase over the measured iterations, per "
                          f"rank.{rows}{over}")] + ([("table", ph)] if not ph.empty else []) + \
            [("table", imbalance_table(ph, r))]
        if not ph.empty:
            title = name + (f" ({len(ph)} of {world} ranks with per-rank rows)"
                            if len(ph) < world else "")
            s.parts.append(("fig", f"breakdown_{k}", _png(plots.breakdown_figure(ph, title))))
        pr = profile_table(r)
        if not pr.empty:
            p.parts += [("p", f"{name}: device activity in the profiler window (kernels, NCCL "
                              "communication, memcpy, memset, CUDA runtime/driver calls)."),
                        ("table", pr), ("fig", f"profile_{k}", _png(plots.profile_figure(pr, name)))]
    if not any(part[0] == "table" for part in s.parts):
        s.parts.append(("p", "No training runs."))
    if not p.parts:
        p.parts.append(("p", "No profiler window with device activity (CPU runs have no GPU "
                             "kernels; enable profile.enabled on GPU runs)."))
    out += [s, p]

    s = _Section("Memory")
    mem = memory_table(study, include_incomplete)
    if mem.empty:
        s.parts.append(("p", "No runs."))
    else:
        s.parts.append(("table", mem))
        counted = mem[[c for c in mem.columns if c.endswith("[MiB]")]].fillna(0).to_numpy()
        if not counted.size or not (counted > 0).any():
            s.parts.append(("p", "No memory counters in these runs: no figure."))
        else:
            shown = mem.head(MAX_MEMORY_BARS)
            if len(mem) > len(shown):
                s.parts.append(("p", f"The figure shows the first {len(shown)} of {len(mem)} "
                                     "runs (the table above has all)."))
            s.parts.append(("fig", "memory", _png(plots.memory_figure(shown))))
    out.append(s)

    s = _Section("Communication")
    comm = comm_table(study, include_incomplete)
    if comm.empty:
        s.parts.append(("p", "No communication benchmark runs (run.workload=comm)."))
    else:
        s.parts += [("table", comm), ("fig", "comm", _png(plots.comm_figure(comm)))]
    out.append(s)
    return out


def _compression_section(study: Study, include_incomplete: bool) -> _Section | None:
    """"Communication optimisation": runs that differ only in dist.compress compared setting by
    setting (compression.table), the compression finding's sentences, and for compressed runs
    without an uncompressed partner their ratio and exposed communication. None when no usable
    multi-rank run compresses its gradients."""
    comps = compression.comparisons(study, include_incomplete)
    if not comps:
        return None
    s = _Section("Communication optimisation")
    df = compression.table(comps)
    s.parts += [("p", "Gradient compression (dist.compress), per workload and placement: bytes "
                      "sent per step and rank (comm_bytes) and their ratio to the uncompressed "
                      "bytes (comm_uncompressed_bytes), the time in the collectives "
                      "(comm_collective_s), the exposed communication (comm_wait) and the step "
                      "(medians over the measured iterations of the mean over ranks), PowerSGD's "
                      "error-feedback norm (comm_error_norm: mean over ranks, first -> last "
                      "quarter of its compressed iterations), the final loss (validation where "
                      "evaluated, else train) and the best validation accuracy over the epochs; "
                      "means over repeats, changes against dist.compress=none."),
                ("table", df), ("fig", "compression", _png(plots.compression_figure(df)))]
    for c in comps:
        for _, text in compression.verdicts(c):
            s.parts.append(("p", text[0].upper() + text[1:] + "."))
        if c.baseline is None:
            s.parts += [("p", t + ".") for t in compression.single_text(c)]
            s.parts.append(("p", f"{c.name}: no uncompressed run (dist.compress=none) of the same "
                                 "configuration to compare with: run one to see what the "
                                 "compression saves and costs."))
    return s


def configuration_table(study: Study, mode: str) -> pd.DataFrame:
    """One row per configuration of the study (runs grouped as the scaling tables group them):
    its name, rank counts, runs by status and the mean of the completed runs' median step."""
    groups = group_by_config(study.runs, mode=mode)
    rows = []
    for g in groups:
        done = [r for r in g if r.completed and r.summary]
        steps = [float(r.summary.get("median_step_s", math.nan)) for r in done]
        statuses = {}
        for r in g:
            statuses[r.status] = statuses.get(r.status, 0) + 1
        rows.append({"configuration": describe_group(g, groups, mode),
                     "workload": g[0].workload,
                     "ranks": ",".join(map(str, sorted({r.ranks for r in g}))),
                     "runs": len(g),
                     "status": ", ".join(f"{n} {k}" for k, n in sorted(statuses.items())),
                     "mean median step [s]": float(np.nanmean(steps)) if steps and
                     not all(math.isnan(x) for x in steps) else math.nan})
    return pd.DataFrame(rows)


MAX_MEMORY_BARS = 24  # runs in the memory figure (the table has every run)
# Findings evidence longer than this is shown up to its first comparisons, the rest folded.
FOLD_EVIDENCE_CHARS = 600
# Tables longer than this are folded (<details>) in the HTML page: a 200-run study's per-run rows
# are there on demand, not a scroll of 200 rows before the figures.
FOLD_ROWS = 25
MAX_MODEL_CONFIGS = 8  # configurations with a figure in the report; `trainscope-post model` has all
# The model curve runs to this multiple of the largest measured rank count, and the advice
# considers up to this multiple of the largest measured node count.
EXTRAPOLATE_X = 8


def _model_section(study: Study, mode: str, include_incomplete: bool,
                   model_kw: dict) -> _Section:
    """The "Model and advice" section. Modelling needs Extra-P's own venv and runs at 2+ rank
    counts; whatever it lacks, the section says why in one sentence and the report goes on."""
    s = _Section("Model and advice")
    try:
        s.parts = _model_parts(study, mode, include_incomplete, model_kw)
    except (StudyError, OSError, subprocess.SubprocessError, json.JSONDecodeError) as e:
        # StudyError: no runs, Extra-P missing or failed; the others: Extra-P's Python could not
        # be started, timed out or did not answer in JSON. A bug still raises: tests catch it.
        s.parts = [("p", f"No models: {str(e).rstrip('.')}.")]
    return s


def _model_parts(study: Study, mode: str, include_incomplete: bool, model_kw: dict) -> list:
    """model_kw: build_models' cores_per_node / shared_host_cores (CPU contention)."""
    train = [r for r in study.usable(include_incomplete) if r.workload in ("cv", "llm")
             and r.summary]
    groups = group_by_config(train, ignore=("dist.nodes",), mode=mode)
    if not any(len({r.ranks for r in g}) >= 2 for g in groups):
        return [("p", f"No models: no configuration was measured at two or more rank counts "
                      f"under {mode} scaling (of {len(groups)} configurations), and a model of "
                      "how the step scales needs at least two.")]
    skipped: list[str] = []  # runs and configurations without a usable step time
    models, comm = model.build_models(study, mode, include_incomplete=include_incomplete,
                                      skipped=skipped, **model_kw)
    fitted = [cm for cm in models if len(cm.rank_counts) >= 2]
    parts = [("p", f"Performance models of the median step per configuration ({mode} scaling; "
                   "trainscope-post model, docs/advisor.md): Extra-P fits each compute phase "
                   "over the measured rank counts, the gradient traffic is priced by the "
                   "alpha-beta models of the comm runs (run.workload=comm) where the study has "
                   "them, and the band is +-2 sigma (fit residuals, repeats and comm model, "
                   "widened beyond the measured ranks).")]
    parts += [("p", f"Not modelled: {line}.") for line in skipped]
    single = [cm.workload for cm in models if len(cm.rank_counts) < 2]
    if single:
        counts = ", ".join(f"{single.count(w)} {w}" for w in ("cv", "llm") if w in single)
        parts.append(("p", f"Not modelled: {counts} configuration(s) measured at one rank count "
                           "only (trainscope-post model lists them; advise does not scale them)."))

    recommended = {}
    for workload in ("cv", "llm"):
        wl = [cm for cm in fitted if cm.workload == workload]
        if not wl:
            continue
        gpn = max(cm.ranks_per_node for cm in wl)
        max_nodes = EXTRAPOLATE_X * max(m.nodes for cm in wl for m in cm.runs)
        cands = advise.candidates(wl, gpn, max_nodes, None, None)
        ranked = advise.rank(cands, "time")
        # Samples/s and tokens/s do not compare: each workload gets its own recommendation.
        parts += [("p", f"{workload}: recommendation of trainscope-post advise --gpus-per-node "
                        f"{gpn} (the most ranks per node measured) --max-nodes {max_nodes} "
                        f"({EXTRAPOLATE_X}x the most nodes measured) --objective time, with no "
                        "memory limit (run files do not record the device memory; give "
                        "--memory-per-device to advise):"),
                  ("pre", "\n".join(advise.recommendation(cands, ranked, "time", None)))]
        if ranked:
            recommended[id(ranked[0].model)] = ranked[0]

    if len(fitted) > MAX_MODEL_CONFIGS:
        parts.append(("p", f"The first {MAX_MODEL_CONFIGS} of {len(fitted)} modelled "
                           "configurations (trainscope-post model prints them all)."))
    for k, cm in enumerate(fitted[:MAX_MODEL_CONFIGS]):
        parts += [("p", f"{cm.label} ({cm.workload}, {len(cm.runs)} runs at ranks "
                        f"{','.join(map(str, cm.rank_counts))}; {cm.ranks_per_node} ranks per "
                        "node): the Extra-P model of each phase, in seconds per step at p ranks."),
                  ("table", model.phase_model_table(cm))]
        notes = [x for x in [model.comm_summary(cm)] + cm.notes if x]
        rec = recommended.get(id(cm))
        curve = _model_curve(cm, rec.ranks if rec else None)
        notes.append("the curve's communication: " + "; ".join(
            f"{basis} at ranks {_span(g['ranks'])}"
            for basis, g in curve.groupby("comm_basis", sort=False)))
        parts += [("p", n[0].upper() + n[1:] + ".") for n in notes]
        parts += [("p", "Predicted vs measured median step at each measured point."),
                  ("table", model.fit_table(cm)),
                  ("fig", f"model_{k}", _png(plots.model_figure(
                      pd.DataFrame(cm.fit_rows()), curve, f"{cm.label}: measured and modelled "
                      "step time", (rec.ranks, rec.pred["step_s"]) if rec else None)))]

    if comm:
        parts += [("p", "Alpha-beta models of the collectives from the comm runs (t = alpha * "
                        "L + bytes * F / busbw with the algorithm's steps L and link bytes F at "
                        "each placement; 'line' is one line over all sizes, "
                        "'local' the size-local pricing the predictions use, each size left out "
                        "of its own fit)."), ("table", model.comm_model_table(comm))]
    else:
        parts.append(("p", "No comm runs (run.workload=comm): communication is fitted "
                           "empirically per configuration (Extra-P on comm_wait)."))
    return parts


def _span(ranks) -> str:
    lo, hi = int(min(ranks)), int(max(ranks))
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def _model_curve(cm, extra_ranks: int | None = None) -> pd.DataFrame:
    """Predictions on a log-spaced grid of rank counts from the smallest measured one to
    EXTRAPOLATE_X times the largest (or `extra_ranks`), with every measured count on it."""
    lo, hi = min(cm.rank_counts), max(cm.rank_counts)
    top = max(EXTRAPOLATE_X * hi, extra_ranks or 0)
    grid = set(np.unique(np.round(np.geomspace(lo, top, 64))).astype(int)) | set(cm.rank_counts)
    return pd.DataFrame([cm.predict(int(p)) for p in sorted(grid)])


def _per_rank_mode(run) -> str:
    with run.open() as rf:
        return rf.per_rank_mode()


def _rank_list(ranks, most: int = 8) -> str:
    """"0, 512, 1024, ..., 15872" for a long list of ranks."""
    ranks = [int(r) for r in ranks]
    if len(ranks) <= most:
        return ", ".join(map(str, ranks)) or "none"
    return ", ".join(map(str, ranks[:3])) + ", ..., " + str(ranks[-1])


def _run_sections(usable, base: Path) -> list[_Section]:
    """Training curves (one figure per workload), step times and their heat map, telemetry and
    the top operators, per run (the first MAX_RUN_SECTIONS)."""
    runs = usable[:MAX_RUN_SECTIONS]
    more = (f"The first {MAX_RUN_SECTIONS} of {len(usable)} runs." if len(usable) > len(runs)
            else None)
    c = _Section("Training curves")
    for workload in ("cv", "llm"):
        curves = [(label(r, base), *curves_tables(r)) for r in runs if r.workload == workload]
        curves = [x for x in curves if not x[1].empty]
        if curves:
            c.parts += [("p", f"{workload}: train loss per iteration (mean over ranks), and per "
                              "epoch train / validation loss and validation accuracy where the run "
                              "evaluated."),
                        ("fig", f"curves_{workload}", _png(plots.curves_figure(
                            curves, f"{workload} training curves")))]
    if not c.parts:
        c.parts.append(("p", "No training runs."))
    st, te, to = _Section("Step times"), _Section("Telemetry"), _Section("Top operators")
    for k, r in enumerate(runs):
        name = label(r, base)
        view = step_view(r)
        step, warmup = view.step, view.warmup
        has_rows = step.size and not np.all(np.isnan(step))
        if has_rows or (view.hi.size and np.isfinite(view.hi).any()):
            shown = plots.rows_text(view)
            if shown and not len(view.ranks):
                text = (f"{name}: no per-rank rows (output.per_rank=none): the spread over all "
                        f"{view.world} ranks and the slowest rank per iteration from the file's "
                        "aggregates (warm-up shaded, excluded from the statistics).")
            elif shown:
                text = (f"{name}: per-rank rows of {shown} (output.per_rank="
                        f"{_per_rank_mode(r)}; ranks {_rank_list(view.ranks)}). The step figure "
                        f"shows the spread over all {view.world} ranks and the slowest rank per "
                        "iteration from the file's aggregates, lines for the slowest of the "
                        f"{len(view.ranks)} ranks with rows, and their means' distribution; the "
                        f"heat map shows those {len(view.ranks)} ranks (warm-up shaded, excluded "
                        "from the statistics).")
            else:
                text = (f"{name}: step time per iteration and rank (warm-up shaded, excluded from "
                        "the statistics), its distribution per rank, and the rank x iteration "
                        f"heat map (a straggler is a bright row); all {view.world} ranks.")
            st.parts += [("p", text),
                         ("fig", f"steps_{k}", _png(plots.steps_figure(step, warmup, name,
                                                                       view)))]
            if has_rows:
                st.parts.append(("fig", f"heatmap_{k}",
                                 _png(plots.heatmap_figure(step, warmup, name, view))))
        tel = telemetry_table(r)
        if not tel.empty and len(tel.columns) > 2:
            world = int(tel.attrs.get("world", 0) or 0)
            ranks = tel["rank"].nunique()
            of = f" ({ranks} of {world} ranks have per-rank rows)" if world > ranks else ""
            te.parts += [("p", f"{name}: sampled counters per rank (telemetry.interval_ms){of}."),
                         ("fig", f"telemetry_{k}", _png(plots.telemetry_figure(tel, name)))]
        ops = top_ops_table(r)
        if not ops.empty:
            to.parts += [("p", f"{name}: CPU operators with the largest total time in the "
                               "profiler window, per iteration of the window."), ("table", ops),
                         ("fig", f"top_ops_{k}", _png(plots.top_ops_figure(ops, name)))]
    if not st.parts:
        st.parts.append(("p", "No training runs."))
    if not te.parts:
        te.parts.append(("p", "No telemetry (telemetry.enabled=false in these runs)."))
    if not to.parts:
        to.parts.append(("p", "No profiler window (enable profile.enabled)."))
    for sec in (c, st, te, to):
        if more and any(part[0] == "fig" for part in sec.parts):
            sec.parts.insert(0, ("p", more))
    return [c, st, te, to]


VERDICT_STYLE = {REPRODUCED: "ok", NOT_REPRODUCED: "no", NOT_COVERED: "na"}


def _findings_html(df: pd.DataFrame) -> str:
    rows = ["<table class='findings'><thead><tr><th>finding</th><th>verdict</th>"
            "<th>measured</th></tr></thead><tbody>"]
    for _, r in df.iterrows():
        evidence = html.escape(r["evidence"])
        if len(r["evidence"]) > FOLD_EVIDENCE_CHARS:
            items = r["evidence"].split("; ")
            head, n = "", 0
            while n < len(items) and len(head) + len(items[n]) < FOLD_EVIDENCE_CHARS:
                head += ("; " if n else "") + items[n]
                n += 1
            n = max(n, 1)
            head = "; ".join(items[:n])
            evidence = (f"{html.escape(head)}; <details><summary>{len(items) - n} more "
                        f"comparisons</summary>{html.escape('; '.join(items[n:]))}</details>")
        rows.append(f"<tr id='finding-{html.escape(r['id'])}'><td>{html.escape(r['finding'])}</td>"
                    f"<td class='verdict {VERDICT_STYLE[r['verdict']]}'>"
                    f"{html.escape(r['verdict'])}</td><td>{evidence}</td></tr>")
    return "".join(rows) + "</tbody></table>"


def _findings_md(df: pd.DataFrame) -> list[str]:
    out = ["| finding | verdict | measured |", "| --- | --- | --- |"]
    for _, r in df.iterrows():
        cells = [str(r[c]).replace("|", "\\|") for c in ("finding", "verdict", "evidence")]
        out.append(f"| {cells[0]} | **{cells[1]}** | {cells[2]} |")
    return out + [""]


def write_report(study: Study, root: Path, out_html: Path, mode: str = "strong",
                 include_incomplete: bool = False,
                 model_kw: dict | None = None) -> tuple[Path, Path]:
    out_html = Path(out_html)
    out_md = out_html.with_suffix(".md")
    files_dir = out_html.parent / (out_html.stem + "_files")
    files_dir.mkdir(parents=True, exist_ok=True)
    for old in files_dir.glob("*.png"):  # figures of an earlier report of this name
        old.unlink()
    try:
        # Every section reads the runs through the files load() left open: one open per file.
        sections = build_sections(study, root, mode, include_incomplete, model_kw)
    finally:
        study.close()
    h = ["<!DOCTYPE html><html><head><meta charset='utf-8'><title>trainscope report</title>",
         "<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto;color:#111}"
         "table{border-collapse:collapse;font-size:12px;margin:0.5em 0}"
         "td,th{border:1px solid #999;padding:2px 6px;text-align:right}"
         "th{background:#eee}img{max-width:100%;display:block;margin:0.5em 0}"
         "div.t{overflow-x:auto}table.findings td{text-align:left;vertical-align:top}"
         "table.findings th{text-align:left}td.verdict{font-weight:bold;white-space:nowrap}"
         # Okabe-Ito blue / vermillion and grey; the verdict is also in words
         "td.ok{background:#cfe3f3}td.no{background:#f6d3bf}td.na{background:#e6e6e6}"
         "pre{white-space:pre-wrap;background:#f4f4f4;padding:0.5em;font-size:12px}"
         "nav a{margin-right:0.8em}</style></head><body>",
         f"<h1>trainscope report: {html.escape(str(root))}</h1>",
         f"<p>{len(study.runs)} run files; {len(study.usable(include_incomplete))} in aggregates."
         "</p>",
         "<nav>" + "".join(f"<a href='#{section_id(sec.title)}'>{html.escape(sec.title)}</a>"
                           for sec in sections) + "</nav>"]
    md = [f"# trainscope report: {root}", "",
          f"{len(study.runs)} run files; {len(study.usable(include_incomplete))} in aggregates.", ""]
    for sec in sections:
        h.append(f"<section id='{section_id(sec.title)}'>")
        h.append(f"<h2>{html.escape(sec.title)}</h2>")
        md += [f"## {sec.title}", ""]
        for part in sec.parts:
            if part[0] == "p":
                h.append(f"<p>{html.escape(part[1])}</p>")
                md += [part[1], ""]
            elif part[0] == "pre":
                h.append(f"<pre>{html.escape(part[1])}</pre>")
                md += ["```", part[1], "```", ""]
            elif part[0] == "findings":
                table = "<div class='t'>" + _findings_html(part[1]) + "</div>"
                if len(part) > 2:  # folded, with this summary
                    table = f"<details><summary>{html.escape(part[2])}</summary>{table}</details>"
                    md += [part[2][0].upper() + part[2][1:].split(" (select")[0] + ":", ""]
                h.append(table)
                md += _findings_md(part[1])
            elif part[0] == "table":
                t = fmt_table(part[1])
                table = "<div class='t'>" + t.to_html(index=False, escape=True, border=0) + \
                    "</div>"
                if len(t) > FOLD_ROWS:
                    table = (f"<details><summary>{len(t)} rows (select to show)</summary>"
                             f"{table}</details>")
                h.append(table)
                md += [t.to_markdown(index=False) if _has_tabulate() else "```\n" +
                       text_table(part[1]) + "\n```", ""]
            else:
                _, name, png = part
                (files_dir / f"{name}.png").write_bytes(png)
                h.append(f"<img id='fig-{name}' alt='{name}' src='data:image/png;base64,"
                         f"{base64.b64encode(png).decode()}'>")
                md += [f"![{name}]({files_dir.name}/{name}.png)", ""]
        h.append("</section>")
    h.append("</body></html>")
    out_html.write_text("\n".join(h), encoding="utf-8")
    out_md.write_text("\n".join(md), encoding="utf-8")
    return out_html, out_md


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
        return True
    except ImportError:
        return False
