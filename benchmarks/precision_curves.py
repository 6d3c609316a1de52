"""Mixed and reduced precision loss curves against fp32's over a few hundred iterations.

Do mixed-precision loss curves track fp32? (issue 4, acceptance 2)
Runs inputs/cv/base.ini (MobileNetV2, Fashion-MNIST, 2 CPU ranks, same seed, same data order) for
--iters iterations once per precision, reads /iterations/loss back (per iteration the mean over
ranks: each rank's loss is the mean over its own batch), and compares every curve with fp32's:
  - smoothed: centred moving averages over --window iterations (single-batch losses are noisy and
    reduced precision changes the rounding of every step, so trajectories drift apart in detail
    while training the same way); the largest |difference| of the smoothed curves;
  - final: mean loss over the last --window iterations, relative to fp32's.
  - by applied steps: fp16-mixed skips the optimizer step when a gradient overflowed (the loss
    scaler's back-off, mostly in the first iterations), which shifts its curve in time; dropping
    the iterations whose step was skipped compares the losses after equally many updates.
A precision passes when the smoothed difference by applied steps stays within --tolerance (nats)
everywhere.
For scale, the same figures are printed for fp32 itself with another seed (--noise-seed): two fp32
runs that differ only in initialisation and data order.
"""

import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from trainscope_post import RunFile
from trainscope_jobs.launch import launch_env, mpirun_command

ROOT = Path(__file__).resolve().parent.parent


def run(args, precision, extra=()):
    out = Path(args.outdir) / f"{precision}{'_'.join(('',) + tuple(extra)).replace('--', '')}.h5"
    cmd = mpirun_command(args.ranks, args.binary, "--config", "inputs/cv/base.ini",
                         f"--run.precision={precision}", f"--train.max_iters={args.iters}",
                         "--train.eval=false", "--log.every=0", "--output.overwrite=true",
                         f"--output.file={out}", *extra)
    if not (args.reuse and (ROOT / out).exists()):
        res = subprocess.run(cmd, cwd=ROOT, env=launch_env(), capture_output=True, text=True)
        if res.returncode != 0:
            sys.exit(f"{precision}: run failed\n{res.stdout}\n{res.stderr}")
    with RunFile(ROOT / out) as run:
        # per iteration the mean over all ranks (the aggregates, or every rank's rows)
        loss = run.require_completed().over_ranks("loss", window="recorded")
        skipped = run.over_ranks("step_skipped", field="max", window="recorded")  # together
        step = float(run.summary["median_step_s"])
    return loss, skipped > 0, step


def smooth(x, w):
    k = np.ones(w) / w
    return np.convolve(x, k, mode="valid")


def main():
    p = argparse.ArgumentParser(prog="scripts/bench precision_curves", description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--iters", type=int, default=300)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--window", type=int, default=25)
    p.add_argument("--tolerance", type=float, default=0.15, help="nats, smoothed curves")
    p.add_argument("--noise-seed", type=int, default=43,
                   help="seed of the fp32 comparison run (0: skip it)")
    p.add_argument("--precisions", nargs="+", default=["bf16-mixed", "fp16-mixed", "bf16"])
    p.add_argument("--binary", default=os.path.join(os.environ.get("BUILD_DIR", "build"),
                                                    "app/trainscope"))
    p.add_argument("--outdir", default="runs/precision_curves")
    p.add_argument("--reuse", action="store_true",
                   help="read run files already in --outdir instead of running them again")
    args = p.parse_args()
    (ROOT / args.outdir).mkdir(parents=True, exist_ok=True)

    ref, _, ref_step = run(args, "fp32")
    ref_s = smooth(ref, args.window)
    print(f"loss curves vs fp32 over {args.iters} iterations, {args.ranks} ranks, moving average "
          f"over {args.window} iterations; tolerance {args.tolerance} nats")
    print(f"{'precision':<14}{'max|sm.diff|':>13}{'by steps':>10}{'mean|diff|':>11}"
          f"{'final':>8}{'fp32':>8}{'ratio':>7}{'skipped':>8}{'step ms':>9}  verdict")
    ok = True
    runs = [(p, ()) for p in args.precisions]
    if args.noise_seed:
        runs.append(("fp32", (f"--run.seed={args.noise_seed}",)))
    for prec, extra in runs:
        loss, skipped, step = run(args, prec, extra)
        if extra:
            prec = f"fp32 seed {args.noise_seed}"
        d = np.abs(smooth(loss, args.window) - ref_s)
        applied = loss[~skipped]
        n = len(applied)
        d_steps = np.abs(smooth(applied, args.window) - smooth(ref[:n], args.window))
        final, ref_final = loss[-args.window:].mean(), ref[-args.window:].mean()
        good = bool(np.all(np.isfinite(loss))) and d_steps.max() <= args.tolerance
        if not extra:
            ok &= good
        print(f"{prec:<14}{d.max():>13.4f}{d_steps.max():>10.4f}{np.abs(loss - ref).mean():>11.4f}"
              f"{final:>8.4f}{ref_final:>8.4f}{final / ref_final:>7.3f}{int(skipped.sum()):>8}"
              f"{step * 1e3:>9.1f}  "
              f"{('PASS' if good else 'FAIL') if not extra else '(for scale)'}")
    print(f"fp32 median step {ref_step * 1e3:.1f} ms")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
