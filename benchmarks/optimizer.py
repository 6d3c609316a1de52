"""The optimizer phase before and after the fused kernels (train.fused_optimizer=false vs true).

Same binary, same runs, alternating within every repeat (order rotated between repeats): the per-
parameter loop of LibTorch's torch::optim::SGD/AdamW (and ZeRO/FSDP's per-shard arithmetic) against
ATen's fused multi-tensor kernels (_fused_sgd_, _fused_adamw_) with the multi-tensor gradient scale
and non-finite check. Each run's median_optimizer_s and median_step_s come from its /summary (per
iteration the mean over ranks, then the median over the measured iterations). Workloads:
  cv        MobileNetV2 (158 tensors), SGD with momentum, synthetic data, --ranks ranks
  llm       tiny Llama, full fine-tuning (AdamW on every weight), --ranks ranks (DDP)
  llm-fsdp  the same at dist.zero=3 (one fused call for every unit's shards)
Prints the median over repeats of each phase median and the paired fused/loop ratio.
"""

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from trainscope_post import RunFile
from trainscope_jobs.launch import launch_env, mpirun_command

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = {
    "cv": ["--config", str(ROOT / "inputs/quickstart.ini"), "--data.dataset=synthetic",
           "--train.eval=false", "--train.epochs=100", "--train.optimizer=sgd",
           "--train.momentum=0.9"],
    "llm": ["--config", str(ROOT / "inputs/llm/full-tiny.ini"), "--train.epochs=100",
            "--llm.gradient_accumulation=1"],
    "llm-fsdp": ["--config", str(ROOT / "inputs/llm/full-tiny.ini"), "--train.epochs=100",
                 "--llm.gradient_accumulation=1", "--dist.zero=3"],
}


def run_once(binary, workload, fused, a, out):
    args = [*WORKLOADS[workload], f"--output.file={out}", "--output.overwrite=true",
            f"--train.max_iters={a.iters}", f"--profile.warmup_iters={a.warmup}",
            "--log.every=0", "--telemetry.enabled=false", "--run.threads=1",
            f"--train.fused_optimizer={'true' if fused else 'false'}"]
    p = subprocess.run(mpirun_command(a.ranks, str(binary), *args), cwd=ROOT, env=launch_env(),
                       capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        sys.exit(f"{workload} (fused={fused}) failed with exit {p.returncode}:\n{p.stdout}\n"
                 f"{p.stderr}")
    with RunFile(out) as rf:
        s = rf.require_completed().summary
        return {k: float(s.get(f"median_{k}_s", math.nan)) for k in ("optimizer", "step")}


def main():
    ap = argparse.ArgumentParser(prog="scripts/bench optimizer", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", type=Path,
                    default=ROOT / os.environ.get("BUILD_DIR", "build") / "app/trainscope")
    ap.add_argument("--workloads", default="cv,llm,llm-fsdp")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    if not a.binary.is_file():
        sys.exit(f"no binary at {a.binary}: scripts/build")
    print(f"optimizer phase: {a.ranks} ranks, {a.iters} iterations ({a.warmup} warm-up), "
          f"{a.repeats} interleaved repeats, 1 thread per rank")
    print(f"  {'workload':<10} {'loop opt [ms]':>14} {'fused opt [ms]':>15} {'fused/loop':>11}"
          f" {'loop step [ms]':>15} {'fused step [ms]':>16}")
    with tempfile.TemporaryDirectory(prefix="ts-optim-") as tmp:
        for w in a.workloads.split(","):
            res = {False: [], True: []}
            for rep in range(a.repeats):
                for fused in ((False, True) if rep % 2 == 0 else (True, False)):
                    res[fused].append(run_once(a.binary, w, fused, a,
                                               Path(tmp) / f"{w}_{fused}_{rep}.h5"))
            med = {f: {k: statistics.median(r[k] for r in res[f]) for k in ("optimizer", "step")}
                   for f in res}
            ratio = statistics.median(res[True][i]["optimizer"] / res[False][i]["optimizer"]
                                      for i in range(a.repeats))
            print(f"  {w:<10} {med[False]['optimizer'] * 1e3:14.2f} "
                  f"{med[True]['optimizer'] * 1e3:15.2f} {ratio:11.2f} "
                  f"{med[False]['step'] * 1e3:15.1f} {med[True]['step'] * 1e3:16.1f}", flush=True)


if __name__ == "__main__":
    main()
