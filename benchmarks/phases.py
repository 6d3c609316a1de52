"""Phase split of two trainscope builds on the same runs: median comm_wait, control, step (CV and LLM).

Answers "did a change move time between phases, and what did it cost?": a baseline binary (e.g. a
build of an older commit) and a candidate binary (default: $BUILD_DIR/app/trainscope) run the same
CV configuration (the quick start, synthetic data) and the same LLM configuration (lora-tiny) at
--ranks ranks, alternating within every repeat and rotating the order between repeats, so drifts of
the machine hit both alike. Each run's medians come from its /summary (trainscope_post.RunFile):
median_<phase>_s is per iteration the mean over ranks, then the median over the measured iterations.
A baseline without the `control` phase reports it as n/a (its control work was inside comm_wait).

Prints per workload and binary the median over repeats of each phase median, and the paired
candidate/baseline ratios of comm_wait and step (median over repeats of the per-repeat ratios).
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
PHASES = ("data", "forward", "backward", "comm_wait", "control", "optimizer", "step")
WORKLOADS = {
    "cv": ["--config", str(ROOT / "inputs/quickstart.ini"), "--data.dataset=synthetic",
           "--train.eval=false", "--train.epochs=100"],
    "llm": ["--config", str(ROOT / "inputs/llm/lora-tiny.ini"), "--train.epochs=100"],
}


def run_once(binary: Path, workload: str, a: argparse.Namespace, out: Path) -> dict:
    args = [*WORKLOADS[workload], f"--output.file={out}", "--output.overwrite=true",
            f"--train.max_iters={a.iters}", f"--profile.warmup_iters={a.warmup}",
            "--log.every=0", "--telemetry.enabled=false", "--run.threads=1"]
    cmd = mpirun_command(a.ranks, str(binary), *args)
    p = subprocess.run(cmd, cwd=ROOT, env=launch_env(), capture_output=True, text=True,
                       timeout=1800)
    if p.returncode != 0:
        sys.exit(f"{binary} ({workload}) failed with exit {p.returncode}:\n{p.stdout}\n{p.stderr}")
    with RunFile(out) as rf:
        rf.require_completed()
        s = rf.summary
        return {ph: float(s.get(f"median_{ph}_s", math.nan)) for ph in PHASES}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=True, type=Path, help="the binary to compare against")
    ap.add_argument("--candidate", type=Path,
                    default=ROOT / os.environ.get("BUILD_DIR", "build") / "app/trainscope")
    ap.add_argument("--workloads", default="cv,llm", help="comma-separated: cv, llm")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    binaries = {"baseline": a.baseline.resolve(), "candidate": a.candidate.resolve()}
    for name, b in binaries.items():
        if not b.is_file():
            sys.exit(f"--{name}: no binary at {b}")
    print(f"phases: {a.ranks} ranks, {a.iters} iterations ({a.warmup} warm-up), {a.repeats} "
          f"interleaved repeats\n  baseline  {binaries['baseline']}\n  candidate "
          f"{binaries['candidate']}")
    with tempfile.TemporaryDirectory(prefix="ts-phases-") as tmp:
        for workload in a.workloads.split(","):
            res = {k: [] for k in binaries}
            for rep in range(a.repeats):
                order = list(binaries) if rep % 2 == 0 else list(reversed(binaries))
                for name in order:
                    res[name].append(run_once(binaries[name], workload, a,
                                              Path(tmp) / f"{workload}_{name}_{rep}.h5"))
            print(f"\n{workload}: median over repeats of each run's median [ms]")
            print(f"  {'phase':<11}" + "".join(f"{k:>12}" for k in binaries))
            for ph in PHASES:
                cells = []
                for k in binaries:
                    v = [r[ph] for r in res[k] if not math.isnan(r[ph])]
                    cells.append(f"{statistics.median(v) * 1e3:12.2f}" if v else f"{'n/a':>12}")
                print(f"  {ph:<11}" + "".join(cells))
            for ph in ("comm_wait", "step"):
                ratios = [c[ph] / b[ph] for b, c in zip(res["baseline"], res["candidate"])
                          if b[ph] > 0]
                per = ", ".join(f"{x:.3f}" for x in ratios)
                print(f"  candidate/baseline {ph}: {statistics.median(ratios):.3f} (repeats: {per})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
