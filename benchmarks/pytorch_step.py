#!/usr/bin/env python3
"""Median MobileNetV2 training step, trainscope vs PyTorch (DDP), on 1 and 2 ranks, CPU or GPU.

Runs trainscope and a PyTorch reference alternately (never concurrently) on 1 and 2 MPI ranks and
prints, per rank count, both median step times and the ratio trainscope / PyTorch (target <= 1.0).
This is a benchmark, not a test: it measures, it does not assert. Entry point:
scripts/bench pytorch_step.

Fairness rules (both sides get the same work; the output repeats them):
  model     torchvision.models.mobilenet_v2(num_classes=10) (width 1.0, dropout 0.2) vs trainscope's
            MobileNetV2 (same layout, 2,236,682 parameters; both checked); train mode
  data      fp32, 3 channels, per-rank batch B, image side S. Each iteration builds its batch in the
            training thread from a pre-generated uint8 [N, 1, 28, 28] set, exactly as trainscope's
            synthetic dataset with data.workers=0 (modules/data: Loader::build + AdaptedTransform):
            index_select of B shuffled rows (images and labels), to float32, one multiply-add that
            scales to [0, 1] and normalises with mean = std = 0.5 (equal to normalising after the
            resize, because bilinear weights sum to 1), bilinear resize to S (align_corners=False,
            no antialias; skipped at S = 28), repeat to 3 channels into a new [B, 3, S, S] tensor
  step      batch build + forward + cross-entropy + backward (+ gradient averaging) + SGD step
            (lr 0.05, momentum 0.9, weight decay 4e-5, constant lr) + zero_grad
  threads   1 intra-op thread per rank (torch.set_num_threads(1) / --run.threads=1),
            1 inter-op thread, OMP_NUM_THREADS=1; both launched by the same mpirun command line
            (trainscope_jobs.launch, as scripts/mpirun; Open MPI binds each rank to one core)
  ranks     PyTorch: torch.distributed gloo over mpirun (RANK/WORLD_SIZE from OMPI_COMM_WORLD_*),
            DistributedDataParallel with its defaults (bucket_cap_mb=25, broadcast_buffers=True),
            also on 1 rank (a world of 1) unless --pytorch-1rank=plain; trainscope: strategy ddp-ds,
            MPI backend, dist.bucket_mb=25 (it broadcasts batch-norm buffers every step like DDP)
  malloc    trainscope runs with its default run.host_memory=retain (glibc keeps freed blocks up
            to 32 MiB, no heap trimming: an iteration's tensors reuse the previous iteration's
            pages instead of faulting in fresh ones); PyTorch with glibc's defaults, as it runs
            out of the box, or with --pytorch-malloc=retain the same policy via GLIBC_TUNABLES.
            Run both to see how much of the ratio is the allocator and how much is the loop
  timing    per iteration wall time (time.perf_counter around the whole step; trainscope's steady
            clock around data..optimizer), mean over ranks per iteration, median over the measured
            iterations after the same warm-up: trainscope's /summary median_step_s
  device    --device cuda (scripts/gpu-check): one GPU per rank (local rank modulo the visible
            GPUs); PyTorch builds each batch on the host as above, copies it to the GPU and runs
            DDP over NCCL, synchronising the device before every clock read (so its phases and
            steps are device-complete) only with --pytorch-timing sync; by default
            (--pytorch-timing events) both sides time their phases and steps with CUDA events
            recorded on the stream and never synchronize inside the loop, so each may build the
            next batch on the host while the device runs the previous step; trainscope runs
            run.device=cuda, dist.backend=nccl. Threads and malloc as on CPU. img/s = ranks x
            batch / median step
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trainscope_jobs.launch import launch_env, mpirun_command

REPO = Path(__file__).resolve().parent.parent
EXPECTED_PARAMETERS = 2_236_682  # MobileNetV2, width 1.0, 10 classes
MNIST_SIDE = 28                  # trainscope's synthetic images are 1x28x28 uint8
NUM_CLASSES = 10
LR, MOMENTUM, WEIGHT_DECAY = 0.05, 0.9, 4e-5
RESULT_TAG = "BENCH_PYTORCH_RESULT "
# Phases reported by both sides; trainscope's backward and comm_wait are summed to match PyTorch,
# where DDP waits for its allreduces inside loss.backward().
PHASES = ("data", "forward", "backward", "optimizer")


# ----------------------------------------------------------------------------------------------
# PyTorch reference (one process per rank, started by mpirun)
# ----------------------------------------------------------------------------------------------
def pytorch_worker(a: argparse.Namespace) -> int:
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a.port))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # single node: loopback, like MASTER_ADDR
    os.environ["OMP_NUM_THREADS"] = "1"  # before torch is imported

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    import torchvision

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    cuda = a.device == "cuda"
    if cuda:
        if not torch.cuda.is_available():
            print("scripts/bench pytorch_step: --device cuda but PyTorch sees no GPU "
                  "(torch.cuda.is_available() is False)", file=sys.stderr, flush=True)
            os._exit(2)
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    B, S, W, M = a.batch, a.image_size, a.warmup, a.iters
    torch.manual_seed(42)
    model = torchvision.models.mobilenet_v2(num_classes=NUM_CLASSES)  # width 1.0, dropout 0.2
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    model.to(device).train()
    use_ddp = world > 1 or a.pytorch_1rank == "ddp"
    if use_ddp:  # bucket_cap_mb=25 default
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)

    # This rank's shard of the synthetic set: one batch per iteration, shuffled like a sampler.
    n = (W + M) * B
    g = torch.Generator().manual_seed(1000 + rank)
    images = torch.randint(0, 256, (n, 1, MNIST_SIDE, MNIST_SIDE), dtype=torch.uint8,
                           generator=g)                                      # [N, 1, 28, 28]
    labels = torch.randint(0, NUM_CLASSES, (n,), dtype=torch.int64, generator=g)  # [N]
    order = torch.randperm(n, generator=g)                                    # [N]
    mean = std = 0.5  # trainscope's synthetic set statistics

    def build_batch(k: int):
        idx = order[k * B:(k + 1) * B]                                        # [B]
        x = images.index_select(0, idx)                                       # [B, 1, 28, 28] u8
        y = labels.index_select(0, idx)                                       # [B]
        x = x.to(torch.float32).mul_(1.0 / (255.0 * std)).add_(-mean / std)  # [B, 1, 28, 28]
        if S != MNIST_SIDE:
            x = F.interpolate(x, size=(S, S), mode="bilinear", align_corners=False,
                              antialias=False)                                # [B, 1, S, S]
        out = torch.empty((B, 3, S, S), dtype=torch.float32)                  # [B, 3, S, S]
        out.copy_(x.expand(B, 3, S, S))
        return out.to(device), y.to(device)

    zero_to_none = a.pytorch_zero_grad == "none"
    clock = time.perf_counter
    times = torch.zeros((W + M, 1 + len(PHASES)), dtype=torch.float64)  # step, then phases
    # On a GPU with --pytorch-timing events (default), as trainscope's PhaseTimer: CUDA events
    # recorded on the stream at the phase boundaries, no synchronize inside the loop, so the host
    # may build the next batch while the device still runs the previous step (PyTorch's own
    # loop). --pytorch-timing sync: a synchronize before every clock read (device-complete
    # phases; the host's batch building can then never overlap the device's work).
    events = cuda and a.pytorch_timing == "events"
    marks = [[torch.cuda.Event(enable_timing=True) for _ in range(5)]
             for _ in range(W + M)] if events else None
    for k in range(W + M):
        t = [0.0] * 5

        def mark(j):
            if events:
                marks[k][j].record()
            else:
                sync()
                t[j] = clock()

        mark(0)
        x, y = build_batch(k)
        mark(1)
        loss = F.cross_entropy(model(x), y)
        mark(2)
        loss.backward()  # DDP: bucketed allreduces overlap and are waited for in here
        mark(3)
        opt.step()
        opt.zero_grad(set_to_none=zero_to_none)
        mark(4)
        if not events:
            times[k] = torch.tensor([t[4] - t[0], t[1] - t[0], t[2] - t[1], t[3] - t[2],
                                     t[4] - t[3]], dtype=torch.float64)
    if events:
        torch.cuda.synchronize()
        for k in range(W + M):
            e = marks[k]
            times[k] = torch.tensor([e[0].elapsed_time(e[4]), e[0].elapsed_time(e[1]),
                                     e[1].elapsed_time(e[2]), e[2].elapsed_time(e[3]),
                                     e[3].elapsed_time(e[4])], dtype=torch.float64) / 1e3

    # As trainscope's Recorder: step and phases = mean over ranks per iteration.
    step = times[:, 0].clone()
    phases = times[:, 1:].clone()
    if world > 1:
        step, phases = step.to(device), phases.to(device)
        dist.all_reduce(step, op=dist.ReduceOp.SUM)
        dist.all_reduce(phases, op=dist.ReduceOp.SUM)
        step, phases = step.cpu() / world, phases.cpu() / world
    if rank == 0:
        result = {
            "ranks": world,
            "parameters": n_params,
            "ddp": use_ddp,
            "median_step_s": statistics.median(step[W:].tolist()),
            "mean_step_s": float(step[W:].mean()),
            "phases": {name: statistics.median(phases[W:, i].tolist())
                       for i, name in enumerate(PHASES)},
            "threads": torch.get_num_threads(),
            "interop_threads": torch.get_num_interop_threads(),
            "torch": torch.__version__,
            "device": torch.cuda.get_device_name(device) if cuda else "cpu",
            "last_loss": float(loss.detach()),
        }
        print(RESULT_TAG + json.dumps(result), flush=True)
    # The all_reduce above already synchronised the ranks and the result is out. gloo's teardown
    # (barrier + destroy_process_group) occasionally hangs one rank on this machine (seen 2 times in
    # 12 runs), which would cost a timeout for nothing: leave without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ----------------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# trainscope's run.host_memory=retain as glibc tunables: the same malloc policy for a PyTorch
# process, which cannot call mallopt itself before its first allocations.
GLIBC_RETAIN = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=2147483647"


def child_env(malloc: str = "default") -> dict:
    extra = {"GLIBC_TUNABLES": GLIBC_RETAIN} if malloc == "retain" else {}
    return launch_env(OMP_NUM_THREADS="1", **extra)


def run_logged(cmd: list[str], log: Path, timeout: float, malloc: str = "default") -> str:
    """Runs cmd, keeps its output in log; raises with the output's tail on failure."""
    t0 = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env=child_env(malloc), timeout=timeout, cwd=REPO)
    log.write_text("$ " + shlex.join(cmd) + "\n" + p.stdout)
    if p.returncode != 0:
        tail = "\n".join(p.stdout.splitlines()[-25:])
        raise RuntimeError(f"command failed (exit {p.returncode}, {time.monotonic() - t0:.0f} s): "
                           f"{shlex.join(cmd)}\n--- last lines (full log: {log}) ---\n{tail}")
    return p.stdout


def run_pytorch(a: argparse.Namespace, ranks: int, tmp: Path, tag: str) -> dict:
    cmd = mpirun_command(ranks, sys.executable, Path(__file__).resolve(), "--pytorch-worker",
                         "--port", free_port(), "--batch", a.batch, "--image-size", a.image_size,
                         "--iters", a.iters, "--warmup", a.warmup, "--pytorch-1rank",
                         a.pytorch_1rank, "--pytorch-zero-grad", a.pytorch_zero_grad,
                         "--device", a.device, "--pytorch-timing", a.pytorch_timing)
    out = run_logged(cmd, tmp / f"pytorch_np{ranks}_{tag}.log", a.timeout, a.pytorch_malloc)
    for line in out.splitlines():
        if line.startswith(RESULT_TAG):
            r = json.loads(line[len(RESULT_TAG):])
            if r["parameters"] != EXPECTED_PARAMETERS:
                raise RuntimeError(f"torchvision MobileNetV2 has {r['parameters']} parameters, "
                                   f"expected {EXPECTED_PARAMETERS}: not the same model")
            return r
    raise RuntimeError(f"PyTorch run printed no result line; see {tmp}/pytorch_np{ranks}_{tag}.log")


def trainscope_command(a: argparse.Namespace, ranks: int, out: Path) -> list[str]:
    total = a.warmup + a.iters
    # Every option that decides the work is spelled out, so a changed default cannot skew this.
    opts = {
        "run.workload": "cv", "run.strategy": "ddp-ds", "run.device": a.device,
        "dist.backend": "nccl" if a.device == "cuda" else "mpi",
        "run.precision": "fp32", "run.threads": 1, "dist.bucket_mb": 25,
        "run.host_memory": a.trainscope_malloc,
        "data.dataset": "synthetic", "data.workers": 0, "data.drop_last": "true",
        # ddp-ds gives each rank 1/ranks of the set: enough for every iteration in one epoch.
        "data.synthetic_samples": total * a.batch * ranks, "data.synthetic_classes": NUM_CLASSES,
        "cv.image_size": a.image_size, "cv.channels": 3, "cv.width_mult": 1.0, "cv.dropout": 0.2,
        "train.batch_size": a.batch, "train.epochs": 1, "train.max_iters": total,
        "train.optimizer": "sgd", "train.lr": LR, "train.momentum": MOMENTUM,
        "train.weight_decay": WEIGHT_DECAY, "train.nesterov": "false",
        "train.schedule": "constant", "train.warmup_iters": 0, "train.eval": "false",
        "profile.warmup_iters": a.warmup, "log.every": 0,
        "output.file": out, "output.overwrite": "true",
    }
    return mpirun_command(ranks, a.trainscope, *[f"--{k}={v}" for k, v in opts.items()],
                          *shlex.split(a.trainscope_args))


def run_trainscope(a: argparse.Namespace, ranks: int, tmp: Path, tag: str) -> dict:
    from trainscope_post import IncompleteRunError, RunFile

    out = tmp / f"ts_np{ranks}_{tag}.h5"
    run_logged(trainscope_command(a, ranks, out), tmp / f"trainscope_np{ranks}_{tag}.log",
               a.timeout)
    with RunFile(out) as run:
        try:
            run.require_completed()
        except IncompleteRunError as e:
            raise RuntimeError(f"trainscope run file {e}") from e
        s, plan = run.summary, run.plan
    if int(s["measured_iterations"]) != a.iters or int(s["warmup_iterations"]) != a.warmup:
        raise RuntimeError(f"{out}: measured {s['measured_iterations']} iterations after "
                           f"{s['warmup_iterations']} warm-up, expected {a.iters} after "
                           f"{a.warmup} (too few synthetic samples?)")
    params = int(plan.get("parameters", EXPECTED_PARAMETERS))
    if params != EXPECTED_PARAMETERS:
        raise RuntimeError(f"trainscope's MobileNetV2 has {params} parameters, expected "
                           f"{EXPECTED_PARAMETERS}: not the same model")
    phase = lambda n: float(s.get(f"median_{n}_s", float("nan")))
    return {
        "median_step_s": float(s["median_step_s"]),
        "mean_step_s": float(s["mean_step_s"]),
        # Medians of per-phase series; trainscope's h2d (a no-op copy on CPU) joins data.
        "phases": {"data": phase("data") + phase("h2d"), "forward": phase("forward"),
                   "backward": phase("backward") + phase("comm_wait"),
                   "optimizer": phase("optimizer")},
        "threads": int(plan.get("threads_per_rank", -1)),
    }


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    fmt = lambda r: " | ".join(c.rjust(w) for c, w in zip(r, widths))
    return "\n".join([fmt(header), "-+-".join("-" * w for w in widths)] + [fmt(r) for r in rows])


def settings_line(a: argparse.Namespace) -> str:
    pt_backend = "nccl" if a.device == "cuda" else "gloo"
    ts_backend = "NCCL" if a.device == "cuda" else "MPI"
    return (f"settings: {a.device}, MobileNetV2 (10 classes, width 1.0, dropout 0.2, "
            f"2,236,682 parameters), "
            f"fp32, batch {a.batch}/rank, 3x{a.image_size}x{a.image_size} from uint8 1x28x28 "
            f"(bilinear, built each iteration in the training thread), SGD lr {LR} momentum "
            f"{MOMENTUM} wd {WEIGHT_DECAY}, 1 intra-op + 1 inter-op thread/rank, OMP_NUM_THREADS=1, "
            f"{a.warmup} warm-up + {a.iters} measured iterations, {a.repeats} repeat(s); "
            f"PyTorch {'DDP' if a.pytorch_1rank == 'ddp' else 'plain model'} on 1 rank, DDP "
            f"({pt_backend}, bucket 25 MiB) on more; zero_grad(set_to_none="
            f"{a.pytorch_zero_grad == 'none'}); trainscope: {ts_backend} backend, bucket 25 MiB, "
            f"zero_grad(set_to_none=False); host malloc: trainscope run.host_memory="
            f"{a.trainscope_malloc}, PyTorch "
            f"{'the same (GLIBC_TUNABLES)' if a.pytorch_malloc == 'retain' else 'glibc defaults'}"
            f"; step = mean over ranks, median over iterations"
            + (f"; GPU timing: PyTorch {a.pytorch_timing}, trainscope events"
               if a.device == "cuda" else ""))


def driver(a: argparse.Namespace) -> int:
    ranks_list = [int(r) for r in a.ranks.split()]
    run_ts = a.only in (None, "trainscope")
    run_pt = a.only in (None, "pytorch")
    if run_ts and not a.trainscope.is_file():
        print(f"scripts/bench pytorch_step: trainscope binary {a.trainscope} not found: build it first "
              f"(scripts/build trainscope) or pass --trainscope PATH", file=sys.stderr)
        return 2
    try:
        import trainscope_post  # noqa: F401  (its run file reader needs h5py)
    except ImportError as e:
        if run_ts:
            print(f"scripts/bench pytorch_step: {e}: run it through scripts/bench (the trainscope "
                  f"venv's python, PYTHONPATH=postprocess)", file=sys.stderr)
            return 2

    keep = a.keep_tmp
    tmp = Path(tempfile.mkdtemp(prefix="bench_pytorch_step."))
    print(__doc__[__doc__.index("Fairness rules"):].rstrip())
    print()
    print(settings_line(a))
    print(f"logs and run files: {tmp}" +
          ("" if keep else " (removed after a successful run; --keep-tmp keeps them)"))
    print(flush=True)

    results: dict[int, dict[str, list]] = {n: {"ts": [], "pt": []} for n in ranks_list}
    for n in ranks_list:
        for rep in range(a.repeats):
            tag = f"r{rep}"
            # Alternate: trainscope first, then PyTorch, never at the same time.
            if run_ts:
                t = run_trainscope(a, n, tmp, tag)
                results[n]["ts"].append(t)
                print(f"  np {n} repeat {rep + 1}/{a.repeats}: trainscope median step "
                      f"{t['median_step_s']:.4f} s", flush=True)
            if run_pt:
                p = run_pytorch(a, n, tmp, tag)
                results[n]["pt"].append(p)
                print(f"  np {n} repeat {rep + 1}/{a.repeats}: PyTorch    median step "
                      f"{p['median_step_s']:.4f} s  (threads {p['threads']}, interop "
                      f"{p['interop_threads']}, torch {p['torch']})", flush=True)
    if not keep:  # after a failure the logs stay for inspection
        shutil.rmtree(tmp)

    def med(rs, key="median_step_s"):
        return statistics.median(r[key] for r in rs) if rs else float("nan")

    rows, prow = [], []
    for n in ranks_list:
        ts, pt = results[n]["ts"], results[n]["pt"]
        ratios = [t["median_step_s"] / p["median_step_s"] for t, p in zip(ts, pt)]
        ratio = statistics.median(ratios) if ratios else float("nan")
        num = lambda x, digits: "-" if x != x else f"{x:.{digits}f}"  # NaN: side not run
        rows.append([str(n), num(med(ts), 4), num(med(pt), 4), num(n * a.batch / med(ts), 1),
                     num(n * a.batch / med(pt), 1), num(ratio, 3),
                     " ".join(f"{r:.3f}" for r in ratios) or "-"])
        for who, rs in (("trainscope", ts), ("PyTorch", pt)):
            if rs:
                prow.append([str(n), who] + [f"{statistics.median(r['phases'][ph] for r in rs):.4f}"
                                             for ph in PHASES])
    print()
    print(table(rows, ["ranks", "trainscope median step [s]", "PyTorch median step [s]",
                       "trainscope [img/s]", "PyTorch [img/s]", "ratio ts/pt",
                       "ratio per repeat"]))
    print()
    print("phase medians [s] (per iteration mean over ranks; trainscope backward includes "
          "comm_wait, data includes h2d):")
    print(table(prow, ["ranks", "side"] + list(PHASES)))
    print()
    print(settings_line(a))
    print("target: ratio <= 1.0 (trainscope no slower than PyTorch)")
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scripts/bench pytorch_step",
        description="Median MobileNetV2 training-step time of trainscope vs PyTorch (Python) on "
                    "1 and 2 MPI ranks, with the same model, data work, threads and timing.")
    p.add_argument("--iters", type=int, default=40, help="measured iterations (default 40)")
    p.add_argument("--warmup", type=int, default=10, help="warm-up iterations (default 10)")
    p.add_argument("--batch", type=int, default=64, help="per-rank batch (default 64)")
    p.add_argument("--image-size", type=int, default=64,
                   help="network input side, >= 32 (default 64)")
    p.add_argument("--ranks", default="1 2", help='rank counts, e.g. "1 2" (default)')
    p.add_argument("--repeats", type=int, default=1,
                   help="trainscope/PyTorch pairs per rank count; the ratio is their median")
    p.add_argument("--only", choices=("trainscope", "pytorch"),
                   help="run one side only (for debugging)")
    p.add_argument("--trainscope", type=Path,
                   default=Path(os.environ.get("TRAINSCOPE_BIN",
                                               REPO / os.environ.get("BUILD_DIR", "build") /
                                               "app" / "trainscope")),
                   help="trainscope binary (default $TRAINSCOPE_BIN or $BUILD_DIR/app/trainscope)")
    p.add_argument("--trainscope-args", default="",
                   help="extra trainscope options appended last (e.g. to try a setting)")
    p.add_argument("--pytorch-1rank", choices=("ddp", "plain"), default="ddp",
                   help="PyTorch on 1 rank: DDP over a world of 1 (default) or the plain model")
    p.add_argument("--pytorch-zero-grad", choices=("none", "zero"), default="none",
                   help="PyTorch zero_grad: set_to_none=True (default, PyTorch's own default) "
                        "or zero the tensors like trainscope")
    p.add_argument("--trainscope-malloc", choices=("retain", "release"), default="retain",
                   help="trainscope's run.host_memory (default retain, trainscope's default)")
    p.add_argument("--pytorch-malloc", choices=("default", "retain"), default="default",
                   help="PyTorch's host malloc: glibc defaults (default, as PyTorch runs out of "
                        "the box) or trainscope's retain policy through GLIBC_TUNABLES, to "
                        "separate the allocator's share of the ratio from the loop's")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cpu (default) or cuda: one GPU per rank, NCCL on both sides")
    p.add_argument("--pytorch-timing", choices=("events", "sync"), default="events",
                   help="on a GPU: PyTorch's phases and step timed by CUDA events with no "
                        "synchronize in the loop, as trainscope times its own (default), or "
                        "with a device synchronize before every clock read (device-complete "
                        "phases, no overlap of batch building with the previous step)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per run")
    p.add_argument("--keep-tmp", action="store_true", help="keep logs and run files")
    p.add_argument("--pytorch-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.iters < 1 or a.warmup < 0 or a.batch < 1 or a.repeats < 1:
        p.error("--iters, --batch and --repeats must be >= 1, --warmup >= 0")
    if a.image_size < 32:
        p.error(f"--image-size {a.image_size}: trainscope's cv.image_size must be >= 32")
    try:
        if not all(int(r) >= 1 for r in a.ranks.split()) or not a.ranks.split():
            raise ValueError
    except ValueError:
        p.error(f'--ranks "{a.ranks}": expected positive integers, e.g. "1 2"')
    return a


def main(argv: list[str]) -> int:
    a = parse_args(argv)
    if a.pytorch_worker:
        return pytorch_worker(a)
    try:
        return driver(a)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"scripts/bench pytorch_step: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
