"""Performance models from measured runs (``trainscope-post model``), used by the advisor.

A *configuration* is a group of runs that differ only in ranks and nodes (as ``scaling`` groups
them, for a scaling mode). Its model of the median iteration time at ``p`` ranks on ``n`` nodes:

    step(p, n) = k(p) * sum_phase f_phase(p)  +  exposed_comm(p, n)  +  f_other(p)

- ``f_phase`` for each compute phase (data, h2d, forward, backward, optimizer; the medians of
  /summary) is fitted by Extra-P (extrap_fit.py, in Extra-P's own environment) over the measured
  rank counts; ``f_other`` is the rest of the step (median step minus the phases, comm_wait and
  control), fitted the same way.
- ``k(p)`` is the CPU contention factor for CPU runs: max(1, ranks per node x threads per rank /
  cores per node), or with ``shared_host_cores`` (nodes emulated on one machine) max(1, ranks x
  threads / cores); only with --cores-per-node or --shared-host-cores. Measured phase times are
  divided by their run's factor before fitting, and predictions multiplied by the target's. GPU
  runs have k = 1.
- ``exposed_comm`` is what the step waits for communication: comm_wait plus the control phase
  (its blocking host allreduce of the stop/non-finite flags queues behind gradient traffic still
  on the wire, so on a slow link it absorbs part of the wait), above its 1-rank value (the
  non-finite check), which is added as a constant. It is priced from the per-step gradient
  traffic (bytes per bucket from /comm/buckets, times the allreduce rounds per step =
  comm_bytes / sum of buckets) by the alpha-beta model of the allreduce in the target's scope (intra-node when n = 1, else inter-node) fitted from
  ``run.workload=comm`` files: t(S, n) = alpha * L(n) + beta * F(n) * S, with the ring
  algorithm's step count L and factor F (allreduce: 2(n-1) and 2(n-1)/n; allgather and
  reduce-scatter: n-1 and (n-1)/n; broadcast: 1 and 1). Of that time the measured overlap fraction
  (1 - exposed / comm_collective at the measured multi-rank points of that scope) is hidden, but
  never more than the backward phase it overlaps with. ZeRO runs (dist.zero >= 1), and
  configurations without buckets or comm runs, fit comm_wait + control empirically with Extra-P
  instead, and say so.

Uncertainty: a relative sigma from the fit residuals (RMS relative error of the composed step at
the measured points), the spread of repeats (mean coefficient of variation) and the alpha-beta
pricing's RMS error weighted by communication's share of the step; beyond the measured rank counts by
d doublings that sigma is multiplied by (1 + d) and EXTRAPOLATION_SIGMA * d is added in
quadrature. The band is +-2 sigma.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import schema
from .study import (Run, Study, StudyError, describe_group, group_by_config, point_config)

COMPUTE_PHASES = ["data", "h2d", "forward", "backward", "optimizer"]
OPS = ("allreduce", "allgather", "reduce_scatter", "broadcast")
MEMORY_CATEGORIES = ["weight", "gradient", "optimizer_state", "activation", "logits",
                     "gathered_weight", "unit_gradient"]
SCHEMA = "trainscope-model/1"
# Relative sigma added per doubling of the rank count beyond the measured range: the model form
# itself is uncertain there (two or three points cannot tell p^-1 from p^-1/2 or a log term).
# Calibrated against the held-out and leave-one-out errors of docs/advisor.md.
EXTRAPOLATION_SIGMA = 0.05
EXTRAP_TIMEOUT_S = 600  # one Extra-P process fits every series of a study


def algorithm(op: str, n: int) -> tuple[float, float]:
    """(latency steps L(n), bandwidth factor F(n)) of the ring algorithm of `op` on n ranks."""
    if n <= 1:
        return 0.0, 0.0
    if op == "allreduce":
        return 2.0 * (n - 1), 2.0 * (n - 1) / n
    if op in ("allgather", "reduce_scatter"):
        return float(n - 1), (n - 1) / n
    return 1.0, 1.0  # broadcast (pipelined)


# --- Extra-P ------------------------------------------------------------------------------------
def extrap_python() -> str:
    """The Python of Extra-P's environment: $TRAINSCOPE_EXTRAP_PYTHON, else scripts/setup's
    ${TRAINSCOPE_CACHE:-~/.cache/trainscope}/venv-extrap."""
    env = os.environ.get("TRAINSCOPE_EXTRAP_PYTHON")
    if env:
        return env
    cache = Path(os.environ.get("TRAINSCOPE_CACHE", Path.home() / ".cache" / "trainscope"))
    return str(cache / "venv-extrap" / "bin" / "python")


def extrap_fit(series: list[dict], evaluate=()) -> dict:
    """Runs extrap_fit.py in Extra-P's environment on `series` (see that file) in one process."""
    if not series:
        return {"extrap_version": "", "models": {}}
    py = extrap_python()
    if not Path(py).exists():
        raise StudyError(f"Extra-P is not installed ({py} does not exist): run scripts/setup "
                         "--tests, which makes that environment, or set TRAINSCOPE_EXTRAP_PYTHON to a "
                         "Python that has `pip install extrap`")
    req = json.dumps({"series": series, "evaluate": sorted(set(float(p) for p in evaluate))})
    try:
        proc = subprocess.run([py, str(Path(__file__).with_name("extrap_fit.py"))], input=req,
                              capture_output=True, text=True, timeout=EXTRAP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise StudyError(f"Extra-P did not answer within {EXTRAP_TIMEOUT_S} s ({py}): fewer "
                         "configurations at a time, or check that environment") from None
    if proc.returncode != 0:
        # its last line: extrap_fit's own one-line message, or the exception of a traceback
        lines = proc.stderr.strip().splitlines()
        err = lines[-1][-2000:] if lines else f"no error output from {py}"
        raise StudyError(f"Extra-P failed (exit {proc.returncode}): {err}")
    return json.loads(proc.stdout)


def evaluate_pmnf(m: dict, p: float) -> float:
    """Evaluates an Extra-P model (constant + sum c * p^poly * log2(p)^log) at p."""
    v = m["constant"]
    for t in m["terms"]:
        v += t["coefficient"] * (p ** t["poly"]) * (math.log2(p) ** t["log"] if t["log"] else 1.0)
    return v


# --- communication: alpha-beta per collective and scope -----------------------------------------
@dataclass
class AlphaBeta:
    """The alpha-beta model of one collective in one scope, from the comm runs' (size, time)
    tables at each measured rank count n.

    One line t = alpha * L(n) + beta * F(n) * S over all sizes and rank counts is the summary
    (alpha, busbw = 1 / beta). Real transports are not one line (eager/rendezvous protocols, TCP
    windows, a token bucket's burst), so a message of S bytes at a measured n is priced by the
    alpha-beta line fitted to the measured sizes within a factor of 4 of S (the nearest two when
    fewer; the end ranges beyond the measured sizes). An unmeasured n takes the nearest measured
    n_ref's time scaled by the ring's F(n) / F(n_ref), plus alpha * (L(n) - L(n_ref))."""

    op: str
    scope: str  # intra | inter
    alpha_s: float
    beta_s_per_byte: float
    ranks: list[int]
    points: int
    rms_rel: float          # of the single line
    max_rel: float
    local_rms_rel: float    # of the size-local pricing (leave-one-size-out)
    local_max_rel: float
    tables: dict = field(default_factory=dict)  # n -> (sizes [B], times [s]) sorted by size
    files: list[str] = field(default_factory=list)

    def _local(self, nbytes: float, n: int, skip: int | None = None) -> float:
        sizes, times = self.tables[n]
        idx = [i for i in range(len(sizes)) if i != skip]
        near = [i for i in idx if sizes[i] / 4 <= nbytes <= sizes[i] * 4]
        if len(near) < 2:
            near = sorted(idx, key=lambda i: abs(math.log(sizes[i] / nbytes)))[:2]
        lat, fac = algorithm(self.op, n)
        rows = [(lat, fac * sizes[i], times[i]) for i in near]
        a, b, *_ = _fit_alpha_beta(rows)
        return a * lat + b * fac * nbytes

    def time(self, nbytes: float, n: int) -> float:
        if n <= 1 or nbytes <= 0:
            return 0.0
        if n in self.tables:
            return self._local(nbytes, n)
        below = [m for m in self.tables if m < n]
        ref = max(below) if below else min(self.tables)
        lat, fac = algorithm(self.op, n)
        lat0, fac0 = algorithm(self.op, ref)
        return self._local(nbytes, ref) * fac / fac0 + self.alpha_s * (lat - lat0)

    def measured_n(self, n: int) -> bool:
        return n in self.tables

    @property
    def busbw_GBps(self) -> float:
        return 1e-9 / self.beta_s_per_byte if self.beta_s_per_byte > 0 else math.inf

    def to_json(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "tables"}
        d["tables"] = {str(n): {"bytes": list(map(float, t[0])), "time_s": list(map(float, t[1]))}
                       for n, t in self.tables.items()}
        d["busbw_GBps"] = self.busbw_GBps
        return d


def _fit_alpha_beta(rows):
    """Least squares of t = alpha*L + beta*F*S in relative error (every size counts alike),
    alpha, beta >= 0. rows: (L, F*S, t)."""
    a = np.array([[lat / t, fs / t] for lat, fs, t in rows])
    y = np.ones(len(rows))
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    if coef[0] < 0 or coef[1] < 0:  # refit with the negative one at zero
        k = 1 if coef[0] < 0 else 0
        col = a[:, k]
        c = float(col @ y / (col @ col)) if col @ col > 0 else 0.0
        coef = np.array([0.0, c]) if k == 1 else np.array([c, 0.0])
    pred = a @ coef
    rel = pred - 1.0
    return float(coef[0]), float(coef[1]), float(np.sqrt(np.mean(rel**2))), float(np.max(np.abs(rel)))


def fit_comm(runs: list[Run]) -> dict[tuple[str, str], AlphaBeta]:
    """alpha-beta models per (op, scope) from the /comm/<op> tables of run.workload=comm files;
    repeats at the same rank count are combined by the median time per size."""
    data: dict[tuple[str, str], dict] = {}
    files: dict[tuple[str, str], set] = {}
    for r in runs:
        scope = "inter" if r.nodes > 1 else "intra"
        with r.open() as rf:
            g = rf.group(schema.COMM)
            if g is None:
                continue
            for op in OPS:
                if op not in g or "bytes" not in g[op] or "time_s" not in g[op]:
                    continue
                per_n = data.setdefault((op, scope), {}).setdefault(r.ranks, {})
                for b, t in zip(g[op]["bytes"][...], g[op]["time_s"][...]):
                    if t > 0 and b > 0:
                        per_n.setdefault(float(b), []).append(float(t))
                files.setdefault((op, scope), set()).add(str(r.path))
    out = {}
    for key, by_n in data.items():
        tables = {}
        for n, by_size in by_n.items():
            sizes = sorted(by_size)
            if sizes:
                tables[n] = (sizes, [float(np.median(by_size[b])) for b in sizes])
        if not tables:
            continue
        rows = []
        for n, (sizes, times) in tables.items():
            lat, fac = algorithm(key[0], n)
            rows += [(lat, fac * b, t) for b, t in zip(sizes, times)]
        alpha, beta, rms, mx = _fit_alpha_beta(rows)
        ab = AlphaBeta(key[0], key[1], alpha, beta, sorted(tables), len(rows), rms, mx, 0.0, 0.0,
                       tables, sorted(files[key]))
        # the size-local pricing, each size predicted without itself
        rel = []
        for n, (sizes, times) in tables.items():
            if len(sizes) < 3:
                continue
            for i, (b, t) in enumerate(zip(sizes, times)):
                rel.append(ab._local(b, n, skip=i) / t - 1.0)
        if rel:
            ab.local_rms_rel = float(np.sqrt(np.mean(np.square(rel))))
            ab.local_max_rel = float(np.max(np.abs(rel)))
        out[key] = ab
    return out


# --- measurements of one training run -----------------------------------------------------------
def contention(device: str, ranks: int, nodes: int, threads: int, cores_per_node: float | None,
               shared_host_cores: float | None) -> float:
    """CPU contention factor (1 for GPU runs): compute threads per core, at least 1."""
    if not str(device).startswith("cpu"):
        return 1.0
    per_rank = threads
    if shared_host_cores:
        return max(1.0, ranks * per_rank / shared_host_cores)
    if cores_per_node:
        return max(1.0, math.ceil(ranks / max(nodes, 1)) * per_rank / cores_per_node)
    return 1.0


@dataclass
class Measured:
    path: str
    ranks: int
    nodes: int
    step: float
    phases: dict
    comm_wait: float
    collective: float
    comm_bytes: float
    buckets: list
    device: str
    threads: int
    work: float            # samples or tokens per step, all ranks
    unit: str
    samples: float         # samples per step, all ranks
    power_w_per_rank: float
    plan: dict
    zero: int
    kfactor: float = 1.0

    control: float = 0.0

    @property
    def sync(self) -> float:
        """Exposed communication: comm_wait plus the control phase, whose blocking host
        allreduce queues behind the gradient traffic still on the wire."""
        return self.comm_wait + self.control

    @property
    def other(self) -> float:
        return self.step - sum(self.phases.values()) - self.sync


def _seconds(summary: dict, key: str) -> float:
    """A /summary median time that may be missing or NaN (a phase the run did not time): 0."""
    v = float(summary.get(key, 0.0) or 0.0)
    return 0.0 if v != v else v


def step_problem(run: Run) -> str:
    """Why `run` cannot be modelled, as "median_step_s = <value>" ("" when it can): its median
    step, which every model term is fitted to, must be a positive, finite time. A run whose
    iterations were all warm-up records NaN medians (the binary warns so in /summary)."""
    v = run.summary.get("median_step_s")
    if v is None:
        return "median_step_s missing"
    try:
        t = float(v)
    except (TypeError, ValueError):
        return f"median_step_s = {v!r}"
    return "" if math.isfinite(t) and t > 0 else f"median_step_s = {t:g}"


def measure(run: Run) -> Measured:
    s = run.summary
    phases = {p: _seconds(s, f"median_{p}_s") for p in COMPUTE_PHASES}
    with run.open() as rf:
        def med(col):
            v = rf.measured(col)
            if v.size == 0:
                return 0.0
            m = np.nanmedian(np.nanmean(v, axis=0))
            return float(m) if m == m else 0.0
        collective, comm_bytes = med("comm_collective_s"), med("comm_bytes")
        buckets = [float(b) for b in rf.series(schema.COMM_BUCKETS, "bytes").values] \
            if rf.has(schema.COMM_BUCKETS_BYTES) else []
        plan = rf.plan
    step = float(s.get("median_step_s", math.nan))
    tok = float(s.get("throughput_tokens_per_s", math.nan))
    samples = float(s.get("global_batch_samples", math.nan))
    if run.workload == "llm" and tok == tok:
        work, unit = tok * step, "tokens"
    else:
        work, unit = samples, "samples"
    eps = float(s.get("energy_per_sample_j", math.nan))
    sps = float(s.get("throughput_samples_per_s", math.nan))
    power = eps * sps / max(run.ranks, 1) if eps == eps and sps == sps else math.nan
    try:
        zero = int(run.config.get("dist.zero", plan.get("zero", 0)) or 0)
    except (TypeError, ValueError):
        zero = 0
    return Measured(str(run.path), run.ranks, run.nodes, step, phases,
                    _seconds(s, "median_comm_wait_s"), collective, comm_bytes,
                    buckets, str(plan.get("device", run.config.get("run.device", "cpu"))),
                    int(plan.get("threads_per_rank", 1) or 1), work, unit, samples, power,
                    dict(plan), zero, control=_seconds(s, "median_control_s"))


def state_shards(plan, zero: int, ranks: int) -> dict:
    """Over how many ranks the run divided its weights, gradients and optimizer state (1:
    replicated), as /plan records it (memory_plan_<category>_shards). Files written before the
    binary recorded them carry only dist.zero: for those, ZeRO's rules (>= 1 optimizer state,
    >= 2 gradients, 3 weights, over the run's ranks)."""
    shards = {}
    for c, stage in (("weight", 3), ("gradient", 2), ("optimizer_state", 1)):
        try:
            n = int(plan.get(f"memory_plan_{c}_shards", 0) or 0)
        except (TypeError, ValueError):
            n = 0
        shards[c] = n if n >= 1 else (ranks if zero >= stage else 1)
    return shards


# --- the model of one configuration -------------------------------------------------------------
@dataclass
class ConfigModel:
    label: str
    workload: str
    mode: str
    config: dict
    runs: list[Measured]
    phases: dict = field(default_factory=dict)     # name -> Extra-P model
    comm: dict = field(default_factory=dict)
    comm_models: dict = field(default_factory=dict)  # (op, scope) -> AlphaBeta
    cores_per_node: float | None = None
    shared_host_cores: float | None = None
    sigma_fit: float = 0.0
    sigma_repeat: float = 0.0
    notes: list[str] = field(default_factory=list)

    # -- measured facts
    @property
    def rank_counts(self) -> list[int]:
        return sorted({m.ranks for m in self.runs})

    @property
    def points(self) -> list[tuple[int, int]]:
        return sorted({(m.ranks, m.nodes) for m in self.runs})

    @property
    def ranks_per_node(self) -> int:
        return max(math.ceil(m.ranks / max(m.nodes, 1)) for m in self.runs)

    @property
    def unit(self) -> str:
        return self.runs[0].unit

    def kfactor(self, ranks: int, nodes: int) -> float:
        m = self.runs[0]
        return contention(m.device, ranks, nodes, m.threads, self.cores_per_node,
                          self.shared_host_cores)

    def _per_step(self, attr: str, ranks: int) -> float:
        """Measured `attr` (all ranks' work per step) at `ranks`: the mean of the runs under
        strong scaling (fixed global batch), the per-rank mean x ranks under weak scaling."""
        base = [(getattr(m, attr), m.ranks) for m in self.runs if getattr(m, attr) ==
                getattr(m, attr)]
        if not base:
            return math.nan
        if self.mode == "weak":
            return float(np.mean([w / r for w, r in base])) * ranks
        return float(np.mean([w for w, _ in base]))

    def work_per_step(self, ranks: int) -> float:
        """Samples or tokens (self.unit) per step at `ranks`."""
        return self._per_step("work", ranks)

    def samples_per_step(self, ranks: int) -> float:
        return self._per_step("samples", ranks)

    # -- prediction
    def comm_time(self, ranks: int, nodes: int) -> tuple[float, float, str]:
        """(collective seconds per step, exposed seconds per step before the backward cap, what
        they are based on) at ranks/nodes."""
        c = self.comm
        if ranks <= 1 or not c:
            return 0.0, 0.0, "none (1 rank)" if ranks <= 1 else "none"
        if c["source"] == "alpha-beta":
            scope = "inter" if nodes > 1 else "intra"
            ab = self.comm_models.get(("allreduce", scope))
            basis = f"alpha-beta {scope}"
            if ab is None:
                other = "intra" if scope == "inter" else "inter"
                ab = self.comm_models.get(("allreduce", other))
                basis = f"alpha-beta {other} (NO {scope}-node comm runs)"
            t = c["rounds"] * sum(ab.time(b, ranks) for b in c["bucket_bytes"])
            return t, t * (1.0 - c["overlap"][scope]), basis
        if "sync" in self.phases:
            w = max(0.0, evaluate_pmnf(self.phases["sync"], ranks)) - c.get("sync_base", 0.0)
            return w, w, "extrap comm_wait+control"
        return 0.0, 0.0, "none (no comm model)"

    def step(self, ranks: int, nodes: int) -> dict:
        k = self.kfactor(ranks, nodes)
        parts = {p: max(0.0, evaluate_pmnf(self.phases[p], ranks)) * k
                 for p in COMPUTE_PHASES if p in self.phases}
        other = evaluate_pmnf(self.phases["other"], ranks) if "other" in self.phases else 0.0
        coll, exposed, basis = self.comm_time(ranks, nodes)
        if self.comm.get("source") == "alpha-beta" and ranks > 1:
            exposed = max(exposed, coll - parts.get("backward", 0.0))
        total = sum(parts.values()) + self.comm.get("sync_base", 0.0) + exposed + other
        return {"step_s": total, "compute_s": sum(parts.values()), "collective_s": coll,
                "exposed_comm_s": exposed, "other_s": other, "contention": k, "phases": parts,
                "comm_basis": basis}

    def sigma(self, comm_share: float, scope: str) -> float:
        ab = self.comm_models.get(("allreduce", scope)) if self.comm.get("source") == \
            "alpha-beta" else None
        s_ab = comm_share * ab.local_rms_rel if ab else 0.0
        return math.sqrt(self.sigma_fit**2 + self.sigma_repeat**2 + s_ab**2)

    def predict(self, ranks: int, nodes: int | None = None) -> dict:
        nodes = nodes or max(1, math.ceil(ranks / self.ranks_per_node))
        st = self.step(ranks, nodes)
        t = st["step_s"]
        lo_r, hi_r = min(self.rank_counts), max(self.rank_counts)
        doublings = math.log2(ranks / hi_r) if ranks > hi_r else (
            math.log2(lo_r / ranks) if ranks < lo_r else 0.0)
        share = st["exposed_comm_s"] / t if t > 0 else 0.0
        sig = self.sigma(share, "inter" if nodes > 1 else "intra")
        sig = math.sqrt((sig * (1 + doublings))**2 + (EXTRAPOLATION_SIGMA * doublings)**2)
        work = self.work_per_step(ranks)
        p0 = lo_r
        t0 = self.step(p0, max(1, math.ceil(p0 / self.ranks_per_node)))["step_s"]
        if self.mode == "weak":
            eff = t0 / t if t > 0 else math.nan
        else:
            eff = (p0 * t0) / (ranks * t) if t > 0 else math.nan
        powers = [m.power_w_per_rank for m in self.runs if m.power_w_per_rank == m.power_w_per_rank]
        samples = self.samples_per_step(ranks)
        energy = float(np.mean(powers)) * ranks * t / samples if powers and samples > 0 else \
            math.nan
        in_range = lo_r <= ranks <= hi_r and nodes <= max(m.nodes for m in self.runs)
        return {
            "ranks": ranks, "nodes": nodes, "step_s": t,
            "step_lo_s": max(0.0, t * (1 - 2 * sig)), "step_hi_s": t * (1 + 2 * sig),
            "sigma_rel": sig, "throughput": work / t if t > 0 else math.nan,
            "throughput_unit": f"{self.unit}/s", "efficiency": eff,
            "energy_per_sample_j": energy, "memory_bytes": self.memory(ranks),
            "in_range": in_range,
            "range": ("measured" if (ranks, nodes) in self.points else "interpolated") if in_range
            else "EXTRAPOLATED",
            "compute_s": st["compute_s"],
            "exposed_comm_s": st["exposed_comm_s"], "collective_s": st["collective_s"],
            "contention": st["contention"], "comm_basis": st["comm_basis"],
        }

    def memory(self, ranks: int) -> float:
        """Per-device bytes at `ranks` from the /plan of the measured run with the most ranks: a
        category the run divided over n > 1 ranks (/plan memory_plan_<category>_shards, written
        by the binary from its own sharding rules) holds n/ranks of it at `ranks`, a replicated
        one (n = 1) all of it; under strong scaling the activations and logits follow the
        per-rank batch."""
        ref = max(self.runs, key=lambda m: m.ranks)
        plan = ref.plan
        cats = {c: float(plan.get(f"memory_plan_{c}_bytes", 0.0) or 0.0) for c in MEMORY_CATEGORIES}
        if not any(cats.values()):
            est = float(plan.get("memory_estimate_bytes", math.nan))
            return est
        for c, n in state_shards(plan, ref.zero, ref.ranks).items():
            if n > 1:
                cats[c] *= n / ranks
        if self.mode == "strong":
            b0 = float(plan.get("batch_per_rank", 0) or 0)
            g = float(plan.get("global_batch", 0) or 0)
            if b0 > 0 and g > 0:
                ga = float(plan.get("gradient_accumulation", 1) or 1)
                b = max(1.0, math.ceil(g / ga / ranks))
                for c in ("activation", "logits"):
                    cats[c] *= b / b0
        return float(sum(cats.values()))

    # -- reporting
    def fit_rows(self) -> list[dict]:
        rows = []
        for r, n in self.points:
            ms = [m.step for m in self.runs if (m.ranks, m.nodes) == (r, n)]
            st = self.step(r, n)
            pred = st["step_s"]
            med = float(np.median(ms))
            coll = [m.collective for m in self.runs if (m.ranks, m.nodes) == (r, n)]
            rows.append({"ranks": r, "nodes": n, "repeats": len(ms), "measured_s": med,
                         "measured_min_s": float(min(ms)), "measured_max_s": float(max(ms)),
                         "predicted_s": pred, "rel_err": (pred - med) / med,
                         "collective_measured_s": float(np.median(coll)),
                         "collective_predicted_s": st["collective_s"]})
        return rows

    def to_json(self) -> dict:
        return {
            "label": self.label, "workload": self.workload, "mode": self.mode,
            "config": self.config, "unit": self.unit, "ranks_per_node": self.ranks_per_node,
            "cores_per_node": self.cores_per_node, "shared_host_cores": self.shared_host_cores,
            "phases": self.phases, "comm": self.comm,
            "sigma_fit": self.sigma_fit, "sigma_repeat": self.sigma_repeat,
            "notes": self.notes, "fit": self.fit_rows(),
            "runs": [m.path for m in self.runs],
        }


# --- tables for `model` and the report ----------------------------------------------------------
def comm_model_table(comm: dict):
    """One row per (collective, scope) alpha-beta model: the single line's alpha and busbw with its
    error, and the error of the size-local pricing the predictions use."""
    import pandas as pd
    return pd.DataFrame([{
        "op": ab.op, "scope": ab.scope, "ranks": ",".join(map(str, ab.ranks)),
        "sizes": ab.points, "alpha [us]": 1e6 * ab.alpha_s, "busbw [GB/s]": ab.busbw_GBps,
        "line RMS err [%]": 100 * ab.rms_rel, "line max err [%]": 100 * ab.max_rel,
        "local RMS err [%]": 100 * ab.local_rms_rel, "local max err [%]": 100 * ab.local_max_rel}
        for ab in comm.values()])


def phase_model_table(cm: ConfigModel):
    """The Extra-P model of each phase with its fit quality and hypothesis space."""
    import pandas as pd
    return pd.DataFrame([{"phase": k, "model [s] (p = ranks)": v["function"],
                          "SMAPE [%]": v["smape"], "adj. R2": v["ar2"], "search": v["search"]}
                         for k, v in cm.phases.items()])


def fit_table(cm: ConfigModel):
    """Predicted vs measured median step (and allreduce time) at every measured point."""
    import pandas as pd
    fit = pd.DataFrame(cm.fit_rows())
    fit["rel_err"] *= 100
    return fit.rename(columns={"measured_s": "measured [s]", "measured_min_s": "min [s]",
                               "measured_max_s": "max [s]", "predicted_s": "predicted [s]",
                               "rel_err": "error [%]",
                               "collective_measured_s": "allreduce meas. [s]",
                               "collective_predicted_s": "allreduce pred. [s]"})


def comm_summary(cm: ConfigModel) -> str | None:
    """What the alpha-beta pricing of a configuration's traffic rests on (None when its
    communication is fitted empirically; its notes say so)."""
    c = cm.comm
    if c.get("source") != "alpha-beta":
        return None
    return (f"communication: alpha-beta allreduce of {len(c['bucket_bytes'])} bucket(s), "
            f"{sum(c['bucket_bytes']) / 2**20:.3f} MiB x {c['rounds']:.3g} per step, "
            f"measured overlap {100 * c['overlap']['intra']:.0f} % intra-node, "
            f"{100 * c['overlap']['inter']:.0f} % inter-node (hidden at most the backward phase)")


def _series_for(cm_name: str, runs: list[Measured], mode: str, with_comm_wait: bool) -> list[dict]:
    by_p: dict[int, list[Measured]] = {}
    for m in runs:
        by_p.setdefault(m.ranks, []).append(m)
    ps = sorted(by_p)
    out = []
    for ph in COMPUTE_PHASES:
        out.append({"name": f"{cm_name}|{ph}", "points": ps, "scaling": mode,
                    "values": [[m.phases[ph] / m.kfactor for m in by_p[p]] for p in ps]})
    out.append({"name": f"{cm_name}|other", "points": ps, "scaling": mode,
                "values": [[m.other for m in by_p[p]] for p in ps]})
    if with_comm_wait:
        pc = [p for p in ps if p > 1]
        if pc:
            out.append({"name": f"{cm_name}|sync", "points": pc, "scaling": mode,
                        "values": [[m.sync for m in by_p[p]] for p in pc]})
    return out


def _comm_setup(runs: list[Measured], comm_models: dict) -> tuple[dict, list[str]]:
    notes = []
    multi = [m for m in runs if m.ranks > 1]
    single = [m.sync for m in runs if m.ranks == 1]
    base = float(np.median(single)) if single else 0.0
    ref = next((m for m in multi if m.buckets), None) or next((m for m in runs if m.buckets), None)
    zero = max(m.zero for m in runs)
    if zero >= 1:
        notes.append(f"dist.zero={zero}: its reduce-scatter/all-gather traffic is modelled "
                     "empirically (Extra-P on comm_wait), not by the alpha-beta allreduce model")
        return {"source": "extrap", "sync_base": base}, notes
    if ref is None:
        notes.append("no /comm/buckets: comm_wait modelled empirically (Extra-P)")
        return {"source": "extrap", "sync_base": base}, notes
    if not any(k[0] == "allreduce" for k in comm_models):
        notes.append("no run.workload=comm runs with allreduce: comm_wait modelled empirically "
                     "(Extra-P); add comm runs for the alpha-beta model")
        return {"source": "extrap", "sync_base": base}, notes
    total = sum(ref.buckets)
    rounds = [m.comm_bytes / total for m in multi if total > 0 and m.comm_bytes > 0]
    overlap = {}
    for scope in ("intra", "inter"):
        fr = [1.0 - (m.sync - base) / m.collective for m in multi if m.collective > 0 and
              (m.nodes > 1) == (scope == "inter")]
        if fr:
            overlap[scope] = float(np.clip(np.mean(fr), 0.0, 1.0))
    for scope, other in (("intra", "inter"), ("inter", "intra")):
        if scope not in overlap:
            if other in overlap:
                overlap[scope] = overlap[other]
                notes.append(f"overlap of {scope}-node traffic not measured: the {other}-node "
                             f"fraction {100 * overlap[other]:.0f} % is used")
            else:
                overlap[scope] = 0.0
    if not any(m.collective > 0 for m in multi):
        notes.append("no multi-rank run measured the overlap: none assumed (upper bound)")
    return {"source": "alpha-beta", "bucket_bytes": ref.buckets,
            "rounds": float(np.median(rounds)) if rounds else 1.0, "overlap": overlap,
            "sync_base": base}, notes


def build_models(study: Study, mode: str = "strong", cores_per_node: float | None = None,
                 shared_host_cores: float | None = None, include_incomplete: bool = False,
                 exclude=None, skipped: list[str] | None = None
                 ) -> tuple[list[ConfigModel], dict]:
    """Models of every cv/llm configuration of `study` and the alpha-beta models of its comm runs.
    `exclude(run) -> bool` leaves runs out (held-out points). Returns (models, comm models).

    A run without a positive, finite median step (step_problem) is left out, and a configuration
    left with no run is dropped: one line each, naming the files, the field and the fix, goes to
    `skipped` (to stderr when None), never silently. StudyError when no configuration is left."""
    def tell(line: str) -> None:
        if skipped is None:
            print(f"trainscope-post: {line}", file=sys.stderr)
        else:
            skipped.append(line)
    usable = [r for r in study.usable(include_incomplete) if r.summary or r.workload == "comm"]
    if exclude is not None:
        usable = [r for r in usable if not exclude(r)]
    comm_runs = [r for r in usable if r.workload == "comm"]
    train = [r for r in usable if r.workload in ("cv", "llm")]
    if not train:
        raise StudyError("no completed cv or llm runs to model")
    comm_models = fit_comm(comm_runs)
    groups = group_by_config(train, ignore=("dist.nodes",), mode=mode)
    models, dropped = [], []
    fix = ("re-run those points with measured iterations (profile.warmup_iters below "
           "train.max_iters) or leave the files out")
    for g in groups:
        same = [h for h in groups if h[0].workload == g[0].workload]
        name = describe_group(g, same, mode)
        if len({h[0].workload for h in groups}) > 1 and name != g[0].workload:
            name = f"{g[0].workload}: {name}"
        problems = [(r, step_problem(r)) for r in g]
        bad = [(r, why) for r, why in problems if why]
        if len(bad) == len(g):
            by_why: dict[str, list[str]] = {}
            for r, why in bad:
                by_why.setdefault(why, []).append(str(r.path))
            files = "; ".join(f"{why} in {', '.join(ps[:3])}" +
                              (f" and {len(ps) - 3} more" if len(ps) > 3 else "")
                              for why, ps in by_why.items())
            dropped.append(f"configuration {name!r} dropped from the model: none of its "
                           f"{len(bad)} run(s) has a positive, finite /summary median_step_s "
                           f"({files}); {fix}")
            continue
        for r, why in bad:
            tell(f"{r.path}: /summary {why} is not a positive, finite step time: left out of "
                 f"the model of configuration {name!r}; {fix}")
        ms = [measure(r) for r, why in problems if not why]
        cm = ConfigModel(name, g[0].workload, mode,
                         point_config(g[0], mode=mode), ms, comm_models=comm_models,
                         cores_per_node=cores_per_node, shared_host_cores=shared_host_cores)
        for m in ms:
            m.kfactor = cm.kfactor(m.ranks, m.nodes)
        cm.comm, cm.notes = _comm_setup(ms, comm_models)
        models.append(cm)
    if not models:
        raise StudyError("no configuration can be modelled: " + "; ".join(dropped[:3]) +
                         (f"; and {len(dropped) - 3} more" if len(dropped) > 3 else ""))
    for line in dropped:
        tell(line)
    _fit_phases(models)
    return models, comm_models


def _fit_phases(models: list[ConfigModel]):
    series = []
    for i, cm in enumerate(models):
        series += _series_for(str(i), cm.runs, cm.mode, cm.comm.get("source") != "alpha-beta")
    res = extrap_fit(series)["models"]
    for i, cm in enumerate(models):
        cm.phases = {k.split("|", 1)[1]: v for k, v in res.items() if k.split("|", 1)[0] == str(i)}
        _set_sigmas(cm)


def _set_sigmas(cm: ConfigModel):
    rows = cm.fit_rows()
    cm.sigma_fit = float(np.sqrt(np.mean([r["rel_err"] ** 2 for r in rows]))) if rows else 0.0
    cvs = []
    for r, n in cm.points:
        ms = [m.step for m in cm.runs if (m.ranks, m.nodes) == (r, n)]
        if len(ms) > 1:
            cvs.append(float(np.std(ms, ddof=1) / np.mean(ms)))
    cm.sigma_repeat = float(np.mean(cvs)) if cvs else 0.0


def leave_one_out(models: list[ConfigModel]) -> list[dict]:
    """Per configuration with at least 3 measured (ranks, nodes) points: each point left out in
    turn (all its repeats), the model refitted on the rest (same comm models), the point
    predicted. All folds go to Extra-P in one process."""
    folds = []
    series = []
    for cm in models:
        pts = cm.points
        if len(pts) < 3:
            continue
        for pt in pts:
            rest = [m for m in cm.runs if (m.ranks, m.nodes) != pt]
            if len({m.ranks for m in rest}) < 1:
                continue
            fold = ConfigModel(cm.label, cm.workload, cm.mode, cm.config, rest,
                               comm_models=cm.comm_models, cores_per_node=cm.cores_per_node,
                               shared_host_cores=cm.shared_host_cores)
            fold.comm, fold.notes = _comm_setup(rest, cm.comm_models)
            name = f"f{len(folds)}"
            series += _series_for(name, rest, cm.mode, fold.comm.get("source") != "alpha-beta")
            folds.append((cm, pt, fold, name))
    if not folds:
        return []
    res = extrap_fit(series)["models"]
    rows = []
    for cm, (r, n), fold, name in folds:
        fold.phases = {k.split("|", 1)[1]: v for k, v in res.items() if k.split("|", 1)[0] == name}
        ms = [m.step for m in cm.runs if (m.ranks, m.nodes) == (r, n)]
        meas = float(np.median(ms))
        pred = fold.step(r, n)["step_s"]
        rows.append({"configuration": cm.label, "ranks": r, "nodes": n, "measured_s": meas,
                     "predicted_s": pred, "rel_err": (pred - meas) / meas})
    return rows


def save(models: list[ConfigModel], comm_models: dict, path: Path, predictions=None, loo=None):
    doc = {"schema": SCHEMA,
           "comm": [ab.to_json() for ab in comm_models.values()],
           "configurations": [cm.to_json() for cm in models]}
    if predictions is not None:
        doc["predictions"] = predictions
    if loo is not None:
        doc["leave_one_out"] = loo
    Path(path).write_text(json.dumps(doc, indent=1, default=float))
    return path


def parse_counts(text: str) -> list[int]:
    """'8,16,32' -> [8, 16, 32]; 'a..b' doubles from a to b (e.g. 8..4096)."""
    out, backwards = [], ""
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if ".." in part:
                a, b = (int(x) for x in part.split("..", 1))
                if a > b:
                    backwards = f"{b}..{a}"
                    break
                v = a
                while v <= b:
                    out.append(v)
                    v *= 2
            else:
                out.append(int(part))
        except ValueError:
            raise StudyError(f"--predict {text!r}: {part!r} is not a rank count; use e.g. "
                             "8,16,32 or 8..4096") from None
    if backwards:
        raise StudyError(f"--predict {text!r}: a range runs backwards; write {backwards} "
                         "(e.g. 8..4096)")
    if not out or min(out) < 1:
        raise StudyError(f"--predict {text!r}: give positive rank counts, e.g. 8,16,32")
    return out


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use trainscope-post model")
