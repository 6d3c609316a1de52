"""One self-contained HTML page (PNG figures embedded as base64) for a study directory, and a
Markdown twin whose figures are files in `<name>_files/` beside it."""

from __future__ import annotations

import base64
import html
import io
import math
from pathlib import Path

import pandas as pd

from . import plots
from .study import (Study, StudyError, comm_table, imbalance_table, label, memory_table,
                    phase_table, profile_table, scaling_table, summary_table)

SECTIONS = ["Runs", "Scaling", "Phase breakdown", "Profile", "Memory", "Communication"]


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
        self.title, self.parts = title, []  # ("p", text) | ("table", df) | ("fig", name, png)


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plots.plt.close(fig)
    return buf.getvalue()


def build_sections(study: Study, root: Path, mode: str, include_incomplete: bool) -> list[_Section]:
    out = []
    s = _Section("Runs")
    s.parts.append(("table", summary_table(study)))
    excluded = study.excluded(include_incomplete)
    if excluded:
        s.parts.append(("p", "Excluded from aggregates (not completed): " + ", ".join(
            f"{r.path.name} ({r.status})" for r in excluded)))
    if study.errors:
        s.parts.append(("p", "Not run files: " + "; ".join(study.errors)))
    out.append(s)

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
    if not s.parts:
        s.parts.append(("p", "No training runs."))
    out.append(s)

    usable = [r for r in study.usable(include_incomplete) if r.workload in ("cv", "llm")]
    s = _Section("Phase breakdown")
    p = _Section("Profile")
    if len(usable) > MAX_RUN_SECTIONS:
        s.parts.append(("p", f"Per-run breakdowns of the first {MAX_RUN_SECTIONS} of "
                             f"{len(usable)} runs (trainscope-post breakdown gives any run's)."))
    base = root if root.is_dir() else root.parent
    for k, r in enumerate(usable[:MAX_RUN_SECTIONS]):
        name = label(r, base)
        ph = phase_table(r)
        if ph.empty:
            continue
        s.parts += [("p", f"{name}: mean seconds per phase over the measured iterations, per rank; "
                          "imbalance = max / mean over ranks."), ("table", ph),
                    ("table", imbalance_table(ph)),
                    ("fig", f"breakdown_{k}", _png(plots.breakdown_figure(ph, name)))]
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
        s.parts += [("table", mem), ("fig", "memory", _png(plots.memory_figure(mem)))]
    out.append(s)

    s = _Section("Communication")
    comm = comm_table(study, include_incomplete)
    if comm.empty:
        s.parts.append(("p", "No communication benchmark runs (run.workload=comm)."))
    else:
        s.parts += [("table", comm), ("fig", "comm", _png(plots.comm_figure(comm)))]
    out.append(s)
    return out


def write_report(study: Study, root: Path, out_html: Path, mode: str = "strong",
                 include_incomplete: bool = False) -> tuple[Path, Path]:
    out_html = Path(out_html)
    out_md = out_html.with_suffix(".md")
    files_dir = out_html.parent / (out_html.stem + "_files")
    files_dir.mkdir(parents=True, exist_ok=True)
    for old in files_dir.glob("*.png"):  # figures of an earlier report of this name
        old.unlink()
    sections = build_sections(study, root, mode, include_incomplete)
    h = ["<!DOCTYPE html><html><head><meta charset='utf-8'><title>trainscope report</title>",
         "<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto;color:#111}"
         "table{border-collapse:collapse;font-size:12px;margin:0.5em 0}"
         "td,th{border:1px solid #999;padding:2px 6px;text-align:right}"
         "th{background:#eee}img{max-width:100%}div.t{overflow-x:auto}</style></head><body>",
         f"<h1>trainscope report: {html.escape(str(root))}</h1>",
         f"<p>{len(study.runs)} run files; {len(study.usable(include_incomplete))} in aggregates."
         "</p>"]
    md = [f"# trainscope report: {root}", "",
          f"{len(study.runs)} run files; {len(study.usable(include_incomplete))} in aggregates.", ""]
    for sec in sections:
        h.append(f"<h2>{html.escape(sec.title)}</h2>")
        md += [f"## {sec.title}", ""]
        for part in sec.parts:
            if part[0] == "p":
                h.append(f"<p>{html.escape(part[1])}</p>")
                md += [part[1], ""]
            elif part[0] == "table":
                t = fmt_table(part[1])
                h.append("<div class='t'>" + t.to_html(index=False, escape=True, border=0) +
                         "</div>")
                md += [t.to_markdown(index=False) if _has_tabulate() else "```\n" +
                       text_table(part[1]) + "\n```", ""]
            else:
                _, name, png = part
                (files_dir / f"{name}.png").write_bytes(png)
                h.append(f"<img alt='{name}' src='data:image/png;base64,"
                         f"{base64.b64encode(png).decode()}'>")
                md += [f"![{name}]({files_dir.name}/{name}.png)", ""]
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
