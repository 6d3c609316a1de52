"""Tables and the LLM loss figure of the gradient compression study (issue 40, point 4) from the
run files of tests/multinode/compression_study.sh: per workload, link rate and dist.compress the
bytes per step, exposed communication (comm_wait) and step time, and the LLM loss per iteration.

  PYTHONPATH=postprocess python tests/multinode/compression_table.py STUDYDIR \
      [--skip 5] [--figure docs/figures/compression_llm_loss.svg] [--figure-rate 100mbit]

Per iteration a value is the mean over the 4 ranks (/iterations/aggregate), its statistics the
median over the iterations after the first --skip (warm-up; PowerSGD's first
dist.powersgd_start_iter = 2 are plain allreduces) of every repeat pooled. With STUDYDIR/cpustat.log
(lines "EPOCH_S cpu USER NICE SYSTEM IDLE IOWAIT IRQ SOFTIRQ STEAL ...", /proc/stat sampled every
few seconds) it also gives the share of the cores that niced processes (other users' builds at
nice 19) used while the runs ran.
"""

import argparse
import datetime
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from trainscope_post.runfile import RunFile

RATES = ["100mbit", "1gbit", "unlimited"]
RATE_LABEL = {"100mbit": "100 Mbit/s", "1gbit": "1 Gbit/s", "unlimited": "unlimited"}
COMPRESS = ["none", "fp16", "bf16", "powersgd"]
NAME = re.compile(r"(?P<wl>cv|llm)_(?P<c>[a-z0-9]+)_rep(?P<rep>\d+)\.h5$")


def load_cpustat(path: Path):
    """[(epoch_s, nice_jiffies, total_jiffies)] from the sampler's log, or None."""
    if not path.exists():
        return None
    rows = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) < 6 or parts[1] != "cpu":
            continue
        values = [int(v) for v in parts[2:]]
        rows.append((int(parts[0]), values[1], sum(values[:8])))
    return np.array(rows, dtype=np.float64) if rows else None


def nice_share(cpustat, start: float, end: float) -> float:
    """Share of all cores' time used by niced processes between start and end [s since epoch]
    (nearest samples inside the window); NaN without two samples there."""
    if cpustat is None:
        return float("nan")
    inside = cpustat[(cpustat[:, 0] >= start) & (cpustat[:, 0] <= end)]
    if len(inside) < 2:
        return float("nan")
    d = inside[-1] - inside[0]
    return d[1] / d[2] if d[2] > 0 else float("nan")


def utc_seconds(text: str) -> float:
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=datetime.timezone.utc).timestamp()


def read_run(path: Path, skip: int, cpustat):
    with RunFile(path) as rf:
        if not rf.completed:
            return None

        def per_iter(name):  # mean over all ranks, every recorded iteration
            return rf.over_ranks(name, field="mean", window="recorded")

        attrs = rf.attrs()
        start = utc_seconds(str(attrs["created_utc"]))
        end = utc_seconds(str(attrs["finished_utc"]))
        return {
            "step_s": per_iter("step_s")[skip:],
            "comm_wait_s": per_iter("comm_wait_s")[skip:],
            # everything but the exposed communication: compute, data, control, optimizer
            "rest_s": (per_iter("step_s") - per_iter("comm_wait_s"))[skip:],
            "comm_bytes": per_iter("comm_bytes")[skip:],
            "comm_uncompressed_bytes": per_iter("comm_uncompressed_bytes")[skip:],
            "loss": per_iter("loss"),
            "nice_share": nice_share(cpustat, start, end),
        }


def collect(study: Path, skip: int):
    cpustat = load_cpustat(study / "cpustat.log")
    runs = defaultdict(list)  # (workload, rate, compress) -> [run, ...]
    for rate_dir in sorted(p for p in study.iterdir() if p.is_dir()):
        for f in sorted(rate_dir.glob("*.h5")):
            m = NAME.match(f.name)
            if not m:
                continue
            run = read_run(f, skip, cpustat)
            if run is not None:
                runs[(m["wl"], rate_dir.name, m["c"])].append(run)
    return runs


def refusals(study: Path):
    """(rate, workload, compress, exit code) of runs that did not finish, from runs.tsv."""
    tsv = study / "runs.tsv"
    out = []
    if tsv.exists():
        for line in tsv.read_text().splitlines():
            rate, wl, c, _rep, rc, _wall = line.split("\t")
            if rc != "0":
                out.append((rate, wl, c, int(rc)))
    return out


def pooled(runs, key):
    return float(np.nanmedian(np.concatenate([r[key] for r in runs])))


def per_repeat(runs, key):
    return [float(np.nanmedian(r[key])) for r in runs]


def table(runs, workload: str):
    print(f"\n{workload.upper()}: median per step over iterations after the warm-up "
          "(mean over ranks), repeats pooled\n")
    print("| link | `dist.compress` | bytes sent / uncompressed per rank | exposed comm [ms] "
          "| rest of step [ms] | step [ms] | step per repeat [ms] | speed-up vs none "
          "| niced CPU [%] |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for rate in RATES:
        base = runs.get((workload, rate, "none"))
        base_step = pooled(base, "step_s") if base else float("nan")
        for c in COMPRESS:
            rs = runs.get((workload, rate, c))
            if not rs:
                continue
            step = pooled(rs, "step_s")
            reps = ", ".join(f"{1e3 * v:.0f}" for v in per_repeat(rs, "step_s"))
            shares = [r["nice_share"] for r in rs if np.isfinite(r["nice_share"])]
            nice = f"{100 * max(shares):.0f}" if shares else "n/a"  # the worst repeat
            print(f"| {RATE_LABEL.get(rate, rate)} | {c} | {pooled(rs, 'comm_bytes'):,.0f} / "
                  f"{pooled(rs, 'comm_uncompressed_bytes'):,.0f} | "
                  f"{1e3 * pooled(rs, 'comm_wait_s'):.0f} | {1e3 * pooled(rs, 'rest_s'):.0f} | "
                  f"{1e3 * step:.0f} | {reps} | {base_step / step:.2f} | {nice} |")


def loss_table(runs):
    """The LLM loss per setting; the curves of every link and repeat are compared with the first
    (the computation does not depend on the link: they should be the same)."""
    print("\nLLM loss (mean over ranks) per setting: final iteration, mean of the last epoch "
          "(4 iterations), largest difference to `none` at any iteration, and the largest "
          "difference between this setting's runs (links, repeats)\n")
    print("| `dist.compress` | runs | final loss | last-epoch mean | max. diff. to none "
          "| max. diff. between runs |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    base = [r for rate in RATES for r in runs.get(("llm", rate, "none"), [])]
    for c in COMPRESS:
        rs = [r for rate in RATES for r in runs.get(("llm", rate, c), [])]
        if not rs:
            continue
        loss = rs[0]["loss"]
        spread = max(float(np.nanmax(np.abs(r["loss"] - loss))) for r in rs)
        diff = float(np.nanmax(np.abs(loss - base[0]["loss"]))) if base else float("nan")
        print(f"| {c} | {len(rs)} | {loss[-1]:.3f} | {np.nanmean(loss[-4:]):.3f} | {diff:.4f} "
              f"| {spread:.1e} |")


def figure(runs, rate: str, path: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.fonttype"] = "none"  # text stays text: a smaller, searchable SVG
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    styles = {"none": ("k", "-"), "fp16": ("tab:blue", "--"), "bf16": ("tab:orange", "-."),
              "powersgd": ("tab:green", ":")}
    for c in COMPRESS:
        rs = runs.get(("llm", rate, c))
        if not rs:
            continue
        loss = rs[0]["loss"]
        color, ls = styles[c]
        label = "powersgd (rank 2)" if c == "powersgd" else c
        ax.plot(np.arange(1, len(loss) + 1), loss, color=color, linestyle=ls, linewidth=1.4,
                label=label)
    ax.set_xlabel("iteration (16 sequences each, 4 per epoch)")
    ax.set_ylabel("training loss [nats/token]")
    ax.set_title("Tiny Llama full fine-tuning (inputs/llm/full-tiny.ini), 2 + 2 ranks",
                 fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(title="dist.compress")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, metadata={"Date": None} if path.suffix == ".svg" else None)
    print(f"\nfigure: {path} ({path.stat().st_size:,} B)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("study", type=Path)
    ap.add_argument("--skip", type=int, default=5, help="warm-up iterations left out")
    ap.add_argument("--figure", type=Path, help="write the LLM loss curves here (.svg/.png)")
    ap.add_argument("--figure-rate", default="100mbit", help="the link of the figure's runs")
    args = ap.parse_args(argv)
    runs = collect(args.study, args.skip)
    if not runs:
        print(f"no completed run files under {args.study}", file=sys.stderr)
        return 1
    for wl in ("cv", "llm"):
        table(runs, wl)
    loss_table(runs)
    refused = refusals(args.study)
    print("\nruns that did not finish (exit 3 = configuration refused):",
          ", ".join(f"{r} {w} {c} (exit {rc})" for r, w, c, rc in refused) or "none")
    if args.figure:
        figure(runs, args.figure_rate, args.figure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
