"""Reads run files written by io_runfile_writer (tests/mpi/io_runfile_writer.cpp) under mpirun with
h5py and h5dump: a completed run, and a run SIGKILLed after a flush, which must still open, say
status=running and hold exactly the flushed rows. Skips when the helper binary was not built.
Build directory: $TRAINSCOPE_BUILD_DIR (default /work/main/build)."""
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from trainscope_jobs.launch import MPIRUN as MPIRUN_NAME, launch_env, mpirun_command

h5py = pytest.importorskip("h5py")

BUILD_DIR = Path(os.environ.get("TRAINSCOPE_BUILD_DIR", "/work/main/build"))
NP = 2
COLUMNS = ["iteration", "epoch", "t_start", "data_s", "h2d_s", "forward_s", "backward_s",
           "comm_wait_s", "optimizer_s", "step_s", "loss", "samples", "tokens", "lr", "mem_bytes"]


def find_writer():
    for candidate in [BUILD_DIR / "tests" / "io_runfile_writer", *BUILD_DIR.glob("**/io_runfile_writer")]:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


WRITER = find_writer()
MPIRUN = shutil.which(MPIRUN_NAME)
pytestmark = [
    pytest.mark.skipif(WRITER is None, reason=f"io_runfile_writer not built under {BUILD_DIR}"),
    pytest.mark.skipif(MPIRUN is None, reason="mpirun not found"),
]


def run_writer(path, rows, flush_every, mode):
    return subprocess.run(mpirun_command(NP, WRITER, path, rows, flush_every, mode),
                          env=launch_env(OMP_NUM_THREADS="1"), capture_output=True, text=True,
                          timeout=120)


def expected_row(rank, i):
    values = rank * 1000.0 + i + np.arange(len(COLUMNS)) / 100.0
    values[0] = i
    return values


def check_series(f, rows, exact=True):
    """exact: a file whose status was set (extents are the longest rank's rows); otherwise a
    running file, whose extent grew in steps of the chunk rows (64 by default) and whose slots
    beyond each rank's rows are NaN."""
    group = f["iterations"]
    longest = rows + NP - 1
    extent = longest if exact else -(-longest // 64) * 64
    assert group.attrs["rows"] == extent
    assert list(group["rank_rows"][()]) == [rows + r for r in range(NP)]
    assert "rank_rows" not in group.attrs  # a dataset since issue 39
    assert group.attrs["columns"] == ",".join(COLUMNS)
    table = np.stack([group[c][()] for c in COLUMNS], axis=-1)  # (rank, row, column)
    assert table.shape == (NP, extent, len(COLUMNS))
    for r in range(NP):
        n = rows + r
        expected = np.stack([expected_row(r, i) for i in range(n)])
        np.testing.assert_array_equal(table[r, :n], expected)
        assert np.isnan(table[r, n:]).all()
    assert group["forward_s"].attrs["units"] == "s"
    assert group["samples"].attrs["units"] == "samples"
    assert group["loss"].chunks == (NP, 64)  # every rank's rows in one chunk, 64 rows
    assert group["loss"].maxshape == (NP, None)


def test_completed_run_reads_with_h5py(tmp_path):
    path = tmp_path / "run.h5"
    result = run_writer(path, rows=23, flush_every=5, mode="completed")
    assert result.returncode == 0, result.stderr
    assert "mean_flush_ms=" in result.stdout
    with h5py.File(path, "r") as f:
        assert f.attrs["schema"] == "trainscope/1"
        assert f.attrs["status"] == "completed"
        assert "finished_utc" in f.attrs
        assert f.attrs["world_size"] == NP
        assert f.attrs["workload"] == "io_runfile_writer"
        assert f["config"].attrs["train.lr"] == 0.1
        assert f["config"].attrs["train.epochs"] == 2
        assert f["config/ini"].asstr()[()] == "[train]\nlr = 0.1\nepochs = 2\n"
        assert f["config/ini"].attrs["units"] == "text"
        ranks = f["ranks"][()]
        assert list(ranks["rank"]) == list(range(NP))
        assert [d.decode() for d in ranks["cpu_affinity"]] == [str(r) for r in range(NP)]
        assert [d.decode() for d in ranks["device"]] == ["cpu"] * NP
        assert all(pid > 0 for pid in ranks["pid"])
        check_series(f, rows=23)


def test_killed_run_leaves_readable_file_with_flushed_rows(tmp_path):
    path = tmp_path / "killed.h5"
    result = run_writer(path, rows=17, flush_every=4, mode="kill")
    assert result.returncode != 0, "the writer should have been killed"
    assert "mean_flush_ms=" in result.stdout, result.stderr
    if shutil.which("h5dump"):
        dump = subprocess.run(["h5dump", "-H", str(path)], capture_output=True, text=True,
                              timeout=60)
        assert dump.returncode == 0, dump.stderr
        assert 'DATASET "loss"' in dump.stdout
    with h5py.File(path, "r") as f:
        assert f.attrs["status"] == "running"  # never completed: a reader sees the crash
        assert "finished_utc" not in f.attrs
        assert "flushed_utc" in f.attrs
        # Exactly the flushed rows: the 3 rows buffered after the last flush are lost (the
        # writer's RunFile syncs at every flush: set_sync_interval's default 0).
        check_series(f, rows=17, exact=False)
