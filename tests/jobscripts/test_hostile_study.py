"""jobscripts/study under hostile input (issue 26): every bad study file, --out and study
directory is refused with one line that names the key, option or file, exit 2 (status: 3 when a
point is not completed), never a traceback, and nothing is written outside the study directory or
deleted inside it. No case needs the binary to run: they stop before anything is launched."""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("TRAINSCOPE_BUILD_DIR", ROOT / "build"))
STUDY = ROOT / "jobscripts" / "study"
QUICK = ROOT / "inputs" / "quickstart.ini"


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string (escapes \n, \t, quotes)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


def base() -> dict:
    return {
        "top": {"name": "hostile", "reproduces": "hostile input for the study runner",
                "configs": [str(QUICK)]},
        "scale": {"ranks": [1, 2], "mode": "strong", "global_batch": 8},
        "scheduler": {"binary": str(BUILD / "app" / "trainscope")},
        "axes": [{"option": "run.precision", "values": ["fp32"]}],
    }


def write_study(path: Path, doc: dict) -> Path:
    lines = [f"{k} = {toml_value(v)}" for k, v in doc["top"].items()]
    if "axes" in doc and not isinstance(doc["axes"], list):
        lines.append(f"axes = {toml_value(doc['axes'])}")
    for table in ("scale", "scheduler"):
        if table in doc:
            lines.append(f"[{table}]")
            lines += [f"{k} = {toml_value(v)}" for k, v in doc[table].items()]
    axes = doc.get("axes")
    if isinstance(axes, list):
        for ax in axes:
            lines.append("[[axes]]")
            lines += [f"{k} = {toml_value(v)}" for k, v in ax.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def snapshot(*dirs: Path, skip: Path | None = None) -> set:
    """Every path under dirs (ROOT: its top level and studies/ only), with size and mtime."""
    seen = set()
    for d in dirs:
        if d == ROOT:
            entries = list(ROOT.iterdir()) + list((ROOT / "studies").rglob("*")
                                                  if (ROOT / "studies").exists() else [])
        else:
            entries = list(d.rglob("*"))
        for p in entries:
            if skip is not None and (p == skip or skip in p.parents):
                continue
            st = p.lstat()
            seen.add((str(p), st.st_size if stat.S_ISREG(st.st_mode) else -1,
                      st.st_mtime_ns if stat.S_ISREG(st.st_mode) else 0))
    return seen


def study(*args, timeout=120):
    return subprocess.run([sys.executable, str(STUDY), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def refused(proc, *fragments, code=2):
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text, text
    assert proc.returncode == code, text
    for f in fragments:
        assert f in text, (f, text)
    # One line of error on stderr.
    assert len([line for line in proc.stderr.splitlines() if line.strip()]) == 1, proc.stderr


def edit(section, key, value):
    def apply(doc):
        if section == "top":
            doc["top"][key] = value
        elif section == "axis":
            doc["axes"][0][key] = value
        else:
            doc[section][key] = value
    return apply


def set_axes(axes):
    def apply(doc):
        doc["axes"] = axes
    return apply


def drop(section, key):
    def apply(doc):
        doc[section].pop(key, None)
    return apply


# (id, change to the base study, fragments of the one-line error)
BAD_STUDIES = [
    # Security: paths that leave the study directory, values that add job-script lines.
    ("name-dotdot", edit("top", "name", ".."), ["name '..'", "no directory of its own"]),
    ("name-dot", edit("top", "name", "."), ["name '.'", "no directory of its own"]),
    ("name-three-dots", edit("top", "name", "..."), ["no directory of its own"]),
    ("axis-label-dotdot", set_axes([{"name": "x", "values": [{"label": "..", "options": {}}]}]),
     ["axis x label '..'", "no directory of its own"]),
    ("axis-value-dotdot", set_axes([{"option": "run.tag", "values": [".."]}]),
     ["axis run.tag value '..'", "no directory of its own"]),
    ("partition-newline", edit("scheduler", "partition", "gpu\n#SBATCH --qos=high"),
     ["[scheduler] partition", "line break"]),
    ("account-newline", edit("scheduler", "account", "acct\n#PBS -l walltime=99:00:00"),
     ["[scheduler] account", "line break"]),
    ("qos-carriage-return", edit("scheduler", "qos", "normal\r#SBATCH -x"),
     ["[scheduler] qos", "line break"]),
    ("extra-newline", edit("scheduler", "extra", ["--exclusive\n#SBATCH --mem=0"]),
     ["[scheduler] extra", "line break"]),
    ("time-newline", edit("scheduler", "time", "00:10:00\necho owned"),
     ["[scheduler] time", "line break"]),
    ("option-newline", edit("top", "options", {"run.tag": "a\nrm -rf ~"}),
     ["option run.tag", "line break"]),
    ("binary-newline", edit("scheduler", "binary", "/bin/true\n#SBATCH -A x"),
     ["[scheduler] binary", "line break"]),
    ("config-name-newline", edit("top", "configs", ["a.ini\n#SBATCH -A x"]),
     ["configs", "line break"]),
    # Wrong TOML types: refused, never coerced.
    ("repeats-string", edit("scale", "repeats", "3"), ["[scale] repeats = '3'", "an integer"]),
    ("repeats-float", edit("scale", "repeats", 2.7), ["[scale] repeats = 2.7", "an integer"]),
    ("repeats-bool", edit("scale", "repeats", True), ["[scale] repeats = True", "an integer"]),
    ("repeats-zero", edit("scale", "repeats", 0), ["[scale] repeats = 0", "at least 1"]),
    ("cpus-string", edit("scale", "cpus_per_task", "2"), ["[scale] cpus_per_task", "an integer"]),
    ("cpus-negative", edit("scale", "cpus_per_task", -2), ["[scale] cpus_per_task", "at least 1"]),
    ("global-batch-string", edit("scale", "global_batch", "8"),
     ["[scale] global_batch = '8'", "an integer"]),
    ("global-batch-negative", edit("scale", "global_batch", -8),
     ["[scale] global_batch = -8", "at least 1"]),
    ("ranks-per-node-negative", edit("scale", "ranks_per_node", -1),
     ["[scale] ranks_per_node = -1", "at least 1"]),
    ("gpus-string-false", edit("scale", "gpus", "false"), ["[scale] gpus", "true or false"]),
    ("serialize-string", edit("scheduler", "serialize", "yes"),
     ["[scheduler] serialize", "true or false"]),
    ("single-process-string",
     set_axes([{"name": "dp", "values": [{"label": "one", "single_process": "false"}]}]),
     ["single_process", "true or false"]),
    ("time-int", edit("scheduler", "time", 30), ["[scheduler] time = 30", "a string"]),
    ("time-format", edit("scheduler", "time", "30min"), ["[scheduler] time", "HH:MM:SS"]),
    ("array-threshold-negative", edit("scheduler", "array_threshold", -1),
     ["[scheduler] array_threshold", "at least 0"]),
    ("signal-string", edit("scheduler", "signal_secs", "60"),
     ["[scheduler] signal_secs", "an integer"]),
    ("site-int", edit("scheduler", "site", 5), ["[scheduler] site", "a string"]),
    ("site-missing", edit("scheduler", "site", "nowhere"), ["[scheduler] site = 'nowhere'"]),
    ("paper-int", edit("top", "paper", 5), ["paper", "a string"]),
    ("configs-int", edit("top", "configs", 5), ["configs = 5", "a file name or a list"]),
    ("options-list", edit("top", "options", ["run.tag"]), ["options must be a table"]),
    ("axes-string", set_axes("x"), ["axes are [[axes]] tables"]),
    ("axis-options-string", set_axes([{"name": "x", "values": [{"label": "a", "options": "y"}]}]),
     ["axis x: options = 'y'", "a table"]),
    ("axis-name-int", set_axes([{"name": 3, "values": ["fp32"], "option": "run.precision"}]),
     ["[[axes]] #1 name = 3", "a string"]),
    ("option-value-table", edit("top", "options", {"run.tag": {"a": 1}}),
     ["option run.tag", "a string, number or boolean"]),
    # Study keys named, not the sweep's flags.
    ("weak-without-batch", lambda d: d["scale"].update(mode="weak"),
     ["[scale] mode = \"weak\" needs batch_per_rank"]),
    ("batch-not-dividing", lambda d: d["scale"].update(ranks=[4], global_batch=6),
     ["[scale] global_batch 6 does not divide over 4 ranks"]),
    ("ranks-uneven", lambda d: d["scale"].update(ranks=[3, 4], ranks_per_node=2),
     ["[scale] ranks 3 does not split evenly", "[scale] ranks_per_node 2"]),
    # Sizes that would render without limit.
    ("repeats-million", edit("scale", "repeats", 1000000), ["2000000 points", "limit of 10000"]),
    ("axes-product", set_axes([{"option": f"x.k{i}", "values": list(range(30))}
                               for i in range(3)]), ["54000 points", "limit of 10000"]),
    ("not-toml", None, ["not valid TOML"]),
]


@pytest.mark.parametrize("case", BAD_STUDIES, ids=[c[0] for c in BAD_STUDIES])
def test_a_bad_study_file_is_refused_with_its_key_and_nothing_is_written(tmp_path, case):
    name, change, fragments = case
    inputs = tmp_path / "in"
    inputs.mkdir()
    f = inputs / "study.toml"
    if change is None:
        f.write_text("name = \"x\nreproduces = 1\n")
    else:
        doc = base()
        change(doc)
        write_study(f, doc)
    out = tmp_path / "out" / "deep"
    before = snapshot(tmp_path, ROOT)
    for sched in ("slurm", "pbs"):
        proc = study("run", f, "--scheduler", sched, "--out", out, "--dry-run", timeout=60)
        refused(proc, *fragments)
        if name != "not-toml":
            assert str(f) in proc.stderr  # the study file is named
    assert snapshot(tmp_path, ROOT) == before  # nothing written anywhere, in or out
    assert not (tmp_path / "out").exists()


def test_a_dotdot_name_without_out_writes_nothing_in_the_repository(tmp_path):
    """The default --out is studies/<name>: a name of '..' once rendered into the repository."""
    doc = base()
    doc["top"]["name"] = ".."
    f = write_study(tmp_path / "s.toml", doc)
    before = snapshot(ROOT)
    refused(study("run", f, "--scheduler", "slurm", "--dry-run"), "no directory of its own")
    assert snapshot(ROOT) == before


@pytest.fixture
def good(tmp_path):
    return write_study(tmp_path / "good.toml", base())


def test_out_that_is_a_file_is_refused(tmp_path, good):
    target = tmp_path / "file.txt"
    target.write_text("keep me\n")
    refused(study("run", good, "--scheduler", "slurm", "--out", target, "--dry-run"),
            f"--out {target}: exists and is not a directory")
    assert target.read_text() == "keep me\n"


def test_out_holding_other_run_files_is_refused_and_they_survive(tmp_path, good):
    out = tmp_path / "mine"
    (out / "a" / "b").mkdir(parents=True)
    run = out / "a" / "b" / "run.h5"
    run.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 64)
    refused(study("run", good, "--scheduler", "local", "--out", out),
            "not a study directory (no study.json)", "a/b/run.h5", "nothing was changed")
    assert run.read_bytes().startswith(b"\x89HDF")
    assert sorted(p.name for p in out.rglob("*")) == ["a", "b", "run.h5"]


@pytest.mark.parametrize("bad", ["with\ttab", "with\nnewline"])
def test_out_with_control_characters_is_refused(tmp_path, good, bad):
    before = snapshot(tmp_path)
    refused(study("run", good, "--scheduler", "slurm", "--out", tmp_path / bad, "--dry-run"),
            "--out", "control character")
    assert snapshot(tmp_path) == before


def rendered(tmp_path, good) -> Path:
    out = tmp_path / "study"
    proc = study("run", good, "--scheduler", "local", "--out", out, "--dry-run")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


@pytest.mark.parametrize("content,fragment", [
    ("{not json", "corrupt"),
    ("\xff\xfe", "corrupt"),
    ('{"points": [1, 2]}', "not a study.json written by jobscripts/study"),
    ('{"points": [{"run_dir": 5}]}', "not a study.json written by jobscripts/study"),
    ("[]", "not a study.json written by jobscripts/study"),
])
def test_a_corrupt_study_json_is_named_by_status_and_run(tmp_path, good, content, fragment):
    out = rendered(tmp_path, good)
    (out / "study.json").write_bytes(content.encode("latin-1"))
    refused(study("status", out), f"{out / 'study.json'}", fragment)
    refused(study("run", good, "--scheduler", "local", "--out", out, "--dry-run"), fragment)


def test_status_of_a_file_or_a_directory_without_study_json(tmp_path):
    f = tmp_path / "x.txt"
    f.write_text("x")
    refused(study("status", f), "not a directory")
    refused(study("status", tmp_path), "no study.json here")


@pytest.mark.parametrize("pid,detail", [("-1", "not a process id"), ("abc", "not a process id"),
                                        ("", "not a process id"),
                                        ("99999999999", "not a process id")])
def test_a_bad_job_pid_is_a_failed_point_not_pending_forever(tmp_path, good, pid, detail):
    out = rendered(tmp_path, good)
    doc = json.loads((out / "study.json").read_text())
    d = Path(doc["points"][0]["run_dir"])
    (d / "job.id").write_text("local -\n")
    (d / "job.pid").write_text(pid + "\n")
    proc = study("status", out)
    assert "Traceback" not in proc.stderr and proc.returncode == 3, proc.stdout + proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.split()[:1] == ["0"])
    assert "failed" in line and detail in line, line


def test_fifos_in_a_study_directory_do_not_hang_status(tmp_path, good):
    out = rendered(tmp_path, good)
    doc = json.loads((out / "study.json").read_text())
    d = Path(doc["points"][0]["run_dir"])
    os.mkfifo(d / "run.h5")
    (d / "job.id").write_text("local -\n")
    os.mkfifo(d / "job.pid")
    proc = study("status", out, timeout=60)
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.split()[:1] == ["0"])
    assert "failed" in line and "not a regular file" in line, line


def test_a_fifo_study_json_does_not_hang_status(tmp_path):
    os.mkfifo(tmp_path / "study.json")
    refused(study("status", tmp_path, timeout=60), "not a regular file")


def test_status_json_onto_a_directory_is_refused(tmp_path, good):
    out = rendered(tmp_path, good)
    refused(study("status", out, "--json", tmp_path), "--json", "is a directory", code=2)
