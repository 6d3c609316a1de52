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
import pytest

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


@pytest.mark.parametrize("per_rank", ["all", "auto", None])
def test_a_16384_rank_run_file_is_written_and_read_back(tmp_path, per_rank):
    """per_rank: output.per_rank of the writer since issue 39 point 1 (auto: every 512th rank
    has rows, 32 of them; aggregates over all ranks), None: the layout before it."""
    t0 = time.monotonic()
    path = syn.write_run(tmp_path / "world16k.h5", syn.Law(), ranks=WORLD, nodes=WORLD // 4,
                         iterations=12, warmup=2, per_rank=per_rank, noise=0.01)
    written = time.monotonic() - t0
    big = {k: n for k, n in attribute_sizes(path).items() if n > 1}
    assert not big, f"attributes with more than one element: {big}"
    rows_of = 32 if per_rank == "auto" else WORLD
    with RunFile(path) as run:  # the reader's structural checks walk every series
        assert run.world_size == WORLD
        detail = run.detail_ranks()
        assert detail.tolist() == (list(range(0, WORLD, 512)) if per_rank == "auto"
                                   else list(range(WORLD)))
        rows = run.rank_rows()
        assert rows.shape == (rows_of,) and np.all(rows == 12)
        step = run.recorded("step_s")
        assert step.shape == (rows_of, 12) and np.isfinite(step).all()
        assert run.measured("step_s").shape == (rows_of, 10)
        assert "rank_rows" not in run.columns("iterations")
        assert "ranks" not in run.columns("iterations")
        assert len(run.ranks()) == WORLD
        assert run.has_aggregate() == (per_rank is not None)
        # Over all ranks, whichever layout: the detail rows lie within min..max, count = world.
        lo, hi = run.over_ranks("step_s", field="min"), run.over_ranks("step_s", field="max")
        assert lo.shape == hi.shape == (10,)
        assert np.all(lo <= run.measured("step_s").min(axis=0))
        assert np.all(hi >= run.measured("step_s").max(axis=0))
        assert np.all(run.over_ranks("step_s", field="count") == WORLD)
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "trainscope_post", "summary", str(path)],
                         capture_output=True, text=True, timeout=600)
    print(f"16,384-rank file ({per_rank}): written in {written:.1f} s, "
          f"{path.stat().st_size / 2**20:.0f} MiB; trainscope-post summary "
          f"{time.monotonic() - t0:.1f} s")
    assert out.returncode == 0, out.stderr
    assert "world16k.h5" in out.stdout and "16384" in out.stdout


def test_report_on_16384_ranks_x_1000_iterations_names_the_ranks_it_shows(tmp_path):
    """Issue 39 (f), scaled down to 1,000 iterations: `trainscope-post report` on a 16,384-rank
    file in the default output.per_rank mode (auto = every:512, 32 ranks with rows; aggregates
    over all 16,384) completes, names the ranks its per-rank figures show, and finds the
    straggler, a rank WITHOUT per-rank rows, through the aggregates. The full size (10,000
    iterations) is measured in docs/scaling.md."""
    iterations, straggler = 1000, 5462  # 5462 = 16384 // 3 + 1: not a multiple of 512
    t0 = time.monotonic()
    path = syn.write_large_run(tmp_path / "runs" / "world16k.h5", WORLD, iterations,
                               straggler=(straggler, 1.3))
    written = time.monotonic() - t0
    with RunFile(path) as run:
        assert run.detail_ranks().tolist() == list(range(0, WORLD, 512))
        assert run.per_rank_mode() == "auto"
        arg = run.measured_aggregate("step_s", field="argmax")
        assert arg.shape == (iterations - 5,) and np.all(arg == straggler)
        # the aggregates hold every rank, the rows the 32: consistent with each other
        rows = run.measured("backward_s")
        assert np.all(run.measured_aggregate("backward_s", field="max") >= rows.max(axis=0))
        assert np.all(run.measured_aggregate("backward_s", field="min") <= rows.min(axis=0))
        assert np.all(run.measured_aggregate("backward_s", field="slowest") ==
                      run.measured_aggregate("backward_s", field="max"))
    html = tmp_path / "report.html"
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "trainscope_post", "report",
                          str(tmp_path / "runs"), "-o", str(html)],
                         capture_output=True, text=True, timeout=600)
    took = time.monotonic() - t0
    print(f"16,384 x {iterations}: written in {written:.1f} s "
          f"({path.stat().st_size / 2**20:.0f} MiB), report in {took:.1f} s")
    assert out.returncode == 0, out.stdout + out.stderr
    page = html.read_text()
    assert "per-rank rows of 32 of 16384 ranks" in page
    assert "ranks 0, 512, 1024, ..., 15872" in page
    assert "id='fig-steps_0'" in page and "id='fig-heatmap_0'" in page
    assert f"<td>{straggler}</td>" in page  # the imbalance table's slowest rank, all ranks
    assert took < 120, f"report took {took:.0f} s"


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


def test_step_figures_of_a_subset_show_the_rows_it_has_and_the_slowest_rank_it_lacks(tmp_path):
    """output.per_rank=every:16 at 64 ranks: rows for ranks 0, 16, 32, 48; the straggler, rank 7,
    has none, and the aggregates still name it. The same run in the old layout (every rank's
    rows) draws its slowest rank as a line."""
    from trainscope_post import plots
    from trainscope_post.study import load, step_view

    args = dict(law=syn.Law(), ranks=64, nodes=16, noise=0.02, seed=5, iterations=30, warmup=3,
                straggler=(7, 0.01))
    new = syn.write_run(tmp_path / "new" / "r.h5", per_rank="every:16", **args)
    old = syn.write_run(tmp_path / "old" / "r.h5", per_rank=None, **args)
    view = step_view(load([new]).runs[0])
    assert view.ranks.tolist() == [0, 16, 32, 48] and view.world == 64 and view.subset
    assert view.step.shape == (4, 30) and view.hi.shape == (30,) and view.from_aggregates
    fig = plots.steps_figure(view.step, view.warmup, "subset", view)
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert "slowest rank per iteration (rank 7 in 100% of the measured)" in labels
    assert "mean over all 64 ranks" in labels
    assert {f"rank {r}" for r in (0, 16, 32, 48)} <= {lab.split(" (")[0] for lab in labels}
    assert "rank 7" not in [lab.split(" (")[0] for lab in labels]  # it has no rows to draw
    heat = plots.heatmap_figure(view.step, view.warmup, "subset", view)
    ax = heat.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["0", "16", "32", "48"]
    assert "4 of 64 ranks" in ax.get_ylabel() and "4 of 64 ranks" in ax.get_title()

    full = step_view(load([old]).runs[0])
    assert not full.subset and not full.from_aggregates
    assert np.allclose(full.hi, view.hi) and np.all(full.argmax == view.argmax)
    labels = [line.get_label() for line in
              plots.steps_figure(full.step, full.warmup, "old", full).axes[0].get_lines()]
    assert "rank 7 (slowest)" in labels and "median over 64 ranks" in labels


def test_report_says_which_ranks_each_file_has_rows_of(tmp_path):
    """A report over files of three layouts: a subset (every:5 of 20), none (0 of 40) and one
    written before issue 39 point 1 (all 8 ranks, no aggregates)."""
    runs = tmp_path / "runs"
    syn.write_run(runs / "subset.h5", syn.Law(), 20, 5, noise=0.05, per_rank="every:5", epochs=2)
    syn.write_run(runs / "none.h5", syn.Law(), 40, 10, noise=0.05, per_rank="none", seed=1,
                  config={"run.precision": "fp32"})
    syn.write_run(runs / "old.h5", syn.Law(), 8, 2, noise=0.05, per_rank=None, seed=2,
                  config={"run.precision": "bf16"})
    html = tmp_path / "report.html"
    out = subprocess.run([sys.executable, "-m", "trainscope_post", "report", str(runs), "-o",
                          str(html)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    page = html.read_text()
    assert "per-rank rows of 4 of 20 ranks (output.per_rank=every:5; ranks 0, 5, 10, 15)" in page
    assert "none.h5: no per-rank rows (output.per_rank=none)" in page
    assert "heat map (a straggler is a bright row); all 8 ranks" in page
    assert "The file holds per-rank rows of 4 of 20 ranks" in page
    assert "The file holds no per-rank rows (output.per_rank=none)" in page
    assert page.count("Imbalance over all") == 2  # the two files with aggregates
    # figures: every run's step figure, heat maps only where there are rows
    assert page.count("id='fig-steps_") == 3 and page.count("id='fig-heatmap_") == 2
