"""Valid trainscope run files (schema trainscope/1, docs/run_file_schema.md) made from KNOWN laws,
so that tests and benchmarks can check that `trainscope-post model`/`advise` recover what was put
in: training runs whose phase times follow `a + b / p` and whose gradient allreduce follows a
ring or hierarchical alpha-beta law (Network.algorithm; Law.collective_scale makes the training's
allreduce differ from the benchmark's price, Law.overlap_inter the overlap across nodes), and
comm-workload files from the same alpha and beta per scope. write_manifest records a campaign's
link rate as benchmarks/advisor_runs.py does.

The writer's conventions are reproduced where the model reads them: per-iteration columns
[ranks, iterations] with the `rank_rows` dataset, /summary medians = per iteration the mean over ranks, then
the median over the measured iterations; comm_wait = the collective time not hidden behind the
backward phase; /plan memory categories per rank with ZeRO sharding. Noise (seeded, relative,
per rank and iteration) is optional.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

PHASES = ("data", "h2d", "forward", "backward", "optimizer", "control")
OPS = ("allreduce", "allgather", "reduce_scatter", "broadcast")
MiB = 2.0**20
GiB = 2.0**30


def ring(op: str, n: int) -> tuple[float, float]:
    """(latency steps, bandwidth factor) of the ring algorithm of `op` on n ranks."""
    if n <= 1:
        return 0.0, 0.0
    if op == "allreduce":
        return 2.0 * (n - 1), 2.0 * (n - 1) / n
    if op in ("allgather", "reduce_scatter"):
        return float(n - 1), (n - 1) / n
    return 1.0, 1.0


@dataclass
class Network:
    """alpha [s] and beta [s/B] of every collective, per scope (intra: one node, inter: more).
    algorithm: how an allreduce across nodes runs. "ring": over all n ranks, each node's link
    carrying 2(n-1)/n of the message (beta per link); "hierarchical": a ring among one rank per
    node (2(N-1)/N over the link, as much at 2+2 as at 1+1) plus a ring allreduce among each
    node's ranks at the intra-node alpha and beta (its local reduce and broadcast)."""

    intra: tuple[float, float] = (5e-6, 1 / 100e9)   # 5 us, 100 GB/s busbw
    inter: tuple[float, float] = (20e-6, 1 / 10e9)   # 20 us, 10 GB/s busbw
    algorithm: str = "ring"

    def time(self, op: str, nbytes: float, n: int, nodes: int) -> float:
        alpha, beta = self.inter if nodes > 1 else self.intra
        if nodes > 1 and op == "allreduce" and self.algorithm == "hierarchical":
            lat, fac = ring(op, nodes)
            lat_i, fac_i = ring(op, math.ceil(n / nodes))
            return (alpha * lat + beta * fac * nbytes +
                    self.intra[0] * lat_i + self.intra[1] * fac_i * nbytes)
        lat, fac = ring(op, n)
        return alpha * lat + beta * fac * nbytes


@dataclass
class Law:
    """One configuration's per-iteration time [s] at p ranks on `nodes` nodes (strong scaling:
    the global batch is fixed, every rank gets global_batch / p samples)."""

    phases: dict = field(default_factory=lambda: {
        "data": (2e-4, 2e-3), "h2d": (1e-5, 5e-4), "forward": (5e-3, 0.2),
        "backward": (1e-2, 0.4), "optimizer": (3e-3, 0.0), "control": (2e-4, 0.0)})  # (a, b)
    other: float = 1e-3                     # framework overhead outside the phases [s]
    bucket_bytes: tuple = (25 * MiB, 25 * MiB, 10 * MiB)
    rounds: float = 1.0                     # allreduces of every bucket per step
    overlap: float = 0.5                    # share of the collective hidden behind backward
    network: Network = field(default_factory=Network)
    overlap_inter: float | None = None      # the share hidden across nodes, if not `overlap`
    collective_scale: float = 1.0           # training's allreduce / the comm benchmark's price
    global_batch: int = 256
    tokens_per_sample: float = 0.0          # > 0: an LLM run (throughput in tokens/s)
    # per-rank memory plan of the unsharded model [B]; activations and logits per sample
    weight: float = 1 * GiB
    gradient: float = 1 * GiB
    optimizer_state: float = 2 * GiB
    activation_per_sample: float = 64 * MiB
    logits_per_sample: float = 0.0
    zero: int = 0

    def phase(self, name: str, p: int) -> float:
        a, b = self.phases[name]
        return a + b / p

    def collective(self, p: int, nodes: int) -> float:
        if p <= 1:
            return 0.0
        return self.collective_scale * self.rounds * sum(
            self.network.time("allreduce", b, p, nodes) for b in self.bucket_bytes)

    def overlap_at(self, nodes: int) -> float:
        return self.overlap_inter if nodes > 1 and self.overlap_inter is not None else \
            self.overlap

    def comm_wait(self, p: int, nodes: int) -> float:
        c = self.collective(p, nodes)
        return max(c * (1.0 - self.overlap_at(nodes)), c - self.phase("backward", p))

    def step(self, p: int, nodes: int) -> float:
        return (sum(self.phase(n, p) for n in PHASES) + self.comm_wait(p, nodes) + self.other)

    def work_per_step(self) -> float:
        return self.global_batch * (self.tokens_per_sample or 1.0)

    def throughput(self, p: int, nodes: int) -> float:
        return self.work_per_step() / self.step(p, nodes)

    def batch_per_rank(self, p: int) -> int:
        return max(1, math.ceil(self.global_batch / p))

    def memory_plan(self, p: int) -> dict:
        """The /plan memory categories of one rank at p ranks [B]."""
        shard = 1.0 / p
        b = self.batch_per_rank(p)
        return {
            "weight": self.weight * (shard if self.zero >= 3 else 1.0),
            "gradient": self.gradient * (shard if self.zero >= 2 else 1.0),
            "optimizer_state": self.optimizer_state * (shard if self.zero >= 1 else 1.0),
            "activation": self.activation_per_sample * b,
            "logits": self.logits_per_sample * b,
        }

    def memory(self, p: int) -> float:
        return sum(self.memory_plan(p).values())


def _series(group, name, data, units):
    data = np.asarray(data, dtype=np.float64)
    if not data.shape[0]:  # output.per_rank=none: [0, n], nothing to chunk
        group.create_dataset(name, data=data).attrs["units"] = units
        return
    # Chunked as the writer does: up to 64 ranks by the rows (io::series_chunk_rows).
    chunks = (min(data.shape[0], 64), max(1, min(data.shape[1], 1 << 14)))
    ds = group.create_dataset(name, data=data, maxshape=(data.shape[0], None), chunks=chunks)
    ds.attrs["units"] = units


def _rank_rows(group, ranks: int, rows: int):
    """<group>/rank_rows as the writer has made it since issue 39: an int64 dataset [R]."""
    ds = group.create_dataset("rank_rows", data=np.full(ranks, rows, dtype=np.int64))
    ds.attrs["units"] = "1"


# --- output.per_rank (issue 39 point 1): detail ranks and aggregates over all ranks -------------
AGGREGATE = np.dtype([("min", "<f8"), ("mean", "<f8"), ("max", "<f8"), ("argmax", "<i8"),
                      ("count", "<i8"), ("slowest", "<f8")])
# The largest world whose every rank writes its rows under output.per_rank=auto.
AUTO_ALL_UP_TO = 32


def detail_ranks(mode: str, world: int, nodes: int = 1) -> np.ndarray:
    """The ranks that write per-rank rows under output.per_rank=`mode`: all, none, node (local
    rank 0 of every node, ranks filling nodes of ceil(world / nodes) as _ranks_table places
    them), every:K (0, K, 2K, ...), auto (all up to 32 ranks, else every ceil(world/32)-th)."""
    if mode == "all" or (mode == "auto" and world <= AUTO_ALL_UP_TO):
        return np.arange(world, dtype=np.int64)
    if mode == "none":
        return np.empty(0, dtype=np.int64)
    if mode == "node":
        return np.arange(0, world, math.ceil(world / nodes), dtype=np.int64)
    if mode == "auto":
        step = math.ceil(world / AUTO_ALL_UP_TO)
    elif mode.startswith("every:") and mode[6:].isdigit() and int(mode[6:]) > 0:
        step = int(mode[6:])
    else:
        raise ValueError(f"output.per_rank={mode!r}")
    return np.arange(0, world, step, dtype=np.int64)


def aggregate_rows(values: np.ndarray, key: np.ndarray) -> np.ndarray:
    """<group>/aggregate/<column> rows for values [world, n] over ALL ranks: min, mean, max,
    argmax (rank of the max, -1 when no rank has a value), count (finite values), slowest (this
    column on the argmax rank of the key column `key` [world, n], NaN when none)."""
    values = np.asarray(values, dtype=np.float64)
    key = np.asarray(key, dtype=np.float64)
    n = values.shape[1]
    out = np.empty(n, dtype=AGGREGATE)
    finite = np.isfinite(values)
    count = finite.sum(axis=0)
    some = count > 0
    with np.errstate(invalid="ignore"):
        out["min"] = np.where(some, np.where(finite, values, np.inf).min(axis=0), np.nan)
        out["max"] = np.where(some, np.where(finite, values, -np.inf).max(axis=0), np.nan)
        out["mean"] = np.where(some, np.where(finite, values, 0.0).sum(axis=0) /
                               np.maximum(count, 1), np.nan)
    out["argmax"] = np.where(some, np.argmax(np.where(finite, values, -np.inf), axis=0), -1)
    out["count"] = count
    kfinite = np.isfinite(key)
    slow = np.argmax(np.where(kfinite, key, -np.inf), axis=0)
    out["slowest"] = np.where(kfinite.any(axis=0), values[slow, np.arange(n)], np.nan)
    return out


def _aggregate(group, cols: dict, units: dict, key: str):
    """<group>/aggregate with one compound dataset per column (cols: name -> [world, n])."""
    a = group.create_group("aggregate")
    a.attrs["slowest_by"] = key
    rows = 0
    for name, data in cols.items():
        ds = a.create_dataset(name, data=aggregate_rows(data, cols[key]))
        ds.attrs["units"] = units.get(name, "s")
        rows = ds.shape[0]
    a.attrs["rows"] = np.int64(rows)


def _series_group(group, cols: dict, units: dict, detail, key: str | None, shape=None):
    """A per-rank series group: every column's rows of the detail ranks (`detail`; None: the
    layout before issue 39 point 1, every rank's row and no `ranks` dataset), rank_rows, and with
    `key` the aggregates over all ranks."""
    world, n = next(iter(cols.values())).shape if cols else shape
    rows = detail if detail is not None else slice(None)
    for name, data in cols.items():
        _series(group, name, np.asarray(data)[rows], units.get(name, "s"))
    group.attrs["columns"] = ",".join(cols)
    group.attrs["rows"] = np.int64(n)
    _rank_rows(group, len(detail) if detail is not None else world, n)
    if detail is not None:
        group.create_dataset("ranks", data=np.asarray(detail, dtype=np.int64)).attrs["units"] = "1"
        if key is not None:
            _aggregate(group, cols, units, key)


def _ranks_table(f, ranks: int, nodes: int, device: str):
    dt = np.dtype([("rank", "<i4"), ("local_rank", "<i4"), ("node", "<i4"), ("hostname", "S8"),
                   ("pid", "<i8"), ("device", "S8"), ("device_name", "S16"),
                   ("pci_bus_id", "S16"), ("cpu_affinity", "S16")])
    per_node = math.ceil(ranks / nodes)
    rows = [(r, r % per_node, r // per_node, f"node{r // per_node}".encode(), 1000 + r,
             device.encode(), b"synthetic", b"", f"{r % per_node}".encode())
            for r in range(ranks)]
    f.create_dataset("ranks", data=np.array(rows, dtype=dt)).attrs["units"] = "1"


def _root(f, workload: str, ranks: int, nodes: int, status: str):
    for k, v in {"schema": "trainscope/1", "status": status, "workload": workload,
                 "trainscope_version": "0.1.0", "git_sha": "synthetic",
                 "created_utc": "2026-01-01T00:00:00Z", "finished_utc": "2026-01-01T00:01:00Z",
                 "command_line": "tests/python/synthetic_runs.py"}.items():
        f.attrs[k] = v
    f.attrs["world_size"] = np.int64(ranks)
    f.attrs["num_nodes"] = np.int64(nodes)


def write_run(path: Path, law: Law, ranks: int, nodes: int, config: dict | None = None,
              noise: float = 0.0, seed: int = 0, iterations: int = 12, warmup: int = 2,
              device: str = "cuda", status: str = "completed", shards: bool = True,
              slow: float = 1.0, backend: str = "nccl", per_rank: str | None = "auto",
              epochs: int = 0, straggler: tuple[int, float] | None = None,
              compress: str | None = None, compress_ratio: float = 1.0,
              compress_cost: float = 0.0, accuracy: float | None = None) -> Path:
    """A cv (or, with law.tokens_per_sample, llm) training run at `ranks` on `nodes` nodes.
    `config` overrides /config attributes (strings), e.g. to name the configuration. shards:
    /plan records memory_plan_<category>_shards, as the binary does since it writes them.
    slow: every time of this run multiplied by it (a repeat that ran slower or faster).
    per_rank: output.per_rank (detail_ranks) with /iterations and /epochs aggregates over all
    ranks, as the writer lays them out since issue 39 point 1; None: the layout before it (every
    rank's rows, no <group>/ranks, no aggregates). epochs: /epochs rows (0: no /epochs).
    straggler: (rank, seconds) added to that rank's step and backward on every iteration.
    compress: dist.compress (none, fp16, bf16, powersgd) with /plan@compress and the columns
    comm_uncompressed_bytes and comm_error_norm, as the binary writes them since issue 40 (None:
    the layout before, none of them): the gradient bytes and the allreduce time x
    compress_ratio, compress_cost [s] added to comm_wait and the step (PowerSGD's computation);
    powersgd's error norm rises from 0.1 to 0.2 after its 2 plain iterations. accuracy: the last
    epoch's validation accuracy (a fraction; the epochs before it 0.04 lower each)."""
    rng = np.random.default_rng(seed)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    llm = law.tokens_per_sample > 0
    workload = "llm" if llm else "cv"
    p, shape = ranks, (ranks, iterations)

    def noisy(value):  # [ranks, iterations]
        value = value * slow
        return value * (1.0 + noise * rng.standard_normal(shape)) if noise else np.full(shape,
                                                                                      value)

    cols = {f"{ph}_s": noisy(law.phase(ph, p)) for ph in PHASES}
    ratio = compress_ratio if compress is not None else 1.0
    coll = noisy(law.collective(p, nodes)) * ratio
    # exposed = the collective not hidden behind this iteration's backward (as the writer sees it)
    wait = np.maximum(coll * (1.0 - law.overlap_at(nodes)), coll - cols["backward_s"]) + \
        compress_cost if p > 1 else np.zeros(shape)
    other = noisy(law.other)
    cols["comm_wait_s"] = wait
    cols["comm_collective_s"] = coll
    cols["step_s"] = sum(cols[f"{ph}_s"] for ph in PHASES) + wait + other
    samples_per_rank = law.global_batch / p
    uncompressed = law.rounds * sum(law.bucket_bytes) if p > 1 else 0.0
    cols["comm_bytes"] = np.full(shape, uncompressed * ratio)
    if compress is not None:
        cols["comm_uncompressed_bytes"] = np.full(shape, uncompressed)
        norm = np.full(shape, math.nan)
        if compress == "powersgd" and p > 1:
            norm[:, :2] = 0.0  # dist.powersgd_start_iter = 2 plain iterations
            norm[:, 2:] = np.linspace(0.1, 0.2, max(iterations - 2, 0))
        cols["comm_error_norm"] = norm
    cols["samples"] = np.full(shape, samples_per_rank)
    cols["tokens"] = np.full(shape, samples_per_rank * law.tokens_per_sample if llm else math.nan)
    cols["loss"] = np.full(shape, 2.0)
    cols["iteration"] = np.tile(np.arange(iterations, dtype=np.float64), (ranks, 1))
    if straggler is not None:
        cols["backward_s"][straggler[0]] += straggler[1]
        cols["step_s"][straggler[0]] += straggler[1]

    meas = slice(warmup, iterations)

    def median(col):  # the writer's: mean over ranks per iteration, median over iterations
        return float(np.median(np.mean(cols[col][:, meas], axis=0)))

    step = median("step_s")
    cfg = {"run.workload": workload, "run.strategy": "ddp-ds", "run.precision": "bf16-mixed",
           "run.device": device, "dist.zero": str(law.zero), "dist.backend": backend,
           "train.batch_size": str(law.batch_per_rank(p)), "train.global_batch_size": "0",
           "profile.warmup_iters": str(warmup), "train.max_iters": str(iterations),
           "cv.model": "mobilenet_v2", "llm.method": "full" if llm else "lora",
           "output.file": str(path)}
    if compress is not None:
        cfg["dist.compress"] = compress
        if compress == "powersgd":
            cfg.update({"dist.powersgd_rank": "2", "dist.powersgd_start_iter": "2"})
    cfg.update({k: str(v) for k, v in (config or {}).items()})
    summary = {f"median_{ph}_s": median(f"{ph}_s") for ph in (*PHASES, "comm_wait")}
    summary.update({
        "median_step_s": step, "mean_step_s": float(np.mean(cols["step_s"][:, meas])),
        "global_batch_samples": float(law.global_batch),
        "throughput_samples_per_s": law.global_batch / step,
        "warmup_iterations": np.int64(warmup),
        "measured_iterations": np.int64(iterations - warmup),
        "total_iterations": np.int64(iterations),
        "energy_per_sample_j": math.nan, "wall_s": float(np.sum(cols["step_s"][0])),
        "peak_device_allocated_bytes": law.memory(p), "peak_host_rss_bytes": GiB,
    })
    if llm:
        summary["throughput_tokens_per_s"] = law.work_per_step() / step
        summary["throughput_tokens_per_s_per_rank"] = law.work_per_step() / step / p
    plan = {"device": device, "backend": backend, "strategy": cfg["run.strategy"],
            "precision": cfg["run.precision"], "global_batch": np.int64(law.global_batch),
            "batch_per_rank": np.int64(law.batch_per_rank(p)), "threads_per_rank": np.int64(1),
            "total_iterations": np.int64(iterations), "zero": np.int64(int(cfg["dist.zero"]))}
    mem = law.memory_plan(p)
    plan.update({f"memory_plan_{k}_bytes": float(v) for k, v in mem.items()})
    if shards:  # as the binary records them (older files carry only dist.zero)
        plan.update({f"memory_plan_{c}_shards": np.int64(p if law.zero >= stage else 1)
                     for c, stage in (("weight", 3), ("gradient", 2), ("optimizer_state", 1))})
    plan["memory_estimate_bytes"] = float(sum(mem.values()))
    if llm:
        plan["method"] = cfg["llm.method"]
    if compress is not None:
        plan["compress"] = compress

    with h5py.File(path, "w") as f:
        _root(f, workload, ranks, nodes, status)
        for name, attrs in (("config", cfg), ("plan", plan), ("summary", summary)):
            g = f.create_group(name)
            for k, v in attrs.items():
                g.attrs[k] = v
        detail = detail_ranks(per_rank, ranks, nodes) if per_rank is not None else None
        if per_rank is not None:
            f.attrs["per_rank"] = per_rank
        units = {"samples": "samples", "tokens": "tokens", "comm_bytes": "B", "loss": "1",
                 "comm_uncompressed_bytes": "B", "comm_error_norm": "1",
                 "iteration": "1", "epoch": "1", "train_loss": "1", "val_loss": "1",
                 "val_accuracy": "1"}
        _series_group(f.create_group("iterations"), cols, units, detail, "step_s")
        if epochs:
            per = iterations // epochs
            ep = {"epoch": np.tile(np.arange(epochs, dtype=np.float64), (ranks, 1)),
                  "epoch_s": np.stack([cols["step_s"][:, e * per:(e + 1) * per].sum(axis=1)
                                       for e in range(epochs)], axis=1),
                  "train_loss": np.tile(2.0 / (1.0 + np.arange(epochs)), (ranks, 1)),
                  "val_loss": np.tile(2.2 / (1.0 + np.arange(epochs)), (ranks, 1)),
                  "val_accuracy": np.tile((0.5 if accuracy is None else
                                           accuracy - 0.04 * (epochs - 1)) +
                                          0.04 * np.arange(epochs), (ranks, 1)),
                  "samples": np.full((ranks, epochs), per * law.global_batch / p)}
            _series_group(f.create_group("epochs"), ep, units, detail, "epoch_s")
        b = f.create_group("comm/buckets")
        bb = b.create_dataset("bytes", data=ratio * np.asarray(law.bucket_bytes,
                                                               dtype=np.float64))
        bb.attrs["units"] = "B"
        total = max(sum(law.bucket_bytes), 1.0)
        # the collective split by payload; no aggregates in /comm/buckets
        _series_group(b, {f"bucket_{k}_s": coll * nbytes / total
                          for k, nbytes in enumerate(law.bucket_bytes)}, {}, detail, None,
                      shape)
        _ranks_table(f, ranks, nodes, device)
    return path


# The large writer's phase means [s] (a ~100 ms step); forward, backward and data vary by 2 %.
LARGE_PHASES = {"data_s": 0.002, "h2d_s": 0.001, "forward_s": 0.030, "backward_s": 0.060,
                "optimizer_s": 0.005, "control_s": 0.0005}
LARGE_NOISY = ("data_s", "forward_s", "backward_s")


def write_large_run(path: Path, world: int, iterations: int, nodes: int | None = None,
                    per_rank: str = "auto", warmup: int = 5, seed: int = 0,
                    straggler: tuple[int, float] | None = None, epochs: int = 10,
                    block: int = 128) -> Path:
    """A completed cv run of `world` ranks x `iterations` iterations in the writer's layout since
    issue 39 point 1 (output.per_rank=`per_rank`), made `block` iterations at a time so that no
    [world, iterations] array exists (16,384 x 10,000 doubles are 1.3 GB per column): each
    block's values for ALL ranks give the aggregates, and the detail ranks' rows of the same
    values are written beside them. straggler: (rank, factor): that rank's backward is `factor`
    times longer (default: a rank that is no detail rank under auto, world // 3 + 1, 1.3).
    The warm-up iterations are 3x slower. /summary as the writer computes it (medians over the
    measured iterations of the mean over ranks)."""
    rng = np.random.default_rng(seed)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    nodes = nodes or max(1, world // 4)
    straggler = straggler or (world // 3 + 1, 1.3)
    detail = detail_ranks(per_rank, world, nodes)
    rows = len(detail)
    per_rank_batch = 32
    names = [*LARGE_PHASES, "comm_collective_s", "comm_wait_s", "step_s", "loss", "samples",
             "comm_bytes", "iteration"]
    units = {"loss": "1", "samples": "samples", "comm_bytes": "B", "iteration": "1",
             "epoch": "1", "train_loss": "1", "val_loss": "1", "val_accuracy": "1"}
    speed = 1.0 + 0.01 * rng.standard_normal(world)  # each rank's own pace
    per_epoch = max(1, iterations // epochs) if epochs else 0
    epoch_s = np.zeros((world, epochs))
    with h5py.File(path, "w") as f:
        _root(f, "cv", world, nodes, "completed")
        f.attrs["per_rank"] = per_rank
        it = f.create_group("iterations")
        agg = it.create_group("aggregate")
        agg.attrs["slowest_by"] = "step_s"
        agg.attrs["rows"] = np.int64(iterations)
        chunk = (max(1, min(rows, 64)), max(1, min(iterations, 2**17 // max(rows, 1))))
        sets, aggs = {}, {}
        for name in names:
            sets[name] = it.create_dataset(name, shape=(rows, iterations), dtype="<f8",
                                           chunks=chunk if rows else None)
            sets[name].attrs["units"] = units.get(name, "s")
            aggs[name] = agg.create_dataset(name, shape=(iterations,), dtype=AGGREGATE)
            aggs[name].attrs["units"] = units.get(name, "s")
        it.attrs["columns"] = ",".join(names)
        it.attrs["rows"] = np.int64(iterations)
        _rank_rows(it, rows, iterations)
        it.create_dataset("ranks", data=detail).attrs["units"] = "1"
        for a in range(0, iterations, block):
            b = min(block, iterations - a)
            idx = np.arange(a, a + b)
            warm = np.where(idx < warmup, 3.0, 1.0)
            cols = {}
            for name, mean in LARGE_PHASES.items():
                v = np.outer(speed, mean * warm)
                if name in LARGE_NOISY:
                    v *= 1.0 + 0.02 * rng.standard_normal((world, b))
                cols[name] = v
            cols["backward_s"][straggler[0]] *= straggler[1]
            coll = np.full((world, b), 0.02)
            cols["comm_collective_s"] = coll
            cols["comm_wait_s"] = np.maximum(0.2 * coll, coll - cols["backward_s"])
            cols["step_s"] = sum(cols[k] for k in LARGE_PHASES) + cols["comm_wait_s"] + 0.001
            cols["loss"] = np.tile(2.0 / (1.0 + 1e-3 * idx), (world, 1))
            cols["samples"] = np.full((world, b), float(per_rank_batch))
            cols["comm_bytes"] = np.full((world, b), 60 * MiB)
            cols["iteration"] = np.tile(idx.astype(np.float64), (world, 1))
            for name in names:
                aggs[name][a:a + b] = aggregate_rows(cols[name], cols["step_s"])
                if rows:
                    sets[name][:, a:a + b] = cols[name][detail]
            if epochs:
                e = np.minimum(idx // per_epoch, epochs - 1)
                for k in np.unique(e):
                    epoch_s[:, k] += cols["step_s"][:, e == k].sum(axis=1)
        step_mean = aggs["step_s"].fields("mean")[warmup:]
        summary = {f"median_{k}": float(np.median(aggs[k].fields("mean")[warmup:]))
                   for k in (*LARGE_PHASES, "comm_wait_s")}
        step = float(np.median(step_mean))
        summary.update({
            "median_step_s": step, "mean_step_s": float(np.mean(step_mean)),
            "global_batch_samples": float(per_rank_batch * world),
            "throughput_samples_per_s": per_rank_batch * world / step,
            "warmup_iterations": np.int64(warmup),
            "measured_iterations": np.int64(iterations - warmup),
            "total_iterations": np.int64(iterations), "energy_per_sample_j": math.nan,
            "wall_s": float(np.sum(aggs["step_s"].fields("max")[:])),
            "peak_device_allocated_bytes": 4 * GiB, "peak_host_rss_bytes": GiB})
        cfg = {"run.workload": "cv", "run.strategy": "ddp-ds", "run.precision": "bf16-mixed",
               "run.device": "cuda", "dist.zero": "0", "dist.backend": "nccl",
               "train.batch_size": str(per_rank_batch), "train.global_batch_size": "0",
               "profile.warmup_iters": str(warmup), "train.max_iters": str(iterations),
               "cv.model": "mobilenet_v2", "output.per_rank": per_rank, "output.file": str(path)}
        plan = {"device": "cuda", "backend": "nccl", "strategy": "ddp-ds",
                "precision": "bf16-mixed", "global_batch": np.int64(per_rank_batch * world),
                "batch_per_rank": np.int64(per_rank_batch), "threads_per_rank": np.int64(1),
                "total_iterations": np.int64(iterations), "zero": np.int64(0)}
        for name, attrs in (("config", cfg), ("plan", plan), ("summary", summary)):
            g = f.create_group(name)
            for k, v in attrs.items():
                g.attrs[k] = v
        if epochs:
            ep = {"epoch": np.tile(np.arange(epochs, dtype=np.float64), (world, 1)),
                  "epoch_s": epoch_s,
                  "train_loss": np.tile(2.0 / (1.0 + np.arange(epochs)), (world, 1)),
                  "val_loss": np.tile(2.2 / (1.0 + np.arange(epochs)), (world, 1)),
                  "val_accuracy": np.tile(0.5 + 0.04 * np.arange(epochs), (world, 1)),
                  "samples": np.full((world, epochs), float(per_epoch * per_rank_batch))}
            _series_group(f.create_group("epochs"), ep, units, detail, "epoch_s")
        _ranks_table(f, world, nodes, "cuda")
    return path


def write_comm(path: Path, network: Network, ranks: int, nodes: int, noise: float = 0.0,
               seed: int = 0, sizes=tuple(2**k for k in range(3, 29, 2)),
               backend: str = "nccl") -> Path:
    """A run.workload=comm file: /comm/<op> tables over `sizes` bytes at `ranks` on `nodes`,
    time_s from `network` (the scope follows nodes)."""
    rng = np.random.default_rng(seed)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    nbytes = np.asarray(sizes, dtype=np.float64)
    with h5py.File(path, "w") as f:
        _root(f, "comm", ranks, nodes, "completed")
        cfg = f.create_group("config")
        for k, v in {"run.workload": "comm", "comm.ops": ",".join(OPS), "comm.dtype": "float32",
                     "comm.iters": "20", "comm.warmup": "5", "output.file": str(path)}.items():
            cfg.attrs[k] = v
        plan = f.create_group("plan")
        for k, v in {"workload": "comm", "device": "cuda", "backend": backend,
                     "dataset": "none (communication benchmark)"}.items():
            plan.attrs[k] = v
        comm = f.create_group("comm")
        for k, v in {"backend": backend, "dtype": "float32", "iters": np.int64(20),
                     "warmup": np.int64(5), "world_size": np.int64(ranks),
                     "bytes": "whole array as nccl-tests count it",
                     "time": "seconds per operation"}.items():
            comm.attrs[k] = v
        for op in OPS:
            t = np.array([network.time(op, b, ranks, nodes) for b in nbytes])
            if noise:
                t = t * (1.0 + noise * rng.standard_normal(t.shape))
            fac = ring(op, ranks)[1] if op != "broadcast" else 1.0
            algbw = nbytes / t / 1e9
            g = comm.create_group(op)
            g.attrs["busbw_factor"] = float(fac)
            for name, data, units in (("bytes", nbytes, "B"), ("count", nbytes / 4, "1"),
                                      ("time_s", t, "s"), ("time_max_s", t * 1.02, "s"),
                                      ("algbw_GBps", algbw, "GB/s"),
                                      ("busbw_GBps", algbw * fac, "GB/s")):
                g.create_dataset(name, data=data).attrs["units"] = units
        _ranks_table(f, ranks, nodes, "cuda")
    return path


def write_study(root: Path, configs: dict, ranks=(1, 2, 4, 8, 16), gpus_per_node: int = 4,
                repeats: int = 2, noise: float = 0.0, comm_ranks=((2, 1), (4, 1), (8, 2), (16, 4)),
                seed: int = 0, shards: bool = True) -> Path:
    """root/<name>/n<p>/rep<r>.h5 for every configuration {name: (law, config overrides)} and
    root/comm/n<p>.h5 for every (ranks, nodes) of comm_ranks, with the first law's network.
    Ranks fill nodes of gpus_per_node."""
    root = Path(root)
    s = seed
    for name, (law, cfg) in configs.items():
        for p in ranks:
            for r in range(repeats):
                s += 1
                write_run(root / name / f"n{p}" / f"rep{r}.h5", law, p,
                          math.ceil(p / gpus_per_node), cfg, noise=noise, seed=s, shards=shards)
    network = next(iter(configs.values()))[0].network
    for p, n in comm_ranks:
        s += 1
        write_comm(root / "comm" / f"n{p}x{n}.h5", network, p, n, noise=noise, seed=s)
    return root


def write_manifest(root: Path, rate: str, files) -> Path:
    """root/manifest.json as benchmarks/advisor_runs.py writes it for a campaign: the link `rate`
    and every run file (relative to root) made at it."""
    root = Path(root)
    runs = [{"file": str(Path(f).resolve().relative_to(root.resolve()))} for f in files]
    path = root / "manifest.json"
    path.write_text(json.dumps({"rate": rate, "runs": runs}, indent=1))
    return path
