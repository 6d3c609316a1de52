"""`trainscope-post export --format tensorboard|thicket`: run files in the forms of the tools HPC
and ML users already have (issue 41): TensorBoard event files of the per-iteration and per-epoch
scalars, and the per-rank phase breakdown as a profile that Hatchet and Thicket read."""

from __future__ import annotations

import json
import math
import os
from datetime import datetime, timezone
from hashlib import md5
from pathlib import Path

import numpy as np

from . import schema
from .runfile import AGGREGATE, RunFile
from .study import PHASES, Run, Study, StudyError, phase_table

EVENT_FILE_PREFIX = "events.out.tfevents."


def run_names(runs: list[Run]) -> list[str]:
    """A directory-like name per run: its file's path relative to the directory all the files
    share, without `.h5` (cv/n2/rep0), so runs of the same file name in different directories
    stay apart; a single file gives its stem."""
    paths = [r.path.resolve() for r in runs]
    if not paths:
        return []
    root = Path(os.path.commonpath([p.parent for p in paths]))
    return [str(p.relative_to(root).with_suffix("")) for p in paths]


def check_export_dir(path, fmt: str) -> Path:
    """-o of the directory formats: a directory (made when missing) whose parent exists."""
    p = Path(path)
    if any(ord(c) < 32 for c in str(p)):
        raise StudyError(f"-o/--output {str(p)!r} contains a control character; give a plain "
                         "directory name")
    if p.exists() and not p.is_dir():
        raise StudyError(f"-o/--output {p}: exists and is not a directory; --format {fmt} "
                         "writes a directory (one entry per run): give a directory name")
    if not p.exists() and not p.parent.is_dir():
        raise StudyError(f"-o/--output {p}: directory {p.parent} does not exist")
    return p


def _created_epoch(rf: RunFile) -> float:
    """The run file's creation time (root@created_utc) in seconds since 1970, now if absent."""
    text = str(rf.attrs(schema.ROOT).get("created_utc", ""))
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=timezone.utc).timestamp()
    except ValueError:
        return datetime.now(timezone.utc).timestamp()


# --- TensorBoard ------------------------------------------------------------------------------
# Tags group in TensorBoard by their first segment; the units end every tag name (_s, _bytes,
# _per_s), and each tag's description (the schema's meaning, the units and the statistic across
# ranks) is in its summary metadata, shown in TensorBoard's tooltips.
ITERATION_SCALARS_SKIPPED = frozenset({"iteration", "epoch", "t_start", "samples", "tokens"})


def _iteration_tags(name: str, units: str) -> list[tuple[str, str]]:
    """(tag, statistic across ranks) of /iterations column `name`: times as the mean and the
    slowest rank, memory as the largest rank, everything else as the mean."""
    if units == "s":
        stem = name[:-2] if name.endswith("_s") else name
        base = f"time/phase/{stem}" if stem in PHASES else f"time/{stem}"
        return [(f"{base}_s", "mean"), (f"{base}_max_s", "max")]
    if units == "B":
        group = "comm" if name.startswith(("comm_", "allgather", "reduce_scatter")) else "memory"
        tail = name if name.endswith("_bytes") else f"{name}_bytes"
        return [(f"{group}/{tail}", "max" if group == "memory" else "mean")]
    suffix = "_nats" if units == "nats" and not name.endswith("_nats") else ""
    group = "comm" if name.startswith("comm_") else "train"
    return [(f"{group}/{name}{suffix}", "mean")]


STATISTIC_WORDS = {"mean": "mean over the {n} ranks", "max": "largest of the {n} ranks"}


def _describe(group: str, name: str, units: str, statistic: str, world: int) -> str:
    e = schema.entry(group, name, "column")
    meaning = e["meaning"] if e else ""
    per = "epoch" if group == schema.EPOCHS else "iteration"
    return (f"{meaning} Units: {units or '1'}; per {per} the "
            f"{STATISTIC_WORDS[statistic].format(n=world)} ({schema.child(group, name)}).").strip()


def _tensorboard_modules():
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError as e:
        raise StudyError(f"--format tensorboard needs the tensorboard package ({e}); "
                         "scripts/setup installs it (or: pip install tensorboard)") from e
    return event_pb2, summary_pb2, EventFileWriter


def tensorboard_scalars(rf: RunFile) -> list[tuple[str, str, np.ndarray, np.ndarray]]:
    """Every scalar series of a run as (tag, description, steps int64 [n], values [n]), non-finite
    points left out: /iterations per iteration (step = iteration) from the statistics over ALL
    ranks (the aggregates, or the rows of files without them), throughput per iteration, and
    /epochs per epoch (step = the 0-based epoch)."""
    world = rf.world_size
    out = []

    def over(name, group, field):
        return rf.over_ranks(name, group, field, window="recorded") \
            if rf.has_column(name, group) else np.empty(0)

    def add(tag, description, steps, values):
        n = min(len(steps), len(values))
        steps, values = steps[:n], np.asarray(values[:n], dtype=np.float64)
        keep = np.isfinite(values) & np.isfinite(steps)
        if keep.any():
            out.append((tag, description, steps[keep].astype(np.int64), values[keep]))

    it = over("iteration", schema.ITERATIONS, "mean")
    n_iter = rf.iterations_recorded()
    steps = it if len(it) else np.arange(n_iter, dtype=np.float64)
    for name in sorted(set(rf.columns(schema.ITERATIONS)) |
                       set(_aggregate_columns(rf, schema.ITERATIONS))):
        if name in ITERATION_SCALARS_SKIPPED:
            continue
        units = _units(rf, schema.ITERATIONS, name)
        for tag, statistic in _iteration_tags(name, units):
            add(tag, _describe(schema.ITERATIONS, name, units, statistic, world), steps,
                over(name, schema.ITERATIONS, statistic))
    # Throughput as /summary defines it: all ranks' samples (tokens) of the iteration over its
    # rank-mean step time.
    step = over("step_s", schema.ITERATIONS, "mean")
    for name in ("samples", "tokens"):
        mean, count = over(name, schema.ITERATIONS, "mean"), over(name, schema.ITERATIONS,
                                                                   "count")
        n = min(len(mean), len(count), len(step))
        if n:
            with np.errstate(divide="ignore", invalid="ignore"):
                rate = mean[:n] * count[:n] / step[:n]
            add(f"throughput/{name}_per_s",
                f"All ranks' {name} of the iteration / its step time (mean over the {world} "
                f"ranks), as /summary@throughput_{name}_per_s. Units: {name}/s.", steps, rate)
    ep = over("epoch", schema.EPOCHS, "mean")
    for name in sorted(set(rf.columns(schema.EPOCHS)) |
                       set(_aggregate_columns(rf, schema.EPOCHS))):
        if name == "epoch":
            continue
        units = _units(rf, schema.EPOCHS, name)
        suffix = "_bytes" if units == "B" and not name.endswith("_bytes") else ""
        add(f"epoch/{name}{suffix}", _describe(schema.EPOCHS, name, units, "mean", world), ep,
            over(name, schema.EPOCHS, "mean"))
    return out


def _units(rf: RunFile, group: str, name: str) -> str:
    """The units of a column: its dataset's attribute, else the schema's (a column the file
    holds only as an aggregate), else "" (a column newer than this package's schema)."""
    try:
        units = rf.units(name, group)
    except KeyError:
        units = ""
    try:
        return units or schema.units_of(group, name)
    except KeyError:
        return ""


def _aggregate_columns(rf: RunFile, group: str) -> list[str]:
    """The schema's columns of which a file holds aggregates (output.per_rank=none has no
    per-rank rows; RunFile reads no aggregate of a name the schema does not know)."""
    g = rf.group(group)
    a = g.get(AGGREGATE) if g is not None else None
    return [k for k in a.keys() if schema.is_column(group, k)] if a is not None else []


def write_tensorboard(study: Study, out) -> str:
    """One TensorBoard run directory per run file under `out` (named as run_names), each with one
    event file of tensorboard_scalars; an earlier export's event files there are replaced, so
    TensorBoard does not show each point twice. Returns what was written, for the terminal."""
    event_pb2, summary_pb2, EventFileWriter = _tensorboard_modules()
    out = check_export_dir(out, "tensorboard")
    runs = study.usable(include_incomplete=True)
    lines = []
    for run, name in zip(runs, run_names(runs)):
        logdir = out / name
        replaced = sorted(logdir.glob(EVENT_FILE_PREFIX + "*")) if logdir.is_dir() else []
        for old in replaced:
            old.unlink()
        with run.open() as rf:
            scalars = tensorboard_scalars(rf)
            created = _created_epoch(rf)
            t_start = rf.over_ranks("t_start", window="recorded") \
                if rf.has_column("t_start") else np.empty(0)
            it = rf.over_ranks("iteration", window="recorded") \
                if rf.has_column("iteration") else np.empty(0)
        # Wall time of a point: the file's creation plus the iteration's start on the run clock
        # (TensorBoard's "relative" axis then shows the run's real timeline).
        start_of = {int(i): float(t) for i, t in zip(it, t_start) if math.isfinite(i) and
                    math.isfinite(t)}
        writer = EventFileWriter(str(logdir))
        points = 0
        for tag, description, steps, values in scalars:
            for k, (s, v) in enumerate(zip(steps.tolist(), values.tolist())):
                meta = summary_pb2.SummaryMetadata(
                    display_name=tag, summary_description=description,
                    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars")) \
                    if k == 0 else None  # TensorBoard keeps a tag's first metadata
                value = summary_pb2.Summary.Value(tag=tag, simple_value=v, metadata=meta)
                wall = created + (0.0 if tag.startswith("epoch/") else start_of.get(s, 0.0))
                writer.add_event(event_pb2.Event(wall_time=wall, step=int(s),
                                                 summary=summary_pb2.Summary(value=[value])))
                points += 1
        writer.close()
        lines.append(f"{logdir}: {len(scalars)} tags, {points} points"
                     + (f" (replaced {len(replaced)} earlier event file(s))" if replaced else ""))
    lines.append(f"open with: tensorboard --logdir {out}")
    return "\n".join(lines)


# --- Hatchet / Thicket ----------------------------------------------------------------------------
# One JSON file per run in Thicket's serialization (Thicket.to_json / Thicket.from_json), which
# is Hatchet's JSON GraphFrame (GraphFrame.from_json) plus the profile table: one profile per
# detail rank, the call tree `step` > the phases, and metadata (run, rank, world size, ...)
# to group profiles by. No Hatchet or Thicket is needed to write it.
TIME_INC, TIME_EXC = "time (inc)", "time"


def _profile_id(run_path: Path, rank: int) -> int:
    """A profile id unique across runs, so exports of several runs concatenate in Thicket:
    Thicket's own profile hash (11 hex digits of md5) of "<file>:rank<r>"."""
    return int(md5(f"{run_path.resolve()}:rank{rank}".encode()).hexdigest()[:11], 16)


def thicket_profile(run: Run) -> dict:
    """The per-rank phase breakdown of `run` (phase_table: mean seconds per measured iteration
    on each detail rank) as a Thicket/Hatchet JSON document. Node `step` holds the step time
    inclusively and the time outside the recorded phases exclusively; each phase is a leaf.
    Phases no rank recorded (h2d on CPU) are left out; a missing value is null."""
    table = phase_table(run)
    phases = [p for p in PHASES if table[f"{p} [s]"].notna().any()]
    graph = {0: {"data": {"name": "step", "type": "function"}, "children":
                 list(range(1, len(phases) + 1)), "parents": []}}
    for i, p in enumerate(phases, start=1):
        graph[i] = {"data": {"name": p, "type": "function"}, "children": [], "parents": [0]}

    def number(v):
        return float(v) if v == v else None  # NaN -> null: JSON has no NaN

    with run.open() as rf:
        measured = int(rf.summary.get("measured_iterations", rf.iterations_recorded()))
    rows, metadata, profiles, mapping = [], [], [], {}
    for _, row in table.iterrows():
        rank = int(row["rank"])
        pid = _profile_id(run.path, rank)
        profiles.append(pid)
        mapping[str(pid)] = f"{run.path}:rank{rank}"
        step = float(row["step [s]"])
        inside = sum(float(row[f"{p} [s]"]) for p in phases if row[f"{p} [s]"] == row[f"{p} [s]"])
        rows.append({"node": 0, "profile": pid, "name": "step", "rank": rank,
                     TIME_INC: number(step), TIME_EXC: number(step - inside)})
        for i, p in enumerate(phases, start=1):
            v = number(float(row[f"{p} [s]"]))
            rows.append({"node": i, "profile": pid, "name": p, "rank": rank,
                         TIME_INC: v, TIME_EXC: v})
        metadata.append({"profile": pid, "rank": rank, "run": str(run.path),
                         "world_size": run.ranks, "num_nodes": run.nodes,
                         "workload": run.workload, "status": run.status,
                         "strategy": str(run.config.get("run.strategy", "")),
                         "precision": str(run.config.get("run.precision", "")),
                         "batch_size": str(run.config.get("train.batch_size", "")),
                         "method": str(run.row.get("method", "")),
                         "measured_iterations": measured, "time_units": "s per iteration"})
    return {"graph": [graph], "dataframe_indices": ["node", "profile"], "dataframe": rows,
            "exclusive_metrics": [TIME_EXC], "inclusive_metrics": [TIME_INC],
            "profile": profiles, "profile_idx_name": "profile", "profile_mapping": mapping,
            "metadata": metadata}


def write_thicket(study: Study, out) -> tuple[str, list[str]]:
    """`out`/<run>.json (thicket_profile) per run file with per-rank rows; returns what was
    written and the runs skipped (no per-rank rows: output.per_rank=none, or no iterations)."""
    out = check_export_dir(out, "thicket")
    runs = study.usable(include_incomplete=True)
    lines, skipped = [], []
    for run, name in zip(runs, run_names(runs)):
        doc = thicket_profile(run)
        if not doc["profile"]:
            skipped.append(f"{run.path}: no per-rank phase times (output.per_rank=none, or no "
                           "iterations): not exported")
            continue
        path = out / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=1) + "\n")
        lines.append(f"{path}: {len(doc['profile'])} profiles (one per rank), "
                     f"{len(doc['graph'][0])} nodes")
    lines.append("read with: thicket.Thicket.from_json(open(FILE).read()) or "
                 "hatchet.GraphFrame.from_json(open(FILE).read())")
    return "\n".join(lines), skipped
