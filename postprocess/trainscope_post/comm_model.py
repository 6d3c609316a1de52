"""The network side of the performance model: what a collective costs at a placement (nodes x ranks
per node), fitted from the per-placement tables of the comm benchmark (run.workload=comm).

A placement is not priced by its rank count alone. What crosses the inter-node link depends on
the algorithm the backend runs: under a ring over all p ranks every node's link carries
2(p-1)/p of an allreduce's bytes, under a hierarchical allreduce (reduce inside each node, ring
among one rank per node, broadcast inside each node) 2(N-1)/N, as much at 2+2 as at 1+1 (Open MPI
on the emulated nodes: 8 MiB in 1.25 s at 2+2 and 1.31 s at 1+1, issue 38). Which algorithm ran
is decided from the comm runs where they measured two placements the algorithms price
differently; otherwise it is assumed from the backend, and the model says so.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import schema

OPS = ("allreduce", "allgather", "reduce_scatter", "broadcast")
ALGORITHMS = ("ring", "hierarchical")
# The allreduce across nodes when the comm runs cannot tell: Open MPI's crossed the link with the
# same bytes at 2+2 as at 1+1 on the emulated nodes (issue 38); NCCL's rings pass through every
# rank, so each node's link carries 2(p-1)/p of the message.
DEFAULT_ALGORITHM = {"mpi": "hierarchical", "nccl": "ring"}
# Two algorithms are told apart by a pair of measured placements when the ratio of their link
# bytes between the two differs by more than this.
DISTINCT = 0.05
MANIFEST_MAX_BYTES = 16 << 20


def algorithm(op: str, n: int) -> tuple[float, float]:
    """(latency steps L(n), bandwidth factor F(n)) of the ring algorithm of `op` on n ranks."""
    if n <= 1:
        return 0.0, 0.0
    if op == "allreduce":
        return 2.0 * (n - 1), 2.0 * (n - 1) / n
    if op in ("allgather", "reduce_scatter"):
        return float(n - 1), (n - 1) / n
    return 1.0, 1.0  # broadcast (pipelined)


def placement(ranks: int, nodes: int) -> tuple[int, int]:
    """(nodes, ranks per node) of `ranks` spread over `nodes` nodes (the fullest node counts)."""
    nodes = max(1, int(nodes))
    return nodes, max(1, math.ceil(ranks / nodes))


def describe_placement(nodes: int, per_node: int) -> str:
    """'2 nodes x 1 rank', '1 node x 2 ranks'."""
    return (f"{nodes} node{'s' if nodes > 1 else ''} x {per_node} "
            f"rank{'s' if per_node > 1 else ''}")


def crossing(alg: str, op: str, nodes: int, per_node: int) -> tuple[float, float]:
    """(latency steps L, bytes each node's link carries per byte of message F) of `op` at a
    placement. Within one node: the ring over its ranks. Across nodes, for an allreduce: the ring
    over all ranks, or the hierarchical algorithm's ring among one rank per node (its node-local
    reduce and broadcast are priced separately, AlphaBeta.stage). Other collectives: the ring."""
    if nodes <= 1:
        return algorithm(op, per_node)
    if alg == "hierarchical" and op == "allreduce":
        return algorithm(op, nodes)
    return algorithm(op, nodes * per_node)


def doublings_apart(a: tuple[int, int], b: tuple[int, int]) -> float:
    """Doublings between two placements, in nodes plus in ranks per node."""
    return abs(math.log2(a[0] / b[0])) + abs(math.log2(a[1] / b[1]))


def link_rate(path) -> str:
    """The rate of the inter-node link a run was made at, where it is recorded: the `rate` of the
    campaign manifest that benchmarks/advisor_runs.py writes (OUT/manifest.json, listing every
    run file relative to OUT), found in one of the three directories above the file; "" when no
    manifest there lists it. A manifest that is not a regular file, too large or not JSON is
    ignored."""
    p = Path(path).resolve()
    for d in list(p.parents)[:3]:
        m = d / "manifest.json"
        try:
            if not m.is_file() or m.stat().st_size > MANIFEST_MAX_BYTES:
                continue
            doc = json.loads(m.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict) or not doc.get("rate"):
            continue
        runs = doc.get("runs", [])
        files = {str(r.get("file")) for r in runs if isinstance(r, dict)} \
            if isinstance(runs, list) else set()
        if str(p.relative_to(d)) in files:
            return str(doc["rate"])
    return ""


# --- alpha-beta per collective and scope ----------------------------------------------------------
@dataclass
class AlphaBeta:
    """The alpha-beta model of one collective in one scope (intra: all ranks on one node; inter:
    more than one node), from the comm runs' (size, time) tables at each measured placement.

    One line t = alpha * L + beta * F * S over all sizes and placements, with the algorithm's
    L and F (crossing), is the summary (alpha, busbw = 1 / beta: per node's link across nodes).
    Real transports are not one line (eager/rendezvous protocols, TCP windows, a token bucket's
    burst), so a message of S bytes at a measured placement is priced by the alpha-beta line
    fitted to the measured sizes within a factor of 4 of S (the nearest two when fewer). An
    unmeasured placement takes the nearest measured one (in doublings of nodes plus of ranks per
    node) as its reference: the reference's time for the message whose link bytes there equal
    the target's (S * F / F_ref), plus alpha * (L - L_ref), plus, for the hierarchical
    algorithm, the change in its node-local stages (the intra-node model)."""

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
    tables: dict = field(default_factory=dict)  # (nodes, per_node) -> (sizes [B], times [s])
    files: list[str] = field(default_factory=list)
    algorithm: str = "ring"
    algorithm_basis: str = ""
    algorithm_measured: bool = True   # False: assumed from the backend
    backend: str = ""
    link_rates: list[str] = field(default_factory=list)
    stage: AlphaBeta | None = None    # intra-node model: a hierarchical allreduce's local stages

    @property
    def placements(self) -> list[tuple[int, int]]:
        return sorted(self.tables)

    def _local(self, nbytes: float, pl: tuple[int, int], skip: int | None = None) -> float:
        sizes, times = self.tables[pl]
        idx = [i for i in range(len(sizes)) if i != skip]
        near = [i for i in idx if sizes[i] / 4 <= nbytes <= sizes[i] * 4]
        if len(near) < 2:
            near = sorted(idx, key=lambda i: abs(math.log(sizes[i] / nbytes)))[:2]
        # within one placement L and F are constants: the line does not depend on the algorithm
        lat, fac = crossing(self.algorithm, self.op, *pl)
        a, b, *_ = _fit_alpha_beta([(lat, fac * sizes[i], times[i]) for i in near])
        return a * lat + b * fac * nbytes

    def stage_time(self, nbytes: float, per_node: int, alg: str | None = None) -> float:
        """The node-local reduce and broadcast of a hierarchical allreduce, priced as an
        allreduce among the node's ranks by the intra-node model (0 without one)."""
        alg = alg or self.algorithm
        if alg != "hierarchical" or self.op != "allreduce" or self.scope != "inter" or \
                per_node <= 1 or self.stage is None:
            return 0.0
        return self.stage.time(nbytes, per_node)

    def reference(self, pl: tuple[int, int]) -> tuple[int, int]:
        """The measured placement an unmeasured one is priced from: the nearest, the larger on
        a tie."""
        return min(self.tables, key=lambda q: (doublings_apart(pl, q), -q[0], -q[1]))

    def scaled(self, nbytes: float, pl: tuple[int, int], ref: tuple[int, int],
               alg: str | None = None) -> float:
        """`nbytes` at placement `pl` priced from the measured placement `ref` under `alg`."""
        alg = alg or self.algorithm
        lat, fac = crossing(alg, self.op, *pl)
        lat0, fac0 = crossing(alg, self.op, *ref)
        same = nbytes * fac / fac0 if fac0 > 0 else nbytes
        link = max(0.0, self._local(same, ref) - self.stage_time(same, ref[1], alg))
        return max(0.0, link + self.alpha_s * (lat - lat0) + self.stage_time(nbytes, pl[1], alg))

    def time(self, nbytes: float, ranks: int, nodes: int = 1, alg: str | None = None) -> float:
        """Seconds for one `op` of `nbytes` on `ranks` over `nodes` nodes (an intra-node model
        prices every rank on one node)."""
        if ranks <= 1 or nbytes <= 0:
            return 0.0
        pl = placement(ranks, nodes if self.scope == "inter" else 1)
        if pl in self.tables:
            return self._local(nbytes, pl)
        return self.scaled(nbytes, pl, self.reference(pl), alg)

    @property
    def busbw_GBps(self) -> float:
        return 1e-9 / self.beta_s_per_byte if self.beta_s_per_byte > 0 else math.inf

    def to_json(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k not in ("tables", "stage")}
        d["tables"] = {f"{n}x{g}": {"bytes": list(map(float, t[0])),
                                    "time_s": list(map(float, t[1]))}
                       for (n, g), t in self.tables.items()}
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
    return (float(coef[0]), float(coef[1]), float(np.sqrt(np.mean(rel**2))),
            float(np.max(np.abs(rel))))


def _fit_line(op: str, scope: str, tables: dict, alg: str, stage: AlphaBeta | None) -> AlphaBeta:
    """The alpha-beta model of (op, scope) over `tables` under `alg`, with its size-local
    pricing's leave-one-size-out error."""
    ab = AlphaBeta(op, scope, 0.0, 0.0, sorted({n * g for n, g in tables}), 0, 0.0, 0.0, 0.0,
                   0.0, tables, algorithm=alg, stage=stage)
    rows = []
    for pl, (sizes, times) in tables.items():
        lat, fac = crossing(alg, op, *pl)
        for b, t in zip(sizes, times):
            link = t - ab.stage_time(b, pl[1])
            if link > 0:
                rows.append((lat, fac * b, link))
    if rows:
        ab.alpha_s, ab.beta_s_per_byte, ab.rms_rel, ab.max_rel = _fit_alpha_beta(rows)
    ab.points = len(rows)
    rel = []
    for pl, (sizes, times) in tables.items():
        if len(sizes) < 3:
            continue
        for i, (b, t) in enumerate(zip(sizes, times)):
            rel.append(ab._local(b, pl, skip=i) / t - 1.0)
    if rel:
        ab.local_rms_rel = float(np.sqrt(np.mean(np.square(rel))))
        ab.local_max_rel = float(np.max(np.abs(rel)))
    return ab


def _choose_algorithm(fits: dict[str, AlphaBeta], backend: str) -> AlphaBeta:
    """The algorithm whose crossing bytes predict each measured inter-node placement best from
    the others (messages of at least the median measured size, where bandwidth rules), when two
    placements tell the algorithms apart; else the backend's usual one (DEFAULT_ALGORITHM),
    marked as assumed."""
    any_fit = next(iter(fits.values()))
    pls = any_fit.placements
    pairs = [(a, b) for a in pls for b in pls if a != b]

    def ratio(alg, a, b):
        return crossing(alg, any_fit.op, *b)[1] / crossing(alg, any_fit.op, *a)[1]
    where = ", ".join(describe_placement(*pl) for pl in pls)
    if any(abs(ratio("ring", a, b) / ratio("hierarchical", a, b) - 1.0) > DISTINCT
           for a, b in pairs):
        err = {}
        for alg, ab in fits.items():
            rel = []
            for a, b in pairs:
                sizes, times = ab.tables[b]
                floor = float(np.median(sizes))
                rel += [ab.scaled(s, b, a) / t - 1.0 for s, t in zip(sizes, times) if s >= floor]
            err[alg] = float(np.sqrt(np.mean(np.square(rel)))) if rel else math.inf
        best = fits[min(err, key=err.get)]
        best.algorithm_basis = (
            f"measured: predicting each of the comm runs' placements ({where}) from the others, "
            + ", ".join(f"{alg} is off by {100 * e:.0f} % RMS" for alg, e in err.items())
            + " (messages from the median size up)")
        return best
    alg = DEFAULT_ALGORITHM.get(backend, "ring")
    best = fits[alg]
    best.algorithm_measured = False
    one = "one inter-node placement" if len(pls) == 1 else "inter-node placements"
    best.algorithm_basis = (
        f"ASSUMED {alg} (the usual for backend {backend or 'unknown'}): the comm runs measured "
        f"{one} ({where}), which cannot tell ring from hierarchical; a comm run at another "
        "number of ranks per node across nodes calibrates it")
    return best


def fit_comm(runs) -> dict[tuple[str, str], AlphaBeta]:
    """alpha-beta models per (op, scope) from the /comm/<op> tables of run.workload=comm files
    (runs: study.Run) at two or more ranks; repeats at the same placement are combined by the
    median time per size. The inter-node allreduce's algorithm is chosen by _choose_algorithm."""
    data: dict[tuple[str, str], dict] = {}
    files: dict[tuple[str, str], set] = {}
    backends: dict[tuple[str, str], set] = {}
    rates: dict[tuple[str, str], set] = {}
    for r in runs:
        if r.ranks < 2:
            continue
        scope = "inter" if r.nodes > 1 else "intra"
        pl = placement(r.ranks, r.nodes)
        with r.open() as rf:
            g = rf.group(schema.COMM)
            if g is None:
                continue
            backend = g.attrs.get("backend", rf.plan.get("backend", ""))
            backend = backend.decode() if isinstance(backend, bytes) else str(backend)
            for op in OPS:
                if op not in g or "bytes" not in g[op] or "time_s" not in g[op]:
                    continue
                key = (op, scope)
                per_size = data.setdefault(key, {}).setdefault(pl, {})
                for b, t in zip(g[op]["bytes"][...], g[op]["time_s"][...]):
                    if t > 0 and b > 0:
                        per_size.setdefault(float(b), []).append(float(t))
                files.setdefault(key, set()).add(str(r.path))
                backends.setdefault(key, set()).add(backend)
                rates.setdefault(key, set()).add(link_rate(r.path))
    out: dict[tuple[str, str], AlphaBeta] = {}
    # intra-node first: a hierarchical inter-node allreduce prices its local stages with it
    for key in sorted(data, key=lambda k: (k[1] != "intra", k[0])):
        op, scope = key
        tables = {}
        for pl, by_size in data[key].items():
            sizes = sorted(by_size)
            if sizes:
                tables[pl] = (sizes, [float(np.median(by_size[b])) for b in sizes])
        if not tables:
            continue
        backend = ",".join(sorted(b for b in backends[key] if b))
        if op == "allreduce" and scope == "inter":
            stage = out.get((op, "intra"))
            ab = _choose_algorithm({alg: _fit_line(op, scope, tables, alg, stage)
                                    for alg in ALGORITHMS}, backend)
        else:
            ab = _fit_line(op, scope, tables, "ring", None)
            ab.algorithm_basis = "ring over the node's ranks" if scope == "intra" else \
                "ring over all ranks"
        ab.files = sorted(files[key])
        ab.backend = backend
        ab.link_rates = sorted(x for x in rates[key] if x)
        out[key] = ab
    return out
