"""Figures for the tables of study.py and the models of model.py. Every function returns a
matplotlib Figure (Agg backend, no display needed) with a title, labelled axes and units; colours
are the Okabe-Ito palette (told apart with the common colour-vision deficiencies), and series also
differ by marker, line style and hatch, so the figures read in greyscale too."""

from __future__ import annotations

import math

import textwrap
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from .study import PHASES, PROFILE_CLASSES  # noqa: E402

MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
LINES = ["-", "--", ":", "-."]
HATCHES = ["", "//", "..", "xx", "\\\\", "++", "oo", "--"]
# Okabe & Ito (2008), "Color Universal Design": blue, orange, bluish green, vermillion, sky blue,
# reddish purple, black, yellow (yellow last: it is faint on white).
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#56B4E9", "#CC79A7", "#000000", "#F0E442"]
HEATMAP = "cividis"  # perceptually uniform and readable with colour-vision deficiencies


def colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _style(i):
    return dict(marker=MARKERS[i % len(MARKERS)], linestyle=LINES[i % len(LINES)])


# Up to this many configurations a legend sits inside each panel; more (a 200-run study) get one
# shared legend below the panels, in two columns, so that no line is hidden behind it.
MAX_INNER_LEGEND = 6


def _legends(fig, axes, n_series: int, height: float) -> None:
    if n_series <= MAX_INNER_LEGEND:
        for ax in axes:
            ax.legend(fontsize=7)
        fig.tight_layout()
        return
    rows = math.ceil((n_series + 1) / 2)
    extra = 0.19 * rows
    fig.set_size_inches(fig.get_size_inches()[0], height + extra)
    handles, labels = {}, {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(list(handles.values()), list(handles), fontsize=7, ncol=2, loc="lower center",
               frameon=False)
    fig.tight_layout(rect=(0, extra / (height + extra), 1, 1))


def scaling_figure(df: pd.DataFrame, mode: str) -> plt.Figure:
    """Left: speedup vs ranks with the ideal line and min/max error bars; right: median step time
    vs ranks per configuration."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, (name, g) in enumerate(df.groupby("configuration", sort=False)):
        g = g.sort_values("ranks")
        yerr = [g["speedup"] - g["speedup min"], g["speedup max"] - g["speedup"]]
        ax1.errorbar(g["ranks"], g["speedup"], yerr=yerr, capsize=3, label=name, color=colour(i),
                     **_style(i))
        terr = [g["median step [s]"] - g["step min [s]"], g["step max [s]"] - g["median step [s]"]]
        ax2.errorbar(g["ranks"], g["median step [s]"], yerr=terr, capsize=3, label=name,
                     color=colour(i), **_style(i))
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
    _legends(fig, (ax1, ax2), df["configuration"].nunique(), 4.2)
    return fig


def _stacked_per_rank(df: pd.DataFrame, series: list[tuple[str, np.ndarray]], ylabel: str,
                      title: str) -> plt.Figure:
    """One stacked bar per rank (df["rank"]), one layer per (label, values) in `series`."""
    fig, ax = plt.subplots(figsize=(max(4.5, 0.6 * len(df) + 3), 4))
    bottom = np.zeros(len(df))
    x = np.arange(len(df))
    for i, (label, v) in enumerate(series):
        ax.bar(x, v, bottom=bottom, label=label, color=colour(i), edgecolor="black",
               hatch=HATCHES[i % len(HATCHES)], linewidth=0.5)
        bottom += v
    ax.set_xticks(x, [str(r) for r in df["rank"]])
    ax.set_xlabel("rank")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, bbox_to_anchor=(1.01, 1), loc="upper left")
    fig.tight_layout()
    return fig


# The breakdown figure draws at most this many ranks' bars (the slowest by step time).
MAX_BARS = 32


def breakdown_figure(phases: pd.DataFrame, title: str) -> plt.Figure:
    """Stacked bars per rank: mean milliseconds per phase over the measured iterations; above
    MAX_BARS ranks the MAX_BARS with the longest mean step, in rank order."""
    if len(phases) > MAX_BARS:
        keep = phases["step [s]"].fillna(-np.inf).sort_values(ascending=False,
                                                              kind="stable").index[:MAX_BARS]
        title = f"{title} ({MAX_BARS} of {len(phases)} ranks: the longest steps)"
        phases = phases.loc[sorted(keep)]
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
               color=colour(i), edgecolor="black", hatch=HATCHES[i % len(HATCHES)])
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
               color=colour(i), edgecolor="black", hatch=HATCHES[i % len(HATCHES)])
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
                color=colour(i), **_style(i))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size [B]")
    ax.set_ylabel("bus bandwidth [GB/s]")
    ax.set_title("busbw vs message size (nccl-tests convention)", fontsize=9)
    ax.grid(True, which="both", color="0.9")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def compression_figure(df: pd.DataFrame) -> plt.Figure:
    """compression.table: per comparison (runs of one workload and placement) and setting, the
    bytes sent per step relative to uncompressed, the exposed communication and the step time,
    side by side; hatches tell the settings apart in greyscale."""
    names = list(dict.fromkeys(df["runs"]))
    settings = list(dict.fromkeys(df["compression"]))
    panels = [("ratio to uncompressed", "bytes sent / uncompressed", 1.0),
              ("exposed comm / step [ms]", "exposed communication (comm_wait) [ms]", 1.0),
              ("step [ms]", "median step [ms]", 1.0)]
    fig, axes = plt.subplots(1, 3, figsize=(min(16, 4 + 2.2 * len(names) * len(settings)), 4.2))
    width = 0.8 / max(1, len(settings))
    x = np.arange(len(names))
    for ax, (col, ylabel, scale) in zip(axes, panels):
        for i, st in enumerate(settings):
            sub = df[df["compression"] == st].set_index("runs")
            y = [float(sub[col].loc[n]) * scale if n in sub.index else np.nan for n in names]
            ax.bar(x + i * width, np.nan_to_num(y), width, label=st, color=colour(i),
                   edgecolor="black", hatch=HATCHES[i % len(HATCHES)])
        ax.set_xticks(x + width * (len(settings) - 1) / 2,
                      [textwrap.fill(n, 22) for n in names], fontsize=7)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.grid(True, axis="y", color="0.9")
    axes[0].legend(fontsize=7, title="dist.compress", title_fontsize=7)
    fig.suptitle("gradient compression: bytes, exposed communication and step per setting "
                 "(means over repeats)", fontsize=9)
    fig.tight_layout()
    return fig


def scaling_time_figure(df: pd.DataFrame, mode: str) -> plt.Figure:
    """The papers' axes (study.execution_table): left, execution time vs number of GPUs (ranks)
    with min/max error bars; right, parallel efficiency vs GPUs with the ideal 100% line."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, (name, g) in enumerate(df.groupby("configuration", sort=False)):
        g = g.sort_values("ranks")
        t = g["execution time [s]"]
        ax1.errorbar(g["ranks"], t, yerr=[t - g["execution time min [s]"],
                                          g["execution time max [s]"] - t],
                     capsize=3, label=name, color=colour(i), **_style(i))
        e = g["efficiency [%]"]
        ax2.errorbar(g["ranks"], e, yerr=[e - g["efficiency min [%]"], g["efficiency max [%]"] - e],
                     capsize=3, label=name, color=colour(i), **_style(i))
    n = np.array(sorted(df["ranks"].unique()))
    ax2.axhline(100, color="0.5", linestyle=(0, (1, 1)), label="ideal")
    ax1.set_ylabel("execution time [s]")
    ax1.set_title("execution time vs GPUs (sum of the slowest rank's steps)", fontsize=9)
    ax2.set_ylabel("parallel efficiency [%]")
    ax2.set_ylim(bottom=0)
    ax2.set_title(f"{mode} scaling: parallel efficiency vs GPUs", fontsize=9)
    for ax in (ax1, ax2):
        ax.set_xlabel("GPUs (ranks; CPU processes on CPU runs)")
        ax.set_xticks(n)
        ax.grid(True, color="0.85")
    _legends(fig, (ax1, ax2), df["configuration"].nunique(), 4.2)
    return fig


def model_figure(fit: pd.DataFrame, curve: pd.DataFrame, title: str,
                 recommended: tuple[int, float] | None = None) -> plt.Figure:
    """A configuration's performance model (model.ConfigModel) against its runs. `fit`: one row per
    measured point (ranks, nodes, measured_s, measured_min_s, measured_max_s; fit_rows); `curve`:
    predictions (ranks, step_s, step_lo_s, step_hi_s, in_range) from the smallest measured rank
    count to beyond the largest. Measured medians are markers with min-max bars over repeats (one
    marker per node count), the model a line (solid where measured, dashed where extrapolated,
    which is also shaded), the +-2 sigma band a lighter fill; log2 x axis."""
    fig, ax = plt.subplots(figsize=(8, 4.2))
    curve = curve.sort_values("ranks")
    x = curve["ranks"].to_numpy(dtype=float)
    inside = curve["in_range"].to_numpy(dtype=bool)
    ax.fill_between(x, curve["step_lo_s"], curve["step_hi_s"], color=colour(0), alpha=0.18,
                    linewidth=0, label="model ±2σ band")
    last_in = np.flatnonzero(inside)
    if last_in.size and last_in[-1] + 1 < len(x):
        # the dashed part starts at the last measured rank count so that the line is unbroken
        edge = last_in[-1]
        ax.axvspan(x[edge], x[-1], color="0.93", zorder=0,
                   label="extrapolated (beyond the measured ranks or nodes)")
        ax.plot(x[: edge + 1], curve["step_s"].iloc[: edge + 1], color=colour(0), linewidth=2,
                label="model (Extra-P phases + comm)")
        ax.plot(x[edge:], curve["step_s"].iloc[edge:], color=colour(0), linewidth=2,
                linestyle="--", label="model, extrapolated")
    else:
        ax.plot(x, curve["step_s"], color=colour(0), linewidth=2,
                label="model (Extra-P phases + comm)")
    for i, (nodes, g) in enumerate(fit.groupby("nodes", sort=True)):
        y = g["measured_s"]
        ax.errorbar(g["ranks"], y, yerr=[y - g["measured_min_s"], g["measured_max_s"] - y],
                    fmt=MARKERS[(i + 1) % len(MARKERS)], color=colour(3 + i), capsize=4,
                    markersize=7, markeredgecolor="black", zorder=5,
                    label=f"measured median, {nodes} node(s) (bars: min-max over repeats)")
    if recommended is not None:
        ax.plot(*recommended, marker="*", markersize=16, color=colour(2), markeredgecolor="black",
                linestyle="none", zorder=6, label=f"recommended: {recommended[0]} ranks")
    ax.set_xscale("log", base=2)
    ticks = sorted({int(2**k) for k in range(int(np.floor(np.log2(x.min()))),
                                             int(np.ceil(np.log2(x.max()))) + 1)}
                   | set(int(r) for r in fit["ranks"]))
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlim(x.min() / 1.15, x.max() * 1.15)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("ranks (GPUs or CPU processes), log2 scale")
    ax.set_ylabel("median iteration time [s]")
    ax.set_title(textwrap.fill(title, 110), fontsize=9)
    ax.grid(True, color="0.85")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def curves_figure(curves: list[tuple[str, pd.DataFrame, pd.DataFrame]], title: str) -> plt.Figure:
    """Training curves of several runs (name, per-iteration table, per-epoch table from
    study.curves_tables): train loss per iteration, and per epoch train / val loss and val
    accuracy where the run evaluated (NaN epochs are left out)."""
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(13, 4.2))
    any_loss = any_acc = False
    epochs: set[float] = set()
    for i, (name, it, ep) in enumerate(curves):
        st = dict(color=colour(i), linestyle=LINES[i % len(LINES)])
        ax1.plot(it["iteration"], it["train loss"], label=name, marker=MARKERS[i % len(MARKERS)],
                 markevery=max(1, len(it) // 8), markersize=4, **st)
        tr = ep.dropna(subset=["train loss"])
        if not tr.empty:
            ax2.plot(tr["epoch"] + 1, tr["train loss"], marker=MARKERS[i % len(MARKERS)],
                     label=f"{name} train", **st)
            any_loss = True
        va = ep.dropna(subset=["val loss"])
        if not va.empty:
            ax2.plot(va["epoch"] + 1, va["val loss"], marker=MARKERS[i % len(MARKERS)],
                     fillstyle="none", label=f"{name} val", color=colour(i), linestyle=":")
            any_loss = True
        epochs |= set((ep["epoch"] + 1).tolist())
        acc = ep.dropna(subset=["val accuracy [%]"])
        if not acc.empty:
            ax3.plot(acc["epoch"] + 1, acc["val accuracy [%]"], marker=MARKERS[i % len(MARKERS)],
                     label=name, **st)
            any_acc = True
    ax1.set_xlabel("iteration")
    ax1.set_ylabel("train loss (mean over ranks)")
    ax1.set_title("train loss per iteration (warm-up included)", fontsize=9)
    ax2.set_xlabel("epoch")
    ax2.set_ylabel("loss")
    ax2.set_title("loss per epoch (train: solid, val: dotted)", fontsize=9)
    ax3.set_xlabel("epoch")
    ax3.set_ylabel("val accuracy [%]")
    ax3.set_title("validation accuracy per epoch", fontsize=9)
    for ax, has in ((ax1, bool(curves)), (ax2, any_loss), (ax3, any_acc)):
        ax.grid(True, color="0.85")
        if has:
            ax.legend(fontsize=6)
        else:
            ax.text(0.5, 0.5, "not evaluated in these runs", ha="center", va="center",
                    transform=ax.transAxes, fontsize=9, color="0.3")
            ax.set_xticks([])
            ax.set_yticks([])
    ax1.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax, has in ((ax2, any_loss), (ax3, any_acc)):
        if not has:
            continue
        if 0 < len(epochs) <= 12:
            ax.set_xticks(sorted(epochs))
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


# Beyond these many ranks, per-rank lines and boxes are unreadable (and slow to draw): the figures
# show the spread over ranks and the slowest ranks only (issue 39: the report at 16,384 ranks).
MAX_RANK_LINES = 16
TOP_RANKS = 8
# Heat maps bin their rows (ranks) to at most this many, each bin showing its slowest rank.
MAX_HEATMAP_ROWS = 1024


def slowest_ranks(values: np.ndarray, warmup: int, k: int = TOP_RANKS) -> np.ndarray:
    """values [ranks, n]: the k ranks with the largest mean over the measured iterations,
    slowest first."""
    measured = values[:, warmup:] if 0 < warmup < values.shape[1] else values
    with warnings.catch_warnings():  # an all-NaN rank's mean is NaN, ranked last
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(measured, axis=1)
    mean = np.where(np.isfinite(mean), mean, -np.inf)
    return np.argsort(-mean, kind="stable")[:k]


def rows_text(view) -> str:
    """"R of N ranks" for a StepView whose rows are a subset (output.per_rank), else ""."""
    if view is None or not view.subset:
        return ""
    return f"{len(view.ranks)} of {view.world} ranks"


def steps_figure(step: np.ndarray, warmup: int, title: str, view=None) -> plt.Figure:
    """step [ranks, n] in seconds: left, step time over the iterations per rank with the warm-up
    iterations shaded; right, the distribution of the measured iterations per rank (box plot).
    Above MAX_RANK_LINES ranks: the minimum-median-maximum over ranks per iteration and lines for
    the TOP_RANKS slowest ranks; right, the distribution of the ranks' mean step times.
    view (study.StepView): the rows are those of view.ranks (MPI ranks; a subset of view.world
    under output.per_rank) and the spread over ALL ranks comes from view (the file's
    aggregates): min-max and mean over the world, the slowest rank per iteration (view.argmax),
    lines for the slowest detail ranks."""
    if view is not None:
        return _steps_view_figure(view, title)
    ms = step * 1e3
    ranks = ms.shape[0]
    many = ranks > MAX_RANK_LINES
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [2, 1]})
    it = np.arange(ms.shape[1])
    if warmup > 0:
        ax1.axvspan(-0.5, warmup - 0.5, color="0.88", label=f"warm-up ({warmup} iterations, "
                                                            "excluded from statistics)")
    shown = slowest_ranks(ms, warmup) if many else np.arange(ranks)
    if many:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            lo, mid, hi = (np.nanmin(ms, axis=0), np.nanmedian(ms, axis=0),
                           np.nanmax(ms, axis=0))
        ax1.fill_between(it, lo, hi, color="0.8", label=f"min-max over {ranks} ranks")
        ax1.plot(it, mid, color="black", linewidth=1.2, label="median over ranks")
    for i, r in enumerate(shown):
        label = f"rank {r}" + (" (slowest)" if many and i == 0 else "")
        ax1.plot(it, ms[r], label=label, color=colour(i), linestyle=LINES[i % len(LINES)],
                 marker=MARKERS[i % len(MARKERS)], markersize=3, markevery=max(1, len(it) // 10))
    ax1.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax1.set_xlabel("iteration")
    ax1.set_ylabel("step time [ms]")
    ax1.set_title("step time per iteration and rank" if not many else
                  f"step time per iteration: spread over ranks, the {len(shown)} slowest ranks",
                  fontsize=9)
    ax1.grid(True, color="0.85")
    ax1.legend(fontsize=7, ncol=2 if len(shown) > 4 else 1)
    measured = [row[warmup:][~np.isnan(row[warmup:])] for row in ms]
    if many:
        _means_histogram(ax2, np.array([m.mean() for m in measured if m.size]),
                         f"distribution of the {ranks} ranks' means")
    else:
        _boxes(ax2, measured, [str(r) for r in range(len(measured))])
    ax2.grid(True, axis="y", color="0.85")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def _means_histogram(ax, means: np.ndarray, title: str) -> None:
    if means.size:
        ax.hist(means, bins=min(50, max(5, int(np.sqrt(means.size)))), color=colour(0),
                edgecolor="black", hatch=HATCHES[0])
    else:
        ax.text(0.5, 0.5, "no per-rank rows in this file\n(output.per_rank=none)", ha="center",
                va="center", transform=ax.transAxes, fontsize=8, color="0.3")
    ax.set_xlabel("mean step time, measured iterations [ms]")
    ax.set_ylabel("ranks")
    ax.set_title(title, fontsize=9)


def _boxes(ax, measured: list, labels: list) -> None:
    box = ax.boxplot(measured, patch_artist=True, widths=0.6, medianprops={"color": "black"})
    for r, patch in enumerate(box["boxes"]):
        patch.set(facecolor=colour(r), hatch=HATCHES[r % len(HATCHES)], edgecolor="black")
    ax.set_xticks(np.arange(1, len(measured) + 1), labels)
    ax.set_xlabel("rank")
    ax.set_ylabel("step time [ms]")
    ax.set_title("distribution over the measured iterations", fontsize=9)


def _steps_view_figure(view, title: str) -> plt.Figure:
    """steps_figure of a study.StepView (see there)."""
    ms = view.step * 1e3
    rows, world, warmup = ms.shape[0], view.world, view.warmup
    n = max(ms.shape[1], len(view.hi))
    many = world > MAX_RANK_LINES
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 5.2), gridspec_kw={"width_ratios": [2, 1]})
    it = np.arange(n)
    if warmup > 0:
        ax1.axvspan(-0.5, warmup - 0.5, color="0.88", label=f"warm-up ({warmup} iterations, "
                                                            "excluded from statistics)")
    shown = slowest_ranks(ms, warmup) if many and rows else np.arange(rows)
    over = f"all {world} ranks" if view.from_aggregates else f"{world} ranks"
    if many and len(view.hi):
        k = len(view.hi)
        ax1.fill_between(it[:k], view.lo * 1e3, view.hi * 1e3, color="0.8",
                         label=f"min-max over {over}")
        if view.from_aggregates:
            mid, what = view.mean * 1e3, "mean"
        else:  # every rank's rows: the median, as before the aggregates
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                mid, what = np.nanmedian(ms, axis=0)[:k], "median"
        ax1.plot(it[:len(mid)], mid, color="black", linewidth=1.2, label=f"{what} over {over}")
        arg = view.argmax[warmup:] if 0 < warmup < k else view.argmax
        arg = arg[arg >= 0]
        if arg.size:  # the slowest rank per iteration: which rank, how often
            top = np.bincount(arg).argmax()
            share = 100.0 * float(np.mean(arg == top))
            ax1.plot(it[:k], view.hi * 1e3, color=colour(3), linestyle="none", marker=".",
                     markersize=2,
                     label=f"slowest rank per iteration (rank {top} in {share:.0f}% of "
                           "the measured)")
    for i, j in enumerate(shown):
        label = f"rank {view.ranks[j]}" + (" (slowest with rows)" if many and i == 0
                                           and view.subset else " (slowest)" if many and i == 0
                                           else "")
        ax1.plot(np.arange(ms.shape[1]), ms[j], label=label, color=colour(i),
                 linestyle=LINES[i % len(LINES)], marker=MARKERS[i % len(MARKERS)], markersize=3,
                 markevery=max(1, ms.shape[1] // 10))
    ax1.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax1.set_xlabel("iteration")
    ax1.set_ylabel("step time [ms]")
    shown_text = rows_text(view)
    if not many:
        ax1.set_title("step time per iteration and rank" +
                      (f" ({shown_text} have rows)" if shown_text else ""), fontsize=9)
    else:
        ax1.set_title(f"spread over {over}; " + (
            f"lines: {len(shown)} slowest of the {rows} ranks with per-rank rows" if rows else
            "no per-rank rows (output.per_rank=none)"), fontsize=9)
    ax1.grid(True, color="0.85")
    ax1.legend(fontsize=6, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.16),
               frameon=False)
    measured = [row[warmup:][~np.isnan(row[warmup:])] for row in ms]
    if many or not rows:
        _means_histogram(ax2, np.array([m.mean() for m in measured if m.size]),
                         f"means of the {shown_text or f'{rows} ranks'}")
    else:
        _boxes(ax2, measured, [str(r) for r in view.ranks])
    ax2.grid(True, axis="y", color="0.85")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def binned_rows(values: np.ndarray, most: int = MAX_HEATMAP_ROWS):
    """values [ranks, n] binned to at most `most` rows of consecutive ranks, each the bin's
    maximum per column (a straggler stays bright); with the first rank of every bin."""
    ranks = values.shape[0]
    if ranks <= most:
        return values, np.arange(ranks)
    starts = np.linspace(0, ranks, most + 1).astype(int)[:-1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.fmax.reduceat(values, starts, axis=0), starts


def heatmap_figure(step: np.ndarray, warmup: int, title: str, view=None) -> plt.Figure:
    """step [ranks, n] as a rank x iteration heat map (milliseconds): a straggling rank is a
    bright row, a slow iteration on every rank a bright column. The colour scale spans the
    measured iterations, so that slow warm-up iterations (clipped to the brightest colour) do not
    wash out the differences between ranks. Above MAX_HEATMAP_ROWS ranks the rows are bins of
    consecutive ranks showing each bin's slowest. view (study.StepView): the rows are the MPI
    ranks view.ranks, of view.world (output.per_rank), as the axis and title say."""
    ranks = step.shape[0]
    ms, starts = binned_rows(step * 1e3)
    names = np.asarray(view.ranks) if view is not None else np.arange(ranks)
    starts = names[starts] if len(names) == ranks else starts
    binned = ms.shape[0] < ranks
    height = max(2.4, 0.35 * ms.shape[0] + 1.8) if ms.shape[0] <= 32 else 9.0
    fig, ax = plt.subplots(figsize=(11, height))
    measured = ms[:, warmup:] if 0 < warmup < ms.shape[1] else ms
    finite = measured[np.isfinite(measured)]
    lim = dict(vmin=float(finite.min()), vmax=float(finite.max())) if finite.size else {}
    im = ax.imshow(ms, aspect="auto", cmap=HEATMAP, interpolation="nearest",
                   extent=(-0.5, ms.shape[1] - 0.5, ms.shape[0] - 0.5, -0.5), **lim)
    if 0 < warmup < ms.shape[1]:
        ax.axvline(warmup - 0.5, color="white", linestyle="--", linewidth=1.2)
        ax.annotate("warm-up | measured", (warmup - 0.5, -0.5), xytext=(0, 3),
                    textcoords="offset points", ha="center", va="bottom", fontsize=7)
    if ms.shape[0] <= 32:
        ax.set_yticks(np.arange(ms.shape[0]), [str(r) for r in starts])
    else:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=12))
        ax.yaxis.set_major_formatter(
            FuncFormatter(lambda y, _: str(starts[int(y)]) if 0 <= int(y) < len(starts) else ""))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("iteration")
    shown = rows_text(view)
    ax.set_ylabel(("rank" if not binned else
                   f"rank (bins of ~{ranks / ms.shape[0]:.0f} ranks: each bin's slowest)") +
                  (f"\n{shown} (output.per_rank)" if shown else ""))
    ax.set_title(f"{title}: step time per rank and iteration (colours span the measured "
                 "iterations" + (f"; the {shown} with per-rank rows" if shown else "") + ")",
                 fontsize=9, pad=14)
    extend = "max" if finite.size and np.nanmax(ms) > lim["vmax"] else "neither"
    fig.colorbar(im, ax=ax, label="step time [ms]", extend=extend)
    fig.tight_layout()
    return fig


def telemetry_figure(df: pd.DataFrame, title: str) -> plt.Figure:
    """study.telemetry_table: one panel per sampled counter (CPU %, RSS, GPU power, GPU
    utilisation where present), one line per rank over the run clock."""
    cols = [c for c in df.columns if c not in ("rank", "time [s]")]
    fig, axes = plt.subplots(1, len(cols), figsize=(max(5, 4.2 * len(cols)), 3.6), squeeze=False)
    ranks = df["rank"].nunique() if "rank" in df else 0
    keep = None
    if ranks > MAX_RANK_LINES:  # the TOP_RANKS ranks with the highest mean of the first counter
        means = df.groupby("rank")[cols[0]].mean() if cols else pd.Series(dtype=float)
        keep = set(means.sort_values(ascending=False).index[:TOP_RANKS])
    for ax, c in zip(axes[0], cols):
        for r, g in df.groupby("rank"):
            if keep is not None and r not in keep:
                continue
            ax.plot(g["time [s]"], g[c], label=f"rank {r}", color=colour(int(r)),
                    linestyle=LINES[int(r) % len(LINES)], marker=MARKERS[int(r) % len(MARKERS)],
                    markersize=3)
        ax.set_xlabel("time since the run started [s]")
        ax.set_ylabel(c)
        world = int(df.attrs.get("world", ranks) or ranks)
        of = f"{ranks} of {world} ranks with per-rank rows" if world > ranks else ""
        ax.set_title(c.split(" [")[0] + " over time" +
                     (f" ({len(keep)} of {ranks} ranks: highest {cols[0]}"
                      + (f"; {of}" if of else "") + ")" if keep else
                      f" ({of})" if of else ""), fontsize=9)
        ax.grid(True, color="0.85")
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def top_ops_figure(df: pd.DataFrame, title: str) -> plt.Figure:
    """study.top_ops_table: horizontal bars of each operator's total (inclusive) and self time
    per iteration of the profiler window, largest at the top."""
    fig, ax = plt.subplots(figsize=(11, 0.38 * len(df) + 1.6))
    y = np.arange(len(df))
    names = [n if len(n) <= 60 else n[:57] + "..." for n in df["operator"]]
    ax.barh(y - 0.2, df["total [ms/iter]"], 0.4, label="total (inclusive)", color=colour(0),
            edgecolor="black", hatch=HATCHES[0])
    ax.barh(y + 0.2, df["self [ms/iter]"], 0.4, label="self", color=colour(1), edgecolor="black",
            hatch=HATCHES[1])
    ax.set_yticks(y, names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time per iteration of the profiler window [ms] (mean over ranks)")
    ax.set_ylabel("operator")
    ax.set_title(f"{title}: top CPU operators", fontsize=9)
    ax.grid(True, axis="x", color="0.85")
    ax.legend(fontsize=7, loc="lower right")
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
