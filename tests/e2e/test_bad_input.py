"""Bad input on 2 real ranks: each case gives a clear message on every rank, a non-zero exit
within seconds (no hang), and no file that claims success."""

import os
import time

import h5py
import pytest

from conftest import ROOT

QUICK = ["--config", str(ROOT / "inputs/quickstart.ini")]


def both_ranks_said(proc, *needles):
    text = proc.stdout + proc.stderr
    for rank in (0, 1):
        lines = [l for l in text.splitlines() if l.startswith(f"[rank {rank}/2 ")]
        joined = "\n".join(lines)
        for n in needles:
            assert n in joined, f"rank {rank} did not report {n!r}:\n{text}"


def run_bad(run_ts, *args, timeout=60):
    t0 = time.monotonic()
    proc = run_ts(2, *QUICK, *args, timeout=timeout)
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert elapsed < 45, f"took {elapsed:.0f} s to fail"
    return proc


def test_unknown_option_is_named_with_a_suggestion(run_ts, tmp_path):
    proc = run_bad(run_ts, "--train.batchsize=3", f"--output.file={tmp_path}/x.h5")
    both_ranks_said(proc, "unknown option 'train.batchsize'", "did you mean 'train.batch_size'")
    assert not (tmp_path / "x.h5").exists()


def test_bad_value_names_key_value_and_allowed(run_ts, tmp_path):
    proc = run_bad(run_ts, "--run.strategy=zero3", f"--output.file={tmp_path}/x.h5")
    both_ranks_said(proc, "run.strategy = 'zero3'", "one of ddp-ds, ddp")
    proc = run_bad(run_ts, "--train.batch_size=-1", f"--output.file={tmp_path}/x.h5")
    both_ranks_said(proc, "train.batch_size = '-1'", "an integer")


def test_missing_dataset_names_path_and_package(run_ts, tmp_path):
    missing = tmp_path / "no-such-dir"
    proc = run_bad(run_ts, f"--data.path={missing}", f"--output.file={tmp_path}/x.h5")
    both_ranks_said(proc, str(missing), "dataset-fashion-mnist")
    # The run file, if created, must not claim success.
    if (tmp_path / "x.h5").exists():
        with h5py.File(tmp_path / "x.h5", "r") as f:
            status = f.attrs["status"]
            assert (status.decode() if isinstance(status, bytes) else status) != "completed"


def test_unwritable_output(run_ts, tmp_path):
    proc = run_bad(run_ts, f"--output.file={tmp_path}/missing/dir/x.h5")
    both_ranks_said(proc, f"{tmp_path}/missing/dir")
    proc = run_bad(run_ts, "--output.file=/proc/trainscope.h5")
    both_ranks_said(proc, "/proc/trainscope.h5")


def test_existing_output_is_not_overwritten(run_ts, tmp_path):
    out = tmp_path / "keep.h5"
    out.write_bytes(b"precious")
    proc = run_bad(run_ts, f"--output.file={out}")
    both_ranks_said(proc, str(out), "output.overwrite=true")
    assert out.read_bytes() == b"precious"


def test_batch_that_cannot_be_split(run_ts, tmp_path):
    proc = run_bad(run_ts, "--train.global_batch_size=101", f"--output.file={tmp_path}/x.h5")
    both_ranks_said(proc, "train.global_batch_size=101", "2 ranks", "multiple of 2")
    assert not (tmp_path / "x.h5").exists()


def test_scaling_study_points_are_checked(run_ts, tmp_path):
    """run.scaling (set by jobscripts/sweep): the point must keep the study's batch."""
    proc = run_bad(run_ts, "--run.scaling=strong", "--run.global_batch=65",
                   f"--output.file={tmp_path}/x.h5")
    both_ranks_said(proc, "run.global_batch=65 does not divide over 2 ranks")
    proc = run_bad(run_ts, "--run.scaling=weak", f"--output.file={tmp_path}/x.h5")
    both_ranks_said(proc, "run.scaling=weak needs run.batch_per_rank")
    proc = run_bad(run_ts, "--run.global_batch=64", f"--output.file={tmp_path}/x.h5")
    both_ranks_said(proc, "run.global_batch is set but run.scaling=none")
    proc = run_bad(run_ts, "--run.scaling=strong", "--run.global_batch=64",
                   "--train.batch_size=16", f"--output.file={tmp_path}/x.h5")
    both_ranks_said(proc, "remove --train.batch_size from the command line")
    assert not (tmp_path / "x.h5").exists()


def test_scaling_point_sets_the_per_rank_batch(run_ts, tmp_path):
    out = tmp_path / "strong.h5"
    proc = run_ts(2, *QUICK, "--run.scaling=strong", "--run.global_batch=48",
                  "--train.max_iters=3", "--log.every=0", f"--output.file={out}", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "placement: 2 rank(s) on 1 node(s)" in proc.stdout
    with h5py.File(out, "r") as f:
        assert int(f["config"].attrs["train.batch_size"]) == 24  # the INI's 64 replaced
        assert (f["iterations/samples"][...] == 24).all()
        assert int(f["summary"].attrs["global_batch_samples"]) == 48


def test_malformed_config_file(run_ts, tmp_path):
    bad = tmp_path / "bad.ini"
    bad.write_text("[train\nbatch_size = 3\n")
    proc = run_bad(run_ts, "--config", bad, f"--output.file={tmp_path}/x.h5")
    both_ranks_said(proc, str(bad))


def test_dry_run_prints_the_plan_and_writes_nothing(run_ts, tmp_path):
    out = tmp_path / "dry.h5"
    proc = run_ts(2, *QUICK, "--dry-run", f"--output.file={out}", timeout=120)
    assert proc.returncode == 0, proc.stderr
    for needle in ("2 on 1 node", "rank 0", "rank 1", "64 per rank x 2 = 128", "700490 parameters",
                   "iterations per epoch", "memory/rank"):
        assert needle in proc.stdout, proc.stdout
    assert not out.exists()


def test_help_and_version(run_ts):
    proc = run_ts(1, "--help", timeout=60)
    assert proc.returncode == 0
    assert "--train.batch_size=<integer" in proc.stdout and "(default: 64)" in proc.stdout
    assert "[output]" in proc.stdout and "--output.overwrite" in proc.stdout
    proc = run_ts(1, "--version", timeout=60)
    assert proc.returncode == 0 and "libtorch: 2." in proc.stdout
