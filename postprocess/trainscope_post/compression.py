"""Gradient compression (dist.compress, issue 40) across runs: what each setting sent, waited for
and cost against uncompressed runs of the same workload at the same ranks (the report's
"Communication optimisation" section and the `compression` finding), and the advisor's knob that
prices a setting on a modelled configuration (its communication term scaled by the compressed
bytes, plus the compression's own cost where a run measured it)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from . import schema
from .comm_model import link_rate
from .study import Run, Study, naming_keys, point_config

MODES = ("fp16", "bf16", "powersgd")  # the compressed settings of dist.compress
# Bytes sent / uncompressed bytes without a run that measured it: fp16 and bf16 halve fp32
# gradients (the MPI backend sends 16-bit gradients as fp32 under none, so also those). PowerSGD's
# ratio depends on the model's matrix shapes and the rank: only a measured run gives it.
NOMINAL_RATIO = {"fp16": 0.5, "bf16": 0.5}


def is_setting_key(key: str) -> bool:
    """The options that choose the compression (they do not make two runs' workloads differ)."""
    return key == "dist.compress" or key.startswith("dist.powersgd_")


def mode_of(config: dict) -> str:
    """dist.compress of a run's /config; "none" in files written before it (uncompressed)."""
    return str(config.get("dist.compress", "none") or "none")


def setting_label(config: dict) -> str:
    """'fp16', 'powersgd, rank 4': the setting as the report names it."""
    mode = mode_of(config)
    if mode == "powersgd":
        return f"powersgd, rank {config.get('dist.powersgd_rank', '?')}"
    return mode


# --- one run ------------------------------------------------------------------------------------
@dataclass
class Point:
    """One run's compression figures: medians over the measured iterations of the mean over
    ranks (as /summary's medians), per step and rank."""

    run: Run
    label: str
    sent_b: float            # comm_bytes: what was sent
    uncompressed_b: float    # comm_uncompressed_bytes (= sent in older files under none)
    collective_s: float      # comm_collective_s: time inside the (compressed) collectives
    exposed_s: float         # /summary median_comm_wait_s: the exposed communication
    step_s: float
    error_first: float = math.nan  # PowerSGD error-feedback norm: mean of the first quarter
    error_last: float = math.nan   # ... and of the last quarter of its compressed iterations
    loss: float = math.nan         # final validation loss, else final train loss
    loss_kind: str = ""
    accuracy: float = math.nan     # best validation accuracy over the epochs [%]

    @property
    def ratio(self) -> float:
        return self.sent_b / self.uncompressed_b if self.uncompressed_b > 0 else math.nan

    @property
    def effective_rate(self) -> float:
        """Bytes per second through the collectives (sent bytes / time in them) [B/s]."""
        return self.sent_b / self.collective_s if self.collective_s > 0 else math.nan


def _median(v: np.ndarray) -> float:
    v = v[np.isfinite(v)]
    return float(np.median(v)) if v.size else math.nan


def _seconds(summary: dict, key: str) -> float:
    v = float(summary.get(key, math.nan))
    return v if v == v else 0.0  # a phase the run did not time


def measure(run: Run) -> Point:
    s = run.summary
    p = Point(run, setting_label(run.config), math.nan, math.nan, math.nan,
              _seconds(s, "median_comm_wait_s"), float(s.get("median_step_s", math.nan)))
    with run.open() as rf:
        p.sent_b = _median(rf.over_ranks("comm_bytes"))
        p.uncompressed_b = _median(rf.over_ranks("comm_uncompressed_bytes"))
        if p.uncompressed_b != p.uncompressed_b and mode_of(run.config) == "none":
            p.uncompressed_b = p.sent_b  # files before the column sent what they had
        p.collective_s = _median(rf.over_ranks("comm_collective_s"))
        err = rf.over_ranks("comm_error_norm", window="recorded")
        err = err[np.isfinite(err) & (err > 0)]  # 0 before dist.powersgd_start_iter
        if err.size:
            q = max(1, err.size // 4)
            p.error_first, p.error_last = float(np.mean(err[:q])), float(np.mean(err[-q:]))
        if rf.has_column("val_accuracy", schema.EPOCHS):
            acc = rf.over_ranks("val_accuracy", schema.EPOCHS, window="recorded")
            acc = acc[np.isfinite(acc)]
            if acc.size:
                p.accuracy = 100.0 * float(np.max(acc))
        train_loss = float(run.row.get("train_loss", math.nan))
    if p.accuracy != p.accuracy:
        p.accuracy = 100.0 * float(s.get("final_val_accuracy", math.nan))
    val = float(s.get("final_val_loss", math.nan))
    p.loss, p.loss_kind = (val, "validation") if val == val else (train_loss, "train")
    return p


# --- runs that differ only in the compression ------------------------------------------------
@dataclass
class Comparison:
    """Runs of one workload at one placement that differ only in dist.compress (and PowerSGD's
    options): their points by setting, uncompressed first."""

    name: str
    workload: str
    ranks: int
    nodes: int
    by_setting: dict = field(default_factory=dict)  # label -> [Point] (repeats)

    def mean(self, label: str, attr: str) -> float:
        v = [getattr(p, attr) for p in self.by_setting.get(label, [])]
        v = [x for x in v if x == x]
        return float(np.mean(v)) if v else math.nan

    @property
    def baseline(self) -> str | None:
        return "none" if "none" in self.by_setting else None


def _workload_config(run: Run) -> dict:
    return {k: v for k, v in point_config(run).items() if not is_setting_key(k)}


def comparisons(study: Study, include_incomplete: bool = False) -> list[Comparison]:
    """Every group of completed multi-rank training runs that differ only in the compression
    setting and has a compressed run; a group of one setting too (a study of compressed runs
    without an uncompressed partner: the report states their ratio)."""
    groups: dict[tuple, list[Run]] = {}
    for r in study.usable(include_incomplete):
        if r.workload not in ("cv", "llm") or not r.summary or r.ranks < 2:
            continue
        key = (r.workload, r.ranks, r.nodes, tuple(sorted(_workload_config(r).items())))
        groups.setdefault(key, []).append(r)
    groups = {k: g for k, g in groups.items() if any(mode_of(r.config) != "none" for r in g)}
    configs = [dict(k[3]) for k in groups]
    keys = naming_keys(configs) if len(configs) > 1 else []
    out = []
    for (workload, ranks, nodes, cfg), g in groups.items():
        cfg = dict(cfg)
        name = f"{workload}, {ranks} ranks on {nodes} node{'s' if nodes > 1 else ''}" + \
            "".join(f", {k}={cfg[k]}" for k in keys if k in cfg)
        c = Comparison(name, workload, ranks, nodes)
        points = sorted((measure(r) for r in g),
                        key=lambda p: (p.label != "none", p.label, str(p.run.path)))
        for p in points:
            c.by_setting.setdefault(p.label, []).append(p)
        out.append(c)
    return sorted(out, key=lambda c: c.name)


def _mib(b: float) -> float:
    return b / 2**20


def _change(new: float, old: float) -> float:
    return 100.0 * (new / old - 1.0) if old > 0 and new == new else math.nan


def table(comps: list[Comparison]) -> pd.DataFrame:
    """One row per comparison and setting (means over repeats)."""
    rows = []
    for c in comps:
        base = c.baseline
        for label, pts in c.by_setting.items():
            m = {a: c.mean(label, a) for a in ("sent_b", "uncompressed_b", "collective_s",
                                                 "exposed_s", "step_s", "error_first",
                                                 "error_last", "loss", "accuracy")}
            ratio = m["sent_b"] / m["uncompressed_b"] if m["uncompressed_b"] > 0 else math.nan
            row = {"runs": c.name, "compression": label, "repeats": len(pts),
                   "sent / step [MiB]": _mib(m["sent_b"]), "ratio to uncompressed": ratio,
                   "collective / step [ms]": 1e3 * m["collective_s"],
                   "exposed comm / step [ms]": 1e3 * m["exposed_s"],
                   "step [ms]": 1e3 * m["step_s"],
                   "error norm first -> last": (f"{m['error_first']:.3g} -> "
                                                f"{m['error_last']:.3g}"
                                                if m["error_first"] == m["error_first"] else "-"),
                   "final loss": m["loss"], "best val accuracy [%]": m["accuracy"]}
            if base is not None:
                row["exposed vs none [%]"] = _change(m["exposed_s"], c.mean(base, "exposed_s"))
                row["step vs none [%]"] = _change(m["step_s"], c.mean(base, "step_s"))
                row["accuracy vs none [points]"] = m["accuracy"] - c.mean(base, "accuracy")
                row["loss vs none"] = m["loss"] - c.mean(base, "loss")
            rows.append(row)
    return pd.DataFrame(rows)


def link_text(c: Comparison) -> str:
    """Y of the finding: the link rate where the campaign recorded it (comm_model.link_rate), and
    always the uncompressed runs' effective rate: their bytes per step / their time in the
    collectives (an allreduce's algorithm bandwidth per rank, not the wire's rate)."""
    base = c.by_setting.get("none", [])
    eff = c.mean("none", "effective_rate")
    rate = next((link_rate(p.run.path) for p in base if link_rate(p.run.path)), "") \
        if c.nodes > 1 else ""
    mbs = eff / 1e6
    shown = f"{mbs:,.0f}" if mbs >= 100 else f"{mbs:.3g}"
    how = "the uncompressed runs' bytes per step / their time in the collectives"
    if rate:
        return (f"link rate {rate} (effective {shown} MB/s: {how})" if eff == eff else
                f"link rate {rate}")
    return (f"an effective link rate of {shown} MB/s ({how})" if eff == eff else
            "a link rate the runs do not record")


def quality_text(c: Comparison, label: str) -> str:
    """Z of the finding: best validation accuracy change in points (CV), else the final loss
    change (LLM, or a run that did not evaluate)."""
    acc = c.mean(label, "accuracy") - c.mean("none", "accuracy")
    if acc == acc:
        return f"accuracy change {acc:+.2f} points ({c.mean('none', 'accuracy'):.2f} % -> " \
               f"{c.mean(label, 'accuracy'):.2f} %)"
    loss = c.mean(label, "loss") - c.mean("none", "loss")
    if loss == loss:
        kind = c.by_setting[label][0].loss_kind
        return f"{kind} loss change {loss:+.4g} ({c.mean('none', 'loss'):.4g} -> " \
               f"{c.mean(label, 'loss'):.4g})"
    return "accuracy not measured"


def verdicts(c: Comparison) -> list[tuple[bool, str]]:
    """Per compressed setting of a comparison with an uncompressed baseline: (pays, sentence).
    It pays when both the exposed communication and the step are lower than under none."""
    if c.baseline is None:
        return []
    out = []
    e0, s0 = c.mean("none", "exposed_s"), c.mean("none", "step_s")
    for label in c.by_setting:
        if label == "none":
            continue
        e1, s1 = c.mean(label, "exposed_s"), c.mean(label, "step_s")
        pays = e1 < e0 and s1 < s0
        step = f"step {1e3 * s0:.4g} -> {1e3 * s1:.4g} ms ({_change(s1, s0):+.1f} %)"
        where = f"{link_text(c)}, with {quality_text(c, label)}"
        if pays:
            text = (f"{c.name}: compression ({label}) reduces exposed communication by "
                    f"{-_change(e1, e0):.1f} % ({1e3 * e0:.4g} -> {1e3 * e1:.4g} ms per step) at "
                    f"{where}; {step}")
        else:
            why = "its exposed communication is not lower" if not e1 < e0 else \
                "its step is not lower"
            text = (f"{c.name}: compression ({label}) does not pay ({why}): exposed "
                    f"communication {1e3 * e0:.4g} -> {1e3 * e1:.4g} ms per step "
                    f"({_change(e1, e0):+.1f} %), {step}, at {where}")
        out.append((pays, text))
    return out


def single_text(c: Comparison) -> list[str]:
    """Sentences for compressed runs without an uncompressed partner: ratio and exposed comm."""
    out = []
    for label, pts in c.by_setting.items():
        if label == "none":
            continue
        ratio = c.mean(label, "sent_b") / c.mean(label, "uncompressed_b") \
            if c.mean(label, "uncompressed_b") > 0 else math.nan
        err = ""
        if c.mean(label, "error_first") == c.mean(label, "error_first"):
            err = (f"; PowerSGD's error-feedback norm {c.mean(label, 'error_first'):.3g} -> "
                   f"{c.mean(label, 'error_last'):.3g} (first -> last quarter of its "
                   "compressed iterations)")
        out.append(f"{c.name}, dist.compress={label} ({len(pts)} run(s)): sent "
                   f"{_mib(c.mean(label, 'sent_b')):.4g} MiB per step of "
                   f"{_mib(c.mean(label, 'uncompressed_b')):.4g} MiB uncompressed (ratio "
                   f"{ratio:.3f}); exposed communication {1e3 * c.mean(label, 'exposed_s'):.4g} "
                   f"ms of a {1e3 * c.mean(label, 'step_s'):.4g} ms step; time in the collectives "
                   f"{1e3 * c.mean(label, 'collective_s'):.4g} ms{err}")
    return out


# --- the advisor's knob ---------------------------------------------------------------------------
@dataclass
class Knob:
    """A compression setting priced on a model of an uncompressed configuration."""

    mode: str
    ratio: float
    ratio_basis: str
    overhead_s: float
    overhead_basis: str


def _model_mode(cm) -> str:
    return mode_of(cm.config)


def _model_key(cm) -> tuple:
    return (cm.workload, tuple(sorted((k, v) for k, v in cm.config.items()
                                      if not is_setting_key(k))))


def knob(cm, models: list, mode: str) -> Knob | str:
    """Prices `mode` on configuration `cm` (measured uncompressed): the bytes ratio from the
    runs of that setting of the same configuration (else of any configuration of the workload,
    else NOMINAL_RATIO), and the compression's own cost per step from the same configuration's
    compressed runs: their measured step minus the step the model gives them from the ratio
    alone (at their placement; 0 when none measured it). A string (why not) when it cannot."""
    def ratios(runs):
        return [m.comm_bytes / m.uncompressed_bytes for m in runs
                if m.ranks > 1 and m.uncompressed_bytes > 0 and m.comm_bytes > 0]
    same = [m for o in models if _model_mode(o) == mode and _model_key(o) == _model_key(cm)
            for m in o.runs]
    other = [m for o in models if _model_mode(o) == mode and o.workload == cm.workload
             for m in o.runs]
    if ratios(same):
        ratio = float(np.median(ratios(same)))
        basis = f"measured ({len(ratios(same))} run(s) of this configuration)"
    elif ratios(other):
        ratio = float(np.median(ratios(other)))
        basis = f"measured in another {cm.workload} configuration ({len(ratios(other))} run(s))"
    elif mode in NOMINAL_RATIO:
        ratio, basis = NOMINAL_RATIO[mode], "nominal (16-bit against fp32 gradients)"
    else:
        return (f"{mode}: no run records its bytes ratio (comm_uncompressed_bytes); run one "
                f"with dist.compress={mode} to price it")
    costs = []
    for m in same:
        if m.ranks < 2:
            continue
        plain, scaled = cm.step(m.ranks, m.nodes), cm.step(m.ranks, m.nodes, comm_scale=ratio)
        here = cm.runs_at(m.ranks, m.nodes)
        base = float(np.median([b.step for b in here])) if here else plain["step_s"]
        costs.append(m.step - (base - plain["step_s"] + scaled["step_s"]))
    if costs:
        overhead = max(0.0, float(np.median(costs)))
        obasis = (f"measured: its runs' step minus the step predicted from the ratio, median of "
                  f"{len(costs)} run(s)")
    else:
        overhead, obasis = 0.0, f"not measured (no dist.compress={mode} run of this " \
                                "configuration): none assumed"
    return Knob(mode, ratio, basis, overhead, obasis)


def knob_rows(cm, k: Knob, gpus_per_node: int, node_counts) -> list[dict]:
    """Predicted exposed communication and step with and without the setting per node count."""
    rows = []
    for n in node_counts:
        p = n * gpus_per_node
        plain = cm.step(p, n)
        comp = cm.step(p, n, comm_scale=k.ratio)
        cost = k.overhead_s if p > 1 else 0.0  # one rank sends and compresses nothing
        with_step = comp["step_s"] + cost
        rows.append({"configuration": cm.label, "compression": k.mode, "nodes": n, "ranks": p,
                     "exposed without [ms]": 1e3 * plain["exposed_comm_s"],
                     "exposed with [ms]": 1e3 * comp["exposed_comm_s"],
                     "cost [ms]": 1e3 * cost,
                     "step without [ms]": 1e3 * plain["step_s"],
                     "step with [ms]": 1e3 * with_step,
                     "change [%]": _change(with_step, plain["step_s"]),
                     "pays": "yes" if with_step < plain["step_s"] else "no"})
    return rows


_RATE = re.compile(r"^\s*([0-9.]+)\s*([kmgt]?)(bit|bps|b/s)?\s*$", re.IGNORECASE)


def _scaled_rate(rate: str, factor: float) -> str:
    """'100mbit' x 3.2 -> '320mbit'; another spelling: '3.2x 100mbit'."""
    m = _RATE.match(rate or "")
    if not m:
        return f"{factor:.3g}x {rate}"
    return f"{float(m.group(1)) * factor:.4g}{m.group(2)}{m.group(3) or ''}"


def knob_summary(cm, k: Knob, rows: list[dict]) -> list[str]:
    """Where the setting pays, and up to what link rate at the largest node count: the saving,
    exposed communication x (1 - ratio), grows as the link slows (bandwidth-bound traffic), the
    cost does not."""
    yes = [r["nodes"] for r in rows if r["pays"] == "yes"]
    no = [r["nodes"] for r in rows if r["pays"] == "no"]

    def span(ns):  # "1-4, 6, 8-9"
        runs, out = [], []
        for n in ns:
            if runs and n == runs[-1][-1] + 1:
                runs[-1].append(n)
            else:
                runs.append([n])
        for r in runs:
            out += [f"{r[0]}-{r[-1]}"] if len(r) >= 4 else [str(n) for n in r]
        return ", ".join(out)
    lines = [f"{cm.label}: dist.compress={k.mode}: bytes ratio {k.ratio:.3g} ({k.ratio_basis}); "
             f"its own cost {1e3 * k.overhead_s:.3g} ms per step ({k.overhead_basis})"]
    best = min(rows, key=lambda r: r["change [%]"]) if rows else None
    if yes:
        lines.append(f"  pays at {span(yes)} node(s) (step {best['change [%]']:+.1f} % at "
                     f"{best['nodes']} node(s))" + (f"; does not pay at {span(no)} node(s)"
                                                   if no else ""))
    else:
        lines.append(f"  does not pay at any node count considered ({span(no)})")
    top = rows[-1] if rows else None
    if top and top["ranks"] > 1:
        saved = top["exposed without [ms]"] - top["exposed with [ms]"]
        cost = top["cost [ms]"]
        where = f"the modelled link ({cm.link_rate})" if cm.link_rate else "the modelled link"
        if saved <= 0:
            lines.append(f"  at {top['nodes']} node(s) no communication is exposed to save")
        elif cost <= 0:
            lines.append(f"  at {top['nodes']} node(s) it pays at any link rate that leaves "
                         "communication exposed (no cost measured)")
        else:
            f = saved / cost
            rate = f" = {_scaled_rate(cm.link_rate, f)}" if cm.link_rate else ""
            lines.append(f"  break-even at {top['nodes']} node(s): it saves {saved:.3g} ms of "
                         f"exposed communication for {cost:.3g} ms of cost, so it pays on links "
                         f"up to {f:.3g}x the rate of {where}{rate} (saving taken as "
                         "bandwidth-bound, cost as fixed)")
    return lines


def knob_modes(models: list, requested: str) -> list[str]:
    """The settings to price: `requested` (fp16, bf16, powersgd, all, none) or with "auto" the
    compressed settings the study's runs measured."""
    if requested == "none":
        return []
    if requested == "all":
        return list(MODES)
    if requested == "auto":
        return [m for m in MODES if any(_model_mode(cm) == m for cm in models)]
    return [requested]


def bases(models: list) -> list:
    """The configurations the knob applies to: measured uncompressed at two or more rank counts."""
    return [cm for cm in models if _model_mode(cm) == "none" and len(cm.rank_counts) >= 2]
