"""Allocation advice from performance models (``trainscope-post advise``): which configuration on
how many nodes, and how to split GPUs between several jobs.

Every configuration a study covers (strategy, precision, layout, method, ZeRO stage: whatever its
runs differ in besides ranks and nodes) is predicted at every node count 1..max_nodes with
gpus_per_node ranks per node. A candidate is excluded, with the reason, when its memory plan (the
run file's /plan scaled to the rank count, model.ConfigModel.memory) exceeds the device memory,
when a fixed global batch cannot give every rank a sample, or when its parallel efficiency falls
below --min-efficiency. The survivors are ranked by the objective:
  time        shortest time per unit of work (1 / throughput; for a fixed global batch: the step)
  throughput  highest throughput (samples/s or tokens/s)
  efficiency  highest parallel efficiency (then throughput)
  energy      lowest energy per sample (only where the runs measured energy)
Every candidate carries the model's label of what was measured and what is extrapolated there
(model.ConfigModel.describe); a recommendation whose band overlaps another ranked candidate's is
flagged "too close to call", naming the node counts to measure (close_calls).

Before anything is modelled, check_recorded refuses a run file whose recorded values cannot be
true (a world size or node count out of range, a shard count above the run's ranks, a negative
or non-finite byte count, a step time that is not positive and finite, a negative phase time):
advice extrapolated from them would look as confident as any other, so the file and field are
named instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import schema
from .model import COMPUTE_PHASES, ConfigModel
from .study import Run, Study, StudyError

OBJECTIVES = ("time", "throughput", "efficiency", "energy")
GIB = 2.0**30


# Bounds of what a run file can truthfully record; beyond them a value is a damaged or hand-made
# file. Generous: the largest machines have ~10^5 accelerators and ~10^7 cores.
MAX_RANKS = 2**24
MAX_SECONDS = 1e6         # one iteration or phase: ~12 days
MAX_BYTES = 2.0**60       # one device's memory category, one message: 1 EiB
MAX_COUNT = 1e12          # samples per batch, iterations
MAX_PER_RANK = 2**20      # threads per rank, gradient accumulation steps
REFUSED_FIX = "advise cannot recommend from it (re-run that point or leave the file out)"


def _scalar(v) -> float | None:
    """`v` as a float, None when it is text, an array or not a number."""
    if isinstance(v, (str, bytes, bool, np.bool_)) or np.ndim(v) != 0:
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _show(v) -> str:
    f = _scalar(v)
    return f"{f:.6g}" if f is not None else repr(v)


def _check(path, where: str, key: str, value, lo: float, hi: float, what: str,
           integer: bool = False, nan_ok: bool = False, lo_open: bool = False) -> None:
    """StudyError naming the file and field unless `value` is a number in [lo, hi] ((lo, hi]
    with lo_open; whole with integer; NaN, meaning "not measured", with nan_ok)."""
    f = _scalar(value)
    if f is not None and math.isnan(f) and nan_ok:
        return
    ok = f is not None and math.isfinite(f) and (f > lo if lo_open else f >= lo) and f <= hi \
        and (not integer or f.is_integer())
    if not ok:
        field = f"attribute {key}" if where == schema.ROOT else f"{where}@{key}"
        raise StudyError(f"{path}: {field} = {_show(value)}: {what}; {REFUSED_FIX}")


def _check_array(path, where: str, values, what: str, nan_ok: bool) -> None:
    """Every element of `values` finite (or NaN with nan_ok), >= 0 and <= MAX_BYTES."""
    a = np.asarray(values, dtype=np.float64)
    bad = ~np.isfinite(a) | (a < 0) | (a > MAX_BYTES)
    if nan_ok:
        bad &= ~np.isnan(a)
    if bad.any():
        first = a[bad].flat[0]
        raise StudyError(f"{path}: {where} holds {first:.6g} ({int(bad.sum())} such value(s)): "
                         f"{what}; {REFUSED_FIX}")


def _check_training_run(r: Run) -> None:
    s = r.summary
    step = s.get("median_step_s", math.nan)
    _check(r.path, schema.SUMMARY, "median_step_s", step, 0.0, MAX_SECONDS,
           f"not a positive step time (at most {MAX_SECONDS:g} s)", lo_open=True)
    for ph in (*COMPUTE_PHASES, "comm_wait", "control"):
        key = f"median_{ph}_s"
        if key in s:  # NaN: a phase the run did not time
            _check(r.path, schema.SUMMARY, key, s[key], 0.0, MAX_SECONDS,
                   f"not a phase time in [0, {MAX_SECONDS:g}] s", nan_ok=True)
    if "global_batch_samples" in s:
        _check(r.path, schema.SUMMARY, "global_batch_samples", s["global_batch_samples"], 0.0,
               MAX_COUNT, f"not a batch of (0, {MAX_COUNT:g}] samples", lo_open=True)
    for key in ("throughput_tokens_per_s", "throughput_samples_per_s", "energy_per_sample_j"):
        if key in s:
            _check(r.path, schema.SUMMARY, key, s[key], 0.0, math.inf,
                   "not a non-negative finite rate", nan_ok=True)
    with r.open() as rf:
        plan = rf.plan
        for key, v in plan.items():
            if key.startswith("memory_plan_") and key.endswith("_shards"):
                _check(r.path, schema.PLAN, key, v, 1, r.ranks,
                       f"not a shard count in [1, the run's world_size {r.ranks}]",
                       integer=True)
            elif (key.startswith("memory_plan_") and key.endswith("_bytes")) or \
                    key == "memory_estimate_bytes":
                _check(r.path, schema.PLAN, key, v, 0.0, MAX_BYTES,
                       "not a byte count (finite, in [0, 2^60])")
        for key, lo, hi in (("batch_per_rank", 0, MAX_COUNT), ("global_batch", 0, MAX_COUNT),
                            ("total_iterations", 0, MAX_COUNT),
                            ("gradient_accumulation", 1, MAX_PER_RANK),
                            ("threads_per_rank", 1, MAX_PER_RANK), ("zero", 0, 3)):
            if key in plan:
                _check(r.path, schema.PLAN, key, plan[key], lo, hi,
                       f"not a whole number in [{lo:g}, {hi:g}]", integer=True)
        comm_bytes = rf.measured("comm_bytes")  # the detail ranks' rows, and over all ranks:
        if rf.has_aggregate():
            comm_bytes = np.concatenate([comm_bytes.ravel()] + [
                rf.over_ranks("comm_bytes", field=f) for f in ("min", "max")])
        if comm_bytes.size:
            _check_array(r.path, schema.child(schema.ITERATIONS, "comm_bytes"), comm_bytes,
                         "not a byte count (finite, >= 0)", nan_ok=True)
        if rf.has(schema.COMM_BUCKETS_BYTES):
            _check_array(r.path, schema.COMM_BUCKETS_BYTES,
                         rf.series(schema.COMM_BUCKETS, "bytes").values,
                         "not a bucket size in bytes (finite, >= 0)", nan_ok=False)


def _check_comm_run(r: Run) -> None:
    from .model import OPS
    with r.open() as rf:
        g = rf.group(schema.COMM)
        if g is None:
            return
        for op in OPS:
            if op not in g:
                continue
            for name, what, nan_ok in (("bytes", "not a message size in bytes (finite, >= 0)",
                                        False),
                                       ("time_s", "not a time (finite, >= 0)", True)):
                if name in g[op]:
                    _check_array(r.path, schema.child(schema.fill(schema.COMM_OP, op), name),
                                 g[op][name][...], what, nan_ok)


def check_recorded(study: Study, include_incomplete: bool) -> None:
    """Refuses (StudyError naming the file, the field and the value) a run whose recorded values
    cannot be true; NaN stays allowed where it means "not measured" (a phase, energy). A run
    file the loader found damaged (a world size below 1, series of the wrong shape) is refused
    too: other commands skip it, but advice from the rest would not be what was asked for."""
    if study.damaged:
        raise StudyError(f"{study.damaged[0]}; {REFUSED_FIX}")
    for r in study.usable(include_incomplete):
        if r.workload not in ("cv", "llm", "comm"):
            continue
        _check(r.path, schema.ROOT, "world_size", r.attrs.get("world_size"), 1, MAX_RANKS,
               f"not a rank count in [1, {MAX_RANKS}]", integer=True)
        if "num_nodes" in r.attrs:
            _check(r.path, schema.ROOT, "num_nodes", r.attrs["num_nodes"], 1, r.ranks,
                   f"not a node count in [1, world_size {r.ranks}]", integer=True)
        if r.workload == "comm":
            _check_comm_run(r)
        elif r.summary:
            _check_training_run(r)


def parse_bytes(text: str) -> float:
    """'80GiB', '80GB', '81920MiB', '1e9' -> bytes."""
    t = str(text).strip()
    units = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "kb": 1e3, "mb": 1e6,
             "gb": 1e9, "tb": 1e12, "b": 1}
    low = t.lower()
    for u in sorted(units, key=len, reverse=True):
        if low.endswith(u):
            num, mult = low[: -len(u)], units[u]
            break
    else:
        num, mult = low, 1
    try:
        v = float(num) * mult
    except ValueError:
        raise StudyError(f"--memory-per-device {text!r}: not a size; use e.g. 80GiB, 40GB or "
                         "81920MiB") from None
    if not v > 0:  # also NaN, which every "plan > memory" comparison would let through
        raise StudyError(f"--memory-per-device {text!r}: must be positive")
    return v


def _single_point_reason(cm: ConfigModel) -> str:
    if len(cm.rank_counts) < 2:
        return (f"measured at one rank count only ({cm.rank_counts[0]}): no scaling to model; "
                "run it at 2 or more rank counts")
    return ""


@dataclass
class Candidate:
    model: ConfigModel
    nodes: int
    ranks: int
    pred: dict | None
    excluded: str = ""


def _batch_reason(cm: ConfigModel, ranks: int) -> str:
    if cm.mode != "strong":
        return ""
    plan = cm.runs[0].plan
    g = float(plan.get("global_batch", 0) or 0)
    ga = float(plan.get("gradient_accumulation", 1) or 1)
    if g and g / ga < ranks:
        return f"global batch {g:g} ({ga:g} micro-steps) gives {ranks} ranks less than one sample each"
    return ""


def candidates(models: list[ConfigModel], gpus_per_node: int, max_nodes: int,
               memory_per_device: float | None, min_efficiency: float | None,
               node_counts=None) -> list[Candidate]:
    out = []
    for cm in models:
        for n in (node_counts or range(1, max_nodes + 1)):
            p = n * gpus_per_node
            c = Candidate(cm, n, p, None)
            reason = _batch_reason(cm, p) or _single_point_reason(cm)
            if reason:
                c.excluded = reason
                out.append(c)
                continue
            c.pred = cm.predict(p, n)
            mem = c.pred["memory_bytes"]
            if memory_per_device and mem == mem and mem > memory_per_device:
                c.excluded = (f"memory plan {mem / GIB:.3g} GiB per device > "
                              f"--memory-per-device {memory_per_device / GIB:.3g} GiB")
            elif min_efficiency is not None and c.pred["efficiency"] < min_efficiency:
                c.excluded = (f"efficiency {c.pred['efficiency']:.2f} < --min-efficiency "
                              f"{min_efficiency:g}")
            out.append(c)
    return out


def _score(c: Candidate, objective: str) -> tuple:
    p = c.pred
    if objective == "throughput" or objective == "time":
        return (-p["throughput"],)
    if objective == "efficiency":
        return (-p["efficiency"], -p["throughput"])
    e = p["energy_per_sample_j"]
    return (e if e == e else math.inf, -p["throughput"])


def rank(cands: list[Candidate], objective: str) -> list[Candidate]:
    if objective not in OBJECTIVES:
        raise StudyError(f"--objective {objective!r}: use one of {', '.join(OBJECTIVES)}")
    ok = [c for c in cands if not c.excluded]
    if objective == "energy":
        for c in ok:
            if c.pred["energy_per_sample_j"] != c.pred["energy_per_sample_j"]:
                c.excluded = "no energy measured in its runs (--objective energy needs telemetry)"
        ok = [c for c in ok if not c.excluded]
    return sorted(ok, key=lambda c: _score(c, objective))


def candidate_table(cands: list[Candidate]) -> pd.DataFrame:
    rows = []
    for c in cands:
        p = c.pred or {}
        unit = p.get("throughput_unit", "")
        rows.append({
            "configuration": c.model.label, "nodes": c.nodes, "ranks": c.ranks,
            "step [s]": p.get("step_s", math.nan),
            "band [s]": (f"{p['step_lo_s']:.3g}-{p['step_hi_s']:.3g}" if p else "-"),
            "throughput": p.get("throughput", math.nan), "unit": unit,
            "efficiency": p.get("efficiency", math.nan),
            "energy [J/sample]": p.get("energy_per_sample_j", math.nan),
            "memory [GiB]": p.get("memory_bytes", math.nan) / GIB,
            "range": p.get("range", "-").lower() if p else "-",
            "what was measured": p.get("label", "-") if p else "-",
            "excluded": c.excluded or "",
        })
    return pd.DataFrame(rows)


def _objective_band(c: Candidate, objective: str) -> tuple[float, float]:
    """The candidate's objective over its step band (the +-2 sigma of model.predict): the
    throughput or efficiency scale with 1 / step, the energy per sample with the step."""
    p = c.pred
    t, lo, hi = p["step_s"], p["step_lo_s"], p["step_hi_s"]
    if objective == "energy":
        e = p["energy_per_sample_j"]
        return e * lo / t, e * hi / t
    v = p["efficiency"] if objective == "efficiency" else p["throughput"]
    return v * t / hi, (v * t / lo if lo > 0 else math.inf)


def _objective_unit(c: Candidate, objective: str) -> str:
    return {"energy": "J/sample", "efficiency": "efficiency"}.get(objective,
                                                                  c.pred["throughput_unit"])


def close_calls(ranked: list[Candidate], objective: str) -> list[Candidate]:
    """The ranked candidates, after the first, whose band of the objective overlaps the
    first's: the model cannot tell which of them is better."""
    if len(ranked) < 2:
        return []
    lo, hi = _objective_band(ranked[0], objective)
    out = []
    for c in ranked[1:]:
        clo, chi = _objective_band(c, objective)
        if (chi >= lo) if objective != "energy" else (clo <= hi):
            out.append(c)
    return out


def recommendation(cands: list[Candidate], ranked: list[Candidate], objective: str,
                   min_efficiency: float | None) -> list[str]:
    """Sentences: the choice and why, what happens one node further, the runner-up."""
    if not ranked:
        # memory first: it cannot be traded away, an efficiency floor can
        reasons = sorted({c.excluded for c in cands if c.excluded},
                         key=lambda r: (not r.startswith("memory"), r))
        more = f"; and {len(reasons) - 6} more (see the table)" if len(reasons) > 6 else ""
        return ["no configuration qualifies: " + "; ".join(reasons[:6]) + more]
    best = ranked[0]
    p = best.pred
    lines = [f"recommended: {best.model.label} on {best.nodes} node(s) = {best.ranks} ranks: "
             f"step {p['step_s']:.4g} s ({p['step_lo_s']:.3g}-{p['step_hi_s']:.3g}), "
             f"{p['throughput']:.4g} {p['throughput_unit']}, efficiency {p['efficiency']:.2f}"
             + (f", {p['energy_per_sample_j']:.3g} J/sample" if p['energy_per_sample_j'] ==
                p['energy_per_sample_j'] else "")
             + f", memory {p['memory_bytes'] / GIB:.3g} GiB per device [{p['label']}]"]
    same = sorted((c for c in cands if c.model is best.model), key=lambda c: c.nodes)
    nxt = next((c for c in same if c.nodes > best.nodes), None)
    if nxt is not None:
        if nxt.excluded:
            lines.append(f"  {nxt.nodes} node(s): {nxt.excluded}")
        else:
            q = nxt.pred
            lines.append(f"  {nxt.nodes} node(s): {q['throughput']:.4g} {q['throughput_unit']}, "
                         f"efficiency {q['efficiency']:.2f} (ranked lower for --objective "
                         f"{objective})")
    else:
        lines.append(f"  {best.nodes} node(s) is the largest count considered (--max-nodes)")
    other = next((c for c in ranked if c.model is not best.model), None)
    if other is not None:
        q = other.pred
        d = 100.0 * (q["throughput"] / p["throughput"] - 1.0) if p["throughput"] else math.nan
        lines.append(f"  runner-up configuration: {other.model.label} on {other.nodes} node(s): "
                     f"{q['throughput']:.4g} {q['throughput_unit']} ({d:+.1f} %), efficiency "
                     f"{q['efficiency']:.2f}")
    close = close_calls(ranked, objective)
    if close:
        def name(c):
            return f"{c.model.label} on {c.nodes} node(s)"

        def span(c):
            lo, hi = _objective_band(c, objective)
            return f"{lo:.4g}-{hi:.4g}"
        shown = close[:2]
        others = "; ".join(f"{name(c)} ({span(c)})" for c in shown) + \
            (f"; and {len(close) - 2} more" if len(close) > 2 else "")
        unmeasured = sorted({(c.nodes, c.ranks) for c in [best, *shown]
                             if not c.pred["measured"]})
        todo = ("measure " + " and ".join(f"{n} node(s) ({r} ranks)" for n, r in unmeasured)
                if unmeasured else "all measured: more repeats would separate them")
        lines.append(f"  too close to call: {name(best)} ({span(best)} "
                     f"{_objective_unit(best, objective)}) overlaps {others}; {todo}")
    mem_out = {c.model.label for c in cands if c.excluded.startswith("memory")}
    if mem_out:
        lines.append("  excluded by memory at some node counts: " + "; ".join(sorted(mem_out)))
    return lines


# --- co-allocation ------------------------------------------------------------------------------
@dataclass
class Job:
    name: str
    models: list[ConfigModel]
    work: float     # samples or tokens to process
    unit: str


def best_at(job: Job, ranks: int, gpus_per_node: int, memory_per_device: float | None):
    """(throughput, model, prediction) of the job's best admissible configuration at `ranks`."""
    nodes = max(1, math.ceil(ranks / gpus_per_node))
    best = (0.0, None, None)
    for cm in job.models:
        if _batch_reason(cm, ranks) or _single_point_reason(cm):
            continue
        pred = cm.predict(ranks, nodes)
        if memory_per_device and pred["memory_bytes"] == pred["memory_bytes"] and \
                pred["memory_bytes"] > memory_per_device:
            continue
        if pred["throughput"] == pred["throughput"] and pred["throughput"] > best[0]:
            best = (pred["throughput"], cm, pred)
    return best


def coallocate(jobs: list[Job], gpus: int, gpus_per_node: int, step_gpus: int,
               memory_per_device: float | None, objective: str = "makespan"):
    """Splits `gpus` (in steps of `step_gpus`) between the jobs: minimise the makespan
    (max over jobs of work / throughput) or maximise the summed work rate (sum of throughput /
    work: jobs finished per second). Exhaustive dynamic programming over the allocations.
    Returns (allocation rows, value, equal-split rows, equal value)."""
    for job in jobs:
        if all(_single_point_reason(cm) for cm in job.models):
            raise StudyError(f"job {job.name}: every configuration was measured at one rank count "
                             "only; a co-allocation needs runs at 2 or more rank counts per job")
    units = gpus // step_gpus
    if units < len(jobs):
        raise StudyError(f"--gpus {gpus}: fewer than one allocation unit ({step_gpus} GPUs) per "
                         f"job for {len(jobs)} jobs")
    table = {}
    for j, job in enumerate(jobs):
        for u in range(1, units - len(jobs) + 2):
            table[j, u] = best_at(job, u * step_gpus, gpus_per_node, memory_per_device)

    def cost(j, u):
        thr = table[j, u][0]
        if objective == "makespan":
            return jobs[j].work / thr if thr > 0 else math.inf
        return -(thr / jobs[j].work) if thr > 0 else 0.0

    # best[j][u]: best value for jobs j.. with u units
    memo = {}

    def solve(j, u):
        if j == len(jobs):
            return (0.0 if objective != "makespan" else -math.inf), []
        key = (j, u)
        if key in memo:
            return memo[key]
        best = (math.inf, [])
        for k in range(1, u - (len(jobs) - j - 1) + 1):
            rest, alloc = solve(j + 1, u - k)
            v = max(cost(j, k), rest) if objective == "makespan" else cost(j, k) + rest
            if v < best[0]:
                best = (v, [k] + alloc)
        memo[key] = best
        return best

    value, alloc = solve(0, units)
    equal = [units // len(jobs) + (1 if i < units % len(jobs) else 0) for i in range(len(jobs))]

    def rows(al):
        out = []
        for j, u in enumerate(al):
            thr, cm, pred = table[j, u]  # every split's share is in the table
            out.append({"job": jobs[j].name, "GPUs": u * step_gpus,
                        "nodes": math.ceil(u * step_gpus / gpus_per_node),
                        "configuration": cm.label if cm else "(nothing fits)",
                        "throughput": thr, "unit": f"{jobs[j].unit}/s",
                        "work": jobs[j].work,
                        "time [s]": jobs[j].work / thr if thr > 0 else math.inf,
                        "range": pred["range"].lower() if pred else "-"})
        return out

    def value_of(al):
        if objective == "makespan":
            return max(cost(j, u) for j, u in enumerate(al))
        return -sum(cost(j, u) for j, u in enumerate(al))

    if objective != "makespan":
        value = -value
    return rows(alloc), value, rows(equal), value_of(equal)
