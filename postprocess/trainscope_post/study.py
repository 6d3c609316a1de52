"""Tables over many run files: loading a study, summary rows, scaling, phase breakdown, profile
shares, comparisons, memory and communication. Every function returns a pandas DataFrame whose
column names carry their units (``[s]``, ``[MiB]``, ``[%]``...), so printed and exported tables
say what they hold."""

from __future__ import annotations

import contextlib
import math
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from . import schema
from .runfile import DamagedRunError, RunFile, SchemaError, reading

PHASES = ["data", "h2d", "forward", "backward", "comm_wait", "optimizer", "control"]

# Config keys that never change what a point measures, so they neither split configurations nor
# name them: where the output goes, logging, checkpoints, how long the run is and which of its
# iterations are measured, timeouts, and where adapters are saved.
IGNORED_PREFIXES = ("output.", "log.", "checkpoint.")
INCIDENTAL_KEYS = frozenset({
    "train.max_iters", "train.epochs", "profile.warmup_iters", "profile.top_n", "profile.trace",
    "run.iteration_timeout", "dist.timeout", "llm.save_adapters",
})


def _truthy(value) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def applies(key: str, cfg: dict) -> bool:
    """Whether option `key` has any effect in the configuration `cfg` (the run's /config): an
    option of another workload, method, strategy or ZeRO stage does not (llm.qat.group_size under
    LoRA, pipeline.stages under DDP), so it must not make two otherwise equal runs differ."""
    if key in INCIDENTAL_KEYS or key.startswith(IGNORED_PREFIXES):
        return False
    workload = str(cfg.get("run.workload", "cv"))
    section = key.split(".", 1)[0]
    if section in ("cv", "llm", "comm") and section != workload:
        return False
    if workload == "comm" and section in ("train", "data", "cv", "llm", "pipeline", "dp"):
        return False
    strategy = str(cfg.get("run.strategy", ""))
    if section == "pipeline" and strategy and strategy != "pipeline":
        return False
    if section == "dp" and strategy and strategy != "dp":
        return False
    if key.startswith("dist.powersgd_") and str(cfg.get("dist.compress", "none")) != "powersgd":
        return False
    if key in ("dist.reshard_after_forward", "dist.prefetch") and \
            str(cfg.get("dist.zero", "0")) != "3":
        return False
    if workload == "llm":
        method = str(cfg.get("llm.method", "lora"))
        if key.startswith("llm.lora.") and not (
                method in ("lora", "qlora", "dpo") or
                (method == "qat" and _truthy(cfg.get("llm.qat.lora", False)))):
            return False
        if key.startswith("llm.dpo.") and method != "dpo":
            return False
        if key.startswith("llm.qat.") and method != "qat":
            return False
    return True


class StudyError(ValueError):
    """A study cannot be processed as asked (no files, incompatible runs, ...)."""


# A run's file stays open between uses: a report reads each run in a dozen places (tables,
# sections, findings, the model) and opens it once. At most MAX_OPEN stay open at a time (each
# holds a file descriptor and HDF5's metadata cache, not data); past that the least recently used
# one not being read is closed, and opened again when next needed. Study.close() (and the end of
# write_report and of every trainscope-post command) closes them; a Run nobody holds any more
# closes its file with it (the registry keeps weak references).
MAX_OPEN = 256
_OPEN: OrderedDict[int, weakref.ref] = OrderedDict()


def _keep_open(run: "Run") -> None:
    _OPEN[id(run)] = weakref.ref(run, lambda _, key=id(run): _OPEN.pop(key, None))
    _OPEN.move_to_end(id(run))
    for key, ref in list(_OPEN.items()):
        if len(_OPEN) <= MAX_OPEN:
            break
        old = ref()
        if old is None:
            _OPEN.pop(key, None)
        elif old is not run and not old._readers:
            old.close()


def close_all() -> None:
    """Closes every run file kept open (the end of a trainscope-post command)."""
    for ref in list(_OPEN.values()):
        run = ref()
        if run is not None:
            run.close()
    _OPEN.clear()


@dataclass(eq=False)
class Run:
    """What the tables need of one file, read once (attributes), and the file itself, kept open
    for the readers that need its series (open())."""

    path: Path
    row: dict
    config: dict
    summary: dict
    attrs: dict
    status: str
    _rf: RunFile | None = field(default=None, repr=False)
    _readers: int = field(default=0, repr=False)

    def __post_init__(self):
        if self._rf is not None:
            _keep_open(self)

    @property
    def completed(self) -> bool:
        return self.status == "completed"

    @property
    def ranks(self) -> int:
        return int(self.attrs.get("world_size", 0) or 0)

    @property
    def nodes(self) -> int:
        return int(self.attrs.get("num_nodes", 1) or 1)

    @property
    def workload(self) -> str:
        return str(self.attrs.get("workload", ""))

    @contextlib.contextmanager
    def open(self):
        """`with run.open() as rf:` the run's RunFile, opened on first use and left open for the
        next one (close() or Study.close() ends it)."""
        if self._rf is None:
            self._rf = RunFile(self.path)
        reading(self.path)
        _keep_open(self)
        self._readers += 1
        try:
            yield self._rf
        finally:
            self._readers -= 1

    def close(self) -> None:
        if self._rf is not None:
            self._rf.close()
            self._rf = None
        _OPEN.pop(id(self), None)


@dataclass
class Study:
    runs: list[Run] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    # The errors of files that are trainscope run files with impossible content (also in
    # `errors`): a table skips them, advise refuses to recommend while one is in the study.
    damaged: list[str] = field(default_factory=list)

    def usable(self, include_incomplete: bool = False) -> list[Run]:
        return [r for r in self.runs if include_incomplete or r.completed]

    def excluded(self, include_incomplete: bool = False) -> list[Run]:
        return [] if include_incomplete else [r for r in self.runs if not r.completed]

    def close(self) -> None:
        """Closes the run files kept open (a later read opens the file again)."""
        for r in self.runs:
            r.close()

    def __enter__(self) -> "Study":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def expand(paths) -> list[Path]:
    out = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(p.rglob("*.h5"))
        elif p.exists():
            out.append(p)
        else:
            raise StudyError(f"{p}: no such file or directory")
    return out


def load(paths) -> Study:
    """Reads the attributes of every run file under `paths` (files or directories, recursively).
    Files that are not trainscope run files (not regular files, not HDF5, another schema, a
    structure that does not follow docs/run_file_schema.md) are reported in Study.errors, not
    raised; a FIFO or device is never opened (h5py would block on it). The files of the runs
    stay open for the tables and reports that read them next (Run.open, Study.close)."""
    files = expand(paths)
    if not files:
        raise StudyError("no run files (*.h5) found in: " + " ".join(map(str, paths)))
    study = Study()
    for f in files:
        if not f.is_file():
            study.errors.append(f"{f}: not a regular file (a FIFO, device or directory), "
                                "not read")
            continue
        rf = None
        try:
            rf = RunFile(f)
            study.runs.append(Run(f, rf.summary_row(), rf.config, rf.summary,
                                  rf.attrs(schema.ROOT), rf.status, rf))
        except (SchemaError, OSError, KeyError, ValueError, TypeError, IndexError) as e:
            if rf is not None:
                rf.close()
            msg = str(e)
            study.errors.append(msg if str(f) in msg else f"{f}: {type(e).__name__}: {msg}")
            if isinstance(e, DamagedRunError):
                study.damaged.append(study.errors[-1])
    return study


def label(run: Run, study_root: Path | None = None) -> str:
    try:
        return str(run.path.relative_to(study_root)) if study_root else run.path.name
    except ValueError:
        return run.path.name


# --- summary ------------------------------------------------------------------------------------
SUMMARY_COLUMNS = [
    ("file", "file"), ("workload", "workload"), ("strategy", "strategy"),
    ("precision", "precision"), ("ranks", "ranks"), ("nodes", "nodes"), ("dataset", "dataset"),
    ("method", "method"), ("status", "status"), ("iters", "measured iters"),
    ("median_step_s", "median step [s]"), ("samples_per_s", "throughput [samples/s]"),
    ("tokens_per_s", "throughput [tokens/s]"), ("val_accuracy", "val accuracy [%]"),
    ("train_loss", "train loss"), ("peak_mem_MiB", "peak memory [MiB]"),
    ("peak_rss_MiB", "peak RSS [MiB]"), ("energy_per_sample_j", "energy [J/sample]"),
    ("flush_pct", "run-file I/O [% of wall]"),
]


def summary_table(study: Study) -> pd.DataFrame:
    rows = []
    for r in study.runs:
        row = dict(r.row)
        acc = row.get("val_accuracy", math.nan)
        row["val_accuracy"] = 100.0 * acc if isinstance(acc, (int, float)) else acc
        rows.append({title: row.get(key, math.nan) for key, title in SUMMARY_COLUMNS})
    return pd.DataFrame(rows, columns=[t for _, t in SUMMARY_COLUMNS])


# --- grouping by configuration ----------------------------------------------------------------
BATCH_KEYS = ("train.batch_size", "train.global_batch_size")


def point_config(run: Run, ignore=(), mode: str | None = None) -> dict:
    """The configuration that defines a study point. With a scaling mode, the batch is compared
    the way that mode keeps it fixed: strong = the global batch (per-rank batch = global / N),
    weak = the per-rank batch."""
    cfg = {k: str(v) for k, v in run.config.items()
           if k not in ignore and applies(k, run.config)}
    if mode in ("strong", "weak"):
        for k in BATCH_KEYS:
            cfg.pop(k, None)
        g = run.summary.get("global_batch_samples")
        if g is None:
            try:
                g = int(run.config.get("train.global_batch_size", 0)) or \
                    int(run.config.get("train.batch_size", 0)) * run.ranks
            except (TypeError, ValueError):
                g = 0
        g = float(g)
        if mode == "strong":
            cfg["global batch"] = f"{g:g}"
        else:
            cfg["batch per rank"] = f"{g / max(run.ranks, 1):g}"
    return cfg


def differing_keys(configs: list[dict]) -> list[str]:
    keys = sorted(set().union(*configs)) if configs else []
    return [k for k in keys if len({c.get(k, "<unset>") for c in configs}) > 1]


def group_by_config(runs: list[Run], ignore=(), mode: str | None = None) -> list[list[Run]]:
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        key = tuple(sorted(point_config(r, ignore, mode).items()))
        groups.setdefault(key, []).append(r)
    return list(groups.values())


# Keys that name a configuration first, when they differ: what a study compares.
NAMING_ORDER = ("run.workload", "llm.method", "run.strategy", "dist.zero", "run.precision",
                "dist.compress", "cv.model", "llm.model", "data.dataset", "llm.dataset.format",
                "cv.image_size", "data.pin_memory", "cv.channels_last", "data.preprocess",
                "pipeline.stages", "dp.devices")
MAX_NAME_KEYS = 4


def naming_keys(configs: list[dict]) -> list[str]:
    """The keys that name configurations: of the keys in which they differ, in NAMING_ORDER then
    alphabetical, each taken only if it tells more configurations apart, until every name is
    distinct (or MAX_NAME_KEYS are taken). A key a configuration lacks (another method's option)
    does not name it."""
    differ = differing_keys(configs)
    order = [k for k in NAMING_ORDER if k in differ] + \
        [k for k in differ if k not in NAMING_ORDER]
    chosen: list[str] = []
    distinct = 1
    for k in order:
        names = {tuple(c.get(x, "") for x in chosen + [k]) for c in configs}
        if len(names) > distinct:
            chosen.append(k)
            distinct = len(names)
        if distinct == len(configs) or len(chosen) == MAX_NAME_KEYS:
            break
    return chosen


def describe_group(runs: list[Run], all_groups: list[list[Run]], mode: str | None = None) -> str:
    """A short name for a configuration: the values of the keys that tell it from the other
    groups (naming_keys)."""
    configs = [point_config(g[0], mode=mode) for g in all_groups]
    mine = point_config(runs[0], mode=mode)
    keys = [k for k in naming_keys(configs) if k in mine]
    if not keys:
        return runs[0].workload or "runs"
    return ", ".join(f"{k}={mine[k]}" for k in keys)


# --- scaling ------------------------------------------------------------------------------------
def throughput(run: Run) -> tuple[float, str]:
    s = run.summary
    tok = s.get("throughput_tokens_per_s", math.nan)
    if tok == tok and run.workload == "llm":
        return float(tok), "tokens/s"
    return float(s.get("throughput_samples_per_s", math.nan)), "samples/s"


def scaling_table(study: Study, mode: str, include_incomplete: bool = False) -> pd.DataFrame:
    """Per configuration and rank count: median step time and throughput (mean, min, max over
    repeats), speedup and parallel efficiency against the configuration's smallest rank count.
    strong: speedup = X_N / X_1 (global throughput: the same work finishes that much sooner),
    efficiency = speedup / (N / N_1). weak: efficiency = (X_N / N) / (X_1 / N_1), speedup (scaled)
    = X_N / X_1."""
    if mode not in ("strong", "weak"):
        raise StudyError(f"--mode {mode!r}: use strong or weak")
    runs = [r for r in study.usable(include_incomplete) if r.summary]
    if not runs:
        raise StudyError("no runs with a /summary to scale (incomplete runs write none)"
                         if include_incomplete else
                         "no completed runs to scale (incomplete runs are excluded unless "
                         "--include-incomplete)")
    workloads = {r.workload for r in runs}
    groups = group_by_config(runs, mode=mode)
    if len(workloads) > 1:
        keys = differing_keys([point_config(g[0], mode=mode) for g in groups])
        raise StudyError("runs of different workloads (" + ", ".join(sorted(workloads)) +
                         ") cannot be scaled together; keys that differ: " + ", ".join(keys))
    scalable = [g for g in groups if len({r.ranks for r in g}) > 1]
    if not scalable:
        keys = differing_keys([point_config(g[0], mode=mode) for g in groups])
        raise StudyError("no configuration was run at more than one rank count"
                         + (": the runs differ in " + ", ".join(keys) if keys else ""))
    rows = []
    for g in scalable:
        name = describe_group(g, groups, mode)
        by_n: dict[int, list[Run]] = {}
        for r in g:
            by_n.setdefault(r.ranks, []).append(r)
        n0 = min(by_n)
        x0 = float(np.mean([throughput(r)[0] for r in by_n[n0]]))
        unit = throughput(g[0])[1]
        for n in sorted(by_n):
            xs = np.array([throughput(r)[0] for r in by_n[n]])
            ts = np.array([float(r.summary.get("median_step_s", math.nan)) for r in by_n[n]])
            speedups = xs / x0
            eff = speedups / (n / n0) if mode == "strong" else (xs / n) / (x0 / n0)
            rows.append({
                "configuration": name, "ranks": n, "nodes": max(r.nodes for r in by_n[n]),
                "repeats": len(by_n[n]),
                "median step [s]": float(np.mean(ts)),
                "step min [s]": float(np.min(ts)), "step max [s]": float(np.max(ts)),
                f"throughput [{unit}]": float(np.mean(xs)),
                f"throughput per rank [{unit}]": float(np.mean(xs)) / n,
                "speedup": float(np.mean(speedups)),
                "speedup min": float(np.min(speedups)), "speedup max": float(np.max(speedups)),
                "efficiency [%]": 100.0 * float(np.mean(eff)),
                "efficiency min [%]": 100.0 * float(np.min(eff)),
                "efficiency max [%]": 100.0 * float(np.max(eff)),
            })
    return pd.DataFrame(rows)


# --- breakdown ----------------------------------------------------------------------------------
def phase_table(run: Run) -> pd.DataFrame:
    """Per detail rank (the ranks whose rows the file holds: all of them, or the subset of
    output.per_rank; column "rank" is the MPI rank): mean seconds of each phase over the
    measured iterations and the step time."""
    with run.open() as rf:
        data = {p: rf.measured(f"{p}_s") for p in PHASES}
        step = rf.measured("step_s")
        ranks = rf.detail_ranks()
    n = step.shape[0]
    rows = []
    for r in range(n):
        row = {"rank": int(ranks[r]) if r < len(ranks) else r}
        for p in PHASES:
            v = data[p][r] if data[p].size else np.array([math.nan])
            row[f"{p} [s]"] = float(np.nanmean(v)) if np.any(~np.isnan(v)) else math.nan
        row["step [s]"] = float(np.nanmean(step[r])) if step.size and np.any(~np.isnan(step[r])) \
            else math.nan
        rows.append(row)
    return pd.DataFrame(rows, columns=["rank", *[f"{p} [s]" for p in PHASES], "step [s]"])


def imbalance_table(phases: pd.DataFrame, run: Run | None = None) -> pd.DataFrame:
    """Per phase: mean over ranks, max, max/mean, and the slowest rank (the straggler).
    Without `run` (or for a file without aggregates): from the per-rank means of `phases`
    (phase_table: every rank in such files), max = the largest rank mean. With a `run` whose
    file has /iterations/aggregate: over ALL ranks from the aggregates, mean = the mean over the
    measured iterations of the mean over ranks, max = the mean over the measured iterations of
    the slowest rank's time, slowest rank = the rank that was slowest in the most iterations."""
    if run is not None:
        table = _imbalance_from_aggregates(run)
        if table is not None:
            return table
    rows = []
    for p in PHASES + ["step"]:
        col = phases[f"{p} [s]"]
        if col.isna().all():
            continue
        mean = float(col.mean())
        rows.append({"phase": p, "mean [s]": mean, "max [s]": float(col.max()),
                     "max/mean": float(col.max()) / mean if mean > 0 else math.nan,
                     "slowest rank": int(phases.loc[col.idxmax(), "rank"])})
    return pd.DataFrame(rows)


def _nanmean(v: np.ndarray) -> float:
    v = v[np.isfinite(v)]
    return float(v.mean()) if v.size else math.nan


def _imbalance_from_aggregates(run: Run) -> pd.DataFrame | None:
    rows = []
    with run.open() as rf:
        if not rf.has_aggregate():
            return None
        for p in PHASES + ["step"]:
            col = f"{p}_s"
            try:
                mean = _nanmean(rf.measured_aggregate(col, field="mean"))
                top = _nanmean(rf.measured_aggregate(col, field="max"))
                arg = rf.measured_aggregate(col, field="argmax")
            except KeyError:  # a column this file has no aggregate of
                continue
            if mean != mean:
                continue
            arg = arg[arg >= 0]
            rows.append({"phase": p, "mean [s]": mean, "max [s]": top,
                         "max/mean": top / mean if mean > 0 else math.nan,
                         "slowest rank": int(np.bincount(arg).argmax()) if arg.size else -1})
    return pd.DataFrame(rows)


PROFILE_CLASSES = ["kernels", "communication", "memcpy", "memset", "runtime"]


def _profile_class(category: str) -> str | None:
    if category == "gpu_kernel":
        return "kernels"
    if category == "nccl_kernel":
        return "communication"
    if category.startswith("memcpy"):
        return "memcpy"
    if category == "memset":
        return "memset"
    if category.startswith(("cuda_runtime", "cuda_driver")) or category == "cuda_sync":
        return "runtime"
    return None


def profile_table(run: Run) -> pd.DataFrame:
    """Per rank, from /profile/categories: seconds and percent of kernels, communication kernels,
    memcpy, memset and CUDA runtime/driver calls in the profiler window (like Nsight's summary).
    Empty when the run had no profiler window or no GPU activity (CPU runs)."""
    with run.open() as rf:
        g = rf.group(schema.PROFILE_CATEGORIES)
        if g is None or "name" not in g:
            return pd.DataFrame()
        names = g["name"].asstr()[...]
        total = np.asarray(g["total_s"][...])
        offset = np.asarray(g["name_offset"][...]) if "name_offset" in g else None
        count = np.asarray(g["name_count"][...]) if "name_count" in g else None
    if offset is None or count is None:
        return pd.DataFrame()
    rows = []
    for r in range(len(offset)):
        sums = dict.fromkeys(PROFILE_CLASSES, 0.0)
        for i in range(int(offset[r]), int(offset[r] + count[r])):
            c = _profile_class(str(names[i]))
            if c:
                sums[c] += float(total[i])
        tot = sum(sums.values())
        if tot <= 0:
            continue
        row = {"rank": r}
        for c in PROFILE_CLASSES:
            row[f"{c} [s]"] = sums[c]
        for c in PROFILE_CLASSES:
            row[f"{c} [%]"] = 100.0 * sums[c] / tot
        rows.append(row)
    return pd.DataFrame(rows)


# --- compare ------------------------------------------------------------------------------------
def value_of(run: Run, key: str):
    """A grouping key or metric: a config key (section.key), a summary attribute, a root
    attribute, or a summary-table column (ranks, method, dataset, ...)."""
    for source in (run.config, run.summary, run.attrs, run.row):
        if key in source:
            return source[key]
    return None


def compare_table(study: Study, by: list[str], metric: str, baseline: str | None = None,
                  include_incomplete: bool = False) -> pd.DataFrame:
    runs = study.usable(include_incomplete)
    if not runs:
        raise StudyError("no completed runs to compare")
    missing = [k for k in by if all(value_of(r, k) is None for r in runs)]
    if missing:
        raise StudyError(f"--by {','.join(missing)}: no run has this key (use config keys such as "
                         "run.precision, summary attributes, or ranks/method/dataset)")
    if all(value_of(r, metric) is None for r in runs):
        raise StudyError(f"--metric {metric}: no run has this value (e.g. median_step_s, "
                         "throughput_samples_per_s, peak_host_rss_bytes)")
    groups: dict[str, list[float]] = {}
    for r in runs:
        name = ", ".join(f"{k}={value_of(r, k)}" for k in by)
        v = value_of(r, metric)
        groups.setdefault(name, []).append(float(v) if v is not None else math.nan)
    names = list(groups)
    base = baseline if baseline is not None else names[0]
    if base not in groups:
        raise StudyError(f"--baseline {base!r} is not one of the groups: " + "; ".join(names))
    b = float(np.nanmean(groups[base]))
    rows = []
    for name in names:
        v = np.array(groups[name])
        m = float(np.nanmean(v))
        rows.append({"group": name, "runs": len(v), metric: m, "min": float(np.nanmin(v)),
                     "max": float(np.nanmax(v)), f"relative to {base}": m / b if b else math.nan})
    return pd.DataFrame(rows)


# --- memory -------------------------------------------------------------------------------------
MEMORY_COLUMNS = [
    ("parameter_bytes", "parameters"), ("gradient_bytes", "gradients"),
    ("optimizer_state_bytes", "optimizer state"), ("host_tensor_peak_bytes", "peak CPU tensors"),
    ("device_allocated_peak_bytes", "peak device allocated"),
    ("device_reserved_peak_bytes", "peak device reserved"), ("host_peak_rss_bytes", "peak RSS"),
]


def memory_table(study: Study, include_incomplete: bool = False) -> pd.DataFrame:
    """Per run: the largest value over ranks and measured iterations of each memory column, in
    MiB (over all ranks: from the aggregates where the file has them); columns that are NaN
    everywhere (e.g. device counters on CPU) are dropped."""
    rows = []
    for r in study.usable(include_incomplete):
        row = {"run": r.path.name, "method": r.row.get("method") or "-",
               "precision": r.row.get("precision", ""), "ranks": r.ranks}
        with r.open() as rf:
            for col, title in MEMORY_COLUMNS:
                v = rf.over_ranks(col, field="max")
                row[f"{title} [MiB]"] = float(np.nanmax(v)) / 2**20 if v.size and \
                    np.any(~np.isnan(v)) else math.nan
        rows.append(row)
    df = pd.DataFrame(rows)
    return df.dropna(axis=1, how="all") if not df.empty else df


# --- comm ---------------------------------------------------------------------------------------
def comm_table(study: Study, include_incomplete: bool = False) -> pd.DataFrame:
    rows = []
    for r in study.usable(include_incomplete):
        with r.open() as rf:
            g = rf.group(schema.COMM)
            if g is None:
                continue
            backend = str(rf.attrs(schema.COMM).get("backend", ""))
            for op in ("allreduce", "allgather", "reduce_scatter", "broadcast"):
                if op not in g or "bytes" not in g[op]:
                    continue
                o = g[op]
                for b, t, bus, alg in zip(o["bytes"][...], o["time_s"][...], o["busbw_GBps"][...],
                                          o["algbw_GBps"][...]):
                    rows.append({"run": r.path.name, "op": op, "backend": backend,
                                 "ranks": r.ranks, "size [B]": int(b), "time [us]": 1e6 * float(t),
                                 "algbw [GB/s]": float(alg), "busbw [GB/s]": float(bus)})
    return pd.DataFrame(rows)


# --- export -------------------------------------------------------------------------------------
def long_table(study: Study, include_incomplete: bool = True) -> pd.DataFrame:
    """Every /iterations value as tidy rows: run, rank, iteration, metric, value, units. Only the
    rows each rank wrote (rank_rows), of the ranks the file holds rows of (all, or the detail
    ranks of output.per_rank; "rank" is the MPI rank)."""
    frames = []
    for r in study.usable(include_incomplete):
        with r.open() as rf:
            g = rf.group(schema.ITERATIONS)
            if g is None:
                continue
            rows = rf.rank_rows()
            ranks = rf.detail_ranks()
            it = np.asarray(g["iteration"][...]) if "iteration" in g else None
            for name in rf.columns(schema.ITERATIONS):
                if name == "iteration":
                    continue
                data = np.asarray(g[name][...], dtype=np.float64)
                units = rf.units(name)
                for rank in range(data.shape[0]):
                    k = int(rows[rank]) if rank < len(rows) else data.shape[1]
                    frames.append(pd.DataFrame({
                        "run": r.path.name,
                        "rank": int(ranks[rank]) if rank < len(ranks) else rank,
                        "iteration": it[rank, :k] if it is not None else np.arange(k),
                        "metric": name, "value": data[rank, :k], "units": units}))
    if not frames:
        return pd.DataFrame(columns=["run", "rank", "iteration", "metric", "value", "units"])
    return pd.concat(frames, ignore_index=True)


# --- per-run series for the report ------------------------------------------------------------
def step_matrix(run: Run) -> tuple[np.ndarray, int]:
    """step_s [R, n] of the detail ranks over every iteration they all recorded (warm-up
    included, so the report can show it), and the number of warm-up iterations at its start."""
    view = step_view(run)
    return view.step, view.warmup


@dataclass
class StepView:
    """What the step-time figures show of one run: the per-rank rows `step` [R, n] of the
    detail ranks `ranks` (every rank, or output.per_rank's subset of `world` ranks), and per
    iteration over ALL ranks (aggregates, or reduced from the rows when the file has none):
    min, mean, max, and the slowest rank `argmax` (-1: none). n is the recorded
    iterations (warm-up included); `warmup` of them are warm-up."""
    step: np.ndarray
    ranks: np.ndarray
    world: int
    warmup: int
    lo: np.ndarray
    mean: np.ndarray
    hi: np.ndarray
    argmax: np.ndarray
    from_aggregates: bool

    @property
    def subset(self) -> bool:
        """The rows are a subset of the ranks (output.per_rank other than all)."""
        return len(self.ranks) < self.world


def step_view(run: Run) -> StepView:
    """step_s of `run` for the step-time figures (StepView); empty rows without the column."""
    with run.open() as rf:
        ranks, world, warmup = rf.detail_ranks(), rf.world_size, rf.warmup
        try:
            step = rf.recorded("step_s")
        except KeyError:
            step = np.empty((len(ranks), 0))
        agg = rf.has_aggregate()
        try:
            stats = [rf.over_ranks("step_s", field=f, window="recorded")
                     for f in ("min", "mean", "max", "argmax")]
        except KeyError:
            stats = [np.empty(0)] * 3 + [np.empty(0, dtype=np.int64)]
    n = min(step.shape[1], len(stats[0])) if step.shape[0] else len(stats[0])
    if step.shape[0]:
        step = step[:, :n]
    stats = [v[:n] for v in stats]
    return StepView(step, ranks, world, warmup, *stats, from_aggregates=agg)


def curves_tables(run: Run) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Training curves: per iteration, the train loss (mean over ranks, warm-up included); per
    epoch, train loss, val loss and val accuracy [%] (mean over ranks; NaN where not evaluated)."""
    with run.open() as rf:
        def mean_over_ranks(name, group=schema.ITERATIONS):
            """Per row the mean over ALL ranks (the aggregates, or the rows of files without
            them), every recorded row; KeyError without the column."""
            if not rf.has_column(name, group):
                raise KeyError(name)
            return rf.over_ranks(name, group, "mean", window="recorded")
        try:
            loss = mean_over_ranks("loss")
            try:
                it = mean_over_ranks("iteration")
            except KeyError:
                it = np.arange(len(loss), dtype=np.float64)
            n = min(len(loss), len(it))
            loss, it = loss[:n], it[:n]
        except KeyError:
            loss, it = np.empty(0), np.empty(0)
        per_epoch = {}
        for name in ("epoch", "train_loss", "val_loss", "val_accuracy"):
            try:
                per_epoch[name] = mean_over_ranks(name, schema.EPOCHS)
            except KeyError:
                per_epoch[name] = np.empty(0)
    iters = pd.DataFrame({"iteration": it, "train loss": loss})
    n = per_epoch["epoch"].size
    mean = {k: v[:n] if v.size >= n else np.full(n, math.nan) for k, v in per_epoch.items()}
    epochs = pd.DataFrame({"epoch": mean["epoch"], "train loss": mean["train_loss"],
                           "val loss": mean["val_loss"],
                           "val accuracy [%]": 100.0 * mean["val_accuracy"]}) if n else \
        pd.DataFrame(columns=["epoch", "train loss", "val loss", "val accuracy [%]"])
    return iters, epochs


TELEMETRY_COLUMNS = [("cpu_percent", "CPU [% of one core]", 1.0), ("rss_bytes", "RSS [MiB]", 2**-20),
                     ("power_w", "GPU power [W]", 1.0),
                     ("gpu_util_percent", "GPU utilisation [%]", 1.0)]


def telemetry_table(run: Run) -> pd.DataFrame:
    """/telemetry as rows: rank, time [s] and the sampled CPU %, RSS, GPU power and utilisation
    (each rank's own row count; columns that are NaN everywhere, e.g. GPU ones on CPU, dropped).
    Only the ranks the file holds telemetry rows of (all, or output.per_rank's detail ranks;
    "rank" is the MPI rank); df.attrs["world"] is the run's world size. Empty without
    telemetry."""
    frames = []
    with run.open() as rf:
        g = rf.group(schema.TELEMETRY)
        if g is None or "t_s" not in g:
            return pd.DataFrame()
        rows = rf.rank_rows(schema.TELEMETRY)
        ranks, world = rf.detail_ranks(schema.TELEMETRY), rf.world_size
        t = np.asarray(g["t_s"][...], dtype=np.float64)
        cols = {title: np.asarray(g[c][...], dtype=np.float64) * scale
                for c, title, scale in TELEMETRY_COLUMNS if c in g}
    for rank in range(t.shape[0]):
        k = int(rows[rank]) if rank < len(rows) else t.shape[1]
        frames.append(pd.DataFrame({"rank": int(ranks[rank]) if rank < len(ranks) else rank,
                                    "time [s]": t[rank, :k],
                                    **{title: v[rank, :k] for title, v in cols.items()}}))
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    df = df.dropna(axis=1, how="all") if not df.empty else df
    df.attrs["world"] = world
    return df


def top_ops_table(run: Run, n: int = 10) -> pd.DataFrame:
    """The profiler window's top CPU operators (/profile/top_ops), per iteration of the window
    and averaged over the ranks that list the operator: calls, total (inclusive) and self
    milliseconds. Sorted by total time; empty without a profiler window."""
    per_op: dict[str, list[tuple[float, float, float]]] = {}
    with run.open() as rf:
        top_ops = schema.PROFILE_TOP_OPS
        if not rf.has(schema.child(top_ops, "name")):
            return pd.DataFrame()
        iters = np.asarray(rf.group(schema.PROFILE_ITERATIONS)[...], dtype=np.float64) \
            if rf.has(schema.PROFILE_ITERATIONS) else np.ones(rf.world_size)
        for rank in range(rf.world_size):
            k = iters[rank] if rank < len(iters) and iters[rank] > 0 else math.nan
            names = rf.ragged(schema.child(top_ops, "name"), rank)
            count = rf.ragged(schema.child(top_ops, "count"), rank)
            total = rf.ragged(schema.child(top_ops, "total_s"), rank)
            self_s = rf.ragged(schema.child(top_ops, "self_s"), rank)
            for i, name in enumerate(names):
                per_op.setdefault(str(name), []).append((count[i] / k, 1e3 * total[i] / k,
                                                         1e3 * self_s[i] / k))
    rows = [{"operator": name, "calls per iteration": float(np.mean([v[0] for v in vals])),
             "total [ms/iter]": float(np.mean([v[1] for v in vals])),
             "self [ms/iter]": float(np.mean([v[2] for v in vals])), "ranks": len(vals)}
            for name, vals in per_op.items()]
    if not rows:
        return pd.DataFrame()
    df = pd.DataFrame(rows).sort_values("total [ms/iter]", ascending=False, kind="stable")
    return df.head(n).reset_index(drop=True)


def execution_time(run: Run) -> float:
    """Training time of the run: the sum over its recorded iterations of the slowest rank's step
    (validation, setup and checkpoints excluded); NaN without /iterations/step_s."""
    slowest = step_view(run).hi  # [n] over all ranks: NaN where no rank ran
    slowest = slowest[np.isfinite(slowest)]
    return float(slowest.sum()) if slowest.size else math.nan


def execution_table(study: Study, mode: str, include_incomplete: bool = False) -> pd.DataFrame:
    """The papers' scaling axes per configuration and rank count: execution time (execution_time,
    mean/min/max over repeats) and parallel efficiency [%] (from scaling_table). StudyError as
    scaling_table."""
    eff = scaling_table(study, mode, include_incomplete)
    runs = [r for r in study.usable(include_incomplete) if r.summary]
    groups = group_by_config(runs, mode=mode)
    rows = []
    for g in groups:
        if len({r.ranks for r in g}) < 2:
            continue
        name = describe_group(g, groups, mode)
        for n in sorted({r.ranks for r in g}):
            ts = np.array([execution_time(r) for r in g if r.ranks == n])
            rows.append({"configuration": name, "ranks": n,
                         "execution time [s]": float(np.mean(ts)),
                         "execution time min [s]": float(np.min(ts)),
                         "execution time max [s]": float(np.max(ts))})
    cols = ["configuration", "ranks", "efficiency [%]", "efficiency min [%]", "efficiency max [%]"]
    return pd.DataFrame(rows).merge(eff[cols], on=["configuration", "ranks"], how="left")
