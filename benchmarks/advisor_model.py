"""How long `trainscope-post model STUDY --loo` takes on a study of 200 run files (issue 19).

Writes --configs configurations x --ranks rank counts x --repeats repeats of synthetic training run
files (tests/python/synthetic_runs.py: valid trainscope/1 files from known phase laws; default
5 x 8 x 5 = 200) plus comm-workload files at 2..128 ranks to a temporary directory, then times:
  end to end   `python -m trainscope_post model DIR --loo` as a user runs it (process start,
               imports, reading every file, both Extra-P runs, printing), --runs times;
  in process   the same steps one by one: loading the study (attributes), build_models (reading
               the per-iteration columns, the alpha-beta fits, Extra-P), leave_one_out; and of
               those the time spent inside model.extrap_fit (Extra-P's process: its start, imports
               and the PMNF searches), with the number of series fitted.
No binary and no MPI: a post-processing benchmark, the files stand in for a real study's.
"""

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "python"))
from synthetic_runs import MiB, Law, write_comm, write_run  # noqa: E402

from trainscope_post import model  # noqa: E402
from trainscope_post.study import load  # noqa: E402

GPUS_PER_NODE = 4


def laws(n: int) -> list[tuple[Law, dict]]:
    """n configurations that differ in strategy/precision and in their laws: compute from 1x to
    1.8x, gradient traffic from 1x to 4x, overlap from 0.6 down to 0.2."""
    names = [("ddp-ds", "bf16-mixed"), ("ddp-ds", "fp32"), ("ddp", "bf16-mixed"),
             ("ddp", "fp32"), ("ddp-ds", "fp16-mixed"), ("ddp", "fp16-mixed")]
    out = []
    for i in range(n):
        s, t = 1.0 + 0.2 * i, 1.0 + 0.75 * i
        law = Law(phases={"data": (2e-4, 2e-3), "h2d": (1e-5, 5e-4 * s),
                          "forward": (5e-3, 0.2 * s), "backward": (1e-2, 0.4 * s),
                          "optimizer": (3e-3 * s, 0.0), "control": (2e-4, 0.0)},
                  bucket_bytes=(25 * MiB * t, 25 * MiB * t, 10 * MiB * t),
                  overlap=max(0.2, 0.6 - 0.1 * i))
        strategy, precision = names[i % len(names)]
        out.append((law, {"run.strategy": strategy, "run.precision": precision,
                          "run.seed": str(i // len(names))}))
    return out


def write(root: Path, a) -> int:
    count, seed = 0, 0
    ranks = [2**k for k in range(a.ranks)]
    for i, (law, cfg) in enumerate(laws(a.configs)):
        for p in ranks:
            for r in range(a.repeats):
                seed += 1
                write_run(root / f"c{i}" / f"n{p}" / f"rep{r}.h5", law, p,
                          math.ceil(p / GPUS_PER_NODE), cfg, noise=a.noise, seed=seed,
                          iterations=a.iterations)
                count += 1
    for p in ranks[1:]:
        seed += 1
        write_comm(root / "comm" / f"n{p}.h5", laws(1)[0][0].network, p,
                   math.ceil(p / GPUS_PER_NODE), noise=a.noise, seed=seed)
    return count


def main() -> int:
    ap = argparse.ArgumentParser(prog="scripts/bench advisor_model", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=8, help="rank counts 1, 2, 4, ... (default 8: "
                    "up to 128)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=50, help="per run, 2 of them warm-up")
    ap.add_argument("--noise", type=float, default=0.02, help="relative, per rank and iteration")
    ap.add_argument("--runs", type=int, default=3, help="end-to-end timings (median reported)")
    a = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="ts-advisor-") as tmp:
        root = Path(tmp)
        t = time.perf_counter()
        n = write(root, a)
        comm = len(list((root / "comm").glob("*.h5")))
        print(f"advisor_model: {n} run files ({a.configs} configurations x {a.ranks} rank counts "
              f"x {a.repeats} repeats, {a.iterations} iterations) + {comm} comm files, written "
              f"in {time.perf_counter() - t:.1f} s; Extra-P python: {model.extrap_python()}")

        cmd = [sys.executable, "-m", "trainscope_post", "model", str(root), "--loo"]
        env = dict(os.environ, PYTHONPATH=str(ROOT / "postprocess"))
        wall = []
        for _ in range(a.runs):
            t = time.perf_counter()
            p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
            wall.append(time.perf_counter() - t)
            if p.returncode != 0:
                sys.exit(f"{' '.join(cmd)} failed with exit {p.returncode}:\n{p.stderr}")
        loo = next((ln for ln in p.stdout.splitlines() if ln.startswith("leave-one-out |error|")),
                   "leave-one-out: no summary line")
        print(f"\nend to end: trainscope-post model DIR --loo: median {statistics.median(wall):.2f} s"
              f" (runs: {', '.join(f'{w:.2f}' for w in wall)})\n  {loo}")

        fits = []  # (seconds, series) per extrap_fit call
        real_fit = model.extrap_fit

        def timed_fit(series, evaluate=()):
            t0 = time.perf_counter()
            out = real_fit(series, evaluate)
            fits.append((time.perf_counter() - t0, len(series)))
            return out

        model.extrap_fit = timed_fit
        try:
            t0 = time.perf_counter()
            study = load([root])
            t1 = time.perf_counter()
            models, _ = model.build_models(study)
            t2 = time.perf_counter()
            rows = model.leave_one_out(models)
            t3 = time.perf_counter()
        finally:
            model.extrap_fit = real_fit
        print(f"\nin process ({len(models)} configurations, {len(rows)} leave-one-out folds):")
        print(f"  {'step':<34}{'seconds':>9}")
        print(f"  {'load (attributes of every file)':<34}{t1 - t0:9.2f}")
        print(f"  {'build_models':<34}{t2 - t1:9.2f}")
        print(f"  {'  of which Extra-P':<34}{fits[0][0]:9.2f}  ({fits[0][1]} series)")
        print(f"  {'leave_one_out':<34}{t3 - t2:9.2f}")
        print(f"  {'  of which Extra-P':<34}{fits[1][0]:9.2f}  ({fits[1][1]} series)")
        print(f"  {'total':<34}{t3 - t0:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
