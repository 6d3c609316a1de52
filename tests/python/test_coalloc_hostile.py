"""trainscope-study coalloc under hostile input (issue 37, classes 1-3): links, FIFOs and damaged
or foreign calibration files in --out, a second executor on one --out, signals while launches
run; scheduler values that would add #SBATCH/#PBS lines or cannot work; plans whose planner
search is too large. Every refusal: exit 2, one line naming the option, file or field and the
fix, no traceback, nothing outside --out written or deleted (the files links point to are
snapshots' sentinels). No real training is launched: the plans name a stand-in binary, and the
job models come from a calibration.json written here (tests/e2e/test_coalloc.py calibrates for
real)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import wait_until_gone

from trainscope_jobs import coalloc
from trainscope_jobs.coalloc import (DynamicPolicy, JobModel, best_static, load_plan, main,
                                     predict, save_calibration, simulate, static_policy)
from trainscope_post.study import StudyError

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(ROOT / "postprocess"))
QUICK = ROOT / "inputs" / "quickstart.ini"
LORA = ROOT / "inputs" / "llm" / "lora-tiny.ini"
MODELS = {"cv": ({1: 0.17, 2: 0.11}, 2.0, 0.6, 0.15), "llm": ({1: 0.22, 2: 0.125}, 1.3, 0.55, 0.15)}


def toml(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string: \n, \u2028 ... stay escapes
    if isinstance(v, list):
        return "[" + ", ".join(toml(x) for x in v) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {toml(x)}" for k, x in v.items()) + "}"


class Workspace:
    """tmp_path/: plan.toml, fake (the stand-in binary: exits 1), out/ (--out), victim/ (what
    links point to: must stay as it is)."""

    def __init__(self, tmp_path: Path):
        self.root = tmp_path
        self.fake = tmp_path / "fake"
        self.fake.write_text("#!/bin/sh\nexit 1\n")
        self.fake.chmod(0o755)
        self.plan = tmp_path / "plan.toml"
        self.out = tmp_path / "out"
        self.victim = tmp_path / "victim"
        self.victim.mkdir()
        (self.victim / "file").write_text("sentinel\n")
        (self.victim / "sub").mkdir()
        (self.victim / "sub" / "keep.txt").write_text("keep me\n")
        self.top = {"binary": str(self.fake), "units": 2,
                    "calibration": {"iterations": 4, "ranks": [1, 2]}}
        self.jobs = [{"name": "cv", "configs": [str(QUICK)], "iterations": 10,
                      "global_batch": 64},
                     {"name": "llm", "configs": [str(LORA)], "iterations": 10, "global_batch": 4}]
        self.write_plan()

    def write_plan(self) -> Path:
        lines = [f"{k} = {toml(v)}" for k, v in self.top.items()]
        for j in self.jobs:
            lines += ["[[job]]"] + [f"{json.dumps(k)} = {toml(v)}" for k, v in j.items()]
        self.plan.write_text("\n".join(lines) + "\n")
        return self.plan

    def calibration(self) -> dict:
        """A calibration.json for this plan (mpirun launcher), as the executor writes it."""
        spec = load_plan(self.plan)
        self.out.mkdir(exist_ok=True)
        f = save_calibration(self.out, spec, "mpirun", [
            JobModel(j.name, j.iterations, j.arrive, [1, 2], MODELS[j.name][0],
                     {1: MODELS[j.name][1], 2: MODELS[j.name][1]}, *MODELS[j.name][2:])
            for j in spec.jobs])
        return json.loads(f.read_text())

    def edit_calibration(self, change) -> None:
        doc = self.calibration()
        text = change(doc)
        f = self.out / "calibration.json"
        if isinstance(text, bytes):
            f.write_bytes(text)
        else:
            f.write_text(text if isinstance(text, str) else json.dumps(doc))

    def link(self, name: str, target: Path) -> None:
        self.out.mkdir(exist_ok=True)
        p = self.out / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.symlink_to(target)


def snapshot(root: Path, skip: Path) -> dict:
    """Every entry under root but those under skip: kind, size, content hash, link target."""
    found = {}
    for d, dirs, files in os.walk(root):
        if Path(d) == skip or skip in Path(d).parents:
            continue
        for n in dirs + files:
            p = Path(d) / n
            if p == skip:
                continue
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode):
                found[str(p)] = ("file", hashlib.sha256(p.read_bytes()).hexdigest())
            elif stat.S_ISLNK(st.st_mode):
                found[str(p)] = ("link", os.readlink(p))
            else:
                found[str(p)] = (stat.S_IFMT(st.st_mode),)
    return found


@pytest.fixture
def ws(tmp_path):
    return Workspace(tmp_path)


def refused(rc: int, out: str, err: str, fragments, code: int = 2) -> None:
    text = out + err
    assert "Traceback" not in text, text
    assert rc == code, text
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainscope-study coalloc: "), err
    for f in fragments:
        assert f in err, (f, err)


class Hung(BaseException):
    """Raised by within(): a BaseException, so that no handler of the code under test takes it."""


@contextlib.contextmanager
def within(seconds: float):
    """A time limit for code run in this process (SIGALRM), as subprocesses get a timeout."""
    def expire(signum, frame):
        raise Hung(f"still running after {seconds} s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def cli(capsys, *args, limit: float = 60) -> tuple[int, str, str]:
    """The command in this process (main: every error caught, signal handlers restored)."""
    with within(limit):
        rc = main([str(a) for a in args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def needs_two_cores():
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("the executor needs a core per unit (2)")


# --- class 1: --out and calibration.json ----------------------------------------------------------
def cal_edit(change):
    return lambda w: w.edit_calibration(change)


def step(doc, value, job=0, count="1"):
    doc["models"][job]["step_s"][count] = value


def raw_number(text):
    """calibration.json with llm's 1-rank step time spelled `text` (NaN, Infinity: not JSON
    numbers, which Python's json module accepts unless told not to)."""
    def change(doc):
        doc["models"][1]["step_s"]["1"] = 12345.678
        return json.dumps(doc).replace("12345.678", text)
    return change


def set_model(key, value, job=0):
    def change(doc):
        doc["models"][job][key] = value
    return change


OUT_CASES = [
    # links where the executor writes or deletes: refused, never followed
    ("sbatch-link", lambda w: w.link("coalloc.sbatch", w.victim / "file"),
     ["--scheduler", "slurm", "--dry-run"], ["coalloc.sbatch is a symbolic link", "remove"]),
    ("pbs-link", lambda w: w.link("coalloc.pbs", w.victim / "file"),
     ["--scheduler", "pbs", "--dry-run"], ["coalloc.pbs is a symbolic link"]),
    ("calibration-json-link", lambda w: (w.calibration(), os.replace(
        w.out / "calibration.json", w.victim / "cal.json"),
        w.link("calibration.json", w.victim / "cal.json")),
     ["--plan-only"], ["calibration.json is a symbolic link", "never through a link"]),
    ("calibration-dir-link", lambda w: w.link("calibration", w.victim / "sub"),
     ["--plan-only"], ["calibration is a symbolic link"]),
    ("mode-dir-link", lambda w: w.link("equal", w.victim / "sub"),
     ["--plan-only"], ["equal is a symbolic link"]),
    ("nested-link", lambda w: w.link("calibration/cv", w.victim / "sub"),
     ["--plan-only"], ["calibration/cv is a symbolic link", "never follows a link out"]),
    ("results-link", lambda w: w.link("results.json", w.victim / "file"),
     ["--plan-only"], ["results.json is a symbolic link"]),
    ("lock-link", lambda w: w.link("coalloc.lock", w.victim / "file"),
     ["--plan-only"], ["coalloc.lock is a symbolic link"]),
    ("calibration-json-dir", lambda w: (w.out / "calibration.json").mkdir(parents=True),
     ["--plan-only"], ["calibration.json is a directory, where the executor keeps a regular"]),
    ("mode-dir-file", lambda w: (w.out.mkdir(), (w.out / "dynamic").write_text("x")),
     ["--plan-only"], ["dynamic is a regular file, where the executor keeps a directory"]),
    # calibration.json that is not this plan's calibration: refused naming the field
    ("cal-not-json", cal_edit(lambda d: "{"), ["--plan-only"],
     ["calibration.json: not valid JSON", "--recalibrate"]),
    ("cal-not-utf8", cal_edit(lambda d: b"\xff\xfe{}"), ["--plan-only"], ["not valid JSON"]),
    ("cal-nested", cal_edit(lambda d: "[" * 100000), ["--plan-only"], ["not valid JSON"]),
    ("cal-array", cal_edit(lambda d: "[]"), ["--plan-only"],
     ["not a calibration written by trainscope-study coalloc"]),
    ("cal-nan-step", cal_edit(raw_number("NaN")), ["--plan-only"],
     ["NaN is not a number a calibration holds"]),
    ("cal-inf-step", cal_edit(raw_number("Infinity")), ["--plan-only"],
     ["Infinity is not a number a calibration holds"]),
    ("cal-zero-step", cal_edit(lambda d: step(d, 0)), ["--plan-only"],
     ["models[0] (cv): step_s['1'] = 0: a time in seconds, above 0"]),
    ("cal-negative-step", cal_edit(lambda d: step(d, -0.5, 1, "2")), ["--plan-only"],
     ["models[1] (llm): step_s['2'] = -0.5"]),
    ("cal-list-step", cal_edit(lambda d: step(d, [0.2])), ["--plan-only"],
     ["step_s['1'] = [0.2]: a time in seconds"]),
    ("cal-absurd-step", cal_edit(lambda d: step(d, 1e300)), ["--plan-only"],
     ["step_s['1'] = 1e+300", "at most 1e+06"]),
    ("cal-bool-stop", cal_edit(set_model("stop_s", True)), ["--plan-only"],
     ["stop_s = True: a time in seconds"]),
    ("cal-list-stop", cal_edit(set_model("stop_s", [1])), ["--plan-only"], ["stop_s = [1]"]),
    ("cal-string-restore", cal_edit(set_model("restore_s", "0.1", 1)), ["--plan-only"],
     ["models[1] (llm): restore_s = '0.1'"]),
    ("cal-negative-startup", cal_edit(lambda d: d["models"][0]["startup_s"].update({"2": -1})),
     ["--plan-only"], ["startup_s['2'] = -1: a time in seconds, at least 0"]),
    ("cal-step-not-object", cal_edit(set_model("step_s", 0.1)), ["--plan-only"],
     ["step_s = 0.1: an object of seconds by rank count"]),
    ("cal-unusable-count", cal_edit(lambda d: step(d, 0.1, 0, "3")), ["--plan-only"],
     ["step_s has a model for '3' rank(s), which the plan cannot run (its rank counts: 1, 2)"]),
    ("cal-missing-count", cal_edit(lambda d: d["models"][0]["step_s"].pop("2")),
     ["--plan-only"], ["step_s has no model for 2 rank(s)"]),
    ("cal-missing-job", cal_edit(lambda d: d["models"].pop()), ["--plan-only"],
     ["models: 1 job model(s) for the plan's 2 jobs"]),
    ("cal-swapped-jobs", cal_edit(lambda d: d["models"].reverse()), ["--plan-only"],
     ["models[0]: name 'llm', but the plan's job 1 is 'cv'"]),
    ("cal-model-not-object", cal_edit(lambda d: d["models"].__setitem__(0, 5)), ["--plan-only"],
     ["models[0]: int, not a job model"]),
    ("cal-iterations", cal_edit(set_model("iterations", 0)), ["--plan-only"],
     ["iterations = 0, but the plan's job has 10"]),
    ("cal-counts", cal_edit(set_model("counts", [1, 2, 3])), ["--plan-only"],
     ["counts = [1, 2, 3], but the plan's job has [1, 2]"]),
    ("cal-range", cal_edit(set_model("range", [1])), ["--plan-only"],
     ["range = [1]: an object of words by rank count"]),
    ("cal-oversized", lambda w: (w.calibration(), os.truncate(w.out / "calibration.json",
                                                             17 << 20)),
     ["--plan-only"], ["calibration.json: 17825792 bytes, more than a calibration holds"]),
]


@pytest.mark.parametrize("case", OUT_CASES, ids=[c[0] for c in OUT_CASES])
def test_out_and_calibration_are_checked_before_use(ws, capsys, case):
    _, prepare, args, fragments = case
    needs_two_cores()
    prepare(ws)
    before = snapshot(ws.root, ws.out)
    rc, out, err = cli(capsys, ws.plan, "--out", ws.out, *args)
    refused(rc, out, err, fragments)
    assert snapshot(ws.root, ws.out) == before
    assert not any(p.name.startswith(".") and ".tmp-" in p.name for p in ws.out.iterdir())


@pytest.mark.parametrize("name, args", [
    ("calibration.json", ["--plan-only"]),
    ("results.json", ["--plan-only"]),
    ("coalloc.sbatch", ["--scheduler", "slurm", "--dry-run"]),
    ("coalloc.lock", ["--plan-only"]),
])
def test_a_fifo_in_out_is_refused_without_hanging(ws, name, args):
    ws.calibration()
    (ws.out / name).unlink(missing_ok=True)
    os.mkfifo(ws.out / name)
    before = snapshot(ws.root, ws.out)
    p = subprocess.run([sys.executable, "-m", "trainscope_jobs.coalloc", str(ws.plan), "--out",
                        str(ws.out), *args], capture_output=True, text=True, timeout=60, env=ENV)
    refused(p.returncode, p.stdout, p.stderr, [f"{name} is a FIFO", "remove it"])
    assert snapshot(ws.root, ws.out) == before


def test_a_valid_calibration_is_reused_and_a_foreign_one_measured_again(ws, capsys):
    needs_two_cores()
    ws.calibration()
    rc, out, err = cli(capsys, ws.plan, "--out", ws.out, "--plan-only")
    assert rc == 0 and "calibration: reusing" in out and "predicted dynamic" in out, out + err
    # another plan's (the llm job runs 20 iterations there): measured again, never trusted;
    # here the stand-in binary fails the warm-up launch
    ws.jobs[1]["iterations"] = 20
    ws.write_plan()
    rc, out, err = cli(capsys, ws.plan, "--out", ws.out, "--plan-only")
    assert rc == 2 and "Traceback" not in out + err, out + err
    assert f"calibration: {ws.out / 'calibration.json'} was measured for another plan or " \
           "launcher (its jobs differ); measuring again" in out
    assert "failed in its warm-up launch" in err


def test_writes_replace_links_and_hard_links_instead_of_writing_through(ws, capsys):
    """A file the executor writes is a new file renamed over the old name: a hard link to a file
    outside --out (which check_out cannot tell from the executor's own file) is replaced, and
    the file it shared its data with keeps it."""
    ws.out.mkdir()
    os.link(ws.victim / "file", ws.out / "coalloc.sbatch")
    rc, out, err = cli(capsys, ws.plan, "--out", ws.out, "--scheduler", "slurm", "--dry-run")
    assert rc == 0, out + err
    assert (ws.victim / "file").read_text() == "sentinel\n"
    assert "#SBATCH --ntasks=2" in (ws.out / "coalloc.sbatch").read_text()


def test_nothing_is_deleted_or_written_through_a_link_placed_after_the_check(ws):
    """check_out refuses links before a run; a link placed while it runs (inside a directory the
    executor deletes and recreates, or where it writes a file) is not followed either."""
    from trainscope_jobs.coalloc import _clean, _write
    ws.out.mkdir()
    ws.link("calibration", ws.victim / "sub")
    before = snapshot(ws.root, ws.out)
    with pytest.raises(StudyError, match="calibration: a symbolic link .* remove the link"):
        _clean(ws.out / "calibration" / "warm-up", ws.out)
    (ws.out / "calibration").unlink()
    ws.link("results.json", ws.victim / "file")
    _write(ws.out / "results.json", "{}")
    assert snapshot(ws.root, ws.out) == before
    assert not (ws.out / "results.json").is_symlink()
    assert (ws.out / "results.json").read_text() == "{}"


def test_a_second_executor_on_one_out_is_refused_naming_the_first(ws, capsys):
    """The first executor holds <out>/coalloc.lock (flock) while its warm-up launch runs; a
    second one on the same --out is refused naming the first's pid, and changes nothing."""
    pidfile = ws.root / "launch.pid"
    ws.fake.write_text(f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 120\n")
    first = subprocess.Popen([sys.executable, "-m", "trainscope_jobs.coalloc", str(ws.plan),
                              "--out", str(ws.out)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        deadline = time.monotonic() + 60
        while not (pidfile.exists() and pidfile.read_text().strip()):
            assert first.poll() is None, first.communicate(timeout=30)
            assert time.monotonic() < deadline, "the first executor never launched"
            time.sleep(0.05)
        before = snapshot(ws.root, ws.out / "calibration")
        second = subprocess.run([sys.executable, "-m", "trainscope_jobs.coalloc", str(ws.plan),
                                 "--out", str(ws.out), "--plan-only"], capture_output=True,
                                text=True, timeout=60, env=ENV)
        rc, out, err = second.returncode, second.stdout, second.stderr
        refused(rc, out, err, [f"--out {ws.out} is in use by another co-allocation (pid "
                               f"{first.pid} on ", f"lock {ws.out / 'coalloc.lock'}",
                               "give another --out"])
        assert snapshot(ws.root, ws.out / "calibration") == before
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)
    # the lock went with the first executor: the next one gets past it (and here fails the
    # warm-up launch of the stand-in binary)
    ws.fake.write_text("#!/bin/sh\nexit 1\n")
    rc, out, err = cli(capsys, ws.plan, "--out", ws.out, "--plan-only")
    assert rc == 2 and "in use by another" not in err and "warm-up launch" in err, err


def test_a_lock_held_by_another_process_is_named(ws, capsys):
    ws.out.mkdir()
    lock = ws.out / "coalloc.lock"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "os.write(fd, b'pid %d on elsewhere, since then\\n' % os.getpid())\n"
        "time.sleep(120)\n"), str(lock)])
    try:
        deadline = time.monotonic() + 30
        while not lock.exists() or b"elsewhere" not in lock.read_bytes():
            assert time.monotonic() < deadline and holder.poll() is None
            time.sleep(0.05)
        rc, out, err = cli(capsys, ws.plan, "--out", ws.out, "--plan-only")
        refused(rc, out, err, [f"in use by another co-allocation (pid {holder.pid} on "
                               "elsewhere, since then; lock"])
        assert sorted(p.name for p in ws.out.iterdir()) == ["coalloc.lock"]
    finally:
        holder.kill()
        holder.wait(timeout=30)


@pytest.mark.parametrize("signals", [["SIGHUP"], ["SIGINT", "SIGINT"],
                                     ["SIGINT", "pause", "SIGINT"], ["SIGTERM", "pause", "SIGINT"],
                                     ["SIGINT", "pause", "SIGHUP", "SIGINT"]])
def test_every_signal_ends_every_launch(ws, signals):
    """SIGHUP (the terminal closed), and a second Ctrl-C while the first is still killing the
    launches, end the co-allocation as SIGTERM does: exit 130, no launch left running (each runs
    in a session of its own), no traceback. The launch takes 2 s to exit after SIGTERM, so that a
    signal 0.5 s after the first arrives while the executor waits for it."""
    pidfile = ws.root / "launch.pid"
    ws.fake.write_text(f"#!/bin/sh\necho $$ > {pidfile}\ntrap 'sleep 2; exit 143' TERM\n"
                       "while :; do sleep 0.1; done\n")
    proc = subprocess.Popen([sys.executable, "-m", "trainscope_jobs.coalloc", str(ws.plan),
                             "--out", str(ws.out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV)
    deadline = time.monotonic() + 60
    while not (pidfile.exists() and pidfile.read_text().strip()):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(proc.communicate(timeout=30))
        time.sleep(0.05)
    pid = int(pidfile.read_text())
    for s in signals:
        if s == "pause":
            time.sleep(0.5)
        elif proc.poll() is None:
            proc.send_signal(getattr(signal, s))
    out, err = proc.communicate(timeout=60)
    assert "Traceback" not in out + err, out + err
    assert proc.returncode == 130, out + err
    assert "interrupted; the jobs it started were killed" in err
    wait_until_gone(pid, signals)


# --- class 2: scheduler values and plan values that cannot work -----------------------------------
def plan_edit(change):
    def prepare(w):
        change(w)
        w.write_plan()
    return prepare


def job_set(key, value, job=0):
    return plan_edit(lambda w: w.jobs[job].__setitem__(key, value))


def top_set(key, value):
    return plan_edit(lambda w: w.top.__setitem__(key, value))


def ddp_config(w):
    ini = w.root / "ddp.ini"
    ini.write_text(f"# the quick start as plain DDP\n[run]\nstrategy = ddp   # every rank, "
                   "every sample\n")
    w.jobs[0]["configs"] = [str(QUICK), str(ini)]
    w.write_plan()


def nothing(w):
    pass


SLURM = ["--scheduler", "slurm", "--dry-run"]
PBS = ["--scheduler", "pbs", "--dry-run"]
SCHEDULER_CASES = [
    ("time-newline", nothing, [*SLURM, "--time", "00:10:00\n#SBATCH --qos=high"],
     ["--time '00:10:00\\n#SBATCH --qos=high' contains a line break"]),
    ("time-trailing-newline", nothing, [*SLURM, "--time", "00:10:00\n"], ["line break"]),
    ("time-arabic-digits", nothing, [*SLURM, "--time", "٠١:٠٠:٠٠"],
     ["--time", "outside printable ASCII", "look-alike digit"]),
    ("time-fullwidth-digits", nothing, [*PBS, "--time", "０１:００:００"],
     ["outside printable ASCII"]),
    ("time-format", nothing, [*SLURM, "--time", "1h"], ["--time '1h': use HH:MM:SS"]),
    ("time-zero", nothing, [*SLURM, "--time", "00:00:00"], ["not all zero"]),
    ("time-minutes", nothing, [*PBS, "--time", "01:99:00"], ["minutes and seconds below 60"]),
    ("directive-newline", nothing, [*SLURM, "--directive=--partition=gpu\n#SBATCH --qos=high"],
     ["--directive", "line break"]),
    ("directive-carriage-return", nothing, [*PBS, "--directive=-q debug\r#PBS -l x"],
     ["line break"]),
    ("directive-line-separator", nothing, [*SLURM, "--directive=--qos=a\u2028#SBATCH -x"],
     ["outside printable ASCII"]),
    ("directive-fullwidth", nothing, [*SLURM, "--directive=--partition=ｇｐｕ"],
     ["outside printable ASCII"]),
    ("directive-not-an-option", nothing, [*SLURM, "--directive=partition=gpu"],
     ["--directive 'partition=gpu': an option of sbatch or qsub"]),
    ("directive-local", nothing, ["--plan-only", "--directive=--partition=gpu"],
     ["--directive: for --scheduler slurm or pbs"]),
    ("time-local", nothing, ["--time", "01:00:00"], ["--time: for --scheduler slurm or pbs"]),
    ("dry-run-local", nothing, ["--dry-run"], ["--dry-run: for --scheduler slurm or pbs",
                                              "--plan-only"]),
    ("repeats-fullwidth", nothing, [*SLURM, "--repeats", "３"],
     ["--repeats '３': a whole number from 1 to 100 (ASCII digits)"]),
    ("repeats-zero", nothing, [*SLURM, "--repeats", "0"], ["--repeats '0'"]),
    ("repeats-large", nothing, [*SLURM, "--repeats", "1000"], ["--repeats '1000'"]),
    ("modes-twice", nothing, [*SLURM, "--modes", "equal,dynamic,equal"],
     ["equal given twice"]),
    ("modes-newline", nothing, [*SLURM, "--modes", "equal\n"], ["--modes 'equal\\n'"]),
    ("modes-unknown", nothing, [*SLURM, "--modes", "fastest"], ["--modes 'fastest'"]),
    ("out-percent", nothing, [*SLURM, "--out-suffix", "a%j"], ["no space, quote, '%'"]),
    ("out-space", nothing, [*PBS, "--out-suffix", "a b"], ["no space, quote, '%'"]),
    ("out-line-separator", nothing, ["--plan-only", "--out-suffix", "a\u2028b"],
     ["a plain directory name, one line"]),
    ("plan-name-newline", top_set("name", "x\n"), SLURM, ["name 'x\\n': letters, digits"]),
    ("job-name-newline", job_set("name", "cv\n"), SLURM, ["job 1: name 'cv\\n'"]),
    ("option-key-newline", job_set("options", {"train.lr\n": 1}), SLURM,
     ["option 'train.lr\\n': not a trainscope option name"]),
    ("option-value-separator", job_set("options", {"run.tag": "a\u2028b"}), SLURM,
     ["option run.tag = 'a\\u2028b': a one-line value"]),
    ("arrival-after-end", job_set("arrive", 600), [*SLURM, "--time", "00:10:00"],
     ["job cv arrives at 600 s, at or after the end of the allocation (--time 00:10:00 = "
      "600 s)", "raise --time"]),
    ("strategy-pipeline", job_set("options", {"run.strategy": "pipeline"}), SLURM,
     ["job cv: run.strategy = pipeline (from the job's options): elastic resume refuses it",
      "ddp-ds"]),
    ("strategy-from-config", ddp_config, SLURM, ["run.strategy = ddp (from ", "ddp.ini)"]),
    ("calibration-ranks-twice", top_set("calibration", {"ranks": [1, 1, 2]}), SLURM,
     ["calibration.ranks [1, 1, 2]: 1 given twice"]),
    ("plan-modes-twice", top_set("modes", ["equal", "equal"]), SLURM,
     ["modes ['equal', 'equal']: a list of distinct values"]),
    ("units-per-node-uneven", top_set("units_per_node", 3), SLURM,
     ["units_per_node = 3 for units = 2", "must divide units"]),
    ("units-per-node-local", top_set("units_per_node", 1), ["--plan-only"],
     ["units_per_node = 1 puts the 2 units on 2 nodes", "--scheduler slurm"]),
    ("units-per-node-pbs", top_set("units_per_node", 1), PBS,
     ["but PBS runs every job with mpirun on the cores of one node"]),
    ("gpus-without-gpu", nothing, ["--plan-only", "--gpus"],
     ["--gpus: the units are GPUs, 2 of them on this node, but it has 0", "drop --gpus"]),
]


@pytest.mark.parametrize("case", SCHEDULER_CASES, ids=[c[0] for c in SCHEDULER_CASES])
def test_scheduler_and_plan_values_are_refused_before_anything_is_written(
        ws, capsys, monkeypatch, case):
    _, prepare, args, fragments = case
    monkeypatch.setattr(coalloc, "gpu_count", lambda: 0)
    prepare(ws)
    out = ws.out
    if "--out-suffix" in args:
        i = args.index("--out-suffix")
        out = ws.root / args[i + 1]
        args = args[:i] + args[i + 2:]
    before = snapshot(ws.root, out)
    rc, text, err = cli(capsys, ws.plan, "--out", out, *args)
    refused(rc, text, err, fragments)
    assert snapshot(ws.root, out) == before and not out.exists()


def test_values_that_can_work_are_rendered(ws, capsys):
    """The same options, well-formed: units_per_node is honoured in Slurm's layout."""
    ws.top["units_per_node"] = 1
    ws.write_plan()
    rc, out, err = cli(capsys, ws.plan, "--out", ws.out, *SLURM, "--time", "1:30:00",
                       "--directive=--partition=gpu", "--directive=--qos=high", "--modes",
                       "dynamic, equal", "--repeats", "2")
    assert rc == 0, out + err
    text = (ws.out / "coalloc.sbatch").read_text()
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --time=1:30:00",
                 "#SBATCH --partition=gpu\n#SBATCH --qos=high\n",
                 "--inside --launcher srun --modes dynamic,equal --repeats 2"):
        assert line in text, (line, text)
    assert sum(line.startswith("#SBATCH") for line in text.splitlines()) == 9, text


# --- class 3: the planner's search ----------------------------------------------------------------
def many_jobs(n, units, arrive_step=0.0):
    def prepare(w):
        w.top = {"binary": str(w.fake), "units": units}
        w.jobs = [{"name": f"j{i}", "configs": [str(QUICK)], "iterations": 10 * (i + 1),
                   "global_batch": 64, "arrive": arrive_step * i} for i in range(n)]
        w.write_plan()
    return prepare


SEARCH_CASES = [
    ("static-8-jobs-64-units", many_jobs(8, 64), ["--plan-only", "--modes", "static"],
     ["the static mode's search of 8 jobs on 64 units would evaluate more than 200,000",
      "--modes equal,dynamic"]),
    ("plan-default-modes", many_jobs(8, 64), SLURM, ["static mode's search of 8 jobs on 64"]),
    ("dynamic-8-jobs-64-units", many_jobs(8, 64), [*SLURM, "--modes", "dynamic"],
     ["the dynamic mode's search of 8 jobs on 64 units", "--modes equal,static"]),
    ("dynamic-4-jobs-arriving", many_jobs(4, 8, 2.0), ["--plan-only", "--modes", "dynamic"],
     ["dynamic mode's search of 4 jobs on 8 units would evaluate more than 2,000,000"]),
]


@pytest.mark.parametrize("case", SEARCH_CASES, ids=[c[0] for c in SEARCH_CASES])
def test_a_search_above_its_bound_is_refused_at_once(ws, capsys, case):
    _, prepare, args, fragments = case
    prepare(ws)
    before = snapshot(ws.root, ws.out)
    rc, out, err = cli(capsys, ws.plan, "--out", ws.out, *args, limit=20)
    refused(rc, out, err, fragments)
    assert snapshot(ws.root, ws.out) == before and not ws.out.exists()


def test_a_mode_within_its_bound_still_runs(ws, capsys):
    """The 8-job plan with the equal split only: nothing to search, rendered."""
    many_jobs(8, 64)(ws)
    rc, out, err = cli(capsys, ws.plan, "--out", ws.out, *SLURM, "--modes", "equal")
    assert rc == 0, out + err


def model(name, iters, steps, arrive=0.0):
    return JobModel(name, iters, arrive, sorted(steps), dict(steps), {u: 1.0 for u in steps},
                    0.5, 0.2)


def test_the_planner_api_refuses_before_enumerating():
    steps = {u: 4.0 / u for u in (1, 2, 4, 8, 16, 32, 64)}
    ms = [model(f"j{i}", 10 * (i + 1), steps) for i in range(8)]
    with within(20), pytest.raises(StudyError, match="static mode's search of 8 jobs on 64"):
        best_static(ms, 64)
    with within(20), pytest.raises(StudyError, match="dynamic mode's search of 8 jobs on 64"):
        DynamicPolicy(ms, 64)
    # the equal split alone needs no search
    assert set(predict(ms, 64, modes=("equal",))) == {"equal"}


def test_counted_splits_are_the_enumerated_ones():
    from trainscope_jobs.coalloc import _splits, count_splits, search_size
    ms = [model("a", 10, {1: 1, 2: 1, 4: 1}), model("b", 10, {1: 1, 3: 1}),
          model("c", 10, {1: 1, 2: 1, 5: 1}, arrive=3.0)]
    for units in (3, 4, 6, 9):
        for active in ([0], [0, 1], [0, 1, 2]):
            assert count_splits([ms[j].counts for j in active], units, 10**9) == \
                len(list(_splits(active, ms, units)))
        # the dynamic bound holds what the search evaluates
        d = DynamicPolicy(ms, units)
        simulate(ms, units, d)
        bound = search_size([m.counts for m in ms], [m.arrive for m in ms], units, 10**9)
        d.evals = 0
        d._best(0.0, [coalloc.JState(float(m.iterations)) for m in ms])
        assert 0 < d.evals <= bound


def test_a_simulation_at_large_times_ends():
    """A tiny step time after a late arrival: the rounding of t + remainder x step left the job a
    remainder whose next event rounded back to t, and the simulation stepped in place forever;
    the job whose end is the event now ends there."""
    ms = [model("a", 3, {1: 1.0}), model("b", 999999, {1: 3e-9}, arrive=9.9e6)]
    with within(20):
        end, phases = simulate(ms, 2, static_policy({0: 1, 1: 1}))
    assert end == pytest.approx(9.9e6 + 1.0 + 999999 * 3e-9) and len(phases) == 2
