"""The run file's flush and sync cost against the rank count, next to bare collectives (issue 39).

For each rank count of --ranks (default 8 and 64, oversubscribed here) and each repeat, two
programs run back to back at the same N:
  * trainscope, the tiny Llama LoRA (inputs/llm/lora-tiny.ini) for --iters iterations with
    output.flush_every=1 (a flush at every iteration) and the default output.sync_every_s (60 s:
    the preamble's sync and the status change's; a run here is shorter than 60 s);
  * the peer, build/tests/mpi_collective_latency: the collectives a flush and a sync make, alone
    (no HDF5, no training), each after a barrier, the largest rank's time, median of 20.

From the run file (/iterations/flush_s through its aggregate: per flush, over all ranks):
  flush (rank mean)      per flush the mean over ranks, median over flushes
  flush (largest rank)   per flush the largest rank's flush_s, median over flushes
  flush (mean of means)  per flush the mean over ranks, mean over flushes: what flushes cost a
                         rank in total ÷ their number, outliers included. At 64 ranks on 2 cores
                         some runs have a flush where one rank takes 1-155 ms instead of 0.2
                         (likely descheduled inside it: 32 runnable processes per core, so its
                         flush time then holds the others' time slices). Medians leave these
                         out; this figure keeps them
  flush outliers         flushes whose largest rank took more than 10x the median, per run
  sync                   /summary@flush_sync_total_s ÷ flush_syncs: the preamble's sync (HDF5's
                         metadata written collectively, MPI_File_sync on every rank, agreements)
From the peer: allreduce (12 doubles), barrier, bcast (4 KiB), file_sync (a pwrite, then
MPI_File_sync), and sync_like: the collectives of one sync as tests/mpi/test_run_file.cpp's
PMPI counter counts them (3 allreduces, 2 barriers, 10 broadcasts, a collective write,
MPI_File_sync) back to back: what a sync cannot cost less than on this machine at this N.

Per figure: the median over repeats at each N and the ratio of the largest N to the smallest.
Target (issue 39 (c)): a flush's ratio <= 2 (--target) for both medians. The sync's ratio is
printed next to sync_like's, for information: on 2 cores, 64 ranks are 32 per core, and a
blocking collective then waits until every process has been scheduled (the peer's ratios), so
a sync, which needs collectives, grows with N here whatever it does. Between 2 and 4 ranks the
sync grew faster than its collectives (4.3x against 2.6x: the fsync and HDF5's metadata writes,
not the collectives, dominate a sync at few ranks); between 8 and 64, slower (12.5x against 35x).

Needs build/app/trainscope and the peer (`ninja -C build mpi_collective_latency`; built here when
missing). Takes about 3 minutes with the defaults on 2 cores.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
from trainscope_post import RunFile
from trainscope_jobs.launch import launch_env, mpirun_command

ROOT = Path(__file__).resolve().parent.parent
PEER_FIGURES = ("allreduce", "barrier", "bcast", "file_sync", "sync_like")


def analyse(path):
    """Flush figures of one run file (seconds)."""
    with RunFile(path) as run:
        run.require_completed()
        mean = run.over_ranks("flush_s", field="mean", window="recorded")
        largest = run.over_ranks("flush_s", field="max", window="recorded")
        s = run.summary
        mean, largest = mean[np.isfinite(mean)], largest[np.isfinite(largest)]
        if mean.size == 0:
            raise ValueError(f"{path}: no flush_s rows (output.flush_every=1 expected)")
        syncs = int(s.get("flush_syncs", 0))
        return {
            "ranks": run.world_size,
            "flush_median": float(np.median(mean)),
            "flush_largest": float(np.median(largest)),
            "flush_mean": float(np.mean(mean)),
            "flush_outliers": int(np.sum(largest > 10 * np.median(largest))),
            "sync": float(s["flush_sync_total_s"]) / syncs if syncs else float("nan"),
            "flushes": int(s.get("flushes", 0)),
            "syncs": syncs,
        }


def run_trainscope(args, n, rep):
    out = ROOT / args.outdir / f"flush_{n}_{rep}.h5"
    cmd = mpirun_command(n, args.binary, "--config", "inputs/llm/lora-tiny.ini",
                         "--train.epochs=1000", "--train.batch_size=1",
                         "--llm.gradient_accumulation=1", "--llm.save_adapters=none",
                         f"--train.max_iters={args.iters}", "--output.flush_every=1",
                         "--log.every=0", "--output.overwrite=true", f"--output.file={out}",
                         *args.extra)
    res = subprocess.run(cmd, cwd=ROOT, env=launch_env(), capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"run failed ({res.returncode}): {' '.join(cmd)}\n{res.stdout}\n{res.stderr}")
    return analyse(out)


def run_peer(args, n, rep):
    target = ROOT / args.outdir / f"peer_{n}_{rep}.bin"
    cmd = mpirun_command(n, args.peer, target, str(args.peer_reps))
    res = subprocess.run(cmd, cwd=ROOT, env=launch_env(), capture_output=True, text=True)
    target.unlink(missing_ok=True)
    if res.returncode != 0:
        sys.exit(f"peer failed ({res.returncode}): {' '.join(cmd)}\n{res.stdout}\n{res.stderr}")
    line = [x for x in res.stdout.splitlines() if x.startswith("{")]
    if not line:
        sys.exit(f"peer printed no figures: {res.stdout}\n{res.stderr}")
    figures = json.loads(line[-1])
    return {k: figures[f"{k}_s"] for k in PEER_FIGURES}


def ensure_peer(args):
    if Path(args.peer).exists():
        return
    build = Path(args.binary).resolve().parent.parent
    print(f"building the peer: ninja -C {build} mpi_collective_latency", flush=True)
    subprocess.run(["ninja", "-C", str(build), "mpi_collective_latency"], check=True)


def report(ranks, results, target):
    lo, hi = min(ranks), max(ranks)
    med = {n: {k: statistics.median(r[k] for r in results[n]) for k in results[n][0]}
           for n in ranks}
    rows = [("flush (rank mean)", "flush_median"), ("flush (largest rank)", "flush_largest"),
            ("flush (mean of means)", "flush_mean"), ("sync", "sync")]
    rows += [(f"peer: {k}", k) for k in PEER_FIGURES]
    head = "".join(f"{f'{n} ranks [ms]':>16}" for n in ranks)
    print(f"\n{'median over repeats':<24}{head}{f'{hi} / {lo}':>10}")
    ratio = {}
    for label, key in rows:
        ratio[key] = med[hi][key] / med[lo][key]
        cells = "".join(f"{med[n][key] * 1e3:16.3f}" for n in ranks)
        print(f"{label:<24}{cells}{ratio[key]:10.2f}")
    for n in ranks:
        print(f"at {n} ranks: flush outliers (largest rank > 10x its median) per run: "
              f"{', '.join(str(r['flush_outliers']) for r in results[n])} of "
              f"{results[n][0]['flushes']} flushes")
    for n in ranks:
        print(f"at {n} ranks a sync costs {med[n]['sync'] / med[n]['sync_like']:.1f}x the bare "
              f"collectives of one sync (sync_like)")
    flush_ok = max(ratio["flush_median"], ratio["flush_largest"]) <= target
    print(f"\nflush {hi} / {lo}: rank mean {ratio['flush_median']:.2f}, largest rank "
          f"{ratio['flush_largest']:.2f} (target <= {target}: {'PASS' if flush_ok else 'FAIL'}); "
          f"mean of means {ratio['flush_mean']:.2f} (outliers included)")
    print(f"sync {hi} / {lo}: {ratio['sync']:.2f}, its bare collectives' (sync_like) "
          f"{ratio['sync_like']:.2f} (no target: the machine's collectives set the sync's growth)")
    return flush_ok


def main():
    p = argparse.ArgumentParser(prog="scripts/bench flush_scaling", description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ranks", default="8,64", help="comma-separated rank counts")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--peer-reps", type=int, default=20)
    p.add_argument("--target", type=float, default=2.0)
    build = os.environ.get("BUILD_DIR", "build")
    p.add_argument("--binary", default=os.path.join(build, "app/trainscope"))
    p.add_argument("--peer", default=os.path.join(build, "tests/mpi_collective_latency"))
    p.add_argument("--outdir", default="runs/bench_flush_scaling")
    p.add_argument("--extra", nargs="*", default=[], help="more trainscope options for every run")
    args = p.parse_args()
    try:
        ranks = sorted({int(x) for x in args.ranks.split(",") if x.strip()})
    except ValueError:
        p.error(f"--ranks {args.ranks!r}: comma-separated whole numbers, e.g. 8,64")
    if len(ranks) < 2 or ranks[0] < 1:
        p.error(f"--ranks {args.ranks!r}: at least two rank counts, each at least 1, e.g. 8,64")
    if args.repeats < 1 or args.iters < 2 or args.peer_reps < 1:
        p.error("--repeats and --peer-reps must be at least 1, --iters at least 2 (a flush "
                "precedes every iteration after the first)")
    ensure_peer(args)
    (ROOT / args.outdir).mkdir(parents=True, exist_ok=True)
    results = {n: [] for n in ranks}
    for rep in range(args.repeats):
        for n in ranks if rep % 2 == 0 else reversed(ranks):  # alternate the order
            r = run_trainscope(args, n, rep)
            r.update(run_peer(args, n, rep))
            results[n].append(r)
            print(f"repeat {rep} {n:>4} ranks: flush {r['flush_median'] * 1e3:.3f} ms (mean "
                  f"{r['flush_mean'] * 1e3:.3f}), largest "
                  f"{r['flush_largest'] * 1e3:.3f} ms, sync {r['sync'] * 1e3:.1f} ms; peer "
                  f"sync_like {r['sync_like'] * 1e3:.2f} ms, allreduce "
                  f"{r['allreduce'] * 1e3:.3f} ms",
                  flush=True)
    return 0 if report(ranks, results, args.target) else 1


if __name__ == "__main__":
    sys.exit(main())
