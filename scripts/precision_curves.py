"""Do mixed-precision loss curves track fp32? (issue 4, acceptance 2)

Runs inputs/cv/base.ini (MobileNetV2, Fashion-MNIST, 2 CPU ranks, same seed, same data order) for
--iters iterations once per precision, reads /iterations/loss back (per iteration the mean over
ranks: each rank's loss is the mean over its own batch), and compares every curve with fp32's:
  - smoothed: centred moving averages over --window iterations (single-batch losses are noisy and
    reduced precision changes the rounding of every step, so trajectories drift apart in detail
    while training the same way); the largest |difference| of the smoothed curves;
  - final: mean loss over the last --window iterations, relative to fp32's.
A precision passes when the smoothed difference stays within --tolerance (nats) everywhere.
"""

import argparse
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def run(args, precision):
    out = Path(args.outdir) / f"{precision}.h5"
    cmd = [str(ROOT / "scripts/mpirun"), "-np", str(args.ranks), args.binary, "--config",
           "inputs/cv/base.ini", f"--run.precision={precision}", f"--train.max_iters={args.iters}",
           "--train.eval=false", "--log.every=0", "--output.overwrite=true", f"--output.file={out}"]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"{precision}: run failed\n{res.stdout}\n{res.stderr}")
    with h5py.File(ROOT / out, "r") as f:
        loss = f["iterations/loss"][...]
        skipped = f["iterations/step_skipped"][0].sum()
        step = float(f["summary"].attrs["median_step_s"])
    return loss.mean(axis=0), int(skipped), step


def smooth(x, w):
    k = np.ones(w) / w
    return np.convolve(x, k, mode="valid")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--iters", type=int, default=300)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--window", type=int, default=25)
    p.add_argument("--tolerance", type=float, default=0.1, help="nats, smoothed curves")
    p.add_argument("--precisions", nargs="+", default=["bf16-mixed", "fp16-mixed", "bf16"])
    p.add_argument("--binary", default=os.path.join(os.environ.get("BUILD_DIR", "build"),
                                                    "app/trainscope"))
    p.add_argument("--outdir", default="runs/precision_curves")
    args = p.parse_args()
    (ROOT / args.outdir).mkdir(parents=True, exist_ok=True)

    ref, _, ref_step = run(args, "fp32")
    ref_s = smooth(ref, args.window)
    print(f"loss curves vs fp32 over {args.iters} iterations, {args.ranks} ranks, moving average "
          f"over {args.window} iterations; tolerance {args.tolerance} nats")
    print(f"{'precision':<12}{'max |smoothed diff|':>20}{'mean |diff|':>13}{'final loss':>12}"
          f"{'fp32 final':>12}{'ratio':>8}{'skipped':>9}{'step ms':>9}  verdict")
    ok = True
    for prec in args.precisions:
        loss, skipped, step = run(args, prec)
        d = np.abs(smooth(loss, args.window) - ref_s)
        final, ref_final = loss[-args.window:].mean(), ref[-args.window:].mean()
        good = bool(np.all(np.isfinite(loss))) and d.max() <= args.tolerance
        ok &= good
        print(f"{prec:<12}{d.max():>20.4f}{np.abs(loss - ref).mean():>13.4f}{final:>12.4f}"
              f"{ref_final:>12.4f}{final / ref_final:>8.3f}{skipped:>9}{step * 1e3:>9.1f}  "
              f"{'PASS' if good else 'FAIL'}")
    print(f"fp32 median step {ref_step * 1e3:.1f} ms")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
