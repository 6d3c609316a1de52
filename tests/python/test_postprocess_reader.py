"""trainscope_post's reader refuses files that are not trainscope run files, with a message
naming the file, and the summary command exits non-zero for them instead of crashing."""

import subprocess
import sys

import h5py
import numpy as np
import pytest

from trainscope_post import IncompleteRunError, RunFile, SchemaError


def test_not_hdf5(tmp_path):
    bad = tmp_path / "notes.h5"
    bad.write_text("not an HDF5 file")
    with pytest.raises(SchemaError, match="notes.h5"):
        RunFile(bad)


def test_other_schema(tmp_path):
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f.attrs["schema"] = "someone-else/3"
    with pytest.raises(SchemaError, match="someone-else/3"):
        RunFile(other)


def test_summary_command_reports_bad_files(tmp_path):
    bad = tmp_path / "bad.h5"
    bad.write_bytes(b"\x00" * 64)
    out = subprocess.run([sys.executable, "-m", "trainscope_post", "summary", str(bad)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "bad.h5" in out.stderr


def small_run(path, status, rank_rows=(5, 4), legacy=False):
    """A 2-rank run file as the binary lays it out, written with h5py: 5 iteration slots per rank,
    of which each rank filled rank_rows (the dataset /iterations/rank_rows; legacy: the attribute
    of files written before issue 39)."""
    with h5py.File(path, "w") as f:
        f.attrs.update(schema="trainscope/1", status=status, world_size=2, workload="cv")
        f.create_group("config").attrs["profile.warmup_iters"] = "1"
        f.create_group("plan").attrs["parameters"] = 1234
        f.create_group("summary").attrs["median_step_s"] = 0.25
        it = f.create_group("iterations")
        if legacy:
            it.attrs["rank_rows"] = list(rank_rows)
        else:
            it.create_dataset("rank_rows", data=np.asarray(rank_rows, dtype=np.int64))
        it.create_dataset("step_s", data=[[0.1, 0.2, 0.3, 0.4, 0.5], [1.1, 1.2, 1.3, 1.4, 0.0]])
    return path


def test_recorded_reads_the_rows_every_rank_wrote(tmp_path):
    with RunFile(small_run(tmp_path / "r.h5", "completed")) as run:
        step = run.recorded("step_s")
        assert step.shape == (2, 4) and step.dtype == float
        assert step[1].tolist() == [1.1, 1.2, 1.3, 1.4]  # rank 1's empty slot is left out
        assert run.plan == {"parameters": 1234}
        assert run.require_completed() is run
        with pytest.raises(KeyError, match="r.h5.*iterations/loss"):
            run.recorded("loss")


def test_files_before_issue_39_keep_rank_rows_as_an_attribute(tmp_path):
    for legacy in (False, True):
        with RunFile(small_run(tmp_path / f"r{legacy}.h5", "completed", legacy=legacy)) as run:
            assert run.rank_rows().tolist() == [5, 4]
            assert run.recorded("step_s").shape == (2, 4)
            assert run.columns("iterations") == ["step_s"]  # the index is not a column


def test_require_completed_names_the_file_and_status(tmp_path):
    with RunFile(small_run(tmp_path / "died.h5", "running")) as run:
        with pytest.raises(IncompleteRunError, match="died.h5.*'running'"):
            run.require_completed()


def test_paths_may_be_absolute_or_relative_and_a_misspelt_column_is_named(tmp_path):
    from trainscope_post import schema
    with RunFile(small_run(tmp_path / "r.h5", "completed")) as run:
        assert run.recorded("step_s", schema.ITERATIONS).shape == (2, 4)
        assert run.recorded("step_s", "iterations").shape == (2, 4)
        assert run.rank_rows(schema.ITERATIONS).tolist() == [5, 4]
        assert run.attrs(schema.PLAN) == run.attrs("plan") == {"parameters": 1234}
        assert run.has(schema.child(schema.ITERATIONS, "step_s"))
        # A schema column this (older) file lacks: empty, as before.
        assert run.measured("control_s").shape == (2, 0) and run.units("control_s") == ""
        with pytest.raises(KeyError, match="r.h5.*no dataset /iterations/loss"):
            run.recorded("loss")
        # A name that is no column of the schema: KeyError naming it, not an empty result.
        for read in (run.measured, run.recorded, run.units):
            with pytest.raises(KeyError, match="'stepp_s' is not a column of /iterations"):
                read("stepp_s")
        with pytest.raises(KeyError, match="'loss' is not a column of /epochs"):
            run.measured("loss", schema.EPOCHS)
