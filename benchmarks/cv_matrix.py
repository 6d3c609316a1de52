"""The studies' CV matrix on CPU ranks: median step and data-wait time relative to the baseline.

Every point is a real trainscope run (launched by trainscope_jobs.launch, as scripts/mpirun) of inputs/cv/base.ini plus the matrix
files that define the point (inputs/cv/*.ini, stacked with --config), shortened to --iters
iterations without evaluation. Points run in a rotating order over --repeats repeats; per point the
median over repeats of /summary's median_step_s and median_data_s (per iteration the mean over
ranks, then the median over the measured iterations; the first profile.warmup_iters are left out)
is divided by the baseline's (fp32 / NCHW / host preprocessing / ddp-ds / 2 ranks). Everything is
read back from the run files.

On CPU some points cannot show their GPU effect, and the table says so: pinned memory needs CUDA
(trainscope ignores it without a GPU), tf32 needs tensor cores (refused on CPU, not run), dp drives
one process (1 rank, the same global batch).
"""

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

from trainscope_post import RunFile
from trainscope_jobs.launch import launch_env, mpirun_command

ROOT = Path(__file__).resolve().parent.parent
CV = "inputs/cv"

# name, matrix files stacked on base.ini, ranks, extra options, note
POINTS = [
    ("baseline", [], 2, [], "fp32, NCHW, host preprocessing, ddp-ds"),
    ("fp64", ["precision-fp64.ini"], 2, [], ""),
    ("fp16-mixed", ["precision-fp16-mixed.ini"], 2, [], "autocast + loss scaling"),
    ("bf16-mixed", ["precision-bf16-mixed.ini"], 2, [], "autocast"),
    ("bf16", ["precision-bf16.ini"], 2, [], "pure bf16"),
    ("nhwc", ["layout-nhwc.ini"], 2, [], "channels_last"),
    ("preprocess-device", ["preprocess-device.ini"], 2, [], "uint8 to the device, transform there"),
    ("pin-on", ["pin-on.ini"], 2, [], "no effect on CPU: pinning needs CUDA"),
    ("size-64", [], 2, ["--cv.image_size=64"], "4x the pixels"),
    ("ddp", ["strategy-ddp.ini"], 2, [], "no distributed sampler"),
    ("dp", ["strategy-dp.ini"], 1, [], "1 process, batch 128 (= 2 x 64)"),
    ("pipeline", ["strategy-pipeline.ini"], 2, [], "2 stages, 4 micro-batches, batch 128"),
]


def summary(path):
    with RunFile(path) as run:
        s = run.require_completed().summary
        return float(s["median_step_s"]), float(s["median_data_s"])


def run_point(args, point, rep):
    name, files, ranks, extra, _ = point
    out = Path(args.outdir) / f"{name}_{rep}.h5"
    configs = ["--config", f"{CV}/base.ini"]
    for f in files:
        configs += ["--config", f"{CV}/{f}"]
    cmd = mpirun_command(ranks, args.binary, *configs, f"--train.max_iters={args.iters}",
                         "--train.eval=false", "--log.every=0", "--output.overwrite=true",
                         f"--output.file={out}", *extra, *args.extra)
    res = subprocess.run(cmd, cwd=ROOT, env=launch_env(), capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"{name}: run failed ({res.returncode}): {' '.join(cmd)}\n{res.stdout}\n"
                 f"{res.stderr}")
    return summary(ROOT / out)


def main():
    p = argparse.ArgumentParser(prog="scripts/bench cv_matrix", description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--binary", default=os.path.join(os.environ.get("BUILD_DIR", "build"),
                                                    "app/trainscope"))
    p.add_argument("--outdir", default="runs/bench_cv_matrix")
    p.add_argument("--only", nargs="*", help="run only these points (the baseline always runs)")
    p.add_argument("--extra", nargs="*", default=[], help="more trainscope options for every run")
    args = p.parse_args()
    points = [pt for pt in POINTS if not args.only or pt[0] == "baseline" or pt[0] in args.only]
    (ROOT / args.outdir).mkdir(parents=True, exist_ok=True)
    results = {pt[0]: [] for pt in points}
    for rep in range(args.repeats):
        k = rep % len(points)
        for pt in points[k:] + points[:k]:
            step, data = run_point(args, pt, rep)
            results[pt[0]].append((step, data))
            print(f"repeat {rep} {pt[0]:<18} step {step * 1e3:8.2f} ms  data {data * 1e3:7.3f} ms",
                  flush=True)

    def med(name, i):
        return statistics.median(r[i] for r in results[name])

    base_step, base_data = med("baseline", 0), med("baseline", 1)
    print(f"\nCV matrix on CPU ranks: MobileNetV2 width 0.5, Fashion-MNIST at 32x32 unless noted, "
          f"batch 64 per rank, {args.iters} iterations, median of {args.repeats} repeats")
    print(f"{'point':<18}{'ranks':>6}{'step ms':>10}{'x base':>8}{'data ms':>10}{'x base':>8}  note")
    for name, _, ranks, _, note in points:
        step, data = med(name, 0), med(name, 1)
        rel_data = data / base_data if base_data > 0 else float("nan")
        print(f"{name:<18}{ranks:>6}{step * 1e3:>10.2f}{step / base_step:>8.3f}"
              f"{data * 1e3:>10.3f}{rel_data:>8.3f}  {note}")
    print("tf32: not run (TF32 needs CUDA tensor cores; trainscope refuses it on CPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
