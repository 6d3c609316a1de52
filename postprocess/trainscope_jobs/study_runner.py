"""jobscripts/study: run a whole study from one study file, and say where each of its points is.

  jobscripts/study run FILE --scheduler slurm|pbs|local [--out DIR] [--dry-run]
  jobscripts/study status DIR
  jobscripts/study coalloc PLAN [--out DIR] [--scheduler local|slurm|pbs]

A study file (inputs/studies/*.toml, format in docs/studies.md) names base configs, axes (lists of
config overlays or option values), rank or node counts, strong/weak mode with its batch rule,
repeats and scheduler settings. `run` expands axes x counts x repeats into points, renders each
point's job script with jobscripts/sweep's templates (<out>/<axis labels>/<mode>/n<ranks>/rep<r>/)
and submits them: one job per point, or with Slurm and more points than scheduler.array_threshold
a job array per allocation shape (--array=0-N%K, task i runs row i of a points table). Running
`run` again on the same directory submits only the points that are missing or failed; completed,
queued and running ones are skipped and listed as such. `status` lists every point as pending,
running, completed, interrupted or failed, from the run file's `status` attribute and the
scheduler: squeue, then sacct (or scontrol show job where Slurm keeps no accounting) for how an
ended job ended (TIMEOUT, OUT_OF_MEMORY, NODE_FAIL, PREEMPTED, CANCELLED, its exit code); qstat
(-x for ended jobs) under PBS; the local runner's job.pid / job.exit. Interrupted: trainscope
stopped on a signal with a checkpoint (exit 75); `run` submits it again.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shlex
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from . import paths, schedulers, sweep
from .errors import JobError
from .schedulers.local import pid_alive

StudyError = JobError

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    tomllib = None

STATES = ("pending", "running", "completed", "interrupted", "failed")
# trainscope's exit code after a stop signal, checkpointed, run file "interrupted"
# (core::kInterruptedExitCode; docs/faults.md).
INTERRUPTED_EXIT = 75
TOP_KEYS = {"name", "reproduces", "paper", "description", "configs", "options", "scale",
            "scheduler", "axes"}
SCALE_KEYS = {"ranks", "nodes", "ranks_per_node", "gpus", "cpus_per_task", "mode",
              "global_batch", "batch_per_rank", "repeats"}
SCHED_KEYS = {"partition", "account", "qos", "time", "site", "binary", "array_threshold",
              "array_throttle", "serialize", "signal_secs", "extra"}
AXIS_KEYS = {"name", "option", "values"}
VALUE_KEYS = {"label", "configs", "options", "single_process"}
# Points one study may expand to (axes x counts x repeats): a typo such as repeats = 1000000 is
# refused before anything is rendered instead of writing a million directories.
MAX_POINTS = 10000


# ----------------------------------------------------------------------------- the study file

def _fail(path: Path, what: str) -> StudyError:
    return StudyError(f"{path}: {what} (format: docs/studies.md)")


def _unknown(path: Path, table: str, given: dict, allowed: set) -> None:
    bad = sorted(set(given) - allowed)
    if bad:
        raise _fail(path, f"unknown key(s) {bad} in {table}; known: {sorted(allowed)}")


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _one_line(path: Path, key: str, value: str) -> str:
    """Every value that reaches a job script is one line without control characters: a line
    break in a directive value would add a directive (#SBATCH/#PBS lines are not shell-quoted)."""
    if _CONTROL.search(value):
        raise _fail(path, f"{key} = {value!r} contains a line break or another control "
                          "character; give it on one line")
    return value


def _script_value(path: Path, key: str, value: str, check=sweep.script_value) -> str:
    """A value rendered into a #SBATCH/#PBS line, checked by the sweep's one copy of the rule
    (printable ASCII on one line; `check` may add a format, e.g. sweep.walltime)."""
    try:
        return check(key, value)
    except StudyError as e:
        raise _fail(path, str(e)) from None


def _option_text(path: Path, key: str, value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return _one_line(path, f"option {key}", str(value))
    raise _fail(path, f"option {key} = {value!r}: a string, number or boolean")


_MISSING = object()
_TYPE_NAMES = {int: "an integer", bool: "true or false", str: "a string"}


def _typed(path: Path, table: str, d: dict, key: str, kind: type, default=_MISSING,
           minimum: int | None = None):
    """d[key] of exactly `kind` (TOML types are not coerced: "8" is not 8, 2.7 is not 2, "false"
    is not false), at least `minimum` for integers, one line for strings."""
    if key not in d:
        if default is _MISSING:
            raise _fail(path, f"{table} {key} is missing ({_TYPE_NAMES[kind]})")
        return default
    v = d[key]
    ok = isinstance(v, kind) and (kind is bool or not isinstance(v, bool))
    if not ok:
        raise _fail(path, f"{table} {key} = {v!r}: {_TYPE_NAMES[kind]}, not "
                          f"{type(v).__name__}")
    if kind is int and minimum is not None and v < minimum:
        raise _fail(path, f"{table} {key} = {v}: at least {minimum}")
    if kind is str:
        _one_line(path, f"{table} {key}", v)
    return v


def _label(text: str) -> str:
    """A directory-safe label: letters, digits, '.', '-' (anything else becomes '-')."""
    return re.sub(r"[^A-Za-z0-9.-]+", "-", text).strip("-") or "x"


def _safe_label(path: Path, what: str, text: str) -> str:
    """_label, refusing what would name no directory of its own ("." or "..", which would write
    outside the study directory)."""
    label = _label(text)
    if set(label) <= {"."}:
        raise _fail(path, f"{what} {text!r} names no directory of its own (\".\" and \"..\" "
                          "lead outside the study directory); use letters or digits")
    return label


def _config_names(path: Path, where: str, value) -> list[str]:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(c, str) for c in names):
        raise _fail(path, f"{where} configs = {value!r}: a file name or a list of file names")
    return [_one_line(path, f"{where} configs", c) for c in names]


def resolve_config(path: Path, name: str) -> Path:
    """A config path: absolute, or beside the study file, or relative to the repository."""
    p = Path(name)
    for cand in ([p] if p.is_absolute() else [path.parent / p, paths.under_root(p)]):
        if cand.is_file():
            return cand.resolve()
    raise _fail(path, f"config {name!r} not found (looked beside the study file and in "
                      f"{paths.root()})")


def load_study(path: Path) -> dict:
    """The study file, checked: every mistake is named with the key and what it should be."""
    if tomllib is None:
        raise StudyError("study files need Python 3.11 (tomllib); run through the project's venv "
                         "(bin/trainscope-study) or python3.11")
    if not path.is_file():
        raise StudyError(f"{path}: no such study file")
    try:
        doc = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise _fail(path, f"not valid TOML: {e}")
    _unknown(path, "the top level", doc, TOP_KEYS)
    for key in ("name", "reproduces"):
        if not isinstance(doc.get(key), str) or not doc[key].strip():
            raise _fail(path, f"missing {key} = \"...\" (a non-empty string)")
    for key in ("paper", "description"):
        _typed(path, "the top level", doc, key, str, "")
    scale = doc.get("scale")
    if not isinstance(scale, dict):
        raise _fail(path, "missing [scale] (ranks or nodes, mode, batch)")
    _unknown(path, "[scale]", scale, SCALE_KEYS)
    sched = doc.get("scheduler", {})
    if not isinstance(sched, dict):
        raise _fail(path, "[scheduler] must be a table")
    _unknown(path, "[scheduler]", sched, SCHED_KEYS)
    study = {"path": path.resolve(), "name": _safe_label(path, "name", doc["name"]),
             "reproduces": doc["reproduces"],
             "paper": doc.get("paper", ""), "description": doc.get("description", "")}
    study["configs"] = [resolve_config(path, c)
                        for c in _config_names(path, "the top level", doc.get("configs", []))]
    options = doc.get("options", {})
    if not isinstance(options, dict):
        raise _fail(path, "options must be a table of trainscope options (\"section.key\" = value)")
    study["options"] = [f"--{k}={_option_text(path, k, v)}" for k, v in options.items()]

    # Counts, mode and batch rule: jobscripts/sweep's own checks (as if given on its command line).
    if ("ranks" in scale) == ("nodes" in scale):
        raise _fail(path, "[scale] needs exactly one of ranks = [...] or nodes = [...]")
    counts = scale.get("ranks", scale.get("nodes"))
    if not isinstance(counts, list) or not counts or \
            not all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in counts):
        raise _fail(path, f"[scale] {'ranks' if 'ranks' in scale else 'nodes'} = {counts!r}: "
                          "a non-empty list of positive integers")
    mode = scale.get("mode")
    if mode not in ("strong", "weak"):
        raise _fail(path, f"[scale] mode = {mode!r}: \"strong\" (global_batch) or \"weak\" "
                          "(batch_per_rank)")
    # The batch rule of the mode, named by the study's keys (jobscripts/sweep's messages name its
    # command-line flags).
    batch_key = "global_batch" if mode == "strong" else "batch_per_rank"
    if batch_key not in scale:
        raise _fail(path, f"[scale] mode = \"{mode}\" needs {batch_key} = N (the samples per "
                          f"iteration {'all points share' if mode == 'strong' else 'of each rank'})")
    ns = SimpleNamespace(
        nodes=",".join(map(str, counts)) if "nodes" in scale else None,
        ranks=",".join(map(str, counts)) if "ranks" in scale else None,
        ranks_per_node=_typed(path, "[scale]", scale, "ranks_per_node", int, None, 1),
        gpus=_typed(path, "[scale]", scale, "gpus", bool, False),
        mode=mode, global_batch=_typed(path, "[scale]", scale, "global_batch", int, None, 1),
        batch_per_rank=_typed(path, "[scale]", scale, "batch_per_rank", int, None, 1))
    study["scale"] = ns
    study["unit"] = "nodes" if "nodes" in scale else "ranks"
    study["cpus_per_task"] = _typed(path, "[scale]", scale, "cpus_per_task", int, 1, 1)
    study["repeats"] = _typed(path, "[scale]", scale, "repeats", int, 1, 1)

    study["time"] = _script_value(path, "[scheduler] time",
                                  _typed(path, "[scheduler]", sched, "time", str, "00:30:00"),
                                  sweep.walltime)
    site = _typed(path, "[scheduler]", sched, "site", str, "default")
    try:
        study["site"] = sweep.site_file(site)
    except StudyError as e:
        raise _fail(path, f"[scheduler] site = {site!r}: {str(e).split(': ', 1)[-1]}")
    binary = _typed(path, "[scheduler]", sched, "binary", str, None)
    study["binary"] = (paths.under_root(os.path.expandvars(binary)) if binary is not None
                       else paths.default_binary()).resolve()
    _one_line(path, "[scheduler] binary", str(study["binary"]))
    extra = sched.get("extra", [])
    if not isinstance(extra, list) or not all(isinstance(x, str) for x in extra):
        raise _fail(path, "[scheduler] extra = [\"--directive=value\", ...]: a list of strings")
    study["where"] = {k: _script_value(path, f"[scheduler] {k}",
                                       _typed(path, "[scheduler]", sched, k, str))
                      for k in ("partition", "account", "qos") if k in sched}
    study["extra"] = [_script_value(path, "[scheduler] extra",
                                    _one_line(path, "[scheduler] extra", x)) for x in extra]
    study["array_threshold"] = _typed(path, "[scheduler]", sched, "array_threshold", int, 8, 0)
    study["array_throttle"] = _typed(path, "[scheduler]", sched, "array_throttle", int, 0, 0)
    study["serialize"] = _typed(path, "[scheduler]", sched, "serialize", bool, False)
    study["signal_secs"] = _typed(path, "[scheduler]", sched, "signal_secs", int, 0, 0)

    axes = doc.get("axes", [])
    if not isinstance(axes, list):
        raise _fail(path, "axes are [[axes]] tables (name or option, values)")
    study["axes"] = []
    for i, ax in enumerate(axes):
        if not isinstance(ax, dict):
            raise _fail(path, f"[[axes]] #{i + 1} = {ax!r}: a table (name or option, values)")
        _unknown(path, f"[[axes]] #{i + 1}", ax, AXIS_KEYS)
        option = _typed(path, f"[[axes]] #{i + 1}", ax, "option", str, None)
        name = _typed(path, f"[[axes]] #{i + 1}", ax, "name", str, option)
        values = ax.get("values")
        if not name or not isinstance(values, list) or not values:
            raise _fail(path, f"[[axes]] #{i + 1}: needs name (or option) and a non-empty "
                              "values list")
        parsed = []
        for v in values:
            if isinstance(v, dict):
                _unknown(path, f"a value of axis {name}", v, VALUE_KEYS)
                opts = v.get("options", {})
                if not isinstance(opts, dict):
                    raise _fail(path, f"axis {name}: options = {opts!r}: a table of trainscope "
                                      "options")
                label = _typed(path, f"a value of axis {name}:", v, "label", str, None) or \
                    (str(opts.get(option)) if option and option in opts else None)
                if not label:
                    raise _fail(path, f"axis {name}: a value table needs label = \"...\"")
                cfgs = _config_names(path, f"a value of axis {name}:", v.get("configs", []))
                parsed.append({"label": _safe_label(path, f"axis {name} label", label),
                               "value": _one_line(path, f"axis {name} label", label),
                               "configs": [resolve_config(path, c) for c in cfgs],
                               "options": [f"--{k}={_option_text(path, k, x)}"
                                           for k, x in opts.items()],
                               "single_process": _typed(path, f"a value of axis {name}:", v,
                                                        "single_process", bool, False)})
            else:
                if not option:
                    raise _fail(path, f"axis {name}: plain values need option = \"section.key\" "
                                      "(or give value tables with configs/options)")
                text = _option_text(path, option, v)
                # A number or boolean alone says little in a directory name: "image_size-224",
                # "pin_memory-true"; a string value names itself ("fp16-mixed").
                label = text if isinstance(v, str) else f"{option.split('.')[-1]}-{text}"
                parsed.append({"label": _safe_label(path, f"axis {name} value", label),
                               "value": text, "configs": [],
                               "options": [f"--{option}={text}"], "single_process": False})
        labels = [p["label"] for p in parsed]
        if len(set(labels)) != len(labels):
            raise _fail(path, f"axis {name}: labels {labels} are not distinct")
        study["axes"].append({"name": str(name), "values": parsed})
    return study


# ------------------------------------------------------------------------------ the points

def expand(study: dict, out: Path) -> list[dict]:
    """Every point (axes x counts x repeats), in a fixed order: its id is its index. A point that
    cannot run as asked (a batch that does not divide) refuses the whole study before anything is
    written."""
    ns = study["scale"]
    try:
        shapes = sweep.points(ns)  # (nodes, ranks, ranks per node), sweep's placement rules
    except StudyError as e:  # named by the study's keys, not sweep's flags
        raise StudyError(str(e).replace("--ranks-per-node", "[scale] ranks_per_node")
                         .replace("--ranks", "[scale] ranks").replace("--nodes", "[scale] nodes"))
    total = len(shapes) * study["repeats"]
    for ax in study["axes"]:
        total *= len(ax["values"])
    if total > MAX_POINTS:
        sizes = " x ".join([str(len(ax["values"])) for ax in study["axes"]] +
                           [f"{len(shapes)} counts", f"{study['repeats']} repeats"])
        raise StudyError(f"{study['path']}: {total} points ({sizes}) exceed the limit of "
                         f"{MAX_POINTS}; lower [scale] repeats or split the axes into studies")
    combos = list(itertools.product(*[ax["values"] for ax in study["axes"]])) or [()]
    pts = []
    for combo in combos:
        label = "_".join(v["label"] for v in combo) or study["name"]
        single = any(v["single_process"] for v in combo)
        for nodes, ranks, rpn in shapes:
            count = ranks
            if single:
                # One process drives `count` devices (nn.DataParallel: dp.devices) inside one
                # node; it cannot span nodes, so counts beyond one node are left out.
                if nodes > 1:
                    continue
                bargs, per_rank = _batch_args(ns, count)
                if ns.mode == "strong":
                    per_rank = ns.global_batch
                else:
                    per_rank = ns.batch_per_rank * count
                    bargs = ["--run.scaling=weak", f"--run.batch_per_rank={per_rank}"]
                nodes_p, ranks_p, rpn_p, gpn = 1, 1, 1, count
                extra = [f"--dp.devices={count}"]
                cpus = study["cpus_per_task"] * count
            else:
                bargs, per_rank = _batch_args(ns, ranks)
                nodes_p, ranks_p, rpn_p, gpn, extra = nodes, ranks, rpn, rpn, []
                cpus = study["cpus_per_task"]
            for rep in range(study["repeats"]):
                run_dir = out / label / ns.mode / f"n{count:02d}" / f"rep{rep}"
                if not run_dir.resolve().is_relative_to(out.resolve()):
                    raise StudyError(f"{study['path']}: point directory {run_dir} is not inside "
                                     f"the study directory {out}")
                args = [a for c in [*study["configs"], *[p for v in combo for p in v["configs"]]]
                        for a in ("--config", str(c))]
                # The point's directory belongs to the study: a re-submitted (failed) point
                # replaces what its last attempt left (run file, LoRA adapters beside it).
                args += [*bargs, f"--output.file={run_dir / 'run.h5'}", "--output.overwrite=true",
                         *study["options"],
                         *[o for v in combo for o in v["options"]], *extra]
                pts.append({
                    "point": len(pts), "label": label,
                    "axes": {ax["name"]: v["value"] for ax, v in zip(study["axes"], combo)},
                    "mode": ns.mode, "count": count, "nodes": nodes_p, "ranks": ranks_p,
                    "ranks_per_node": rpn_p, "gpus_per_node": gpn if ns.gpus else 0,
                    "cpus_per_task": cpus, "repeat": rep, "batch_per_rank": per_rank,
                    "global_batch": per_rank * ranks_p, "run_dir": run_dir,
                    "output": run_dir / "run.h5", "trainscope_args": args})
    if not pts:
        raise StudyError(f"{study['path']}: no points (every count left out)")
    return pts


def _batch_args(ns, ranks: int) -> tuple[list[str], int]:
    """sweep.batch_args, its messages naming the study's keys instead of sweep's flags."""
    try:
        return sweep.batch_args(ns, ranks)
    except StudyError as e:
        raise StudyError(str(e).replace("--global-batch", "[scale] global_batch")
                         .replace("--batch-per-rank", "[scale] batch_per_rank")
                         .replace("--mode", "[scale] mode"))


def directives(study: dict, scheduler: str) -> list[str]:
    """Partition, account and QOS as the scheduler spells them, then the study's extra lines.
    PBS has queues (-q) and accounts (-A) but no QOS."""
    w = study["where"]
    return schedulers.get(scheduler).where(w.get("partition"), w.get("account"),
                                           w.get("qos")) + study["extra"]


def render_point(study: dict, p: dict, scheduler: str) -> Path:
    return sweep.render_job(
        scheduler, p["run_dir"], job_name=f"ts-{study['name']}-{p['point']}",
        nodes=p["nodes"], ranks=p["ranks"], ranks_per_node=p["ranks_per_node"],
        cpus_per_task=p["cpus_per_task"], gpus=bool(p["gpus_per_node"]), time=study["time"],
        signal_secs=study["signal_secs"], site=study["site"], binary=study["binary"],
        directives=directives(study, scheduler), trainscope_args=p["trainscope_args"],
        gpus_per_node=p["gpus_per_node"] or None)


# ------------------------------------------------------------------------------ point states

def run_file_status(path: Path) -> str | None:
    """The `status` attribute of a run file ("completed", "running", "failed", "interrupted"),
    "unreadable" for a file h5py cannot open, None when there is none."""
    if not path.exists() and not path.is_symlink():
        return None
    if not path.is_file():  # a FIFO or device would block h5py's open; a directory is no run
        return "not a regular file"
    try:
        import h5py
    except ModuleNotFoundError:
        raise StudyError("h5py missing: run through the project's venv (bin/trainscope-study) "
                         "or install h5py")
    try:
        with h5py.File(path, "r", locking=False) as f:
            s = f.attrs.get("status", "unknown")
    except Exception:  # being created, truncated, not HDF5: not a finished run
        return "unreadable"
    return s.decode() if isinstance(s, bytes) else str(s)


def completed_file(run_dir: Path) -> Path | None:
    """run.h5, or the continuation of a resumed run (run.resume<k>.h5), that completed."""
    for f in sorted(run_dir.glob("run*.h5")):
        if run_file_status(f) == "completed":
            return f
    return None


def scheduler_states(jobs: dict[str, str]) -> dict[str, str]:
    """Job id -> "pending" (queued) or "running", for the jobs their schedulers still hold; a job
    left out has ended. {id: scheduler} pairs come from each point's job.id."""
    found: dict[str, str] = {}
    for name in schedulers.NAMES:
        ids = [j for j, s in jobs.items() if s == name]
        if ids and name != "local":  # a local point's state is in its job.pid / job.exit
            found.update(schedulers.get(name).states(ids))
    return found


def ended_states(jobs: dict[str, str]) -> dict[str, tuple[str, int | None]]:
    """Job id -> (how its scheduler says it ended, its exit code) for ended jobs (Slurm: sacct,
    else scontrol show job; PBS: qstat -x, "FINISHED"). Jobs no scheduler knows are left out."""
    out: dict[str, tuple[str, int | None]] = {}
    for name in schedulers.NAMES:
        ids = [j for j, s in jobs.items() if s == name]
        if ids and name != "local":
            out.update(schedulers.get(name).ended(ids))
    return out


def _read_small(f: Path) -> str:
    """The stripped text of a small record file (job.id, job.pid, job.exit): at most 256 bytes,
    never blocking on a FIFO, undecodable bytes replaced."""
    if not f.is_file():
        return f"<{f.name} is not a regular file>"
    with open(f, "rb") as fh:
        return fh.read(256).decode("utf-8", "replace").strip()


def point_state(p: dict, queue: dict[str, str],
                ended: dict[str, tuple[str, int | None]] | None = None) -> tuple[str, str]:
    """(state, why) of one point; `ended`: ended_states() of the jobs not in `queue`."""
    ended = ended or {}
    d = p["run_dir"]
    done = completed_file(d)
    if done:
        return "completed", done.name
    job_file = d / "job.id"
    sched, job = (_read_small(job_file).split() + ["", ""])[:2] if job_file.exists() else ("", "")
    rf = run_file_status(p["output"])
    if sched == "local":
        exit_file, pid_file = d / "job.exit", d / "job.pid"
        if exit_file.exists():
            code = _read_small(exit_file)[:40]
            if code == str(INTERRUPTED_EXIT) and rf == "interrupted":
                return "interrupted", f"exit {code}, run file interrupted: stopped with a " \
                                      "checkpoint; `run` submits it again"
            return "failed", f"exit {code}, run file {rf or 'missing'}"
        if pid_file.exists():
            text = _read_small(pid_file)
            if not re.fullmatch(r"[1-9]\d{0,9}", text):
                return "failed", f"{pid_file.name} holds {text[:40]!r}, not a process id"
            pid = int(text)
            if pid_alive(pid):
                return "running", f"pid {pid}"
            return "failed", f"pid {pid} gone without an exit code (killed), run file " \
                             f"{rf or 'missing'}"
        return "pending", "not started"
    if sched in ("slurm", "pbs"):
        if job in queue:
            return queue[job], f"{sched} job {job}"
        how, code = ended.get(job, ("", None))
        said = " ".join(x for x in (how, "" if code is None else f"exit {code}") if x)
        detail = f"{sched} job {job} ended{' ' + said if said else ''}, run file {rf or 'missing'}"
        if rf == "interrupted":  # the run stopped on a signal after its checkpoint
            return "interrupted", detail + ": stopped with a checkpoint; `run` submits it again"
        return "failed", detail
    if rf is not None:
        # A run file without a job record (written by hand or by jobscripts/sweep).
        return "failed", f"run file {rf}"
    return "pending", "not submitted"


def states(pts: list[dict]) -> list[tuple[str, str]]:
    jobs = {}
    for p in pts:
        f = p["run_dir"] / "job.id"
        if f.exists() and not completed_file(p["run_dir"]):
            parts = _read_small(f).split()
            if len(parts) == 2:
                jobs[parts[1]] = parts[0]
    queue = scheduler_states(jobs) if jobs else {}
    gone = {j: s for j, s in jobs.items() if j not in queue}
    ended = ended_states(gone) if gone else {}
    return [point_state(p, queue, ended) for p in pts]


# ------------------------------------------------------------------------------ run / status

def save_points(out: Path, study: dict, scheduler: str, pts: list[dict]) -> None:
    """<out>/study.json: the study file and scheduler of this directory and every point (what
    `status` reads), and manifest.json/.tsv in jobscripts/sweep's columns for trainscope-post."""
    def plain(p):
        q = {k: (str(v) if isinstance(v, Path) else v) for k, v in p.items()}
        return q
    (out / "study.json").write_text(json.dumps(
        {"study": str(study["path"]), "name": study["name"], "reproduces": study["reproduces"],
         "scheduler": scheduler, "points": [plain(p) for p in pts]}, indent=1) + "\n")
    rows = []
    for p in pts:
        jf = p["run_dir"] / "job.id"
        rows.append({"point": p["point"], "label": p["label"], "config": p["label"],
                     "mode": p["mode"], "nodes": p["nodes"], "ranks": p["ranks"],
                     "ranks_per_node": p["ranks_per_node"], "repeat": p["repeat"],
                     "batch_per_rank": p["batch_per_rank"], "global_batch": p["global_batch"],
                     "job_id": (_read_small(jf).split() or [""])[-1] if jf.exists() else "",
                     "script": str(p["script"]), "output": str(p["output"])})
    sweep.write_manifest(out, rows)


def shape_of(p: dict) -> tuple:
    return (p["nodes"], p["ranks_per_node"], p["gpus_per_node"], p["cpus_per_task"])


def submit_array(study: dict, out: Path, group: list[dict], stamp: str, gi: int) -> str:
    """One Slurm array over points of one allocation shape; task i runs group[i]."""
    arrays = out / "arrays"
    arrays.mkdir(parents=True, exist_ok=True)
    table = arrays / f"{stamp}-{gi}.tsv"
    with open(table, "w") as fh:
        fh.write("task\tpoint\tscript\n")
        for i, p in enumerate(group):
            fh.write(f"{i}\t{p['point']}\t{p['script']}\n")
    throttle = study["array_throttle"]
    spec = f"0-{len(group) - 1}" + (f"%{throttle}" if throttle > 0 else "")
    p0 = group[0]
    fields = {
        "JOB_NAME": f"ts-{study['name']}-a{gi}"[:64], "NODES": str(p0["nodes"]),
        "RANKS_PER_NODE": str(p0["ranks_per_node"]),
        "GPUS_PER_NODE": str(p0["gpus_per_node"]), "CPUS_PER_TASK": str(p0["cpus_per_task"]),
        "TIME": study["time"], "ARRAY": spec, "SIGNAL_SECS": str(study["signal_secs"]),
        "LOG_DIR": shlex.quote(str(arrays)), "TABLE": shlex.quote(str(table)),
        "EXTRA_DIRECTIVES": sweep.directive_lines("slurm", directives(study, "slurm")),
    }
    script = arrays / f"{stamp}-{gi}.sbatch"
    template = (paths.jobscripts() / "slurm" / "array.sbatch").read_text()
    script.write_text(sweep.render(template, fields,
                                   bool(p0["gpus_per_node"]), study["signal_secs"] > 0))
    script.chmod(0o755)
    return str(script)


def _named(path: Path, e: Exception) -> StudyError:
    """The error with the study file's name in front (the sweep's own checks do not know it)."""
    return e if str(path) in str(e) else StudyError(f"{path}: {e}")


def cmd_run(a) -> int:
    if a.out is not None and _CONTROL.search(str(a.out)):
        raise StudyError(f"--out {str(a.out)!r} contains a tab, line break or another control "
                         "character; give a plain directory name")
    try:
        study = load_study(a.file)
        out = (a.out or Path("studies") / study["name"]).resolve()  # in the working directory
        pts = expand(study, out)
    except StudyError as e:
        raise _named(a.file, e)
    check_out(out)
    if not a.dry_run and not study["binary"].is_file():
        raise StudyError(f"binary {study['binary']}: not built (scripts/build), or set "
                         "[scheduler] binary")
    prev = out / "study.json"
    if prev.exists():
        old = _read_study_json(prev)
        submitted = any((p["run_dir"] / "job.id").exists() for p in pts)
        if old.get("scheduler") not in (None, a.scheduler) and submitted:
            # Job records of one scheduler mean nothing to another (a pid is not a Slurm job).
            raise StudyError(f"{out} holds this study submitted with --scheduler "
                             f"{old['scheduler']}; use that scheduler or another --out")
    # Which points to (re)submit: everything not completed, queued or running.
    st = states(pts) if out.exists() else [("pending", "not submitted")] * len(pts)
    # (A queued point is "pending" too, but with its job named: it is skipped like a running one.)
    todo = [p for p, (s, why) in zip(pts, st)
            if s in ("failed", "interrupted") or
            (s == "pending" and why in ("not submitted", "not started"))]
    chosen = {p["point"] for p in todo}
    for p, (s, why) in zip(pts, st):
        if p["point"] in chosen:
            # Rendered again (the study file may have changed); a job that is queued or running
            # keeps the script it was submitted with.
            p["script"] = render_point(study, p, a.scheduler)
        else:
            p["script"] = p["run_dir"] / sweep.SCRIPT_NAMES[a.scheduler]
            print(f"skip point {p['point']} {p['label']} n{p['count']} rep{p['repeat']}: "
                  f"{s} ({why})")
    for p in todo:
        # A fresh start: no stale run file or job record of the failed attempt.
        for f in ("run.h5", "job.id", "job.pid", "job.exit"):
            if not a.dry_run:
                (p["run_dir"] / f).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    use_array = a.scheduler == "slurm" and len(todo) > study["array_threshold"]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if use_array:
        groups: dict[tuple, list] = {}
        for p in todo:
            groups.setdefault(shape_of(p), []).append(p)
        arrays = []
        for gi, group in enumerate(groups.values()):
            arrays.append((submit_array(study, out, group, stamp, gi), group))
    if a.dry_run:
        save_points(out, study, a.scheduler, pts)
        what = f"{len(arrays)} array job(s) in {out / 'arrays'}" if use_array else "job scripts"
        print(f"rendered {len(pts)} points ({len(todo)} to submit) and {what}; "
              f"nothing submitted (--dry-run)")
        return 0
    # Written before the first submission, so `status` works while (or if) this stops midway.
    save_points(out, study, a.scheduler, pts)
    failed_local = 0
    previous: dict = {}
    t0 = time.monotonic()
    if use_array:
        after = None
        for script, group in arrays:
            job = sweep.submit("slurm", Path(script), after if study["serialize"] else None)
            after = job
            for i, p in enumerate(group):
                (p["run_dir"] / "job.id").write_text(f"slurm {job}_{i}\n")
            print(f"submitted array {job} ({len(group)} points, {script})")
    else:
        for p in todo:
            key = "all" if study["serialize"] or a.scheduler == "local" else \
                (p["label"], p["count"])
            after = previous.get(key) if a.scheduler != "local" else None
            if a.scheduler == "local":
                (p["run_dir"] / "job.id").write_text("local -\n")
                print(f"running point {p['point']} {p['label']} n{p['count']} "
                      f"rep{p['repeat']} ...", flush=True)
            job = sweep.submit(a.scheduler, p["script"], after)
            if a.scheduler == "local":
                failed_local += job != "local:0"
                if job != "local:0":
                    print(f"point {p['point']} failed ({job.replace('local:', 'exit ')}); its "
                          f"output: {p['run_dir'] / 'job.log'}", flush=True)
                pid = (p["run_dir"] / "job.pid").read_text().strip()
                (p["run_dir"] / "job.id").write_text(f"local {pid}\n")
            else:
                (p["run_dir"] / "job.id").write_text(f"{a.scheduler} {job}\n")
                print(f"submitted point {p['point']} {p['label']} n{p['count']} "
                      f"rep{p['repeat']}: job {job}")
            previous[key] = job
    save_points(out, study, a.scheduler, pts)
    if a.scheduler == "local":
        print(f"ran {len(todo)} of {len(pts)} points in {time.monotonic() - t0:.1f} s "
              f"({failed_local} failed); jobscripts/study status {shlex.quote(str(out))}")
        return 1 if failed_local else 0
    print(f"submitted {len(todo)} of {len(pts)} points; jobscripts/study status "
          f"{shlex.quote(str(out))}")
    return 0


def check_out(out: Path) -> None:
    """--out must be a study directory, a new one, or an empty one: `run` deletes the run files
    of points it re-submits, so a directory of other run files is refused, never cleaned."""
    if out.exists() and not out.is_dir():
        raise StudyError(f"--out {out}: exists and is not a directory; give a directory (new, "
                         "empty, or one written by jobscripts/study run)")
    if out.is_dir() and not (out / "study.json").exists():
        held = next((f for f in out.rglob("*.h5")), None)
        if held is not None:
            raise StudyError(f"--out {out}: not a study directory (no study.json) but it holds "
                             f"run files ({held.relative_to(out)}); choose a new or empty "
                             "directory, nothing was changed")


def _read_study_json(f: Path) -> dict:
    """study.json, checked enough that `status` and `run` cannot trip on it."""
    if not f.is_file():
        raise StudyError(f"{f}: not a regular file (a study directory's study.json is one)")
    try:
        doc = json.loads(f.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise StudyError(f"{f}: corrupt ({e}); run `jobscripts/study run STUDY.toml --out "
                         f"{f.parent}` again to rewrite it")
    ok = isinstance(doc, dict) and isinstance(doc.get("points"), list) and all(
        isinstance(p, dict) and all(isinstance(p.get(k), str) for k in
                                    ("run_dir", "output", "script", "label")) and
        all(isinstance(p.get(k), int) and not isinstance(p.get(k), bool)
            for k in ("point", "count", "repeat")) for p in doc["points"])
    if not ok:
        raise StudyError(f"{f}: not a study.json written by jobscripts/study (points with "
                         "run_dir, output, script, label, point, count, repeat); run `run` again "
                         "to rewrite it")
    return doc


def load_points(out: Path) -> tuple[dict, list[dict]]:
    f = out / "study.json"
    if not out.is_dir():
        raise StudyError(f"{out}: not a directory (give a study directory written by "
                         "jobscripts/study run)")
    if not f.exists():
        raise StudyError(f"{out}: no study.json here (a directory written by jobscripts/study "
                         "run)")
    doc = _read_study_json(f)
    for key in ("name", "scheduler", "reproduces"):
        doc[key] = str(doc.get(key, "?"))
    pts = doc["points"]
    for p in pts:
        for k in ("run_dir", "output", "script"):
            p[k] = Path(p[k])
    return doc, pts


def cmd_status(a) -> int:
    out = a.dir.resolve()
    doc, pts = load_points(out)
    st = states(pts)
    print(f"study {doc['name']} ({doc['scheduler']}): {doc['reproduces']}")
    print(f"{'point':>5}  {'state':<9}  {'label':<28} {'ranks':>5} {'rep':>3}  detail")
    for p, (s, why) in zip(pts, st):
        print(f"{p['point']:>5}  {s:<9}  {p['label']:<28} {p['count']:>5} {p['repeat']:>3}  "
              f"{why}")
    counts = {s: sum(1 for x, _ in st if x == s) for s in STATES}
    print("summary: " + ", ".join(f"{counts[s]} {s}" for s in STATES) + f" of {len(pts)}")
    if a.json:
        if a.json.is_dir():
            raise StudyError(f"--json {a.json}: is a directory; give a file name")
        a.json.write_text(json.dumps([{"point": p["point"], "label": p["label"],
                                       "count": p["count"], "repeat": p["repeat"], "state": s,
                                       "detail": why} for p, (s, why) in zip(pts, st)],
                                     indent=1) + "\n")
    return 0 if counts["completed"] == len(pts) else 3


def parse(argv=None):
    p = argparse.ArgumentParser(prog="jobscripts/study", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="render and submit the points that are missing or failed")
    r.add_argument("file", type=Path, help="study file (inputs/studies/*.toml)")
    r.add_argument("--scheduler", choices=schedulers.NAMES, required=True)
    r.add_argument("--out", type=Path,
                   help="study directory (default studies/<name> in the working directory)")
    r.add_argument("--dry-run", action="store_true", help="render only, submit nothing")
    sub.add_parser("coalloc", help="run two or more jobs side by side: equal, advised static and "
                   "dynamic splits of the units (trainscope-study coalloc --help)")
    s = sub.add_parser("status", help="every point: pending, running, completed, interrupted "
                       "or failed (with how the scheduler says its job ended)")
    s.add_argument("dir", type=Path, help="a study directory written by `run`")
    s.add_argument("--json", type=Path, help="also write the table as JSON to this file")
    return p.parse_args(argv)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["coalloc"]:
        # Jobs side by side on one set of units: trainscope_jobs/coalloc.py (docs/coalloc.md).
        from .coalloc import main as coalloc_main
        return coalloc_main(argv[1:])
    a = parse(argv)
    try:
        return cmd_run(a) if a.cmd == "run" else cmd_status(a)
    except StudyError as e:
        print(f"jobscripts/study: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a file it could not read or write: named by the error itself
        print(f"jobscripts/study: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # A local point stopped by Ctrl-C shows as failed (its pid gone without an exit code);
        # `run` again re-runs it and the points not started yet.
        print("jobscripts/study: interrupted; `jobscripts/study status DIR` shows what ran, "
              "`run` again continues", file=sys.stderr)
        return 130
