"""Figures for the tables of study.py. Every function returns a matplotlib Figure (Agg backend, no
display needed) with labelled axes and units; series differ by marker, line style and hatch as
well as colour, so the figures read in greyscale."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from .study import PHASES, PROFILE_CLASSES  # noqa: E402

MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
LINES = ["-", "--", ":", "-."]
HATCHES = ["", "//", "..", "xx", "\\\\", "++", "oo", "--"]
GREYS = ["0.15", "0.45", "0.75", "0.3", "0.6", "0.9", "0.05", "0.55"]


def _style(i):
    return dict(marker=MARKERS[i % len(MARKERS)], linestyle=LINES[i % len(LINES)])


def scaling_figure(df: pd.DataFrame, mode: str) -> plt.Figure:
    """Left: speedup vs ranks with the ideal line and min/max error bars; right: median step time
    vs ranks per configuration."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, (name, g) in enumerate(df.groupby("configuration", sort=False)):
        g = g.sort_values("ranks")
        yerr = [g["speedup"] - g["speedup min"], g["speedup max"] - g["speedup"]]
        ax1.errorbar(g["ranks"], g["speedup"], yerr=yerr, capsize=3, label=name, **_style(i))
        terr = [g["median step [s]"] - g["step min [s]"], g["step max [s]"] - g["median step [s]"]]
        ax2.errorbar(g["ranks"], g["median step [s]"], yerr=terr, capsize=3, label=name,
                     **_style(i))
    n = np.array(sorted(df["ranks"].unique()))
    ideal = n / n.min()  # strong: time shrinks with N; weak: throughput grows with N
    ax1.plot(n, ideal, color="0.5", linestyle=(0, (1, 1)), label="ideal")
    ax1.set_xlabel("ranks (GPUs or CPU processes)")
    ax1.set_ylabel("speedup [×]" if mode == "strong" else "scaled speedup [×]")
    ax1.set_title(f"{mode} scaling: speedup vs ranks")
    ax2.set_xlabel("ranks (GPUs or CPU processes)")
    ax2.set_ylabel("median iteration time [s]")
    ax2.set_title("iteration time vs ranks")
    for ax in (ax1, ax2):
        ax.set_xticks(n)
        ax.grid(True, color="0.85")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _stacked_per_rank(df: pd.DataFrame, series: list[tuple[str, np.ndarray]], ylabel: str,
                      title: str) -> plt.Figure:
    """One stacked bar per rank (df["rank"]), one layer per (label, values) in `series`."""
    fig, ax = plt.subplots(figsize=(max(4.5, 0.6 * len(df) + 3), 4))
    bottom = np.zeros(len(df))
    x = np.arange(len(df))
    for i, (label, v) in enumerate(series):
        ax.bar(x, v, bottom=bottom, label=label, color=GREYS[i % len(GREYS)], edgecolor="black",
               hatch=HATCHES[i % len(HATCHES)], linewidth=0.5)
        bottom += v
    ax.set_xticks(x, [str(r) for r in df["rank"]])
    ax.set_xlabel("rank")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, bbox_to_anchor=(1.01, 1), loc="upper left")
    fig.tight_layout()
    return fig


def breakdown_figure(phases: pd.DataFrame, title: str) -> plt.Figure:
    """Stacked bars per rank: mean milliseconds per phase over the measured iterations."""
    series = [(p, phases[f"{p} [s]"].fillna(0).to_numpy() * 1e3) for p in PHASES]
    return _stacked_per_rank(phases, series, "mean time per iteration [ms]", title)


def profile_figure(prof: pd.DataFrame, title: str) -> plt.Figure:
    """Stacked percent bars per rank: kernels, communication, memcpy, memset, runtime calls."""
    series = [(c, prof[f"{c} [%]"].to_numpy()) for c in PROFILE_CLASSES]
    fig = _stacked_per_rank(prof, series, "share of device activity time [%]", title)
    fig.axes[0].set_ylim(0, 100)
    return fig


def compare_figure(df: pd.DataFrame, metric: str, units: str) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(max(5, 0.9 * len(df) + 2), 4))
    x = np.arange(len(df))
    err = [df[metric] - df["min"], df["max"] - df[metric]]
    for i in range(len(df)):
        ax.bar(x[i], df[metric].iloc[i], yerr=[[err[0].iloc[i]], [err[1].iloc[i]]], capsize=3,
               color=GREYS[i % len(GREYS)], edgecolor="black", hatch=HATCHES[i % len(HATCHES)])
    ax.set_xticks(x, df["group"], rotation=20, ha="right", fontsize=7)
    ax.set_ylabel(f"{metric} [{units}]" if units else metric)
    ax.set_xlabel("group")
    rel = [c for c in df.columns if c.startswith("relative to")][0]
    for i, r in enumerate(df[rel]):
        ax.annotate(f"{r:.2f}×", (x[i], df[metric].iloc[i]), ha="center", va="bottom", fontsize=7)
    ax.set_title(f"{metric} by group ({rel})", fontsize=9)
    fig.tight_layout()
    return fig


def memory_figure(df: pd.DataFrame) -> plt.Figure:
    cols = [c for c in df.columns if c.endswith("[MiB]")]
    fig, ax = plt.subplots(figsize=(min(16, max(6, 1.2 * len(df) + 3)), 4.2))
    width = 0.8 / max(1, len(cols))
    x = np.arange(len(df))
    for i, c in enumerate(cols):
        ax.bar(x + i * width, df[c].fillna(0), width, label=c.replace(" [MiB]", ""),
               color=GREYS[i % len(GREYS)], edgecolor="black", hatch=HATCHES[i % len(HATCHES)])
    names = [f"{m}\n{r}" if m != "-" else r for m, r in zip(df["method"], df["run"])]
    ax.set_xticks(x + width * (len(cols) - 1) / 2, names, fontsize=7, rotation=30, ha="right")
    ax.set_xlabel("run (method)")
    ax.set_ylabel("memory [MiB]")
    ax.set_title("peak memory by category (max over ranks and iterations)", fontsize=9)
    ax.legend(fontsize=7, bbox_to_anchor=(1.01, 1), loc="upper left")
    fig.tight_layout()
    return fig


def comm_figure(df: pd.DataFrame) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, ((run, op), g) in enumerate(df.groupby(["run", "op"], sort=False)):
        g = g[g["busbw [GB/s]"] > 0]
        ax.plot(g["size [B]"], g["busbw [GB/s]"], label=f"{run} {op} ({g['ranks'].iloc[0]} ranks)",
                color=GREYS[i % 4], **_style(i))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size [B]")
    ax.set_ylabel("bus bandwidth [GB/s]")
    ax.set_title("busbw vs message size (nccl-tests convention)", fontsize=9)
    ax.grid(True, which="both", color="0.9")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def save(fig: plt.Figure, path: Path, svg: bool = False) -> list[Path]:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    out = [path.with_suffix(".png")]
    fig.savefig(out[0], dpi=110)
    if svg:
        out.append(path.with_suffix(".svg"))
        fig.savefig(out[1])
    plt.close(fig)
    return out
