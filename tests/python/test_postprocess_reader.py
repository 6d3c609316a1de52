"""trainscope_post's reader refuses files that are not trainscope run files, with a message
naming the file, and the summary command exits non-zero for them instead of crashing."""

import subprocess
import sys

import h5py
import pytest

from trainscope_post import RunFile, SchemaError


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
