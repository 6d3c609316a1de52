"""trainscope_post's reader refuses files that are not trainscope run files, with a message
naming the file, and the summary command exits non-zero for them instead of crashing."""

import re
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


def test_text_summary_attributes_are_read_and_text_in_a_number_is_refused(tmp_path):
    # A GPU run writes /summary@mfu_peak_basis as text ("bf16 tensor cores (autocast)"): the
    # first GPU runs' files were refused by every reader until the text attributes came from the
    # schema instead of a list of one.
    path = small_run(tmp_path / "gpu.h5", "completed")
    with h5py.File(path, "a") as f:
        f["summary"].attrs.update(mfu_peak_basis="bf16 tensor cores (autocast)",
                                  straggler_ranks="1", warning="few iterations", mfu=0.41)
    with RunFile(path) as run:
        assert run.summary["mfu_peak_basis"] == "bf16 tensor cores (autocast)"
        assert run.summary["mfu"] == pytest.approx(0.41)
    with h5py.File(path, "a") as f:
        f["summary"].attrs["mfu"] = "0.41"
    with pytest.raises(SchemaError, match=r"gpu.h5.*/summary@mfu = .*expected a number"):
        RunFile(path)


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


# --- issue 39 point 1: per-rank rows of a subset of ranks, aggregates over all of them ---------
import synthetic_runs as syn  # noqa: E402
from trainscope_post import schema  # noqa: E402
from trainscope_post.runfile import DamagedRunError  # noqa: E402

FIELDS = ("min", "mean", "max", "argmax", "count", "slowest")


def pair(tmp_path, mode, **kw):
    """The same run (same seed: the same values for every rank) written in output.per_rank=mode
    and in the layout before issue 39 point 1 (every rank's rows, no aggregates)."""
    args = dict(law=syn.Law(), ranks=20, nodes=5, noise=0.05, seed=3, iterations=12, warmup=2,
                epochs=3, straggler=(7, 0.01), **kw)
    return (syn.write_run(tmp_path / f"{mode}.h5", per_rank=mode, **args),
            syn.write_run(tmp_path / "old.h5", per_rank=None, **args))


@pytest.mark.parametrize("mode,ranks", [("every:5", [0, 5, 10, 15]), ("node", [0, 4, 8, 12, 16]),
                                        ("none", []), ("all", list(range(20))),
                                        ("auto", list(range(20)))])
def test_subset_rows_are_the_detail_ranks_and_statistics_cover_every_rank(tmp_path, mode, ranks):
    new, old = pair(tmp_path, mode)
    with RunFile(new) as run, RunFile(old) as full:
        assert run.detail_ranks().tolist() == ranks
        assert full.detail_ranks().tolist() == list(range(20))  # no ranks dataset: every rank
        assert run.has_aggregate() and run.has_aggregate(schema.EPOCHS)
        assert not full.has_aggregate()
        assert run.per_rank_mode() == mode and full.per_rank_mode() == "all"
        # rows j of the subset are rows ranks[j] of the full file
        assert run.measured("step_s").shape == (len(ranks), 10)
        assert run.recorded("step_s").tolist() == full.recorded("step_s")[ranks].tolist()
        assert run.rank_rows().tolist() == [12] * len(ranks)
        assert run.rank_rows(schema.COMM_BUCKETS).shape == (len(ranks),)
        # across ranks: the aggregates of the subset file equal the reduction of every rank's rows
        for group, col in ((schema.ITERATIONS, "step_s"), (schema.ITERATIONS, "backward_s"),
                           (schema.EPOCHS, "val_loss"), (schema.EPOCHS, "epoch_s")):
            for window in ("measured", "recorded"):
                for f in FIELDS:
                    got = run.over_ranks(col, group, f, window)
                    want = full.over_ranks(col, group, f, window)
                    assert got.shape == want.shape and np.allclose(got, want, equal_nan=True), \
                        (group, col, window, f)
        assert np.all(run.over_ranks("step_s", field="argmax") == 7)  # the straggler
        assert np.all(run.over_ranks("step_s", field="count") == 20)
        assert run.measured_aggregate("step_s").tolist() == \
            run.aggregate("step_s")[2:].tolist()  # the warm-up left out
        assert run.aggregate("step_s", field=None).dtype.names == FIELDS
        assert run.slowest_by() == "step_s" and run.slowest_by(schema.EPOCHS) == "epoch_s"
        with pytest.raises(KeyError, match="no dataset /comm/buckets/aggregate/bucket_0_s"):
            run.aggregate("bucket_0_s", schema.COMM_BUCKETS)
        with pytest.raises(KeyError, match="no dataset /iterations/aggregate/step_s"):
            full.aggregate("step_s")
        with pytest.raises(KeyError, match="'ranks' is not a column"):
            run.measured("ranks")
        assert run.summary_row()["iters"] == full.summary_row()["iters"]


def test_a_file_being_written_reads_the_aggregated_rows_only(tmp_path):
    """aggregate@rows < the aggregate's extent while a run is written: the rows beyond are not
    every rank's yet and are not read; an interrupted run's iteration count comes from it."""
    path = syn.write_run(tmp_path / "r.h5", syn.Law(), 20, 5, per_rank="every:5", iterations=12,
                         warmup=2, status="running")
    with h5py.File(path, "r+") as f:
        f["iterations/aggregate"].attrs["rows"] = np.int64(9)
        del f["summary"]  # a killed job's file has none
    with RunFile(path) as run:
        assert run.aggregate("step_s").shape == (9,)
        assert run.measured_aggregate("step_s").shape == (7,)
        assert run.summary_row()["iters"] == 9


def damage(path, change):
    with h5py.File(path, "r+") as f:
        change(f)
    return path


def replace(group, name, data):
    def change(f):
        del f[group][name]
        f[group].create_dataset(name, data=data)
    return change


BAD_SUBSETS = [
    ("ranks-descending", replace("iterations", "ranks", np.array([5, 0, 10, 15])),
     re.escape("/iterations/ranks = [5, 0, 10, 15], expected strictly ascending")),
    ("ranks-beyond-world", replace("iterations", "ranks", np.array([0, 5, 10, 20])),
     re.escape("/iterations/ranks = [0, 5, 10, 20], expected strictly ascending ranks in "
               "[0, world_size=20)")),
    ("ranks-float", replace("iterations", "ranks", np.array([0.0, 5.0, 10.0, 15.0])),
     "/iterations/ranks is shape"),
    ("ranks-fewer-than-rows", replace("iterations", "ranks", np.array([0, 5, 10])),
     r"/iterations/backward_s has shape \(4, 12\).*expected numbers of shape "
     r"\[len\(/iterations/ranks\)=3, rows\]"),
    ("rank-rows-of-world", replace("iterations", "rank_rows", np.full(20, 12)),
     "/iterations/rank_rows = .*expected 4 integers"),
    ("buckets-ranks-descending", replace("comm/buckets", "ranks", np.array([15, 10, 5, 0])),
     "/comm/buckets/ranks"),
    ("buckets-rank-rows-of-world", replace("comm/buckets", "rank_rows", np.full(20, 12)),
     "/comm/buckets/rank_rows has 20 values, expected len"),
    ("ranks-table-of-another-world", replace("/", "ranks", np.arange(16)),
     re.escape("/ranks has shape (16,), expected [world_size=20] rows")),
    ("aggregate-not-compound", replace("iterations/aggregate", "step_s", np.zeros(12)),
     "/iterations/aggregate/step_s has shape"),
    ("aggregate-rows-negative",
     lambda f: f["iterations/aggregate"].attrs.__setitem__("rows", np.int64(-1)),
     "/iterations/aggregate@rows"),
]


@pytest.mark.parametrize("case", BAD_SUBSETS, ids=[c[0] for c in BAD_SUBSETS])
def test_a_subset_file_whose_rows_and_ranks_disagree_is_refused_by_name(tmp_path, case):
    name, change, message = case
    path = damage(syn.write_run(tmp_path / f"{name}.h5", syn.Law(), 20, 5, per_rank="every:5"),
                  change)
    with pytest.raises(DamagedRunError, match=f"{name}.h5: {message}"):
        RunFile(path)
