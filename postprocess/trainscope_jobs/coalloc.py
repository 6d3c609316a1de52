"""Co-allocation, executed (``trainscope-study coalloc PLAN``): two or more training jobs share one
set of units (GPUs on a cluster; cores here, one rank each) and are run side by side three ways:

  equal    every job gets units / jobs for its whole run
  static   the advisor's best fixed split (every split tried against the calibrated models)
  dynamic  the advisor re-plans at every event (a job finishing, a job arriving): a job grows onto
           the units another one freed, or shrinks to admit a new one, by a checkpoint (SIGUSR1)
           and an elastic ``--resume`` on the new rank count (docs/faults.md, "Elastic resume")

The jobs are calibrated first: each runs alone, at every unit count the plan allows, for a few
iterations (step time per count through the advisor's model, model.ConfigModel, and the launch
overhead: process start, data, model, file), plus one resize probe per job (stop latency, and the
extra cost of restoring a checkpoint on another rank count). The planner predicts every mode's
makespan from these; the executor runs each mode `repeats` times and records which job held which
units when. results.json, report.md and timeline.png in --out hold the predicted and measured
makespans, their spread and error, and the gain over the equal and the best static split.

Launchers: ``mpirun`` with ``--cpu-set`` on disjoint cores of this machine (the local scheduler,
and inside a PBS job), or ``srun --exclusive`` job steps inside one Slurm allocation (the batch
script `--scheduler slurm` submits runs this module there). Plan file format: docs/coalloc.md.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import errno
import fcntl
import json
import math
import os
import re
import shlex
import signal
import socket
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from trainscope_post.study import StudyError

from . import paths, schedulers, sweep
from .errors import JobError
from .launch import launch_env, mpirun_flags
from .schedulers.slurm import Slurm
from .study_runner import INTERRUPTED_EXIT

MODES = ("equal", "static", "dynamic")
LAUNCHERS = ("mpirun", "srun")
# Names and option keys are checked with fullmatch: `$` would let a trailing line break pass.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_OPTION = re.compile(r"[a-z][a-z0-9_]*(\.[a-z0-9_]+)+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Characters of a path that a #SBATCH/#PBS line names unquoted (--output, -o): no space, quote,
# '%' (Slurm expands %j, %u, ... in --output) or ':' (PBS reads host:path).
_DIRECTIVE_PATH = re.compile(r"[A-Za-z0-9._/+,@=~-]+")
# Options the executor sets for every launch; a plan that sets them would be overridden silently.
_OWNED = {
    "train.max_iters": "the job's `iterations`",
    "run.scaling": "strong scaling with the job's `global_batch` (set by the executor)",
    "run.global_batch": "the job's `global_batch`",
    "run.batch_per_rank": "the job's `global_batch` (the executor runs strong scaling)",
    "train.batch_size": "the job's `global_batch`",
    "train.global_batch_size": "the job's `global_batch`",
    "checkpoint.dir": "nothing: each job checkpoints to <out>/<mode>/rep<r>/<job>/ckpt",
    "output.file": "nothing: each launch writes <out>/.../<job>/seg<k>.h5",
}
MAX_JOBS = 8
MAX_UNITS = 4096
# The planner is exhaustive, so its work is counted before it starts (count_splits, search_size)
# and a plan above these bounds is refused at load time, naming the mode, jobs and units.
MAX_SPLITS = 200_000     # static splits the planner may simulate (one simulation each)
MAX_SEARCH = 2_000_000   # allocations the dynamic planner may evaluate (events x splits)
STOP_TIMEOUT_S = 600     # a job told to stop (SIGUSR1) that has not exited by then is killed
# Strategies elastic resume supports (docs/faults.md): every job is resized (the calibration's
# resize probe, the dynamic mode), so a job of another strategy could never run.
ELASTIC_STRATEGIES = ("ddp-ds",)
LOCK = "coalloc.lock"    # held (flock) by the executor that writes --out
MAX_CALIBRATION_BYTES = 16 << 20
MAX_MODEL_S = 1e6        # a calibrated time (step, start-up, stop, restore) above this is no model


# --- the plan file --------------------------------------------------------------------------------
@dataclass
class JobSpec:
    name: str
    configs: list[Path]
    iterations: int
    global_batch: int
    arrive: float = 0.0
    options: dict = field(default_factory=dict)

    def counts(self, units: int) -> list[int]:
        """Unit (rank) counts this job may run on: the global batch must split evenly."""
        return [u for u in range(1, units + 1) if self.global_batch % u == 0]

    def to_json(self) -> dict:
        return {"name": self.name, "configs": [str(c) for c in self.configs],
                "iterations": self.iterations, "global_batch": self.global_batch,
                "arrive": self.arrive, "options": self.options}


@dataclass
class Plan:
    name: str
    path: Path
    units: int
    units_per_node: int | None  # None: not given (Slurm places the units; here: one node)
    repeats: int
    modes: list[str]
    calibration_iterations: int
    calibration_ranks: list[int]
    binary: Path
    jobs: list[JobSpec]


def _bad(path: Path, what: str) -> StudyError:
    return StudyError(f"{path}: {what}")


def _int(path, where, d, key, default=None, lo=1, hi=10**9) -> int:
    if key not in d:
        if default is None:
            raise _bad(path, f"{where}: `{key}` is missing")
        return default
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise _bad(path, f"{where}: `{key}` = {v!r}: give a whole number from {lo} to {hi}")
    return v


def _check_keys(path, where, d, allowed):
    extra = sorted(set(d) - set(allowed))
    if extra:
        raise _bad(path, f"{where}: unknown key(s) {', '.join(map(repr, extra))}; allowed: "
                   + ", ".join(sorted(allowed)))


def _resolve(path: Path, text) -> Path:
    if not isinstance(text, str) or not text or _CONTROL.search(text) or not text.isprintable():
        raise _bad(path, f"config {text!r}: give a file path as a one-line string")
    p = Path(text)
    for base in ((path.parent, paths.root()) if not p.is_absolute() else (Path("/"),)):
        c = (base / p).resolve()
        if c.exists():
            if not c.is_file():
                raise _bad(path, f"config {text}: {c} is not a regular file")
            return c
    raise _bad(path, f"config {text}: not found (relative paths are tried from the plan's "
               f"directory, then from {paths.root()})")


def load_plan(path: Path) -> Plan:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python < 3.11
        raise StudyError("plan files need Python 3.11 (tomllib); run through the project's venv "
                         "(scripts/setup)") from None
    if not path.is_file():
        raise StudyError(f"{path}: no such plan file" if not path.exists() else
                         f"{path}: not a regular file")
    if path.stat().st_size > 1 << 20:
        raise _bad(path, "larger than 1 MiB: not a plan file")
    try:
        doc = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise _bad(path, f"not valid TOML: {e}") from None
    _check_keys(path, "plan", doc, {"name", "units", "units_per_node", "repeats", "modes",
                                    "calibration", "binary", "job"})
    name = doc.get("name", path.stem)
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise _bad(path, f"name {name!r}: letters, digits, '.', '_' and '-' only (it names "
                   "directories and the batch job)")
    units = _int(path, "plan", doc, "units", hi=MAX_UNITS)
    upn = None
    if "units_per_node" in doc:
        upn = _int(path, "plan", doc, "units_per_node", hi=MAX_UNITS)
        if upn > units or units % upn:
            raise _bad(path, f"units_per_node = {upn} for units = {units}: every node holds "
                       "the same number of units, so it must divide units (units_per_node = "
                       "units: one node)")
    repeats = _int(path, "plan", doc, "repeats", default=3, hi=100)
    raw = doc.get("job", [])
    if not isinstance(raw, list) or not 2 <= len(raw) <= MAX_JOBS:
        raise _bad(path, f"give 2 to {MAX_JOBS} [[job]] tables (found "
                   f"{len(raw) if isinstance(raw, list) else 'none'}): a co-allocation shares "
                   "the units between jobs")
    if units < len(raw):
        raise _bad(path, f"units = {units} for {len(raw)} jobs: every job needs one unit at least")
    modes = doc.get("modes", list(MODES))
    if not isinstance(modes, list) or not modes or any(m not in MODES for m in modes) or \
            len(set(modes)) != len(modes):
        raise _bad(path, f"modes {modes!r}: a list of distinct values from {', '.join(MODES)}")
    cal = doc.get("calibration", {})
    if not isinstance(cal, dict):
        raise _bad(path, "calibration: a table, e.g. calibration = { iterations = 30 }")
    _check_keys(path, "calibration", cal, {"iterations", "ranks"})
    cal_iters = _int(path, "calibration", cal, "iterations", default=30, lo=4, hi=100000)
    default_ranks = sorted({2**k for k in range(13) if 2**k <= units} | {units})
    cal_ranks = cal.get("ranks", default_ranks)
    if not isinstance(cal_ranks, list) or len(cal_ranks) < 2 or any(
            isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= units for r in cal_ranks):
        raise _bad(path, f"calibration.ranks {cal_ranks!r}: 2 or more rank counts from 1 to "
                   f"units ({units}); the model needs two to scale from")
    twice = sorted({r for r in cal_ranks if cal_ranks.count(r) > 1})
    if twice:
        raise _bad(path, f"calibration.ranks {cal_ranks!r}: {', '.join(map(str, twice))} "
                   "given twice; give each rank count once")
    binary = doc.get("binary")
    if binary is not None and (not isinstance(binary, str) or _CONTROL.search(binary) or
                               not binary.isprintable()):
        raise _bad(path, f"binary {binary!r}: a one-line path")
    binary = paths.default_binary() if binary is None else paths.under_root(binary)
    jobs = []
    for i, j in enumerate(raw):
        where = f"job {i + 1}"
        if not isinstance(j, dict):
            raise _bad(path, f"{where}: a [[job]] table")
        _check_keys(path, where, j, {"name", "configs", "iterations", "global_batch", "arrive",
                                     "options"})
        jname = j.get("name")
        if not isinstance(jname, str) or not _NAME.fullmatch(jname):
            raise _bad(path, f"{where}: name {jname!r}: letters, digits, '.', '_' and '-' only")
        where = f"job {jname}"
        if any(jname == o.name for o in jobs):
            raise _bad(path, f"{where}: two jobs have this name")
        cfgs = j.get("configs")
        cfgs = [cfgs] if isinstance(cfgs, str) else cfgs
        if not isinstance(cfgs, list) or not cfgs:
            raise _bad(path, f"{where}: `configs` = one or more trainscope INI files")
        configs = [_resolve(path, c) for c in cfgs]
        iters = _int(path, where, j, "iterations")
        gb = _int(path, where, j, "global_batch", hi=10**7)
        arrive = j.get("arrive", 0.0)
        if isinstance(arrive, bool) or not isinstance(arrive, (int, float)) or \
                not 0 <= arrive < 1e7:
            raise _bad(path, f"{where}: arrive = {arrive!r}: seconds after the start, >= 0")
        opts = j.get("options", {})
        if not isinstance(opts, dict):
            raise _bad(path, f"{where}: options: a table of trainscope options")
        clean = {}
        for k, v in opts.items():
            if not _OPTION.fullmatch(k):
                raise _bad(path, f"{where}: option {k!r}: not a trainscope option name "
                           "(section.key, see docs/options.md)")
            if k in _OWNED:
                raise _bad(path, f"{where}: option {k} is set by the executor; use "
                           f"{_OWNED[k]}")
            if isinstance(v, bool):
                v = "true" if v else "false"
            if not isinstance(v, (str, int, float)) or _CONTROL.search(str(v)) or \
                    not str(v).isprintable():
                raise _bad(path, f"{where}: option {k} = {v!r}: a one-line value")
            clean[k] = str(v)
        spec = JobSpec(jname, configs, iters, gb, float(arrive), clean)
        strategy, source = job_strategy(spec)
        if strategy not in ELASTIC_STRATEGIES:
            raise _bad(path, f"{where}: run.strategy = {strategy} (from {source}): elastic "
                       "resume refuses it (pipeline: per-stage state cannot be resized; ddp, "
                       "dp: a step's samples depend on the rank count), and every job is "
                       "resized (the calibration's resize probe, the dynamic mode); use "
                       "run.strategy = \"ddp-ds\" (with dist.zero or FSDP if needed)")
        counts = [r for r in cal_ranks if r in spec.counts(units)]
        if len(counts) < 2:
            raise _bad(path, f"{where}: global_batch {gb} splits evenly over only "
                       f"{counts or 'none'} of the calibration ranks {cal_ranks}: the model needs "
                       "two; choose a global batch divisible by them")
        jobs.append(spec)
    return Plan(name, path.resolve(), units, upn, repeats, modes, cal_iters,
                sorted(cal_ranks), binary, jobs)


def _ini_value(files: list[Path], section: str, key: str) -> tuple[str, Path] | None:
    """The value of section.key in trainscope INI files (the last file that sets it wins, as in
    trainscope: `[section]` headers, `key = value` lines, '#' starts a comment), with its file."""
    found = None
    for f in files:
        try:  # never blocks: a config swapped for a FIFO since _resolve is read as empty
            with os.fdopen(os.open(f, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as fh:
                text = fh.read(1 << 20).decode("utf-8", "replace") \
                    if stat.S_ISREG(os.fstat(fh.fileno()).st_mode) else ""
        except OSError:
            continue  # trainscope names the file when it cannot read it
        current = ""
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("[") and line.endswith("]"):
                current = line[1:-1].strip()
            elif "=" in line:
                k, v = (x.strip() for x in line.split("=", 1))
                if (current, k) == (section, key) or (not current and k == f"{section}.{key}"):
                    found = (v, f)
    return found


def job_strategy(job: JobSpec) -> tuple[str, str]:
    """The job's run.strategy and where it comes from: its options, its configs, or the default."""
    if "run.strategy" in job.options:
        return job.options["run.strategy"], "the job's options"
    found = _ini_value(job.configs, "run", "strategy")
    if found:
        return found[0], str(found[1])
    return "ddp-ds", "the default"


# --- launching one segment of a job ---------------------------------------------------------------
@dataclass
class Segment:
    job: str
    index: int
    ranks: int
    units: list[int]          # logical unit indices 0..units-1 (the timeline's rows)
    run_file: Path
    log: Path
    resumed: bool
    t_launch: float
    proc: subprocess.Popen | None = None
    t_signal: float | None = None
    t_end: float | None = None
    rc: int | None = None
    status: str = ""
    cores: list[int] = field(default_factory=list)

    def to_json(self, t0: float) -> dict:
        def rel(t):
            return None if t is None else round(t - t0, 3)
        return {"job": self.job, "segment": self.index, "ranks": self.ranks, "units": self.units,
                "cores": self.cores, "resumed": self.resumed, "t_launch": rel(self.t_launch),
                "t_signal": rel(self.t_signal), "t_end": rel(self.t_end), "exit": self.rc,
                "status": self.status, "run_file": str(self.run_file), "log": str(self.log)}


class Launcher:
    """Starts a job's segment on given logical units: mpirun bound to the matching cores of this
    machine, or an exclusive srun step of the enclosing Slurm allocation."""

    def __init__(self, kind: str, binary: Path, units: int, gpus: bool = False):
        if kind not in LAUNCHERS:
            raise StudyError(f"--launcher {kind!r}: use one of {', '.join(LAUNCHERS)}")
        if not binary.is_file():
            raise StudyError(f"binary {binary}: not built (scripts/build), or set `binary` in "
                             "the plan")
        self.kind, self.binary, self.gpus = kind, binary, gpus
        self.cores: list[int] = []
        if kind == "mpirun":
            allowed = sorted(os.sched_getaffinity(0))
            if len(allowed) < units:
                raise StudyError(f"units = {units}, but this process may use {len(allowed)} "
                                 f"core(s) ({','.join(map(str, allowed))}): each unit is one "
                                 "core of its own; lower units or run inside a larger allocation")
            self.cores = allowed[:units]
        elif not os.environ.get("SLURM_JOB_ID"):
            raise StudyError("--launcher srun runs job steps inside a Slurm allocation: use "
                             "--scheduler slurm (which submits one), or --launcher mpirun here")

    def command(self, job: JobSpec, ranks: int, units: list[int], iterations: int, ckpt: Path,
                run_file: Path, resume: bool) -> tuple[list[str], list[int]]:
        args = [str(self.binary)]
        for c in job.configs:
            args += ["--config", str(c)]
        args += [f"--{k}={v}" for k, v in job.options.items()]
        args += ["--run.scaling=strong", f"--run.global_batch={job.global_batch}",
                 f"--train.max_iters={iterations}", f"--checkpoint.dir={ckpt}",
                 f"--output.file={run_file}"]
        if resume:
            args.append("--resume")
        if self.kind == "mpirun":
            cores = [self.cores[u] for u in units]
            return ([*["mpirun", *mpirun_flags(oversubscribe=False)], "--cpu-set",
                     ",".join(map(str, cores)), "--bind-to", "core", "-np", str(ranks), *args],
                    cores)
        return Slurm.step_command(ranks, self.gpus, job.name, args), []

    def start(self, job: JobSpec, index: int, ranks: int, units: list[int], iterations: int,
              jobdir: Path, resume: bool) -> Segment:
        jobdir.mkdir(parents=True, exist_ok=True)
        run_file, log = jobdir / f"seg{index}.h5", jobdir / f"seg{index}.log"
        for f in (run_file, log):
            f.unlink(missing_ok=True)
        cmd, cores = self.command(job, ranks, units, iterations, jobdir / "ckpt", run_file,
                                  resume)
        # jobdir was just emptied (_clean) under a --out without links: a new file, never a link
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644)
        with os.fdopen(fd, "w") as fh:
            fh.write("# " + shlex.join(cmd) + "\n")
            fh.flush()
            t = time.monotonic()
            # GPUs under mpirun: unit u is GPU u of the node, so that two jobs never share one
            # (each job's ranks then bind to the GPUs they see, in local rank order).
            extra = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, units))} \
                if self.gpus and self.kind == "mpirun" else {}
            with _signals_held():  # registered in _LIVE before an interrupt can leave it unknown
                proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=paths.root(),
                                        env=launch_env(OMP_NUM_THREADS="1", **extra),
                                        start_new_session=True)
                seg = Segment(job.name, index, ranks, list(units), run_file, log, resume, t,
                              proc, cores=cores)
                _LIVE.append(seg)
        return seg


def _started(seg: Segment) -> bool:
    """Every rank is inside main (rank 0 prints the placement after a collective over all ranks),
    so a stop signal is held until an iteration ends rather than killing a rank still loading."""
    try:
        return "placement:" in seg.log.read_text(errors="replace")
    except OSError:
        return False


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no output)"


def _run_status(path: Path) -> str:
    try:
        import h5py
        with h5py.File(path, "r") as f:
            s = f.attrs.get("status", b"")
            return s.decode() if isinstance(s, bytes) else str(s)
    except (OSError, KeyError):
        return "missing"


def checkpoint_iteration(ckpt: Path) -> int:
    """Iterations done by the newest complete checkpoint (ckpt-<N>/MANIFEST.json, N = the next
    iteration); 0 when there is none."""
    best = 0
    for d in ckpt.glob("ckpt-*"):
        m = re.fullmatch(r"ckpt-(\d+)", d.name)
        if m and (d / "MANIFEST.json").is_file():
            best = max(best, int(m.group(1)))
    return best


# Launches not yet reaped: killed when the co-allocation ends early (an error, Ctrl-C, SIGTERM),
# since each runs in its own session and would not get the terminal's signal.
_LIVE: list[Segment] = []


def kill_live() -> int:
    n = 0
    for seg in list(_LIVE):
        if seg.proc and seg.proc.poll() is None:
            _kill(seg)
            seg.proc.wait()
            n += 1
        _LIVE.remove(seg)
    return n


def _finish(seg: Segment, rc: int) -> None:
    if seg in _LIVE:
        _LIVE.remove(seg)
    seg.t_end, seg.rc = time.monotonic(), rc
    seg.status = _run_status(seg.run_file)


def _wait(seg: Segment, timeout: float) -> None:
    try:
        rc = seg.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(seg)
        rc = seg.proc.wait()
    _finish(seg, rc)


def _kill(seg: Segment) -> None:
    """Ends a launch now: SIGTERM to mpirun/srun, which tear down the ranks they started (Open MPI
    puts each rank in a process group of its own, so a signal to the launcher's group alone
    would orphan them), then SIGKILL to whatever of the group is left after 5 s."""
    if not seg.proc or seg.proc.poll() is not None:
        return
    seg.proc.send_signal(signal.SIGTERM)
    try:
        seg.proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(seg.proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _wait_started(seg: Segment) -> None:
    """Until every rank is inside main (or the launch ended)."""
    while seg.proc.poll() is None and not _started(seg):
        time.sleep(0.02)


def _stop(seg: Segment) -> None:
    """SIGUSR1 to the launcher (mpirun and srun forward it to the ranks): every rank stops after
    the same iteration, writes a checkpoint and exits 75 with the run file `interrupted`."""
    _wait_started(seg)
    seg.t_signal = time.monotonic()
    if seg.proc.poll() is None:
        seg.proc.send_signal(signal.SIGUSR1)


class ExecError(StudyError):
    pass


def _failed(seg: Segment, what: str) -> ExecError:
    return ExecError(f"job {seg.job} segment {seg.index} ({seg.ranks} rank(s)) {what}; its "
                     f"output ({seg.log}):\n{_tail(seg.log)}")


# --- models of the jobs ---------------------------------------------------------------------------
@dataclass
class JobModel:
    name: str
    iterations: int
    arrive: float
    counts: list[int]
    step: dict[int, float]       # seconds per iteration at u ranks (the advisor's model)
    startup: dict[int, float]    # launch to first measured iteration, plus warm-up excess
    stop_s: float                # SIGUSR1 to exit (the iteration in flight + the checkpoint)
    restore_s: float             # extra start-up of a resumed launch (reading the checkpoint)
    range_: dict[int, str] = field(default_factory=dict)

    def restart(self, u: int) -> float:
        return self.startup[u] + self.restore_s

    def to_json(self) -> dict:
        return {"name": self.name, "iterations": self.iterations, "arrive": self.arrive,
                "counts": self.counts, "step_s": self.step, "startup_s": self.startup,
                "stop_s": self.stop_s, "restore_s": self.restore_s, "range": self.range_}
    # read back, checked against the plan, by load_calibration


def calibrate(plan: Plan, out: Path, launcher: Launcher, log=print) -> list[JobModel]:
    """Each job alone at every calibration rank count, then one resize probe (smallest count,
    stopped half-way, resumed on the largest); fits the advisor's model to the runs."""
    from trainscope_post.model import build_models
    from trainscope_post.study import load
    models = []
    n = plan.calibration_iterations
    # One discarded launch first: the first launch on a machine (or the first job step of an
    # allocation) pays for loading the libraries from disk, which no later launch does.
    d = out / "calibration" / "warm-up"
    _clean(d, out)
    log("calibration: warm-up launch (discarded) ...")
    seg = launcher.start(plan.jobs[0], 0, 1, [0], 2, d, resume=False)
    _wait(seg, STOP_TIMEOUT_S * 4)
    if seg.rc != 0:
        raise _failed(seg, f"failed in its warm-up launch (exit {seg.rc}, {seg.status})")
    for job in plan.jobs:
        counts = [r for r in plan.calibration_ranks if r in job.counts(plan.units)]
        base = out / "calibration" / job.name
        walls = {}
        for r in counts:
            d = base / f"n{r}"
            _clean(d, out)
            log(f"calibrating {job.name} on {r} rank(s): {n} iterations ...")
            seg = launcher.start(job, 0, r, list(range(r)), n, d, resume=False)
            _wait(seg, STOP_TIMEOUT_S * 4)
            if seg.rc != 0 or seg.status != "completed":
                raise _failed(seg, f"failed in calibration (exit {seg.rc}, {seg.status})")
            walls[r] = seg.t_end - seg.t_launch
        with load([base / f"n{r}" / "seg0.h5" for r in counts]) as study:
            cms, _ = build_models(study, "strong")
        if len(cms) != 1:
            raise StudyError(f"job {job.name}: calibration runs form {len(cms)} configurations, "
                             "expected one")
        cm = cms[0]
        allowed = job.counts(plan.units)
        preds = {u: cm.predict(u) for u in allowed}
        step = {u: p["step_s"] for u, p in preds.items()}
        rng = {u: p["range"].lower() for u, p in preds.items()}
        measured = {r: walls[r] - n * step[r] for r in counts}

        def nearest(u):
            return measured[min(counts, key=lambda r: (abs(math.log(r / u)), r))]
        startup = {u: max(0.0, nearest(u)) for u in allowed}
        # resize probe
        lo, hi = counts[0], counts[-1]
        d = base / "probe"
        _clean(d, out)
        log(f"calibrating {job.name}: resize probe {lo} -> {hi} rank(s) ...")
        seg = launcher.start(job, 0, lo, list(range(lo)), 2 * n, d, resume=False)
        # Stopped about half-way, timed from this launch's own start (every rank in main), not
        # from the start-up measured above: the first launch of an allocation can start seconds
        # slower (a first srun step), and a probe timed from it would end before the signal.
        _wait_started(seg)
        t_main = time.monotonic()
        while seg.proc.poll() is None and time.monotonic() < t_main + n * step[lo]:
            time.sleep(0.02)
        _stop(seg)
        _wait(seg, STOP_TIMEOUT_S)
        if seg.rc != INTERRUPTED_EXIT or seg.status != "interrupted":
            raise _failed(seg, f"did not stop with a checkpoint in the resize probe (exit "
                          f"{seg.rc}, run file {seg.status})")
        stop_s = seg.t_end - seg.t_signal
        done = checkpoint_iteration(d / "ckpt")
        seg2 = launcher.start(job, 1, hi, list(range(hi)), 2 * n, d, resume=True)
        _wait(seg2, STOP_TIMEOUT_S * 4)
        if seg2.rc != 0 or seg2.status != "completed":
            raise _failed(seg2, f"failed to resume on {hi} rank(s) in the resize probe "
                          f"(exit {seg2.rc}, {seg2.status})")
        restore = (seg2.t_end - seg2.t_launch) - startup[hi] - (2 * n - done) * step[hi]
        models.append(JobModel(job.name, job.iterations, job.arrive, allowed, step, startup,
                               stop_s, max(0.0, restore), rng))
        log(f"  {job.name}: step " + ", ".join(f"{u}: {step[u]:.4g} s" for u in allowed)
            + f"; start-up {startup[lo]:.3g} s at {lo}; stop {stop_s:.3g} s; restore "
            f"+{max(0.0, restore):.3g} s (measured {restore:+.3g})")
    return models


def _clean(d: Path, out: Path) -> None:
    """A launch directory starts empty: no stale checkpoint may be resumed by mistake. d is inside
    --out, and nothing is deleted or created through a link on the way there (a link would lead
    the deletion out of --out); rmtree itself never follows the links inside d."""
    import shutil
    _no_links(out, d)
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)


def _no_links(out: Path, d: Path) -> None:
    """Every existing component of d below out is a directory of its own, not a link."""
    p = out
    for part in d.relative_to(out).parts:
        p = p / part
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            raise StudyError(f"{p}: a symbolic link (to {os.readlink(p)}) inside --out; the "
                             "executor never writes or deletes through one: remove the link")
        if not stat.S_ISDIR(st.st_mode):
            raise StudyError(f"{p}: not a directory, where the executor keeps one; remove it")


def _write(path: Path, data: str | bytes) -> Path:
    """Writes a file of --out as a new file renamed over the old name: never through a link
    (the link itself is replaced), never into a FIFO or device, never into a file hard-linked
    elsewhere, and a reader sees the old or the new content, not half of one."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o644)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


# --- the planner ----------------------------------------------------------------------------------
@dataclass
class JState:
    rem: float              # iterations left
    ranks: int = 0          # 0: not running
    ready: float = 0.0      # when computing (re)starts
    started: bool = False
    done_at: float | None = None


def _active(models: list[JobModel], st: list[JState], t: float) -> list[int]:
    """The jobs that have arrived by t and not ended."""
    return [j for j, m in enumerate(models) if m.arrive <= t + 1e-9 and st[j].done_at is None]


def _splits(active: list[int], models: list[JobModel], units: int):
    """Every allocation of at most `units` to the active jobs, each an allowed count >= 1, in
    the order of itertools.product over their counts; a branch that leaves the later jobs too
    few units is cut, so the work is that of the allocations made (count_splits), not of the
    product of the counts (16 counts each for 8 jobs: 4e9 tuples, 12870 allocations)."""
    choices = [models[j].counts for j in active]
    need = [0] * (len(choices) + 1)   # the fewest units the jobs from position i on need
    for i in range(len(choices) - 1, -1, -1):
        need[i] = need[i + 1] + min(choices[i])
    combo: list[int] = []

    def extend(i: int, left: int):
        if i == len(choices):
            yield dict(zip(active, combo))
            return
        for c in choices[i]:
            if c + need[i + 1] <= left:
                combo.append(c)
                yield from extend(i + 1, left - c)
                combo.pop()

    yield from extend(0, units)


def _fold(ways, counts: list[int], units: int, cap: int):
    """ways[s] = allocations so far that sum to s units; the same with one more job whose
    allowed counts are `counts`, each entry capped at `cap` (so that it stays a small number)."""
    import numpy as np
    new = np.zeros(units + 1, dtype=np.int64)
    for c in counts:
        if c <= units:
            new[c:] += ways[:units + 1 - c]
    return np.minimum(new, cap)


def count_splits(choices: list[list[int]], units: int, cap: int) -> int:
    """How many allocations _splits yields for jobs with these allowed counts (at most `cap`),
    counted without making them: O(jobs x counts) vector operations over the unit sum."""
    import numpy as np
    ways = np.zeros(units + 1, dtype=np.int64)
    ways[0] = 1
    for counts in choices:
        ways = _fold(ways, counts, units, cap)
    return int(min(int(ways.sum()), cap))


def search_size(choices: list[list[int]], arrivals: list[float], units: int, cap: int) -> int:
    """An upper bound (at most `cap`) on the allocations DynamicPolicy evaluates in one call.
    Its search tree has one level per event: at a level where s of the jobs present run, every
    split of them is tried (at most the most splits any s of them have), and each is followed to
    the next event, an arrival (more jobs present) or a completion (one job fewer; more at once
    is a deeper level, which only shrinks the tree). So the evaluations below a level are at
    most its splits x (1 + the larger of its two next levels)."""
    import numpy as np
    jobs = len(choices)
    splits = [1] * (1 << jobs)     # splits of every subset of the jobs (bit j: job j)
    ways = {0: np.eye(1, units + 1, dtype=np.int64)[0]}
    for mask in range(1, 1 << jobs):
        top = mask.bit_length() - 1
        ways[mask] = _fold(ways[mask & ~(1 << top)], choices[top], units, cap)
        splits[mask] = int(min(int(ways[mask].sum()), cap))
    groups = sorted(set(arrivals))
    present = [sum(1 << j for j in range(jobs) if arrivals[j] <= g) for g in groups]

    def widest(g: int, s: int) -> int:  # most splits of s jobs among those present at group g
        return max(splits[m] for m in range(1 << jobs)
                   if m & present[g] == m and bin(m).count("1") == s)

    memo: dict[tuple[int, int], int] = {}

    def below(g: int, done: int) -> int:
        if (g, done) not in memo:
            s = bin(present[g]).count("1") - done
            nxt = ([below(g + 1, done)] if g + 1 < len(groups) else []) + \
                ([below(g, done + 1)] if s > 0 else [])
            memo[(g, done)] = 0 if not nxt and s == 0 else \
                min(cap, (widest(g, s) if s else 1) * (1 + max(nxt, default=0)))
        return memo[(g, done)]

    return below(0, 0)


def check_search(choices: list[list[int]], arrivals: list[float], units: int,
                 modes) -> None:
    """Refuses a static or dynamic search above its bound before it starts, naming the fix."""
    for mode, limit, count in (
            ("static", MAX_SPLITS, lambda: count_splits(choices, units, MAX_SPLITS + 1)),
            ("dynamic", MAX_SEARCH, lambda: search_size(choices, arrivals, units,
                                                        MAX_SEARCH + 1))):
        if mode in modes and count() > limit:
            others = ",".join(m for m in MODES if m != mode)
            raise StudyError(f"the {mode} mode's search of {len(choices)} jobs on {units} "
                             f"units would evaluate more than {limit:,} allocations: use fewer "
                             f"jobs or units (or global batches that fewer rank counts "
                             f"divide), or leave the mode out (--modes {others})")


def _apply(t: float, st: list[JState], alloc: dict, models: list[JobModel]) -> list[JState]:
    """New states after switching to `alloc` at t: jobs whose rank count changes stop (their stop
    latency holds everyone who waits for units), then (re)start with their start-up cost."""
    new = [dataclasses.replace(s) for s in st]
    changed = [j for j, r in alloc.items() if r != st[j].ranks]
    hold = max((models[j].stop_s for j in changed if st[j].ranks > 0), default=0.0)
    for j in changed:
        s = new[j]
        at = t + hold
        s.ready = at + (models[j].restart(alloc[j]) if s.started else models[j].startup[alloc[j]])
        s.ranks, s.started = alloc[j], True
    return new


def _advance(t: float, st: list[JState], models: list[JobModel], arrivals: list[float]):
    """To the next event (a completion or an arrival): returns its time and the new states.
    The job whose end is the event ends there whatever its rounded remainder says, so that every
    call makes progress (at large times t + a tiny remainder x step rounds back to t)."""
    nxt = min((a for a in arrivals if a > t + 1e-9), default=math.inf)
    end = {}
    for j, s in enumerate(st):
        if s.ranks and s.done_at is None:
            end[j] = max(s.ready, t) + s.rem * models[j].step[s.ranks]
            nxt = min(nxt, end[j])
    if nxt == math.inf:
        return nxt, st
    for j, s in enumerate(st):
        if j in end:
            s.rem -= max(0.0, nxt - max(s.ready, t)) / models[j].step[s.ranks]
            if s.rem <= 1e-6 or end[j] <= nxt:
                s.rem, s.done_at, s.ranks = 0.0, nxt, 0
    return nxt, st


def simulate(models: list[JobModel], units: int, policy, t: float = 0.0,
             st: list[JState] | None = None):
    """Runs `policy(t, states) -> {job: ranks}` from t to the end; returns (makespan, phases):
    one phase per event, {t, alloc}."""
    st = st or [JState(float(m.iterations)) for m in models]
    arrivals = sorted({m.arrive for m in models})
    phases = []
    # every event ends a job or passes an arrival: more steps than that is a bug, not a plan
    for _ in range(2 * (len(models) + len(arrivals)) + 2):
        if all(s.done_at is not None for s in st):
            break
        active = _active(models, st, t)
        if active:
            alloc = policy(t, st)
            if any(alloc.get(j, 0) != st[j].ranks for j in active):
                phases.append({"t": t, "alloc": {models[j].name: alloc[j] for j in active}})
            st = _apply(t, st, {j: alloc[j] for j in active}, models)
        t, st = _advance(t, st, models, arrivals)
        if t == math.inf:
            raise StudyError("the plan leaves a job without units (internal)")
    else:
        raise StudyError("the simulation of the plan did not end (internal)")
    return max(s.done_at for s in st), phases


def static_policy(split: dict):
    return lambda t, st: split


def equal_split(models: list[JobModel], units: int) -> dict:
    k = len(models)
    out = {}
    for j, m in enumerate(models):
        share = units // k + (1 if j < units % k else 0)
        out[j] = max(u for u in m.counts if u <= max(1, share))
    return out


def best_static(models: list[JobModel], units: int) -> tuple[dict, float]:
    check_search([m.counts for m in models], [m.arrive for m in models], units, ("static",))
    best = (None, math.inf)
    for alloc in _splits(list(range(len(models))), models, units):
        ms, _ = simulate(models, units, static_policy(alloc))
        if ms < best[1] - 1e-9:
            best = (alloc, ms)
    return best


class DynamicPolicy:
    """At every event, the split of the units between the jobs present that minimises the
    predicted makespan, looking ahead over every later event (exhaustive, bounded by
    MAX_SEARCH evaluations)."""

    def __init__(self, models: list[JobModel], units: int):
        check_search([m.counts for m in models], [m.arrive for m in models], units,
                     ("dynamic",))
        self.models, self.units = models, units
        self.arrivals = sorted({m.arrive for m in models})
        self.evals = 0

    def _best(self, t: float, st: list[JState]) -> tuple[float, dict | None]:
        if all(s.done_at is not None for s in st):
            return max(s.done_at for s in st), None
        active = _active(self.models, st, t)
        options = list(_splits(active, self.models, self.units)) if active else [{}]
        best = (math.inf, None, None)
        for alloc in options:
            self.evals += 1
            if self.evals > MAX_SEARCH:
                raise StudyError(f"the dynamic plan would evaluate more than {MAX_SEARCH} "
                                 "allocations: use fewer units or jobs")
            s2 = _apply(t, st, alloc, self.models) if active else \
                [dataclasses.replace(s) for s in st]
            t2, s3 = _advance(t, s2, self.models, self.arrivals)
            if t2 == math.inf:
                continue
            v, _ = self._best(t2, s3)
            # ties: keep the current allocation (fewer resizes), then more units in use
            key = (v, sum(alloc.get(j, 0) != st[j].ranks for j in active),
                   -sum(alloc.values()))
            if best[2] is None or key < best[2]:
                best = (v, alloc, key)
        return best[0], best[1]

    def __call__(self, t: float, st: list[JState]) -> dict:
        self.evals = 0
        _, alloc = self._best(t, st)
        return alloc


def predict(models: list[JobModel], units: int, modes=MODES) -> dict:
    """The split or phases and predicted makespan of the equal split and of the other modes
    asked for (a mode left out is never searched: its bound may be what left it out)."""
    eq = equal_split(models, units)
    eq_ms, eq_ph = simulate(models, units, static_policy(eq))
    names = [m.name for m in models]
    pred = {"equal": {"makespan_s": eq_ms, "split": {names[j]: u for j, u in eq.items()},
                      "phases": eq_ph}}
    if "static" in modes:
        st_alloc, st_ms = best_static(models, units)
        _, st_ph = simulate(models, units, static_policy(st_alloc))
        pred["static"] = {"makespan_s": st_ms,
                          "split": {names[j]: u for j, u in st_alloc.items()},
                          "phases": st_ph, "same_as_equal": st_alloc == eq}
    if "dynamic" in modes:
        dy_ms, dy_ph = simulate(models, units, DynamicPolicy(models, units))
        pred["dynamic"] = {"makespan_s": dy_ms, "phases": dy_ph}
    return pred


# --- the executor ---------------------------------------------------------------------------------
def execute(plan: Plan, models: list[JobModel], mode: str, policy, launcher: Launcher,
            rundir: Path, out: Path, log=print) -> dict:
    """Runs the jobs under `policy` (called at every arrival and completion with the states
    estimated from the models) and returns the measured makespan and every segment. rundir is
    inside --out (`out`)."""
    _clean(rundir, out)
    specs = {j.name: j for j in plan.jobs}
    st = [JState(float(m.iterations)) for m in models]
    segs: list[Segment] = []
    running: dict[int, Segment] = {}
    free = list(range(plan.units))
    rem_at_launch: dict[int, float] = {}
    arrivals = sorted({m.arrive for m in models})
    t0 = time.monotonic()
    done_at: dict[int, float] = {}
    seen_arrivals: set[float] = set()

    def now():
        return time.monotonic() - t0

    def estimate(t):
        for j, seg in running.items():
            m = models[j]
            startup = m.restart(seg.ranks) if seg.resumed else m.startup[seg.ranks]
            busy = max(0.0, t - (seg.t_launch - t0) - startup)
            st[j].rem = max(1.0, rem_at_launch[j] - busy / m.step[seg.ranks])
            st[j].ready = (seg.t_launch - t0) + startup

    def event(t):
        active = _active(models, st, t)
        if not active:
            return
        estimate(t)
        alloc = policy(t, st)
        changed = [j for j in active if alloc[j] != st[j].ranks]
        if not changed:
            return
        stopping = [running[j] for j in changed if j in running]
        for seg in stopping:
            _stop(seg)
        for seg in stopping:
            _wait(seg, STOP_TIMEOUT_S)
            j = next(k for k, s in running.items() if s is seg)
            if (seg.rc, seg.status) not in ((INTERRUPTED_EXIT, "interrupted"), (0, "completed")):
                raise _failed(seg, f"did not stop cleanly (exit {seg.rc}, run file {seg.status})")
            del running[j]
            free.extend(seg.units)
            if seg.status == "completed":   # it ended before the signal took effect
                done_at[j], st[j].done_at, st[j].ranks = now(), now(), 0
            else:
                st[j].rem = models[j].iterations - checkpoint_iteration(
                    rundir / models[j].name / "ckpt")
                st[j].ranks = 0
        free.sort()
        for j in changed:
            if j in done_at:
                continue
            r = alloc[j]
            units, free[:] = free[:r], free[r:]
            spec = specs[models[j].name]
            seg = launcher.start(spec, sum(s.job == spec.name for s in segs), r, units,
                                 spec.iterations, rundir / spec.name, resume=st[j].started)
            segs.append(seg)
            running[j] = seg
            rem_at_launch[j] = st[j].rem
            st[j].ranks, st[j].started = r, True
            log(f"  {now():7.1f} s  {spec.name}: {'resumed' if seg.resumed else 'started'} on "
                f"{r} rank(s), units {units}")

    try:
        while len(done_at) < len(models):
            t = now()
            due = [a for a in arrivals if a <= t and a not in seen_arrivals]
            ended = []
            for j, seg in list(running.items()):
                rc = seg.proc.poll()
                if rc is not None:
                    _finish(seg, rc)
                    if rc != 0 or seg.status != "completed":
                        raise _failed(seg, f"ended with exit {rc}, run file {seg.status}")
                    del running[j]
                    free.extend(seg.units)
                    done_at[j] = seg.t_end - t0
                    st[j].done_at, st[j].ranks, st[j].rem = done_at[j], 0, 0.0
                    ended.append(j)
                    log(f"  {done_at[j]:7.1f} s  {seg.job}: completed")
            if due or ended:
                seen_arrivals.update(due)
                free.sort()
                event(now())
            time.sleep(0.05)
    except BaseException:
        for seg in running.values():
            _kill(seg)
        raise
    return {"mode": mode, "makespan_s": max(done_at.values()),
            "job_end_s": {models[j].name: v for j, v in done_at.items()},
            "segments": [s.to_json(t0) for s in segs]}


# --- report ---------------------------------------------------------------------------------------
def summarise(results: dict) -> list[dict]:
    pred = results["predicted"]
    rows = []
    measured = {}
    for mode in MODES:
        runs = [r for r in results["runs"] if r["mode"] == mode]
        src = mode
        if mode == "static" and not runs and pred.get("static", {}).get("same_as_equal"):
            runs, src = [r for r in results["runs"] if r["mode"] == "equal"], "equal"
        if not runs:
            continue
        ms = [r["makespan_s"] for r in runs]
        mean = sum(ms) / len(ms)
        measured[mode] = mean
        p = pred[mode]["makespan_s"]
        rows.append({"mode": mode, "split": _split_text(pred[mode]), "predicted [s]": p,
                     "measured mean [s]": mean, "min [s]": min(ms), "max [s]": max(ms),
                     "spread [%]": 100 * (max(ms) - min(ms)) / mean, "repeats": len(ms),
                     "error [%]": 100 * (p - mean) / mean,
                     "runs": "those of equal (same split)" if src != mode else mode})
    for r in rows:
        for base in ("equal", "static"):
            b = measured.get(base)
            r[f"gain over {base} [%]"] = 100 * (1 - r["measured mean [s]"] / b) if b else math.nan
    return rows


def _split_text(p: dict) -> str:
    if "split" in p:
        return " + ".join(f"{k} {v}" for k, v in p["split"].items())
    return "; ".join(f"{ph['t']:.0f} s: " + " + ".join(f"{k} {v}" for k, v in ph["alloc"].items())
                      for ph in p["phases"])


def timeline_figure(results: dict, path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    units = results["plan"]["units"]
    modes = [m for m in MODES if any(r["mode"] == m for r in results["runs"])]
    names = [j["name"] for j in results["plan"]["jobs"]]
    colors = {n: plt.cm.tab10(i % 10) for i, n in enumerate(names)}
    fig, axes = plt.subplots(len(modes), 1, figsize=(9, 1.2 + 1.0 * len(modes) * max(2, units)
                                                     ** 0.5), sharex=True, squeeze=False)
    xmax = max(r["makespan_s"] for r in results["runs"]) * 1.05
    for ax, mode in zip(axes[:, 0], modes):
        run = next(r for r in results["runs"] if r["mode"] == mode)
        for s in run["segments"]:
            end = s["t_end"]
            for u in s["units"]:
                ax.broken_barh([(s["t_launch"], end - s["t_launch"])], (u - 0.4, 0.8),
                               facecolors=colors[s["job"]], edgecolors="black", linewidths=0.5,
                               alpha=0.85)
                if s["t_signal"] is not None:
                    ax.broken_barh([(s["t_signal"], end - s["t_signal"])], (u - 0.4, 0.8),
                                   facecolors="none", hatch="///", edgecolors="black",
                                   linewidths=0.0)
            ax.text(s["t_launch"] + 0.3, s["units"][0], f"{s['job']} x{s['ranks']}",
                    va="center", fontsize=8)
        pm = results["predicted"][mode]["makespan_s"]
        ax.axvline(run["makespan_s"], color="black", lw=1.2)
        ax.axvline(pm, color="red", ls="--", lw=1.2)
        ax.set_yticks(range(units))
        ax.set_yticklabels([f"unit {u}" for u in range(units)], fontsize=8)
        ax.set_ylim(-0.6, units - 0.4)
        ax.set_title(f"{mode}: measured makespan {run['makespan_s']:.1f} s (repeat 1), "
                     f"predicted {pm:.1f} s", fontsize=9)
    axes[-1, 0].set_xlim(0, xmax)
    axes[-1, 0].set_xlabel("time since the start [s]")
    handles = [Patch(facecolor=colors[n], label=n) for n in names]
    handles += [Patch(facecolor="white", hatch="///", edgecolor="black",
                      label="stopping (signal to exit: checkpoint)"),
                plt.Line2D([], [], color="black", label="measured makespan"),
                plt.Line2D([], [], color="red", ls="--", label="predicted makespan")]
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    import io
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    plt.close(fig)
    return _write(path, png.getvalue())


def write_report(results: dict, out: Path) -> Path:
    import pandas as pd
    rows = summarise(results)
    fig = timeline_figure(results, out / "timeline.png")
    df = pd.DataFrame(rows)
    setup = results["setup"]
    lines = [f"# Co-allocation {results['plan']['name']}", "",
             f"{results['plan']['units']} units ({setup['unit']}), launcher {setup['launcher']}, "
             f"{len(results['plan']['jobs'])} jobs; {setup['host']}, {setup['date']}.", "",
             "| job | iterations | global batch | arrives [s] | step [s] by ranks | start-up [s] "
             "| stop [s] | restore [s] |", "|---|---|---|---|---|---|---|---|"]
    for m in results["models"]:
        steps = ", ".join(f"{u}: {v:.3g}" for u, v in m["step_s"].items())
        spec = next(j for j in results["plan"]["jobs"] if j["name"] == m["name"])
        lines.append(f"| {m['name']} | {m['iterations']} | {spec['global_batch']} | "
                     f"{m['arrive']:g} | {steps} | "
                     f"{min(m['startup_s'].values()):.3g}-{max(m['startup_s'].values()):.3g} | "
                     f"{m['stop_s']:.3g} | {m['restore_s']:.3g} |")
    lines += ["", "Makespans (time from the first launch to the last job's end):", "",
              _markdown(df), "",
              f"![timeline]({fig.name})", "",
              "Timeline: which job held which unit when (first repeat of each mode); hatched: "
              "the job was told to stop and was writing its checkpoint."]
    return _write(out / "report.md", "\n".join(lines) + "\n")


def _markdown(df) -> str:
    def cell(v):
        return f"{v:.3g}" if isinstance(v, float) else str(v)
    head = "| " + " | ".join(df.columns) + " |"
    rule = "|" + "---|" * len(df.columns)
    return "\n".join([head, rule] + ["| " + " | ".join(cell(v) for v in row) + " |"
                                      for row in df.itertuples(index=False)])


# --- command line ---------------------------------------------------------------------------------
def _setup(launcher: str, gpus: bool = False) -> dict:
    import platform
    unit = ("one GPU per rank" if gpus else "one core per rank") + (
        ", mpirun --cpu-set/--bind-to core" if launcher == "mpirun" else
        ", srun --exclusive job steps")
    return {"launcher": launcher, "unit": unit, "host": platform.node(),
            "cores": os.cpu_count(), "slurm_job": os.environ.get("SLURM_JOB_ID"),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def _plan_json(plan: Plan) -> dict:
    return {"name": plan.name, "file": str(plan.path), "units": plan.units,
            "units_per_node": plan.units_per_node, "repeats": plan.repeats, "modes": plan.modes,
            "calibration": {"iterations": plan.calibration_iterations,
                            "ranks": plan.calibration_ranks},
            "binary": str(plan.binary), "jobs": [j.to_json() for j in plan.jobs]}


def save_calibration(out: Path, plan: Plan, launcher_kind: str, models: list[JobModel]) -> Path:
    """<out>/calibration.json: the job models, and what they were measured for (the jobs, the
    calibration settings, the units and the launcher); reused while all of these match."""
    pj = _plan_json(plan)
    out.mkdir(parents=True, exist_ok=True)
    return _write(out / "calibration.json", json.dumps(
        {**{k: pj[k] for k in ("jobs", "calibration", "units")}, "launcher": launcher_kind,
         "models": [m.to_json() for m in models]}, indent=1))


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number a calibration holds")


def load_calibration(f: Path, plan: Plan, launcher_kind: str) -> list[JobModel] | None:
    """The job models in <out>/calibration.json when they were measured for this plan (its jobs,
    calibration settings and units) on this launcher; None when the file is absent or was
    measured for something else (the caller measures again). The planner divides by these
    numbers and simulates until every job ends, so a file that is not such a calibration, or
    holds a model this plan cannot have (a missing job, a rank count it cannot run, a time that
    is not a positive finite number of seconds), is refused naming the field, never used."""
    def bad(what: str) -> StudyError:
        return StudyError(f"{f}: {what}; run with --recalibrate to measure again (it replaces "
                          "the file)")
    try:
        st = os.lstat(f)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):   # check_out refuses these first
        raise bad("not a regular file")
    if st.st_size > MAX_CALIBRATION_BYTES:
        raise bad(f"{st.st_size} bytes, more than a calibration holds")
    with os.fdopen(os.open(f, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC),
                   "rb") as fh:
        raw = fh.read(MAX_CALIBRATION_BYTES + 1)
    try:
        doc = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:   # JSON, UTF-8, NaN/Infinity, nesting
        raise bad(f"not valid JSON ({str(e)[:160]})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("models"), list):
        raise bad("not a calibration written by trainscope-study coalloc (an object with jobs, "
                  "calibration, units, launcher and models)")
    pj = _plan_json(plan)
    differs = [k for k, want in (("jobs", pj["jobs"]), ("calibration", pj["calibration"]),
                                 ("units", plan.units), ("launcher", launcher_kind))
               if doc.get(k) != want]
    if differs:
        print(f"calibration: {f} was measured for another plan or launcher (its "
              f"{', '.join(differs)} differ); measuring again")
        return None
    raw_models = doc["models"]
    if len(raw_models) != len(plan.jobs):
        raise bad(f"models: {len(raw_models)} job model(s) for the plan's {len(plan.jobs)} jobs")
    return [_model(m, i, job, plan.units, bad) for i, (m, job) in
            enumerate(zip(raw_models, plan.jobs))]


def _model(m, i: int, job: JobSpec, units: int, bad) -> JobModel:
    """One job's model from calibration.json, checked against the plan's job."""
    where = f"models[{i}]"
    if not isinstance(m, dict):
        raise bad(f"{where}: {type(m).__name__}, not a job model (an object)")
    if m.get("name") != job.name:
        raise bad(f"{where}: name {m.get('name')!r}, but the plan's job {i + 1} is {job.name!r}")
    where = f"models[{i}] ({job.name})"
    allowed = job.counts(units)
    for key, want in (("iterations", job.iterations), ("arrive", job.arrive),
                      ("counts", allowed)):
        v = m.get(key)
        if isinstance(v, bool) or v != want:
            raise bad(f"{where}: {key} = {_short(v)}, but the plan's job has {_short(want)}")

    def seconds(key, v, positive):
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and \
            (v > 0 if positive else v >= 0) and v <= MAX_MODEL_S
        if not ok:
            raise bad(f"{where}: {key} = {_short(v)}: a time in seconds, "
                      f"{'above' if positive else 'at least'} 0 and at most {MAX_MODEL_S:g}")
        return float(v)

    def by_ranks(key, positive):
        d = m.get(key)
        if not isinstance(d, dict):
            raise bad(f"{where}: {key} = {_short(d)}: an object of seconds by rank count")
        got = {}
        for k, v in d.items():
            if not re.fullmatch(r"[1-9][0-9]{0,5}", k) or int(k) not in allowed:
                raise bad(f"{where}: {key} has a model for {_short(k)} rank(s), which the plan "
                          f"cannot run (its rank counts: {', '.join(map(str, allowed))})")
            got[int(k)] = seconds(f"{key}[{k!r}]", v, positive)
        missing = [u for u in allowed if u not in got]
        if missing:
            raise bad(f"{where}: {key} has no model for {', '.join(map(str, missing))} rank(s)")
        return got

    step, startup = by_ranks("step_s", True), by_ranks("startup_s", False)
    stop, restore = seconds("stop_s", m.get("stop_s"), False), \
        seconds("restore_s", m.get("restore_s"), False)
    rng = m.get("range", {})
    if not isinstance(rng, dict) or not all(
            isinstance(k, str) and k.isdigit() and k.isascii() and int(k) in allowed and
            isinstance(v, str) and len(v) < 200 for k, v in rng.items()):
        raise bad(f"{where}: range = {_short(rng)}: an object of words by rank count")
    return JobModel(job.name, job.iterations, job.arrive, allowed, step, startup, stop,
                    restore, {int(k): v for k, v in rng.items()})


def _short(v) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def gpu_count() -> int:
    """GPUs this machine has: NVIDIA's driver lists them in /proc/driver/nvidia/gpus, else
    `nvidia-smi -L` does; 0 when neither is there."""
    try:
        n = sum(1 for _ in Path("/proc/driver/nvidia/gpus").iterdir())
        if n:
            return n
    except OSError:
        pass
    try:
        p = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in p.stdout.splitlines()) \
        if p.returncode == 0 else 0


def run_here(plan: Plan, out: Path, launcher_kind: str, modes: list[str], repeats: int,
             recalibrate: bool, plan_only: bool = False, gpus: bool = False) -> int:
    launcher = Launcher(launcher_kind, plan.binary, plan.units, gpus)
    out.mkdir(parents=True, exist_ok=True)
    cal_file = out / "calibration.json"
    pj = _plan_json(plan)
    models = None if recalibrate else load_calibration(cal_file, plan, launcher_kind)
    if models is not None:
        print(f"calibration: reusing {cal_file} (--recalibrate measures again)")
    else:
        models = calibrate(plan, out, launcher)
        save_calibration(out, plan, launcher_kind, models)
    pred = predict(models, plan.units, modes)
    for mode in (m for m in MODES if m in pred):
        print(f"predicted {mode:8s} {pred[mode]['makespan_s']:8.1f} s  {_split_text(pred[mode])}")
    if plan_only:
        print(f"calibration: {cal_file}; nothing run (--plan-only)")
        return 0
    results = {"plan": pj, "setup": _setup(launcher_kind, gpus),
               "models": [m.to_json() for m in models], "predicted": pred, "runs": []}
    todo = [m for m in modes if not (m == "static" and pred["static"]["same_as_equal"] and
                                     "equal" in modes)]
    if "static" in modes and "static" not in todo:
        print("static: the best static split is the equal split; its runs are the equal split's")
    policies = {"equal": lambda: static_policy(equal_split(models, plan.units)),
                "static": lambda: static_policy({j: u for j, u in enumerate(
                    pred["static"]["split"][m.name] for m in models)}),
                "dynamic": lambda: DynamicPolicy(models, plan.units)}
    policies = {m: policies[m]() for m in todo}
    res_file = out / "results.json"
    for rep in range(1, repeats + 1):
        for mode in todo:   # modes interleaved, so that drift over time spreads over all of them
            print(f"{mode} repeat {rep}:")
            r = execute(plan, models, mode, policies[mode], launcher, out / mode / f"rep{rep}",
                        out)
            r["repeat"] = rep
            results["runs"].append(r)
            print(f"{mode} repeat {rep}: makespan {r['makespan_s']:.1f} s (predicted "
                  f"{pred[mode]['makespan_s']:.1f} s)")
            _write(res_file, json.dumps(results, indent=1))
    report = write_report(results, out)
    for row in summarise(results):
        print(f"{row['mode']:8s} predicted {row['predicted [s]']:7.1f} s  measured "
              f"{row['measured mean [s]']:7.1f} s ({row['min [s]']:.1f}-{row['max [s]']:.1f}, "
              f"{row['repeats']} runs)  error {row['error [%]']:+.1f} %  gain over equal "
              f"{row['gain over equal [%]']:+.1f} %")
    print(f"results: {res_file}\nreport: {report}")
    return 0


_BATCH_BODY = """
set -euo pipefail
cd {root}
export PYTHONPATH={root}/postprocess${{PYTHONPATH:+:$PYTHONPATH}}
exec {python} -m trainscope_jobs.coalloc {plan} --out {out} --inside --launcher {launcher} {args}
"""
SLURM_TEMPLATE = """#!/bin/bash
#SBATCH --job-name=coalloc-{name}
{layout}#SBATCH --ntasks={units}
#SBATCH --cpus-per-task=1
{gpus}#SBATCH --time={time}
#SBATCH --output={out}/slurm-%j.out
{extra}
# One allocation for all jobs of the co-allocation: each launch is an `srun --exclusive` job step
# on its share of the allocation's CPUs/GPUs (rendered by jobscripts/study coalloc).""" + _BATCH_BODY

PBS_TEMPLATE = """#!/bin/bash
#PBS -N coalloc-{name}
#PBS -l select=1:ncpus={units}:mpiprocs={units}{gpus}
#PBS -l walltime={time}
#PBS -j oe
#PBS -o {out}/pbs.out
{extra}
# PBS has no job steps: the jobs of the co-allocation run as concurrent mpirun launches on
# disjoint cores (and GPUs) of the one chunk (the executor reads the cores PBS's cpuset allows).""" \
    + _BATCH_BODY


def submit(plan: Plan, out: Path, scheduler: str, a, walltime: str, args: list[str]) -> int:
    """Renders the batch script (every value checked by _main) and submits it. `args`: the
    executor's options inside the job (--modes, --repeats, ... as checked)."""
    prefix = schedulers.get(scheduler).directive
    upn = plan.units_per_node
    layout = f"#SBATCH --nodes={plan.units // upn}\n#SBATCH --ntasks-per-node={upn}\n" \
        if upn else ""
    text = (SLURM_TEMPLATE if scheduler == "slurm" else PBS_TEMPLATE).format(
        name=plan.name, units=plan.units, time=walltime, out=shlex.quote(str(out)),
        root=shlex.quote(str(paths.root())), python=shlex.quote(sys.executable),
        plan=shlex.quote(str(plan.path)), args=shlex.join(args),
        extra="\n".join(prefix + d for d in a.directive), layout=layout,
        launcher="srun" if scheduler == "slurm" else "mpirun",
        gpus=("#SBATCH --gpus-per-task=1\n" if scheduler == "slurm" else f":ngpus={plan.units}")
        if a.gpus else "")
    script = _write(out / ("coalloc.sbatch" if scheduler == "slurm" else "coalloc.pbs"), text)
    if a.dry_run:
        print(f"rendered {script}; nothing submitted (--dry-run)")
        return 0
    env = dict(os.environ, PYTHONPATH=str(paths.root() / "postprocess") + os.pathsep +
               os.environ.get("PYTHONPATH", ""))
    job = schedulers.get(scheduler).submit(script, env=env)
    _write(out / "job.id", f"{scheduler} {job}\n")
    print(f"submitted {scheduler} job {job}: {script}; results in {out}/results.json")
    return 0


# What a co-allocation writes in --out; each run deletes and rewrites its own parts of it.
_DIRS = {"calibration", *MODES}
_OURS = {"calibration.json", "results.json", "report.md", "timeline.png", "coalloc.sbatch",
         "coalloc.pbs", "job.id", "pbs.out", LOCK, *_DIRS}


def _kind(mode: int) -> str:
    return ("a symbolic link" if stat.S_ISLNK(mode) else "a directory" if stat.S_ISDIR(mode)
            else "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a regular file")


def check_out(out: Path) -> None:
    """--out must be new, empty, or a co-allocation's own directory: the executor deletes and
    rewrites <out>/<mode>/rep<r> and <out>/calibration, so a directory of anything else is
    refused, never cleaned. What it writes or deletes stays inside: a link where it keeps a file
    or directory (or anywhere below its directories), and a FIFO or device where it writes a file,
    are refused before anything is written, never followed."""
    if not out.exists():
        return
    if not out.is_dir():
        raise StudyError(f"--out {out}: exists and is not a directory; give a new directory")
    names = sorted(p.name for p in out.iterdir())
    ours = [n for n in names if n in _OURS or re.fullmatch(r"slurm-[0-9]+\.out", n) or
            re.fullmatch(r"\.[a-z.]+\.tmp-[0-9]+", n)]
    other = [n if n.isprintable() else repr(n) for n in names if n not in ours]
    if other:
        raise StudyError(f"--out {out}: holds {', '.join(other[:5])}"
                         f"{' ...' if len(other) > 5 else ''}, which a co-allocation did not "
                         "write (it deletes and rewrites its own files there); give a new or "
                         "empty directory, or an earlier co-allocation's")
    for n in ours:
        p = out / n
        mode = os.lstat(p).st_mode
        if stat.S_ISLNK(mode):
            raise StudyError(f"--out {out}: {n} is a symbolic link (to {os.readlink(p)}); the "
                             "executor writes and deletes only inside --out, never through a "
                             "link: remove the link")
        want_dir = n in _DIRS
        if want_dir != stat.S_ISDIR(mode) or not (want_dir or stat.S_ISREG(mode)):
            raise StudyError(f"--out {out}: {n} is {_kind(mode)}, where the executor keeps "
                             f"{'a directory' if want_dir else 'a regular file'}: remove it")
        if want_dir:
            for d, dirs, files in os.walk(p):
                for x in sorted(dirs + files):
                    if os.path.islink(os.path.join(d, x)):
                        q = Path(d) / x
                        raise StudyError(f"--out {out}: {q.relative_to(out)} is a symbolic "
                                         f"link (to {os.readlink(q)}); the executor deletes "
                                         f"and rewrites {n}/ and never follows a link out of "
                                         "--out: remove the link")


# The executor's lock on --out (LOCK): held for the whole run, released by the kernel however
# the process ends, as trainscope holds checkpoint.dir/.lock.
_LOCK_FD: int | None = None


def lock_out(out: Path, wait_s: float = 0.0) -> None:
    """An exclusive flock on <out>/coalloc.lock for as long as this process runs: a second
    executor on the same --out is refused, naming the holder (two would delete each other's
    launch directories and calibration). `wait_s`: how long a held lock is retried (the batch
    job's executor: its submitter may still be exiting)."""
    global _LOCK_FD
    f = out / LOCK
    try:
        fd = os.open(f, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise StudyError(f"{f}: a symbolic link; remove it (the executor's lock file is a "
                             "regular file of --out)") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise StudyError(f"{f}: not a regular file; remove it (the executor's lock file)")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() < deadline:
                time.sleep(0.1)
                continue
            holder = os.pread(fd, 256, 0).decode("utf-8", "replace").strip()
            holder = "".join(c if c.isprintable() else "?" for c in holder)[:200]
            os.close(fd)
            raise StudyError(f"--out {out} is in use by another co-allocation "
                             f"({holder or 'holder unknown'}; lock {f}): two executors in one "
                             "directory would delete each other's launches and calibration; "
                             "wait until it has ended, or give another --out") from None
        except OSError as e:  # a file system without locks
            print(f"warning: cannot lock {f} ({e.strerror}): a second co-allocation on this "
                  "--out would not be noticed", file=sys.stderr)
            break
    since = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, since {since}\n".encode(), 0)
    _LOCK_FD = fd


def unlock_out() -> None:
    global _LOCK_FD
    if _LOCK_FD is not None:
        os.close(_LOCK_FD)
        _LOCK_FD = None


def parse(argv=None):
    p = argparse.ArgumentParser(
        prog="trainscope-study coalloc", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("plan", type=Path, help="co-allocation plan (inputs/coalloc/*.toml)")
    p.add_argument("--out", type=Path, help="results directory (default coalloc/<name>)")
    p.add_argument("--scheduler", choices=["local", "slurm", "pbs"], default="local",
                   help="local: run here now (default); slurm/pbs: submit one job that runs it")
    p.add_argument("--modes", help="comma-separated subset of equal,static,dynamic "
                                   "(default: the plan's)")
    p.add_argument("--repeats", help="runs of each mode, 1 to 100 (default: the plan's)")
    p.add_argument("--recalibrate", action="store_true",
                   help="measure the jobs again even if calibration.json matches the plan")
    p.add_argument("--gpus", action="store_true",
                   help="units are GPUs: one GPU per rank (Slurm --gpus-per-task=1 for the "
                        "allocation and every step; PBS ngpus; mpirun: CUDA_VISIBLE_DEVICES = "
                        "the launch's units)")
    p.add_argument("--plan-only", action="store_true",
                   help="calibrate (or reuse the calibration) and print every mode's predicted "
                        "split and makespan; run no mode")
    p.add_argument("--time", help="slurm/pbs: walltime (HH:MM:SS, default 01:00:00)")
    p.add_argument("--directive", action="append", default=[],
                   help="slurm/pbs: an extra #SBATCH/#PBS line, e.g. --directive=--partition=gpu")
    p.add_argument("--dry-run", action="store_true",
                   help="slurm/pbs: render the batch script only")
    p.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--launcher", choices=LAUNCHERS, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _modes(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    if not text.isascii() or not text.isprintable() or not modes or \
            any(m not in MODES for m in modes):
        raise StudyError(f"--modes {text!r}: use one or more of {', '.join(MODES)}, "
                         "comma-separated")
    twice = sorted({m for m in modes if modes.count(m) > 1})
    if twice:
        raise StudyError(f"--modes {text!r}: {', '.join(twice)} given twice; give each mode "
                         "once")
    return modes


def _repeats(text: str) -> int:
    if not re.fullmatch(r"[0-9]{1,3}", text) or not 1 <= int(text) <= 100:
        raise StudyError(f"--repeats {text!r}: a whole number from 1 to 100 (ASCII digits)")
    return int(text)


def _directive(d: str) -> str:
    sweep.script_value("--directive", d, "one #SBATCH/#PBS line each")
    if not d.startswith("-"):
        raise StudyError(f"--directive {d!r}: an option of sbatch or qsub (it starts with '-', "
                         "e.g. --directive=--partition=gpu or --directive='-q debug')")
    return d


# Signals that end the co-allocation: Ctrl-C, a scheduler's cancel, the terminal closing.
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_STOPPING = False   # the first signal was acted on: the rest are ignored
_HOLDING = False    # a launch is being started and registered: a signal waits for its end
_HELD = False       # a signal arrived while _HOLDING


def _interrupt(signum, frame):
    """The first signal ends the co-allocation as Ctrl-C does (every launch it started is killed
    on the way out); a repeat while it ends is ignored, so that a second Ctrl-C cannot cut the
    killing short and leave launches running in their own sessions."""
    global _STOPPING, _HELD
    if _STOPPING:
        return
    if _HOLDING:
        _HELD = True
        return
    _STOPPING = True
    raise KeyboardInterrupt


@contextlib.contextmanager
def _signals_held():
    """A signal that arrives inside is acted on at its end: an interrupt between a launch's
    start and its registration in _LIVE would leave it running, unknown to kill_live."""
    global _HOLDING, _HELD, _STOPPING
    _HOLDING = True
    try:
        yield
    finally:
        _HOLDING = False
        if _HELD and not _STOPPING:
            _HELD, _STOPPING = False, True
            raise KeyboardInterrupt


def _say(text: str) -> None:
    try:
        print(f"trainscope-study coalloc: {text}", file=sys.stderr)
    except OSError:  # the terminal is gone (SIGHUP)
        pass


def main(argv=None) -> int:
    global _STOPPING, _HELD
    a = parse(argv)
    _STOPPING = _HELD = False
    previous = {s: signal.signal(s, _interrupt) for s in _SIGNALS}
    try:
        return _main(a)
    except KeyboardInterrupt:  # a signal while an error was being reported
        _say("interrupted; the jobs it started were killed")
        return 130
    finally:
        _STOPPING = True    # from here on, signals are ignored until the launches are gone
        try:
            kill_live()
        finally:
            unlock_out()
            for s, h in previous.items():
                signal.signal(s, h)


def _main(a) -> int:
    try:
        return _checked_main(a)
    except (StudyError, JobError) as e:
        _say(str(e))
        return 2
    except OSError as e:
        _say(f"{e.filename or ''}: {e.strerror or e}")
        return 2
    except KeyboardInterrupt:
        _say("interrupted; the jobs it started were killed")
        return 130


def _checked_main(a) -> int:
    """Every option and plan value is checked before anything is written."""
    if a.out is not None and (_CONTROL.search(str(a.out)) or not str(a.out).isprintable()):
        raise StudyError(f"--out {str(a.out)!r}: a plain directory name, one line")
    plan = load_plan(a.plan)
    out = (a.out or paths.root() / "coalloc" / plan.name).resolve()
    modes = _modes(a.modes) if a.modes is not None else plan.modes
    repeats = _repeats(a.repeats) if a.repeats is not None else plan.repeats
    submitting = a.scheduler != "local" and not a.inside
    launcher = a.launcher or ("srun" if a.scheduler == "slurm" else "mpirun")
    if not submitting:
        for flag, given in (("--time", a.time is not None), ("--directive", a.directive),
                            ("--dry-run", a.dry_run)):
            if given:
                raise StudyError(f"{flag}: for --scheduler slurm or pbs (the batch script); "
                                 "nothing is submitted here" + (
                                     ": --plan-only predicts without running a mode"
                                     if flag == "--dry-run" else ""))
    upn = plan.units_per_node
    if upn and upn < plan.units and launcher == "mpirun":
        raise StudyError(f"{plan.path}: units_per_node = {upn} puts the {plan.units} units on "
                         f"{plan.units // upn} nodes, but "
                         f"{'PBS' if a.scheduler == 'pbs' else 'this launcher'} runs every job "
                         "with mpirun on the cores of one node: leave units_per_node out (or "
                         "set it to units), or use --scheduler slurm (job steps span nodes)")
    check_search([j.counts(plan.units) for j in plan.jobs], [j.arrive for j in plan.jobs],
                 plan.units, modes)
    if a.gpus and not submitting:
        have, need = gpu_count(), (plan.units if launcher == "mpirun" else upn or 1)
        if have < need:
            raise StudyError(f"--gpus: the units are GPUs, {need} of them on this node, but "
                             f"it has {have} (nvidia-smi -L, /proc/driver/nvidia): drop --gpus "
                             "to share CPU cores, or run where the GPUs are")
    if submitting:
        walltime = sweep.walltime("--time", a.time or "01:00:00")
        for d in a.directive:
            _directive(d)
        if not _DIRECTIVE_PATH.fullmatch(str(out)):
            raise StudyError(f"--out {out}: the batch script names it in an #SBATCH/#PBS line, "
                             "which is not shell-parsed: use a path of letters, digits and "
                             "./_+,@=~- only (no space, quote, '%' or ':')")
        if not str(plan.path).isprintable():
            raise StudyError(f"plan {str(plan.path)!r}: the batch script names it: a one-line "
                             "path")
        late = [j for j in plan.jobs if j.arrive >= sweep.walltime_seconds(walltime)]
        if late:
            raise StudyError(f"{plan.path}: job {late[0].name} arrives at {late[0].arrive:g} s, "
                             f"at or after the end of the allocation (--time {walltime} = "
                             f"{sweep.walltime_seconds(walltime)} s): it could never run; "
                             "lower its `arrive` or raise --time")
    check_out(out)
    out.mkdir(parents=True, exist_ok=True)
    lock_out(out, wait_s=10.0 if a.inside else 0.0)
    if submitting:
        args = (["--modes", ",".join(modes)] if a.modes is not None else []) + \
            (["--repeats", str(repeats)] if a.repeats is not None else []) + \
            [flag for flag, on in (("--recalibrate", a.recalibrate),
                                   ("--plan-only", a.plan_only), ("--gpus", a.gpus)) if on]
        return submit(plan, out, a.scheduler, a, walltime, args)
    return run_here(plan, out, launcher, modes, repeats, a.recalibrate, a.plan_only, a.gpus)


if __name__ == "__main__":
    sys.exit(main())
