"""Instrumentation overhead: step time with accounting + telemetry off vs on, and the profiler window.

Accounting + telemetry on vs off are profile.accounting and telemetry.enabled; the profiler window
is profile.enabled.

Each configuration is a full `mpirun -np N build/app/trainscope` run (trainscope_jobs.launch) of the quick-start
configuration for --iters iterations (no evaluation, no progress log). Configurations alternate
within every repeat, and the order rotates between repeats, so slow drifts of the machine (other
jobs, thermal state) hit all of them alike.

Step time of a run: per iteration the mean over ranks of /iterations/step_s (ranks run in
lock-step; the /summary convention), over the measured iterations (the first
profile.warmup_iters are left out), then the median. The ratio of two configurations is the
median over repeats of the per-repeat ratios (paired, so drift between repeats cancels).

The profiler window records iterations [profile.start_iter, start_iter + profile.iters): its own
cost is reported as the median step inside the window / the median step outside it in the same
run, and its effect on the whole run as the ratio of run medians and of wall times.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from trainscope_post import RunFile
from trainscope_jobs.launch import launch_env, mpirun_command

ROOT = Path(__file__).resolve().parent.parent

CONFIGS = {
    "off": ["--profile.accounting=false", "--telemetry.enabled=false", "--profile.enabled=false"],
    "on": ["--profile.accounting=true", "--telemetry.enabled=true", "--profile.enabled=false"],
    "profile": ["--profile.accounting=true", "--telemetry.enabled=true", "--profile.enabled=true"],
}


def analyse(path):
    """Step-time figures of one run file (dict), or raises ValueError naming what is missing."""
    with RunFile(path) as run:
        run.require_completed()
        cfg = run.config  # resolved options, as strings
        # lock-stepped ranks: per iteration the mean over all ranks (aggregates or rows), seconds
        per_iter = run.over_ranks("step_s", window="recorded")
        n = per_iter.shape[0]
        iteration = run.over_ranks("iteration", field="min", window="recorded")  # [n]
        warmup = int(cfg.get("profile.warmup_iters", "0"))
        measured = per_iter[warmup:]
        if measured.size == 0:
            raise ValueError(f"{path}: no measured iterations ({n} recorded, {warmup} warm-up)")
        out = {
            "path": str(path),
            "world_size": run.world_size,
            "iterations": n,
            "warmup": warmup,
            "median_step_s": float(np.median(measured)),
            "wall_s": float(run.summary.get("wall_s", float("nan"))),
            "telemetry": cfg.get("telemetry.enabled", "absent"),
            "accounting": cfg.get("profile.accounting", "absent"),
            "profile": cfg.get("profile.enabled", "absent"),
        }
        if out["profile"] == "true":
            start = int(cfg.get("profile.start_iter", "0"))
            count = int(cfg.get("profile.iters", "0"))
            inside = (iteration >= start) & (iteration < start + count)
            mask = np.arange(n) >= warmup
            win, rest = per_iter[inside & mask], per_iter[~inside & mask]
            out["window_median_step_s"] = float(np.median(win)) if win.size else float("nan")
            out["outside_median_step_s"] = float(np.median(rest)) if rest.size else float("nan")
        return out


def run_one(args, name, rep):
    out = Path(args.outdir) / f"{name}_{rep}.h5"
    cmd = mpirun_command(args.ranks, args.binary, "--config", args.config,
                         f"--train.max_iters={args.iters}", "--train.eval=false", "--log.every=0",
                         "--output.overwrite=true", f"--output.file={out}", *CONFIGS[name],
                         *args.extra)
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=ROOT, env=launch_env(), capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"run failed ({res.returncode}): {' '.join(cmd)}\n{res.stdout}\n{res.stderr}")
    r = analyse(out)
    r["process_s"] = time.perf_counter() - t0
    return r


def ratio_stats(results, num, den):
    """Per-repeat ratios of median step times num/den, and their median."""
    ratios = [a["median_step_s"] / b["median_step_s"] for a, b in zip(results[num], results[den])]
    return ratios, statistics.median(ratios)


def report(results, target):
    print(f"\n{'config':<9}{'median step ms per repeat':<40}{'median':>9}")
    for name, runs in results.items():
        per = " ".join(f"{r['median_step_s'] * 1e3:7.2f}" for r in runs)
        med = statistics.median(r["median_step_s"] for r in runs) * 1e3
        print(f"{name:<9}{per:<40}{med:9.2f}")
    ok = True
    if "on" in results and "off" in results:
        ratios, med = ratio_stats(results, "on", "off")
        ok = med <= target
        print(f"\naccounting + telemetry on / off: ratio per repeat "
              f"{', '.join(f'{x:.4f}' for x in ratios)}; median {med:.4f} "
              f"(target <= {target}: {'PASS' if ok else 'FAIL'})")
    if "profile" in results and "on" in results:
        ratios, med = ratio_stats(results, "profile", "on")
        wall = statistics.median(p["wall_s"] / o["wall_s"]
                                 for p, o in zip(results["profile"], results["on"]))
        win = [r["window_median_step_s"] / r["outside_median_step_s"]
               for r in results["profile"] if "window_median_step_s" in r]
        print(f"profiler window on / off: run median step ratio {med:.4f}, wall-time ratio "
              f"{wall:.4f}; inside the window a step takes "
              f"{statistics.median(win) if win else float('nan'):.3f}x a step outside it")
    return ok


def main():
    p = argparse.ArgumentParser(prog="scripts/bench overhead", description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--iters", type=int, default=60)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--config", default="inputs/quickstart.ini")
    p.add_argument("--binary", default=os.path.join(os.environ.get("BUILD_DIR", "build"),
                                                    "app/trainscope"))
    p.add_argument("--outdir", default="runs/bench_overhead")
    p.add_argument("--target", type=float, default=1.02)
    p.add_argument("--no-profile", action="store_true", help="skip the profiler-window runs")
    p.add_argument("--extra", nargs="*", default=[], help="more trainscope options for every run")
    p.add_argument("--parse-only", nargs="+", metavar="RUN_FILE",
                   help="only print the figures of existing run files")
    args = p.parse_args()

    if args.parse_only:
        for path in args.parse_only:
            r = analyse(path)
            extra = ""
            if "window_median_step_s" in r:
                extra = (f", window {r['window_median_step_s'] * 1e3:.2f} ms vs "
                         f"{r['outside_median_step_s'] * 1e3:.2f} ms outside")
            print(f"{path}: {r['world_size']} ranks, {r['iterations']} iterations "
                  f"({r['warmup']} warm-up), median step {r['median_step_s'] * 1e3:.2f} ms, "
                  f"wall {r['wall_s']:.1f} s, telemetry {r['telemetry']}, "
                  f"profile {r['profile']}{extra}")
        return 0

    Path(ROOT / args.outdir).mkdir(parents=True, exist_ok=True)
    names = ["off", "on"] + ([] if args.no_profile else ["profile"])
    results = {n: [] for n in names}
    for rep in range(args.repeats):
        order = names[rep % len(names):] + names[:rep % len(names)]  # rotate the order
        for name in order:
            r = run_one(args, name, rep)
            results[name].append(r)
            print(f"repeat {rep} {name:<8} median step {r['median_step_s'] * 1e3:7.2f} ms "
                  f"(wall {r['wall_s']:.1f} s)", flush=True)
    return 0 if report(results, args.target) else 1


if __name__ == "__main__":
    sys.exit(main())
