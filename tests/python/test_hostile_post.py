"""trainscope-post under hostile input (issue 26): damaged or hand-made run files, outputs that
would overwrite run files or inputs, FIFOs, mixed workloads and impossible step times. Every case
asserts the exit code, a one-line message naming the file or option, no traceback, and that no
input was changed or lost."""

import math
import os
import stat
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from synthetic_runs import Law, write_run

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(ROOT / "postprocess"))


def post(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "trainscope_post", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=ENV)


def snapshot(d: Path) -> dict:
    out = {}
    for p in d.rglob("*"):
        st = p.lstat()
        out[str(p)] = (st.st_size, st.st_mtime_ns) if stat.S_ISREG(st.st_mode) else None
    return out


def refused(proc, *fragments, code=2):
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text, text
    assert proc.returncode == code, text
    for f in fragments:
        assert f in proc.stderr, (f, proc.stderr)


@pytest.fixture
def study(tmp_path):
    """Three completed runs of one configuration at 1, 2 and 4 ranks (weak scaling recorded)."""
    root = tmp_path / "study"
    for p in (1, 2, 4):
        write_run(root / f"n{p}" / "run.h5", Law(), p, 1, {"run.scaling": "strong"})
    return root


def damaged(study: Path, change) -> Path:
    f = study / "n2" / "run.h5"
    with h5py.File(f, "r+") as h:
        change(h)
    return f


def set_attr(group, key, value):
    return lambda h: h[group].attrs.__setitem__(key, value)


def replace_series(group, name, data):
    def change(h):
        del h[group][name]
        h[group].create_dataset(name, data=data)
    return change


def iterations_as_dataset(h):
    del h["iterations"]
    h.create_dataset("iterations", data=np.zeros(4))


BAD_FILES = [
    ("summary-string", set_attr("summary", "median_step_s", "fast"), "/summary@median_step_s"),
    ("summary-array", set_attr("summary", "median_step_s", np.arange(3.0)),
     "/summary@median_step_s"),
    ("world-size-string", set_attr("/", "world_size", "two"), "world_size"),
    ("world-size-zero", set_attr("/", "world_size", 0), "world_size"),
    ("status-number", set_attr("/", "status", 3), "attribute status"),
    ("series-1d", replace_series("iterations", "loss", np.zeros(5)), "/iterations/loss"),
    ("series-strings", replace_series("iterations", "loss", np.array([[b"a"], [b"b"]])),
     "/iterations/loss"),
    ("series-wrong-ranks", replace_series("iterations", "loss", np.zeros((7, 3))),
     "/iterations/loss"),
    ("iterations-dataset", iterations_as_dataset, "/iterations is a dataset"),
    ("rank-rows-negative", replace_series("iterations", "rank_rows", np.array([-1, 2])),
     "/iterations/rank_rows"),
    ("rank-rows-too-many", replace_series("iterations", "rank_rows", np.array([10**6, 10**6])),
     "/iterations/rank_rows"),
    ("rank-rows-float", replace_series("iterations", "rank_rows", np.array([0.5, 1.5])),
     "/iterations/rank_rows"),
    # A file written before issue 39 carries the counts as an attribute; still checked.
    ("rank-rows-attribute-negative", lambda h: (h["iterations"].__delitem__("rank_rows"),
                                                h["iterations"].attrs.__setitem__(
                                                    "rank_rows", np.array([-1, 2]))),
     "/iterations@rank_rows"),
]


@pytest.mark.parametrize("case", BAD_FILES, ids=[c[0] for c in BAD_FILES])
@pytest.mark.parametrize("command", ["summary", "report", "memory"])
def test_a_malformed_run_file_is_skipped_by_name(study, case, command):
    name, change, fragment = case
    f = damaged(study, change)
    before = snapshot(study)
    args = [study, "-o", study.parent / "r.html"] if command == "report" else [study]
    if command == "memory":
        args += ["--out", study.parent / "fig"]
    proc = post(command, *args)
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text, text
    assert proc.returncode == 1, text  # done with the others, the bad one skipped
    line = next(x for x in proc.stderr.splitlines() if fragment in x)
    assert str(f) in line and "skipped" in line, proc.stderr
    assert snapshot(study) == before


def test_every_file_malformed_is_a_clean_error(tmp_path):
    f = tmp_path / "only.h5"
    write_run(f, Law(), 2, 1)
    with h5py.File(f, "r+") as h:
        h["summary"].attrs["median_step_s"] = "x"
    proc = post("scaling", f)
    refused(proc, "no completed runs to scale")
    assert str(f) in proc.stderr


@pytest.mark.parametrize("command", ["summary", "report", "scaling", "export"])
def test_a_fifo_named_like_a_run_file_never_blocks(study, command):
    fifo = study / "n4" / "fifo.h5"
    os.mkfifo(fifo)
    extra = {"export": ["-o", study.parent / "x.csv"], "report": ["-o", study.parent / "r.html"],
             "scaling": ["--out", study.parent / "fig"]}.get(command, [])
    proc = post(command, study, *extra, timeout=120)
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text and proc.returncode == 1, text
    assert f"{fifo}: not a regular file" in proc.stderr


@pytest.mark.parametrize("command,option", [("export", "-o"), ("report", "-o")])
def test_output_onto_a_run_file_is_refused_and_the_run_file_survives(study, command, option):
    target = study / "n1" / "run.h5"
    data = target.read_bytes()
    args = [study, option, target] if command == "report" else [study, option, target]
    refused(post(command, *args), f"{target}", "HDF5 file")
    assert target.read_bytes() == data


def test_export_onto_another_hdf5_file_outside_the_inputs_is_refused(study, tmp_path):
    other = tmp_path / "other.h5"
    write_run(other, Law(), 1, 1)
    data = other.read_bytes()
    refused(post("export", study / "n1" / "run.h5", "-o", other), "HDF5 file")
    assert other.read_bytes() == data


@pytest.mark.parametrize("command,option", [("export", "-o"), ("report", "-o"),
                                            ("summary", "--csv"), ("model", "--out")])
def test_a_file_output_that_is_a_directory_is_refused(study, tmp_path, command, option):
    d = tmp_path / "adir"
    d.mkdir()
    args = {"report": [study]}.get(command, [study])
    refused(post(command, *args, option, d), option, "is a directory")
    assert list(d.iterdir()) == []


def test_a_figure_directory_that_is_a_file_is_refused(study, tmp_path):
    f = tmp_path / "notadir"
    f.write_text("keep")
    refused(post("memory", study, "--out", f), "--out", "not a directory")
    assert f.read_text() == "keep"


def test_csv_onto_a_run_file_is_refused(study):
    target = study / "n4" / "run.h5"
    data = target.read_bytes()
    refused(post("summary", study, "--csv", target), "--csv", "HDF5 file")
    assert target.read_bytes() == data


def test_output_in_a_missing_directory_is_refused(study, tmp_path):
    refused(post("export", study, "-o", tmp_path / "no" / "such" / "x.csv"),
            "does not exist")


def test_output_with_a_control_character_is_refused(study, tmp_path):
    refused(post("export", study, "-o", tmp_path / "a\tb.csv"), "control character")


@pytest.mark.parametrize("fmt", ["tensorboard", "thicket"])
def test_a_directory_export_onto_a_file_is_refused_and_the_file_survives(study, tmp_path, fmt):
    target = tmp_path / "notes.txt"
    target.write_text("keep")
    refused(post("export", study, "--format", fmt, "-o", target), "-o/--output", str(target),
            "not a directory", f"--format {fmt}")
    assert target.read_text() == "keep"
    run = study / "n1" / "run.h5"  # nor onto a run file
    data = run.read_bytes()
    refused(post("export", study, "--format", fmt, "-o", run), "not a directory")
    assert run.read_bytes() == data


def test_tensorboard_export_without_tensorboard_says_how_to_get_it(study, tmp_path):
    # A Python on which `import tensorboard` fails, as where the package is not installed.
    code = ("import sys; sys.modules['tensorboard'] = None; "
            "from trainscope_post.cli import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", code, "export", str(study), "--format",
                           "tensorboard", "-o", str(tmp_path / "tb")],
                          capture_output=True, text=True, timeout=120, env=ENV)
    refused(proc, "--format tensorboard needs the tensorboard package", "scripts/setup")
    assert not (tmp_path / "tb").exists()


def test_thicket_export_skips_a_run_without_per_rank_rows_and_says_so(study, tmp_path):
    none = tmp_path / "none" / "run.h5"
    write_run(none, Law(), 4, 1, per_rank="none")
    proc = post("export", study / "n2" / "run.h5", none, "--format", "thicket", "-o",
                tmp_path / "tk")
    refused(proc, f"{none}: no per-rank phase times", code=1)
    assert sorted(p.name for p in (tmp_path / "tk").rglob("*.json")) == ["run.json"]


def test_compare_refuses_to_average_different_workloads(study, tmp_path):
    llm = tmp_path / "llm.h5"
    write_run(llm, Law(tokens_per_sample=128.0), 2, 1)
    with h5py.File(llm, "r+") as h:
        h.attrs["workload"] = "llm"
    refused(post("compare", study, llm, "--by", "ranks"), "different workloads",
            "add workload to --by")


@pytest.mark.parametrize("value", [-0.5, 0.0, math.nan, math.inf])
def test_advise_refuses_impossible_step_times(study, value):
    f = damaged(study, set_attr("summary", "median_step_s", value))
    refused(post("advise", study, "--gpus-per-node", "4", "--max-nodes", "2"),
            f"{f}", "median_step_s", "not a positive step time")


def test_advise_jobs_with_a_huge_gpu_count_answers_in_bounded_time(study, tmp_path):
    other = tmp_path / "other"
    for p in (1, 2, 4):
        write_run(other / f"n{p}" / "run.h5", Law(), p, 1)
    proc = post("advise", "--jobs", study, other, "--gpus", "65536", "--gpus-per-node", "8",
                timeout=120)
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text and proc.returncode == 0, text
    assert "to keep the search bounded" in proc.stdout


def test_mode_comes_from_the_runs(tmp_path):
    root = tmp_path / "weak"
    for p in (1, 2, 4):
        law = Law(global_batch=16 * p)  # weak: the batch per rank stays 16
        write_run(root / f"n{p}" / "run.h5", law, p, 1, {"run.scaling": "weak"})
    proc = post("scaling", root, "--out", tmp_path / "fig")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("weak scaling"), proc.stdout
    mixed = tmp_path / "mixed.h5"
    write_run(mixed, Law(), 2, 1, {"run.scaling": "strong"})
    refused(post("scaling", root, mixed), "strong and weak scaling together", "--mode")


def test_include_incomplete_advice_is_not_given_when_it_was_used(tmp_path):
    f = tmp_path / "run.h5"
    write_run(f, Law(), 2, 1)
    with h5py.File(f, "r+") as h:
        h.attrs["status"] = "failed"
        del h["summary"]
    proc = post("scaling", f, "--include-incomplete")
    refused(proc, "no runs with a /summary")
    assert "unless --include-incomplete" not in proc.stderr
