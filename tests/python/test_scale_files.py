"""Issue 39 (a): a run file of a 16,384-rank world, laid out as the writer lays it out
(tests/python/synthetic_runs.py: per-rank series [16384, n] in chunks of 64 ranks, rows per rank in
the dataset <group>/rank_rows), is written and read back by the readers and by `trainscope-post
summary`, and no attribute in it has a size that depends on the world size: HDF5 refuses an
object-header message above 64 KiB, which the attribute rank_rows (int64[N]) reached at 8,184
ranks. The binary's own files are checked for the same property at 1-4 ranks in
tests/mpi/test_run_file.cpp (FlushCostsAtMostFiveGlobalCollectivesAndNoSync)."""

import subprocess
import sys
import time

import h5py
import numpy as np

import synthetic_runs as syn
from trainscope_post import RunFile

WORLD = 16384


def attribute_sizes(path):
    sizes = {}

    def visit(name, obj):
        for key, value in obj.attrs.items():
            sizes[f"/{name}@{key}"] = np.size(value)

    with h5py.File(path, "r") as f:
        for key, value in f.attrs.items():
            sizes[f"/@{key}"] = np.size(value)
        f.visititems(visit)
    return sizes


def test_a_16384_rank_run_file_is_written_and_read_back(tmp_path):
    t0 = time.monotonic()
    path = syn.write_run(tmp_path / "world16k.h5", syn.Law(), ranks=WORLD, nodes=WORLD // 4,
                         iterations=12, warmup=2)
    written = time.monotonic() - t0
    big = {k: n for k, n in attribute_sizes(path).items() if n > 1}
    assert not big, f"attributes with more than one element: {big}"
    with RunFile(path) as run:  # the reader's structural checks walk every series
        assert run.world_size == WORLD
        rows = run.rank_rows()
        assert rows.shape == (WORLD,) and np.all(rows == 12)
        step = run.recorded("step_s")
        assert step.shape == (WORLD, 12) and np.isfinite(step).all()
        assert run.measured("step_s").shape == (WORLD, 10)
        assert "rank_rows" not in run.columns("iterations")
        assert len(run.ranks()) == WORLD
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "trainscope_post", "summary", str(path)],
                         capture_output=True, text=True, timeout=600)
    print(f"16,384-rank file: written in {written:.1f} s, "
          f"{path.stat().st_size / 2**20:.0f} MiB; trainscope-post summary "
          f"{time.monotonic() - t0:.1f} s")
    assert out.returncode == 0, out.stderr
    assert "world16k.h5" in out.stdout and "16384" in out.stdout


def test_figures_at_4096_ranks_bin_the_heat_map_and_show_the_slowest_ranks():
    """Issue 39 point 4: per-rank lines, boxes and heat-map rows stop at MAX_RANK_LINES and
    MAX_HEATMAP_ROWS ranks; the slowest ranks stay visible."""
    from trainscope_post import plots

    rng = np.random.default_rng(0)
    ranks, iterations, warmup, straggler = 4096, 60, 5, 2049
    step = 0.1 + 0.002 * rng.standard_normal((ranks, iterations))
    step[straggler, warmup:] += 0.05
    t0 = time.monotonic()
    fig = plots.heatmap_figure(step, warmup, "wide")
    image = fig.axes[0].get_images()[0].get_array()
    assert image.shape == (plots.MAX_HEATMAP_ROWS, iterations)
    row = straggler * plots.MAX_HEATMAP_ROWS // ranks
    measured = np.asarray(image)[:, warmup:]
    assert np.argmax(measured.mean(axis=1)) == row  # the bin holding the straggler is brightest
    assert "slowest" in fig.axes[0].get_ylabel()

    fig = plots.steps_figure(step, warmup, "wide")
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert f"rank {straggler} (slowest)" in labels
    assert len(labels) <= plots.TOP_RANKS + 1  # the slowest ranks and the median over ranks
    assert len(fig.axes[1].patches) <= 64  # a histogram of the ranks' means, not 4096 boxes
    print(f"4096-rank figures in {time.monotonic() - t0:.1f} s")

    small = plots.heatmap_figure(step[:8], warmup, "narrow")
    assert small.axes[0].get_images()[0].get_array().shape == (8, iterations)
