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
  non-finite check), which is added as a constant. The per-step gradient traffic is the buckets
  of /comm/buckets times the allreduce rounds per step (comm_bytes / sum of buckets). Its time
  at a placement (nodes x ranks per node) is, in this order of preference: what the training
  runs of the configuration recorded there (/comm/buckets per bucket, else comm_collective_s);
  the training runs' figure at the nearest measured placement of the same scope (intra-node
  when n = 1, else inter-node), scaled bucket by bucket by the comm benchmark's price ratio
  between the two placements; the comm benchmark's price alone (comm_model.py: alpha-beta per
  collective and scope, with the crossing bytes of the algorithm the backend runs, measured or
  assumed). Where both exist, the notes show the difference. Of that time the measured overlap
  fraction (1 - exposed / comm_collective at the measured multi-rank points of that scope; the
  other scope's, noted as assumed, when one is missing) is hidden, but never more than the
  backward phase it overlaps with. ZeRO runs (dist.zero >= 1), and configurations without
  buckets or comm runs, fit comm_wait + control empirically with Extra-P instead, and say so.

Uncertainty, per prediction (the band is +-2 sigma). At a measured placement (at the comm runs'
link rate where recorded): the point's own spread over its repeats and its own residual. Elsewhere:
the fit residuals (RMS relative error of the composed step at the measured points), the spread of
repeats (mean coefficient of variation) and the communication pricing's error (the alpha-beta
pricing's, plus the benchmark's measured disagreement with the training runs where it alone
prices) weighted by communication's share of the step; beyond the measured rank counts by d_r
doublings that sigma is multiplied by (1 + d_r) and EXTRAPOLATION_SIGMA * d_r is added in
quadrature; beyond the measured node counts by d_n doublings, NODE_EXTRAPOLATION_SIGMA * d_n *
the communication share; where the crossing algorithm or the inter-node overlap was assumed,
half the difference to the alternative (the other algorithm; no overlap).
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
from .comm_model import (OPS, AlphaBeta, algorithm, describe_placement,  # noqa: F401
                         doublings_apart, fit_comm, link_rate, placement)
from .study import (Run, Study, StudyError, describe_group, group_by_config, point_config)

COMPUTE_PHASES = ["data", "h2d", "forward", "backward", "optimizer"]
MEMORY_CATEGORIES = ["weight", "gradient", "optimizer_state", "activation", "logits",
                     "gathered_weight", "unit_gradient", "workspace",  # workspace: cuBLAS, GPU
                     "comm_buffer"]  # DDP's synchronizer buffers: none at one rank
SCHEMA = "trainscope-model/1"
# Relative sigma added per doubling of the rank count beyond the measured range: the model form
# itself is uncertain there (two or three points cannot tell p^-1 from p^-1/2 or a log term).
# Calibrated against the held-out and leave-one-out errors of docs/advisor.md.
EXTRAPOLATION_SIGMA = 0.05
# Relative sigma of the exposed communication per doubling of the node count beyond the measured
# ones: the crossing bytes there come from the algorithm calibrated (or assumed) at the measured
# placements. A first figure, to be checked by the strict hold-out of docs/advisor.md.
NODE_EXTRAPOLATION_SIGMA = 0.10
EXTRAP_TIMEOUT_S = 600  # one Extra-P process fits every series of a study


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
    bucket_times: list = field(default_factory=list)  # per bucket [s per step]; [] unrecorded
    link_rate: str = ""    # the inter-node link's rate where recorded (comm_model.link_rate)
    # comm_uncompressed_bytes (dist.compress): what comm_bytes would have been uncompressed;
    # 0 in files before the column
    uncompressed_bytes: float = 0.0

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
        def med(col, group=schema.ITERATIONS):
            """Per iteration the mean over ranks (all ranks: the aggregates where the file has
            them; /comm/buckets has none, so its detail ranks' rows), then the median (the
            writer's /summary statistic); 0 when the file lacks the column or holds no number
            in it."""
            v = rf.over_ranks(col, group, "mean")
            v = v[np.isfinite(v)]
            return float(np.median(v)) if v.size else 0.0
        collective, comm_bytes = med("comm_collective_s"), med("comm_bytes")
        uncompressed = med("comm_uncompressed_bytes")
        buckets = [float(b) for b in rf.series(schema.COMM_BUCKETS, "bytes").values] \
            if rf.has(schema.COMM_BUCKETS_BYTES) else []
        bucket_times = [med(f"bucket_{k}_s", schema.COMM_BUCKETS) for k in range(len(buckets))]
        if not all(t > 0 for t in bucket_times):
            bucket_times = []  # not every bucket timed: the step's comm_collective_s stands
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
                    dict(plan), zero, control=_seconds(s, "median_control_s"),
                    bucket_times=bucket_times, link_rate=link_rate(run.path),
                    uncompressed_bytes=uncompressed)


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
    link_rate: str = ""     # the comm runs' link rate, where recorded: the network modelled

    # -- measured facts
    @property
    def rank_counts(self) -> list[int]:
        return sorted({m.ranks for m in self.runs})

    def same_link(self, m: Measured) -> bool:
        """Whether run `m` measured the network this model prices: one node (no link), or a
        link rate that is not recorded on either side or is the comm runs'."""
        return m.nodes <= 1 or not self.link_rate or not m.link_rate or \
            m.link_rate == self.link_rate

    def runs_at(self, ranks: int, nodes: int) -> list[Measured]:
        """The runs that measured (ranks, nodes) on the network this model prices."""
        return [m for m in self.runs if (m.ranks, m.nodes) == (ranks, nodes) and self.same_link(m)]

    @property
    def node_counts(self) -> list[int]:
        """The node counts measured on the network this model prices."""
        return sorted({m.nodes for m in self.runs if self.same_link(m)}) or [1]

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
    def _comm_model(self, scope: str) -> tuple[AlphaBeta | None, str]:
        """The allreduce model of `scope` and the basis it names (the other scope's, flagged,
        when the comm runs measured none)."""
        ab = self.comm_models.get(("allreduce", scope))
        if ab is not None:
            return ab, f"alpha-beta {scope}"
        other = "intra" if scope == "inter" else "inter"
        return (self.comm_models.get(("allreduce", other)),
                f"alpha-beta {other} (NO {scope}-node comm runs)")

    def bench_collective(self, ranks: int, nodes: int, alg: str | None = None) -> float:
        """The per-step gradient allreduce priced by the comm benchmark alone [s]."""
        c = self.comm
        ab, _ = self._comm_model("inter" if nodes > 1 else "intra")
        return c["rounds"] * sum(ab.time(b, ranks, nodes, alg) for b in c["bucket_bytes"])

    def _from_training(self, ref: tuple[int, int], ranks: int, nodes: int,
                       alg: str | None) -> float:
        """The training runs' allreduce per step at placement `ref`, scaled to (ranks, nodes) by
        the comm benchmark's price ratio, bucket by bucket where the buckets were timed."""
        c = self.comm
        tr = c["train"][ref]
        ab, _ = self._comm_model("inter" if nodes > 1 else "intra")

        def ratio(nbytes):
            base = ab.time(nbytes, tr["ranks"], tr["nodes"], alg)
            return ab.time(nbytes, ranks, nodes, alg) / base if base > 0 else 1.0
        if tr["bucket_s"]:
            return sum(t * ratio(b) for t, b in zip(tr["bucket_s"], c["bucket_bytes"]))
        base = self.bench_collective(tr["ranks"], tr["nodes"], alg)
        return tr["total_s"] * (self.bench_collective(ranks, nodes, alg) / base if base > 0
                                else 1.0)

    def comm_time(self, ranks: int, nodes: int, alg: str | None = None
                  ) -> tuple[float, float, str, str]:
        """(collective seconds per step, exposed seconds per step before the backward cap, the
        model it is based on, where its figure comes from) at ranks/nodes. `alg`: price the
        crossing bytes under that algorithm instead of the calibrated one."""
        c = self.comm
        if ranks <= 1 or not c:
            return 0.0, 0.0, "none (1 rank)" if ranks <= 1 else "none", "-"
        if c["source"] == "alpha-beta":
            scope = "inter" if nodes > 1 else "intra"
            ab, basis = self._comm_model(scope)
            pl = placement(ranks, nodes)
            train = c["train"]
            refs = [q for q in train if (q[0] > 1) == (nodes > 1)]
            if pl in train and train[pl]["ranks"] == ranks and alg is None:
                t = train[pl]["total_s"]
                source = f"training runs at {describe_placement(*pl)}"
            elif refs and ab.scope == scope:
                ref = min(refs, key=lambda q: (doublings_apart(pl, q), -q[0], -q[1]))
                t = self._from_training(ref, ranks, nodes, alg)
                source = (f"training runs at {describe_placement(*ref)} x comm-benchmark ratio "
                          f"({ab.algorithm if alg is None else alg})")
            else:
                t = self.bench_collective(ranks, nodes, alg)
                source = f"comm benchmark ({ab.algorithm if alg is None else alg})" \
                    if scope == "inter" else "comm benchmark"
            return t, t * (1.0 - c["overlap"][scope]), basis, source
        if "sync" in self.phases:
            w = max(0.0, evaluate_pmnf(self.phases["sync"], ranks)) - c.get("sync_base", 0.0)
            return w, w, "extrap comm_wait+control", "Extra-P on comm_wait + control"
        return 0.0, 0.0, "none (no comm model)", "-"

    def step(self, ranks: int, nodes: int, alg: str | None = None,
             overlap: float | None = None, comm_scale: float = 1.0) -> dict:
        """The composed step at ranks/nodes; `alg` and `overlap` replace the calibrated
        crossing algorithm and the scope's overlap fraction (for the band's alternatives).
        `comm_scale`: the gradient traffic's bytes x this (dist.compress: compressed /
        uncompressed bytes, compression.knob); its time is taken as proportional to the bytes
        (latency included, so small buckets' savings are overstated)."""
        k = self.kfactor(ranks, nodes)
        parts = {p: max(0.0, evaluate_pmnf(self.phases[p], ranks)) * k
                 for p in COMPUTE_PHASES if p in self.phases}
        other = evaluate_pmnf(self.phases["other"], ranks) if "other" in self.phases else 0.0
        coll, exposed, basis, source = self.comm_time(ranks, nodes, alg)
        coll, exposed = coll * comm_scale, exposed * comm_scale
        if self.comm.get("source") == "alpha-beta" and ranks > 1:
            if overlap is not None:
                exposed = coll * (1.0 - overlap)
            exposed = max(exposed, coll - parts.get("backward", 0.0))
        total = sum(parts.values()) + self.comm.get("sync_base", 0.0) + exposed + other
        return {"step_s": total, "compute_s": sum(parts.values()), "collective_s": coll,
                "exposed_comm_s": exposed, "other_s": other, "contention": k, "phases": parts,
                "comm_basis": basis, "comm_source": source}

    def sigma(self, comm_share: float, scope: str, calibrated: bool) -> float:
        """The configuration's sigma at a point it did not measure, before widening: fit
        residuals, repeats, and the communication pricing's error. `calibrated`: the training
        runs' own traffic prices it (the benchmark gives only a ratio); else the benchmark's
        disagreement with the training runs, where measured, counts too."""
        ab = self.comm_models.get(("allreduce", scope)) if self.comm.get("source") == \
            "alpha-beta" else None
        err = ab.local_rms_rel if ab else 0.0
        if ab and not calibrated:
            err = math.hypot(err, self.comm.get("bench_error", 0.0))
        return math.sqrt(self.sigma_fit**2 + self.sigma_repeat**2 + (comm_share * err)**2)

    def describe(self, ranks: int, nodes: int) -> str:
        """What was measured and what is extrapolated at (ranks, nodes), in words."""
        rate = f" at {self.link_rate}" if self.link_rate and nodes > 1 else ""
        here = self.runs_at(ranks, nodes)
        where = describe_placement(*placement(ranks, nodes))
        if here:
            return f"measured: {where}{rate} ({len(here)} run{'s' if len(here) > 1 else ''})"
        lo, hi = min(self.rank_counts), max(self.rank_counts)
        parts = []
        on = sorted({m.nodes for m in self.runs if m.ranks == ranks and self.same_link(m)})
        if on:
            parts.append(f"{ranks} ranks measured on {'/'.join(map(str, on))} "
                         f"node{'s' if on[-1] > 1 else ''}")
        else:
            span = f"{lo}-{hi}" if lo < hi else f"{lo}"
            parts.append(f"{ranks} ranks {'interpolated' if lo < ranks < hi else 'extrapolated'}"
                         f" (measured {span})")
        counts = self.node_counts
        if nodes in counts:
            at = sorted({m.ranks for m in self.runs if m.nodes == nodes and self.same_link(m)})
            parts.append(f"{nodes} node{'s' if nodes > 1 else ''} measured (at "
                         f"{'/'.join(map(str, at))} rank{'s' if at[-1] > 1 else ''}){rate}")
        else:
            parts.append(f"{nodes} node{'s' if nodes > 1 else ''} "
                         f"{'interpolated' if counts[0] < nodes < counts[-1] else 'extrapolated'}"
                         f" (measured {'/'.join(map(str, counts))}){rate}")
        elsewhere = sorted({m.link_rate for m in self.runs
                            if (m.ranks, m.nodes) == (ranks, nodes) and not self.same_link(m)})
        if elsewhere:
            parts.append(f"{where} measured at {'/'.join(elsewhere)} only, not at the comm "
                         f"runs' {self.link_rate}: its communication repriced")
        return "; ".join(parts)

    def predict(self, ranks: int, nodes: int | None = None) -> dict:
        nodes = nodes or max(1, math.ceil(ranks / self.ranks_per_node))
        st = self.step(ranks, nodes)
        t = st["step_s"]
        lo_r, hi_r = min(self.rank_counts), max(self.rank_counts)
        counts = self.node_counts
        share = st["exposed_comm_s"] / t if t > 0 else 0.0
        here = self.runs_at(ranks, nodes)
        terms = {}
        if here:  # the point's own spread and residual, not the configuration's
            steps = [m.step for m in here]
            med = float(np.median(steps))
            terms["repeats"] = float(np.std(steps, ddof=1) / np.mean(steps)) \
                if len(steps) > 1 else 0.0
            terms["residual"] = (t - med) / med
        else:
            d_r = math.log2(ranks / hi_r) if ranks > hi_r else (
                math.log2(lo_r / ranks) if ranks < lo_r else 0.0)
            d_n = math.log2(nodes / counts[-1]) if nodes > counts[-1] else (
                math.log2(counts[0] / nodes) if nodes < counts[0] else 0.0)
            scope = "inter" if nodes > 1 else "intra"
            calibrated = st["comm_source"].startswith("training")
            terms["fit"] = self.sigma(share, scope, calibrated) * (1 + d_r)
            terms["ranks"] = EXTRAPOLATION_SIGMA * d_r
            terms["nodes"] = NODE_EXTRAPOLATION_SIGMA * d_n * share
            if t > 0 and self.comm.get("source") == "alpha-beta" and ranks > 1:
                ab, _ = self._comm_model(scope)
                if ab.scope != scope:  # the other scope's model: anywhere up to what it prices
                    terms["scope"] = share / 2
                if scope == "inter" and ab.scope == "inter" and not ab.algorithm_measured:
                    other = "ring" if ab.algorithm == "hierarchical" else "hierarchical"
                    terms["algorithm"] = abs(self.step(ranks, nodes, alg=other)["step_s"] - t) \
                        / (2 * t)
                if scope in self.comm.get("overlap_assumed", ()):
                    terms["overlap"] = abs(self.step(ranks, nodes, overlap=0.0)["step_s"] - t) \
                        / (2 * t)
        sig = math.sqrt(sum(v * v for v in terms.values()))
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
        in_range = lo_r <= ranks <= hi_r and counts[0] <= nodes <= counts[-1]
        return {
            "ranks": ranks, "nodes": nodes, "step_s": t,
            "step_lo_s": max(0.0, t * (1 - 2 * sig)), "step_hi_s": t * (1 + 2 * sig),
            "sigma_rel": sig, "sigma_terms": terms,
            "throughput": work / t if t > 0 else math.nan,
            "throughput_unit": f"{self.unit}/s", "efficiency": eff,
            "energy_per_sample_j": energy, "memory_bytes": self.memory(ranks),
            "in_range": bool(here) or in_range, "measured": bool(here),
            "range": "measured" if here else ("interpolated" if in_range else "EXTRAPOLATED"),
            "label": self.describe(ranks, nodes),
            "compute_s": st["compute_s"],
            "exposed_comm_s": st["exposed_comm_s"], "collective_s": st["collective_s"],
            "contention": st["contention"], "comm_basis": st["comm_basis"],
            "comm_source": st["comm_source"],
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
        if ranks == 1:  # one rank sends nothing: no synchronizer buffers
            cats["comm_buffer"] = 0.0
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
            bench = self.bench_collective(r, n) if self.comm.get("source") == "alpha-beta" \
                and r > 1 else math.nan
            rows.append({"ranks": r, "nodes": n, "repeats": len(ms), "measured_s": med,
                         "measured_min_s": float(min(ms)), "measured_max_s": float(max(ms)),
                         "predicted_s": pred, "rel_err": (pred - med) / med,
                         "collective_measured_s": float(np.median(coll)),
                         "collective_predicted_s": st["collective_s"],
                         "collective_bench_s": bench})
        return rows

    def to_json(self) -> dict:
        return {
            "label": self.label, "workload": self.workload, "mode": self.mode,
            "config": self.config, "unit": self.unit, "ranks_per_node": self.ranks_per_node,
            "cores_per_node": self.cores_per_node, "shared_host_cores": self.shared_host_cores,
            "link_rate": self.link_rate, "phases": self.phases,
            "comm": {k: ({f"{n}x{g}": v for (n, g), v in c.items()} if k == "train" else c)
                     for k, c in self.comm.items()},
            "sigma_fit": self.sigma_fit, "sigma_repeat": self.sigma_repeat,
            "notes": self.notes, "fit": self.fit_rows(),
            "runs": [m.path for m in self.runs],
        }


# --- tables for `model` and the report ----------------------------------------------------------
def comm_model_table(comm: dict):
    """One row per (collective, scope) alpha-beta model: the placements measured, the algorithm
    whose crossing bytes it uses (ASSUMED when the placements cannot tell), the single line's
    alpha and busbw with its error, and the error of the size-local pricing the predictions use."""
    import pandas as pd
    return pd.DataFrame([{
        "op": ab.op, "scope": ab.scope,
        "nodes x ranks": ",".join(f"{n}x{g}" for n, g in ab.placements),
        "algorithm": ab.algorithm + ("" if ab.algorithm_measured else " (ASSUMED)"),
        "link": ",".join(ab.link_rates) or "-",
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
                               "collective_predicted_s": "allreduce pred. [s]",
                               "collective_bench_s": "comm bench. [s]"})


def comm_summary(cm: ConfigModel) -> str | None:
    """What the alpha-beta pricing of a configuration's traffic rests on (None when its
    communication is fitted empirically; its notes say so)."""
    c = cm.comm
    if c.get("source") != "alpha-beta":
        return None
    over = ", ".join(f"{100 * c['overlap'][scope]:.0f} % {scope}-node ("
                     f"{'ASSUMED' if scope in c['overlap_assumed'] else 'measured'})"
                     for scope in ("intra", "inter"))
    return (f"communication: alpha-beta allreduce of {len(c['bucket_bytes'])} bucket(s), "
            f"{sum(c['bucket_bytes']) / 2**20:.3f} MiB x {c['rounds']:.3g} per step, "
            f"overlap {over}, hidden at most the backward phase")


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


def _comm_setup(cm: ConfigModel) -> None:
    """Sets cm.comm (how the configuration's communication is priced: its buckets and rounds,
    the overlap per scope, the training runs' own allreduce per placement) and cm.notes (what
    that rests on, and where the comm benchmark disagrees with the training runs)."""
    runs, comm_models = cm.runs, cm.comm_models
    notes = []
    single = [m.sync for m in runs if m.ranks == 1]
    base = float(np.median(single)) if single else 0.0
    ref = next((m for m in runs if m.ranks > 1 and m.buckets), None) or \
        next((m for m in runs if m.buckets), None)
    zero = max(m.zero for m in runs)
    empirical = {"source": "extrap", "sync_base": base}
    if zero >= 1:
        notes.append(f"dist.zero={zero}: its reduce-scatter/all-gather traffic is modelled "
                     "empirically (Extra-P on comm_wait), not by the alpha-beta allreduce model")
        cm.comm, cm.notes = empirical, notes
        return
    if ref is None:
        notes.append("no /comm/buckets: comm_wait modelled empirically (Extra-P)")
        cm.comm, cm.notes = empirical, notes
        return
    if not any(k[0] == "allreduce" for k in comm_models):
        notes.append("no run.workload=comm runs with allreduce: comm_wait modelled empirically "
                     "(Extra-P); add comm runs for the alpha-beta model")
        cm.comm, cm.notes = empirical, notes
        return
    total = sum(ref.buckets)
    rounds = [m.comm_bytes / total for m in runs
              if m.ranks > 1 and total > 0 and m.comm_bytes > 0]
    multi = [m for m in runs if m.ranks > 1 and cm.same_link(m)]
    apart = [m for m in runs if m.ranks > 1 and not cm.same_link(m)]
    if apart:
        notes.append(f"{len(apart)} multi-node run(s) at link rate "
                     f"{'/'.join(sorted({m.link_rate for m in apart}))}, not the comm runs' "
                     f"{cm.link_rate}: their compute phases are fitted, their communication and "
                     "overlap are not used")
    overlap, assumed = {}, []
    for scope in ("intra", "inter"):
        fr = [1.0 - (m.sync - base) / m.collective for m in multi if m.collective > 0 and
              (m.nodes > 1) == (scope == "inter")]
        if fr:
            overlap[scope] = float(np.clip(np.mean(fr), 0.0, 1.0))
    for scope, other in (("intra", "inter"), ("inter", "intra")):
        if scope not in overlap:
            if other in overlap:
                overlap[scope] = overlap[other]
                assumed.append(scope)
                runs_of = "multi-node" if scope == "inter" else "one-node multi-rank"
                notes.append(f"ASSUMED overlap of {scope}-node traffic: no {runs_of} training "
                             f"run measured it, so the {other}-node {100 * overlap[other]:.0f} % "
                             "is used (hidden at most the backward phase); the band spans no "
                             "overlap")
            else:
                overlap[scope] = 0.0
    if not any(m.collective > 0 for m in multi):
        notes.append("no multi-rank run measured the overlap: none assumed (upper bound)")
    by_pl: dict[tuple[int, int], list[Measured]] = {}
    for m in multi:
        if m.collective > 0:
            by_pl.setdefault(placement(m.ranks, m.nodes), []).append(m)
    train = {}
    for pl, ms in by_pl.items():
        timed = [m.bucket_times for m in ms if len(m.bucket_times) == len(ref.buckets)]
        train[pl] = {"ranks": ms[0].ranks, "nodes": ms[0].nodes, "runs": len(ms),
                     "total_s": float(np.median([m.collective for m in ms])),
                     "bucket_s": [float(x) for x in np.median(timed, axis=0)] if timed else []}
    cm.comm = {"source": "alpha-beta", "bucket_bytes": ref.buckets,
               "rounds": float(np.median(rounds)) if rounds else 1.0, "overlap": overlap,
               "overlap_assumed": assumed, "sync_base": base, "train": train}
    errs = []
    for pl, tr in sorted(train.items()):
        bench = cm.bench_collective(tr["ranks"], tr["nodes"])
        if bench > 0:
            errs.append(bench / tr["total_s"] - 1.0)
            notes.append(f"allreduce per step at {describe_placement(*pl)}: the training runs "
                         f"recorded {tr['total_s']:.4g} s, the comm benchmark prices {bench:.4g} "
                         f"s ({100 * errs[-1]:+.0f} %); the training runs' figure is used there "
                         "and, times the benchmark's ratio, at the other placements of its scope")
    cm.comm["bench_error"] = max(map(abs, errs)) if errs else 0.0
    if not any(pl[0] > 1 for pl in train):
        rate = f" at {cm.link_rate}" if cm.link_rate else ""
        off = (f", which was off by up to {100 * cm.comm['bench_error']:.0f} % where the "
               "training runs measured it (in the band)") if errs else ""
        notes.append(f"no multi-node training run{rate}: inter-node traffic is priced by the "
                     f"comm benchmark alone{off}")
    inter = comm_models.get(("allreduce", "inter"))
    if inter is not None:
        notes.append(f"bytes crossing the inter-node link: {inter.algorithm} allreduce, "
                     f"{inter.algorithm_basis}")
        if len(inter.link_rates) > 1:
            notes.append(f"the inter-node comm runs mix link rates ({', '.join(inter.link_rates)})"
                         ": their tables are pooled and no training run is told apart by its "
                         "rate; model one rate at a time")
    else:
        notes.append("NO inter-node comm runs: a multi-node placement is priced by the "
                     "intra-node model")
    cm.notes = notes


def _target_rate(comm_models: dict) -> str:
    """The link rate of the network the models price: that of the inter-node comm runs where
    the campaign recorded one rate ("" otherwise; _comm_setup notes a mix)."""
    ab = comm_models.get(("allreduce", "inter"))
    return ab.link_rates[0] if ab is not None and len(ab.link_rates) == 1 else ""


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
    target_rate = _target_rate(comm_models)
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
        cm.link_rate = target_rate
        _comm_setup(cm)
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
    # the points measured on the network the model prices: a run at another link rate is
    # repriced, its residual is the other link's, not the model's error
    rows = [r for r in cm.fit_rows() if cm.runs_at(r["ranks"], r["nodes"])]
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
            fold.link_rate = cm.link_rate
            _comm_setup(fold)
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
