"""jobscripts/sweep: render (and submit) the job scripts of a scaling study.

For every --config, every point (--nodes, or --ranks for studies inside one node) and every
repeat, writes <out>/<config>/<mode>/n<NN>/rep<r>/ with the rendered job script; the run file of
that job is run.h5 in the same directory. <out>/manifest.tsv and manifest.json list every point
(config, mode, nodes, ranks, repeat, batch, job id, script, output file). With --submit the jobs
go to the scheduler: node counts as separate jobs, repeats of a point as a dependency chain
(each starts after the previous one ended, so repeats do not share the machine); --scheduler
local runs them one after another here.

Strong scaling keeps the global batch (--global-batch, per-rank batch = global / ranks), weak
scaling the per-rank batch (--batch-per-rank); a point whose batch does not divide is refused
with the reason, and trainscope checks the same again (run.scaling, run.global_batch,
run.batch_per_rank).

Examples:
  jobscripts/sweep --config inputs/quickstart.ini --scheduler slurm --nodes 1,2,4,8 \\
      --ranks-per-node 4 --mode strong --global-batch 256 --repeats 3 --submit
  jobscripts/sweep --config inputs/quickstart.ini --scheduler local --ranks 1,2,4 \\
      --mode weak --batch-per-rank 32 --dry-run
  trainscope-post report studies/quickstart
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import sys
from pathlib import Path

from . import paths, schedulers
from .errors import JobError

# The job-script template of each scheduler, under paths.jobscripts(), and the name of the
# rendered script in a point's directory.
TEMPLATES = {"slurm": Path("slurm") / "train.sbatch", "pbs": Path("pbs") / "train.pbs",
             "local": Path("local") / "run.sh"}
SCRIPT_NAMES = {"slurm": "job.sbatch", "pbs": "job.pbs", "local": "job.sh"}

SweepError = JobError  # the sweep's checks raise the package's one error type


def parse(argv=None):
    p = argparse.ArgumentParser(prog="jobscripts/sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", action="append", required=True, type=Path,
                   help="trainscope INI file (repeatable: one study per config)")
    p.add_argument("--scheduler", choices=schedulers.NAMES, required=True)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--nodes", help="node counts, e.g. 1,2,4,8 (ranks = nodes x per node)")
    where.add_argument("--ranks", help="rank counts inside one node or across nodes, e.g. 1,2,4 "
                                       "(nodes = ceil(ranks / --ranks-per-node))")
    p.add_argument("--ranks-per-node", "--gpus-per-node", dest="ranks_per_node", type=int,
                   default=None, help="ranks per node = GPUs per node (default 4 with --gpus, "
                                      "else the largest --ranks)")
    p.add_argument("--gpus", action="store_true",
                   help="GPU runs: request one GPU per rank (--gpus-per-node / ngpus)")
    p.add_argument("--cpus-per-task", type=int, default=1, help="cores per rank")
    p.add_argument("--mode", choices=["strong", "weak"], required=True)
    p.add_argument("--global-batch", type=int, help="strong: samples per iteration, all ranks")
    p.add_argument("--batch-per-rank", type=int, help="weak: samples per iteration per rank")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--out", type=Path,
                   help="study directory (default studies/<config name> in the working directory)")
    p.add_argument("--name", help="study name (default: the first config's file name)")
    p.add_argument("--time", default="00:30:00", help="walltime per job (HH:MM:SS)")
    p.add_argument("--site", default="default", help="jobscripts/site/<site>.env (or a path)")
    p.add_argument("--binary", type=Path, default=None,
                   help="the trainscope binary the jobs run (default: $TRAINSCOPE_BINARY, else "
                        "the tree's build/app/trainscope, else trainscope on PATH)")
    p.add_argument("--signal-secs", type=int, default=0,
                   help="Slurm: send SIGUSR1 this many seconds before the walltime (0 = off)")
    p.add_argument("--sbatch-arg", "--qsub-arg", dest="directives", action="append", default=[],
                   help="extra scheduler directive, e.g. --sbatch-arg=--partition=gpu")
    p.add_argument("--serialize", action="store_true",
                   help="every job waits for the previous one (points would share cores, e.g. "
                        "a small test cluster), not only the repeats of a point")
    act = p.add_mutually_exclusive_group()
    act.add_argument("--dry-run", action="store_true", help="render only (the default)")
    act.add_argument("--submit", action="store_true", help="render and submit")
    p.add_argument("trainscope_args", nargs="*", help="after --: extra trainscope options")
    a = p.parse_args(argv)
    return a


def int_list(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SweepError(f"{what} {text!r}: a comma-separated list of positive integers")
    if not values or any(v <= 0 for v in values):
        raise SweepError(f"{what} {text!r}: a comma-separated list of positive integers")
    return sorted(set(values))


def points(a) -> list[tuple[int, int, int]]:
    """(nodes, ranks, ranks_per_node) of every point, refusing uneven placements."""
    out = []
    if a.nodes:
        rpn = a.ranks_per_node or (4 if a.gpus else 1)
        for n in int_list(a.nodes, "--nodes"):
            out.append((n, n * rpn, rpn))
    else:
        ranks = int_list(a.ranks, "--ranks")
        rpn_max = a.ranks_per_node or max(ranks)
        for r in ranks:
            nodes = math.ceil(r / rpn_max)
            if r % nodes:
                raise SweepError(f"--ranks {r} does not split evenly over {nodes} nodes of "
                                 f"--ranks-per-node {rpn_max}")
            out.append((nodes, r, r // nodes))
    return out


def batch_args(a, ranks: int) -> tuple[list[str], int]:
    """trainscope options that fix the batch for the mode, and the per-rank batch."""
    if a.mode == "strong":
        if not a.global_batch:
            raise SweepError("--mode strong needs --global-batch (the samples per iteration all "
                             "points share)")
        if a.global_batch % ranks:
            raise SweepError(f"--global-batch {a.global_batch} does not divide over {ranks} "
                             f"ranks ({a.global_batch} / {ranks} = {a.global_batch / ranks:g}): "
                             "choose a global batch that every rank count divides")
        return ["--run.scaling=strong", f"--run.global_batch={a.global_batch}"], \
            a.global_batch // ranks
    if not a.batch_per_rank:
        raise SweepError("--mode weak needs --batch-per-rank (the samples per iteration of each "
                         "rank, kept at every point)")
    return ["--run.scaling=weak", f"--run.batch_per_rank={a.batch_per_rank}"], a.batch_per_rank


def site_file(site: str) -> Path:
    p = Path(site)
    if not p.suffix:
        p = paths.jobscripts() / "site" / f"{site}.env"
    if not p.is_file():
        raise SweepError(f"--site {site}: {p} not found (sites: " + ", ".join(
            sorted(f.stem for f in (paths.jobscripts() / "site").glob("*.env"))) + ")")
    return p.resolve()


def render(template: str, fields: dict[str, str], gpus: bool, signal: bool) -> str:
    lines = []
    for line in template.splitlines():
        if line.startswith("#@GPU@"):
            if not gpus:
                continue
            line = line[len("#@GPU@"):]
        if line.startswith("#@SIGNAL@"):
            if not signal:
                continue
            line = line[len("#@SIGNAL@"):]
        lines.append(line)
    text = "\n".join(lines) + "\n"
    for key, value in fields.items():
        # A line break in a value would start a script line that the shell runs (shell quoting
        # does not help in #SBATCH/#PBS directive lines): every field is one line, and the extra
        # directives are one directive per line.
        if key == "EXTRA_DIRECTIVES":
            bad = any(line and (line[0] != "#" or "\r" in line) for line in value.split("\n"))
        else:
            bad = "\n" in value or "\r" in value
        if bad:
            raise SweepError(f"{key.lower()} {value!r} contains a line break; a job script field "
                             "(--time, --sbatch-arg/--qsub-arg, a config file name) must be one "
                             "line")
        text = text.replace(f"@@{key}@@", value)
    left = re.findall(r"@@[A-Z_]+@@", text)
    if left:
        raise SweepError(f"template fields without a value: {sorted(set(left))}")
    return text


def submit(scheduler: str, script: Path, after: str | None, array: str | None = None) -> str:
    """Submit one job script through the registered scheduler (schedulers/); its job id.
    --scheduler local runs it here, now (schedulers/local.py: job.pid, job.exit beside it)."""
    return schedulers.get(scheduler).submit(script, after, array)


def render_job(scheduler: str, run_dir: Path, *, job_name: str, nodes: int, ranks: int,
               ranks_per_node: int, cpus_per_task: int, gpus: bool, time: str,
               signal_secs: int, site: Path, binary: Path, directives: list[str],
               trainscope_args: list[str], gpus_per_node: int | None = None) -> Path:
    """Write the job script of one point into run_dir (created) and return its path.
    gpus_per_node defaults to one GPU per rank; a single process driving several GPUs
    (nn.DataParallel) asks for more."""
    if gpus:
        trainscope_args = gpu_device_args(trainscope_args)
    run_dir.mkdir(parents=True, exist_ok=True)
    gpn = ranks_per_node if gpus_per_node is None else gpus_per_node
    fields = {
        "JOB_NAME": job_name[:64],
        "NODES": str(nodes), "RANKS": str(ranks), "RANKS_PER_NODE": str(ranks_per_node),
        "GPUS_PER_NODE": str(gpn),
        "CPUS_PER_TASK": str(cpus_per_task), "NCPUS": str(ranks_per_node * cpus_per_task),
        "PBS_GPUS": f":ngpus={gpn}" if gpus else "", "TIME": time,
        "SIGNAL_SECS": str(signal_secs),
        "RUN_DIR": shlex.quote(str(run_dir)), "BINARY": shlex.quote(str(binary)),
        "SITE_ENV": shlex.quote(str(site)),
        "TRAINSCOPE_ARGS": " ".join(shlex.quote(x) for x in trainscope_args),
        "EXTRA_DIRECTIVES": directive_lines(scheduler, directives),
    }
    script = run_dir / SCRIPT_NAMES[scheduler]
    template = (paths.jobscripts() / TEMPLATES[scheduler]).read_text()
    script.write_text(render(template, fields, gpus, signal_secs > 0))
    script.chmod(0o755)
    return script


def gpu_device_args(trainscope_args: list[str]) -> list[str]:
    """A GPU job passes run.device=cuda, so that a node whose CUDA is broken fails the job with
    the reason instead of training on the CPU (run.device=auto's fallback)."""
    for arg in trainscope_args:
        if arg.startswith("--run.device=") and arg != "--run.device=cuda":
            raise SweepError(f"{arg} with --gpus: a GPU job runs with --run.device=cuda; "
                             "drop the option, or drop --gpus for a CPU job")
    if "--run.device=cuda" in trainscope_args:
        return list(trainscope_args)
    return ["--run.device=cuda", *trainscope_args]


def directive_lines(scheduler: str, directives: list[str]) -> str:
    for d in directives:  # each its own line: a line break would add a directive
        script_value("directive", d, "partition, account, qos and extra directives must be "
                     "one line each")
    return "\n".join(schedulers.get(scheduler).directive + d for d in directives)


# --- values rendered into a job script ------------------------------------------------------------
# #SBATCH/#PBS lines are not shell-quoted, so a line break in a value would add a directive (or a
# shell line). Non-ASCII is refused too: a look-alike digit (Arabic-Indic "٠١:٣٠:٠٠" matches \d)
# or a Unicode line separator would pass a check written for ASCII and mean something else.
# One copy of these checks for jobscripts/sweep, jobscripts/study and trainscope-study coalloc.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_WALLTIME = re.compile(r"([0-9]{1,5}):([0-5][0-9]):([0-5][0-9])")


def script_value(what: str, value, rule: str = "give it on one line") -> str:
    """`value` if it can be one field of a job script: a string of printable ASCII, one line."""
    if not isinstance(value, str):
        raise SweepError(f"{what} {value!r}: a string")
    if _CONTROL.search(value):
        raise SweepError(f"{what} {value!r} contains a line break or another control character "
                         f"({rule})")
    if not value.isascii() or not value.isprintable():
        raise SweepError(f"{what} {value!r} contains characters outside printable ASCII "
                         "(a look-alike digit or letter, a Unicode space or line separator); "
                         "type it in plain ASCII")
    return value


def walltime(what: str, value) -> str:
    """A walltime "HH:MM:SS" in ASCII digits (minutes and seconds below 60), not zero."""
    script_value(what, value)
    m = _WALLTIME.fullmatch(value)
    if not m or not any(int(g) for g in m.groups()):
        raise SweepError(f"{what} {value!r}: use HH:MM:SS (e.g. 01:30:00; minutes and seconds "
                         "below 60, not all zero)")
    return value


def walltime_seconds(value: str) -> int:
    h, m, s = (int(g) for g in _WALLTIME.fullmatch(value).groups())
    return 3600 * h + 60 * m + s


def write_manifest(out: Path, rows: list[dict]) -> None:
    """<out>/manifest.json and manifest.tsv: one row per job (columns: the first row's keys)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "manifest.json").write_text(json.dumps(rows, indent=1) + "\n")
    keys = list(rows[0])
    with open(out / "manifest.tsv", "w") as fh:
        fh.write("\t".join(keys) + "\n")
        for r in rows:
            fh.write("\t".join(str(r.get(k, "")) for k in keys) + "\n")


def check_common(repeats: int, time: str) -> None:
    if repeats < 1:
        raise SweepError(f"--repeats {repeats}: at least 1")
    walltime("--time", time)


def main(argv=None) -> int:
    a = parse(argv)
    try:
        for c in a.config:
            if not c.is_file():
                raise SweepError(f"--config {c}: no such file")
        check_common(a.repeats, a.time)
        site = site_file(a.site)
        pts = points(a)
        name = a.name or a.config[0].stem
        out = (a.out or Path("studies") / name).resolve()  # in the working directory
        binary = (a.binary or paths.default_binary()).resolve()
        if a.submit and not binary.is_file():
            raise SweepError(f"--binary {binary}: not built (scripts/build)")
        # Every point is checked before anything is written or submitted.
        plan = []
        for cfg in a.config:
            for nodes, ranks, rpn in pts:
                bargs, per_rank = batch_args(a, ranks)
                for rep in range(a.repeats):
                    plan.append((cfg, nodes, ranks, rpn, rep, bargs, per_rank))
        rows = []
        previous: dict[tuple, str] = {}
        for cfg, nodes, ranks, rpn, rep, bargs, per_rank in plan:
            run_dir = out / cfg.stem / a.mode / f"n{ranks:02d}" / f"rep{rep}"
            output = run_dir / "run.h5"
            ts_args = ["--config", str(cfg.resolve()), *bargs, f"--output.file={output}",
                       *a.trainscope_args]
            script = render_job(
                a.scheduler, run_dir, job_name=f"ts-{cfg.stem}-{a.mode}-n{ranks}-r{rep}",
                nodes=nodes, ranks=ranks, ranks_per_node=rpn, cpus_per_task=a.cpus_per_task,
                gpus=a.gpus, time=a.time, signal_secs=a.signal_secs, site=site, binary=binary,
                directives=a.directives, trainscope_args=ts_args)
            job = ""
            if a.submit:
                key = "all" if a.serialize else (cfg, ranks)
                job = submit(a.scheduler, script, previous.get(key))
                previous[key] = job
            rows.append({"config": str(cfg), "mode": a.mode, "nodes": nodes, "ranks": ranks,
                         "ranks_per_node": rpn, "repeat": rep, "batch_per_rank": per_rank,
                         "global_batch": per_rank * ranks, "job_id": job,
                         "script": str(script), "output": str(output)})
        write_manifest(out, rows)
        verb = "submitted" if a.submit else "rendered"
        print(f"{verb} {len(rows)} jobs ({len(pts)} points x {a.repeats} repeats x "
              f"{len(a.config)} configs) in {out}; manifest: {out / 'manifest.tsv'}")
        if a.submit and a.scheduler != "local":
            print("when they are done: trainscope-post report " + shlex.quote(str(out)))
        return 0
    except SweepError as e:
        print(f"jobscripts/sweep: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
