"""The papers' findings, decided on a study's runs: the findings are data (findings.toml: id,
paper, text, rule, parameters); this module holds the rules that decide them from the run files'
configuration (never from file names), each returning a verdict (reproduced / not reproduced /
not covered, with the reason) and the measured numbers it rests on."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from . import schema
from .study import Run, Study, StudyError, point_config, scaling_table

REPRODUCED, NOT_REPRODUCED, NOT_COVERED = "reproduced", "not reproduced", "not covered"
TABLE = Path(__file__).with_name("findings.toml")

def _verdict(ok: list[bool], lines: list[str], not_covered: str) -> tuple[str, str]:
    """reproduced when every compared group agrees, not reproduced when one does not, not covered
    (with the reason) when no group could be compared."""
    if not ok:
        return NOT_COVERED, not_covered
    return (REPRODUCED if all(ok) else NOT_REPRODUCED), "; ".join(lines)


def _step(r: Run) -> float:
    return float(r.summary.get("median_step_s", math.nan))


def _peak_mib(r: Run) -> float:
    return float(r.row.get("peak_mem_MiB", math.nan))


def _ranks_text(n: int) -> str:
    return f"{n} rank" + ("s" if n != 1 else "")


def _llm_groups(runs: list[Run]) -> dict[tuple, dict[str, list[Run]]]:
    """LLM runs grouped by what must match for methods to be compared (model, precision, device,
    sequence length, ranks), then by llm.method."""
    out: dict[tuple, dict[str, list[Run]]] = {}
    for r in runs:
        if r.workload != "llm" or not r.summary:
            continue
        c = r.config
        key = (c.get("llm.model", ""), c.get("run.precision", ""), c.get("run.device", ""),
               c.get("llm.max_seq_len", ""), r.ranks)
        out.setdefault(key, {}).setdefault(str(c.get("llm.method", "")), []).append(r)
    return out


def _group_text(key: tuple) -> str:
    model, precision, device, seq, n = key
    return f"{model} {precision} {device} seq {seq}, {_ranks_text(n)}"


def _mean(runs: list[Run], f) -> float:
    v = [f(r) for r in runs]
    v = [x for x in v if x == x]
    return float(np.mean(v)) if v else math.nan


def scales(study: Study, mode: str, inc: bool, strategy: str,
           min_efficiency: float) -> tuple[str, str]:
    lines, ok = [], []
    for workload in ("cv", "llm"):
        sub = Study([r for r in study.usable(inc) if r.workload == workload
                     and r.config.get("run.strategy") == strategy])
        if not sub.runs:
            continue
        try:
            df = scaling_table(sub, mode, inc)
        except StudyError:
            continue
        for name, g in df.groupby("configuration", sort=False):
            top = g.sort_values("ranks").iloc[-1]
            e = float(top["efficiency [%]"])
            ok.append(e >= min_efficiency)
            lines.append(f"{workload} {name}: {e:.1f}% at {_ranks_text(int(top['ranks']))} "
                         f"(vs {_ranks_text(int(g['ranks'].min()))}, {mode} scaling)")
    return _verdict(ok, lines, f"no {strategy} configuration run at two or more rank counts")


def reduced_precision_faster(study: Study, mode: str, inc: bool, baseline: str,
                             reduced: list[str]) -> tuple[str, str]:
    groups: dict[tuple, dict[str, list[Run]]] = {}
    for r in study.usable(inc):
        if not r.summary:
            continue
        key = (r.workload, r.ranks,
               tuple(sorted(point_config(r, ignore=("run.precision",)).items())))
        groups.setdefault(key, {}).setdefault(str(r.config.get("run.precision", "")), []).append(r)
    lines, ok = [], []
    for (workload, n, _), by in groups.items():
        if baseline not in by:
            continue
        t32 = _mean(by[baseline], _step)
        for p in reduced:
            if p in by:
                t = _mean(by[p], _step)
                s = t32 / t if t > 0 else math.nan
                ok.append(s > 1.0)
                device = by[p][0].config.get("run.device", "")
                what = f"{workload} {by[p][0].row.get('method') or ''}".strip()
                lines.append(f"{what} {device}, {_ranks_text(n)}: {p} {t * 1e3:.4g} ms vs "
                             f"{baseline} {t32 * 1e3:.4g} ms per step: speedup {s:.2f}x")
    return _verdict(ok, lines, f"no pair of runs differing only in run.precision ({baseline} vs "
                               f"{'/'.join(reduced)})")


def option_gain_shrinks(study: Study, mode: str, inc: bool, option: str) -> tuple[str, str]:
    """The step-time gain of `option`=true over false, on GPU runs (CPU runs ignore the host
    options this is for), smaller at the largest rank count than at the smallest."""
    runs = [r for r in study.usable(inc) if r.summary]
    cpu_only = any(r.config.get("run.device") == "cpu" for r in runs) and \
        {str(r.config.get(option)) for r in runs} >= {"true", "false"}
    runs = [r for r in runs if r.config.get("run.device") != "cpu"]
    groups: dict[tuple, dict[int, dict[str, list[Run]]]] = {}
    for r in runs:
        key = (r.workload, tuple(sorted(point_config(r, ignore=(option,),
                                                     mode=mode).items())))
        groups.setdefault(key, {}).setdefault(r.ranks, {}).setdefault(
            str(r.config.get(option, "")), []).append(r)
    lines, ok = [], []
    for (workload, _), by_n in groups.items():
        gains = {}
        for n, by in by_n.items():
            if "true" in by and "false" in by:
                gains[n] = 100.0 * (_mean(by["false"], _step) / _mean(by["true"], _step) - 1.0)
        if len(gains) < 2:
            continue
        lo, hi = min(gains), max(gains)
        ok.append(gains[hi] < gains[lo])
        lines.append(f"{workload}: gain {gains[lo]:+.1f}% at {_ranks_text(lo)}, "
                     f"{gains[hi]:+.1f}% at {_ranks_text(hi)}")
    why = f"no GPU configuration run with {option}=true and false at two or more rank counts"
    if cpu_only:
        why += f" (CPU runs do not count: {option} is ignored on CPU)"
    return _verdict(ok, lines, why)


def faster_and_leaner(study: Study, mode: str, inc: bool, method: str,
                      than: str) -> tuple[str, str]:
    lines, ok = [], []
    a, b = method, than
    for key, by in _llm_groups(study.usable(inc)).items():
        if a in by and b in by:
            ts = {m: _mean(by[m], _step) for m in (a, b)}
            ms = {m: _mean(by[m], _peak_mib) for m in (a, b)}
            ok.append(ts[a] < ts[b] and ms[a] < ms[b])
            lines.append(f"{_group_text(key)}: {_NAMES.get(a, a)} {ts[a] * 1e3:.4g} ms, "
                         f"{ms[a]:.4g} MiB vs {_NAMES.get(b, b)} {ts[b] * 1e3:.4g} ms, "
                         f"{ms[b]:.4g} MiB (step {ts[b] / ts[a]:.2f}x, memory "
                         f"{ms[b] / ms[a]:.2f}x)")
    return _verdict(ok, lines, f"no {_NAMES.get(a, a)} and {_NAMES.get(b, b)} runs at the same "
                               "model, precision, sequence length and rank count")


def method_extreme(study: Study, mode: str, inc: bool, method: str, metric: str,
                   extreme: str) -> tuple[str, str]:
    """`method` has the lowest (extreme = "min") or highest ("max") `metric` (step or
    peak_memory) of the LLM methods run beside it."""
    metric_fn, units, scale = _METRICS[metric]
    better = (lambda x, y: x < y) if extreme == "min" else (lambda x, y: x > y)
    lines, ok = [], []
    for key, by in _llm_groups(study.usable(inc)).items():
        if method not in by or len(by) < 2:
            continue
        v = {m: _mean(rs, metric_fn) for m, rs in by.items()}
        others = {m: x for m, x in v.items() if m != method}
        ok.append(all(better(v[method], x) for x in others.values()))
        lines.append(f"{_group_text(key)}: " + ", ".join(
            f"{m} {x * scale:.4g} {units}" for m, x in sorted(v.items(), key=lambda kv: kv[1])))
    return _verdict(ok, lines, f"no {method} run beside another LLM method at the same "
                               "model, precision, sequence length and rank count")


def _val_loss(r: Run) -> float:
    return float(r.summary.get("final_val_loss", math.nan))


def quality_kept(study: Study, mode: str, inc: bool, baseline: str, methods: list[str],
                 max_gap: float) -> tuple[str, str]:
    lines, ok = [], []
    for key, by in _llm_groups(study.usable(inc)).items():
        full = _mean(by.get(baseline, []), _val_loss)
        if not full == full:
            continue
        for method in methods:
            v = _mean(by.get(method, []), _val_loss)
            if not v == v:
                continue
            gap = 100.0 * (v / full - 1.0)
            ok.append(gap <= max_gap)
            lines.append(f"{_group_text(key)}: {method} {v:.4g} vs {baseline} {full:.4g} "
                         f"({gap:+.1f}%)")
    names = [_NAMES.get(m, m) for m in methods]
    some = ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]
    return _verdict(ok, lines, f"no {_NAMES.get(baseline, baseline)} run with a validation loss "
                               f"beside a {some} run at the same model, precision, sequence "
                               "length and rank count")


def overhead_share(study: Study, mode: str, inc: bool, phases: list[str],
                   min_share: float) -> tuple[str, str]:
    lines, ok = [], []
    for r in study.usable(inc):
        if r.workload != "llm" or not r.summary:
            continue
        s = r.summary
        times = [float(s.get(f"median_{p}_s", math.nan)) for p in phases]
        over = sum(v for v in times if v == v)  # a phase the run does not have counts 0
        step = _step(r)
        if not step > 0:
            continue
        share = 100.0 * over / step
        idle = math.nan
        with r.open() as rf:
            idle_s, span_s = schema.PROFILE_BREAKDOWN_IDLE_S, schema.PROFILE_BREAKDOWN_SPAN_S
            if rf.has(idle_s) and rf.has(span_s):
                i = np.asarray(rf.group(idle_s)[...], dtype=np.float64)
                sp = np.asarray(rf.group(span_s)[...], dtype=np.float64)
                if np.any(sp > 0):
                    idle = 100.0 * float(np.nansum(i) / np.nansum(sp))
        ok.append(share >= min_share or idle >= min_share)
        method = r.config.get("llm.method", "")
        text = (f"{method} {r.config.get('run.device', '')}, {_ranks_text(r.ranks)}: "
                f"{share:.1f}% of {step * 1e3:.4g} ms")
        if idle == idle:
            text += f", device idle {idle:.1f}% of the profiler span"
        lines.append(text)
    return _verdict(ok, lines, "no completed LLM run")


def compression_pays(study: Study, mode: str, inc: bool) -> tuple[str, str]:
    """Every compressed setting (dist.compress) lowers both the exposed communication
    (comm_wait) and the step against dist.compress=none in runs that differ only in it, at the
    same ranks (compression.verdicts: each sentence says by how much, at which link rate and
    with which change in accuracy or loss, or that it does not pay)."""
    from .compression import comparisons, verdicts
    found = [v for c in comparisons(study, inc) for v in verdicts(c)]
    return _verdict([ok for ok, _ in found], [text for _, text in found],
                    "no runs that differ only in dist.compress (none and fp16, bf16 or powersgd) "
                    "at the same rank count")


_NAMES = {"lora": "LoRA", "qlora": "QLoRA", "dpo": "DPO", "qat": "QAT",
          "full": "full fine-tuning"}
_METRICS = {"step": (_step, "ms", 1e3), "peak_memory": (_peak_mib, "MiB", 1.0)}
RULES = {"scales": scales, "reduced_precision_faster": reduced_precision_faster,
         "option_gain_shrinks": option_gain_shrinks, "faster_and_leaner": faster_and_leaner,
         "method_extreme": method_extreme, "quality_kept": quality_kept,
         "overhead_share": overhead_share, "compression_pays": compression_pays}


def load_findings(path: Path = TABLE) -> list[dict]:
    """The findings table, checked: every entry has an id, a text, a known rule and the
    parameters that rule takes (a wrong one is named with the file, not met at report time)."""
    import inspect
    try:
        import tomllib
    except ModuleNotFoundError:  # Python < 3.11
        raise StudyError("the findings table needs Python 3.11 (tomllib)") from None
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise StudyError(f"{path}: {e}") from None
    out, seen = [], set()
    for i, f in enumerate(doc.get("finding", [])):
        where = f"{path}: finding {i + 1} ({f.get('id', 'no id')})"
        extra = set(f) - {"id", "paper", "rule", "params", "text"}
        if extra or not all(isinstance(f.get(k), str) for k in ("id", "rule", "text")):
            raise StudyError(f"{where}: needs id, rule and text (strings), optional paper and "
                             f"params{'; unknown: ' + ', '.join(sorted(extra)) if extra else ''}")
        if f["id"] in seen:
            raise StudyError(f"{where}: two findings have this id")
        seen.add(f["id"])
        rule = RULES.get(f["rule"])
        if rule is None:
            raise StudyError(f"{where}: rule {f['rule']!r} is not one of "
                             f"{', '.join(sorted(RULES))}")
        params = dict(f.get("params", {}))
        want = [n for n in inspect.signature(rule).parameters if n not in ("study", "mode", "inc")]
        if sorted(params) != sorted(want):
            raise StudyError(f"{where}: rule {f['rule']} takes params {', '.join(want)}; given "
                             f"{', '.join(sorted(params)) or 'none'}")
        try:
            text = f["text"].format(**params)
        except (KeyError, ValueError, IndexError) as e:
            raise StudyError(f"{where}: text quotes {e} that is not a parameter") from None
        out.append({"id": f["id"], "paper": f.get("paper", ""), "rule": rule, "params": params,
                    "text": text})
    return out


def findings_table(study: Study, mode: str = "strong", include_incomplete: bool = False,
                   findings: list[dict] | None = None) -> pd.DataFrame:
    """One row per finding of the table (findings.toml): the verdict on these runs (reproduced /
    not reproduced / not covered) and the measured numbers it rests on."""
    rows = []
    for f in findings if findings is not None else load_findings():
        verdict, evidence = f["rule"](study, mode, include_incomplete, **f["params"])
        rows.append({"id": f["id"], "finding": f["text"], "verdict": verdict,
                     "evidence": evidence})
    return pd.DataFrame(rows)
