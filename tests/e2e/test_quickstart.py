"""The quickstart configuration on 2 real MPI ranks, cut to a few iterations; the run file's
structure and values checked with h5py and h5dump, and the summary printer run on it."""

import datetime
import re
import subprocess
import sys

import h5py
import numpy as np
import pytest

from conftest import ROOT

ITERS = 12
WARMUP = 5
PHASES = ["data_s", "h2d_s", "forward_s", "backward_s", "comm_wait_s", "optimizer_s", "step_s"]


@pytest.fixture(scope="module")
def quickstart_file(tmp_path_factory, trainscope):
    """One run serves every test of this file: the quickstart cut to ITERS iterations, flushed
    and logged every 4, with evaluation, the profiler window (iterations 6-7, with a trace) and
    fast telemetry sampling (one run instead of a plain and a profiled one)."""
    out = tmp_path_factory.mktemp("e2e") / "quick.h5"
    from conftest import mpirun_cmd

    proc = subprocess.run(
        mpirun_cmd(2, "--config", ROOT / "inputs/quickstart.ini", f"--output.file={out}",
                   f"--train.max_iters={ITERS}", "--output.flush_every=4", "--log.every=4",
                   f"--profile.warmup_iters={WARMUP}", "--profile.enabled=true",
                   "--profile.start_iter=6", "--profile.iters=2", "--profile.trace=true",
                   "--telemetry.interval_ms=50"),
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, proc


def test_progress_is_printed_by_rank_zero(quickstart_file):
    _, proc = quickstart_file
    lines = [l for l in proc.stdout.splitlines() if "samples/s  ETA" in l]
    assert len(lines) == ITERS // 4
    assert all(l.startswith("[rank 0/2 ") for l in lines)
    assert f"iter {ITERS}/{ITERS}" in lines[-1] and "ETA" in lines[-1]
    # Every line carries its UTC time (spdlog's pattern, milliseconds), in order, within the run.
    stamp = re.compile(r"\[rank \d+/2 [^\]]+\] (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})Z ")
    times = []
    for line in (proc.stdout + proc.stderr).splitlines():
        if line.startswith("[rank "):
            m = stamp.match(line)
            assert m, line
            times.append(datetime.datetime.fromisoformat(m.group(1)))
    progress = [datetime.datetime.fromisoformat(stamp.match(l).group(1)) for l in lines]
    assert progress == sorted(progress)
    now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    assert all(now - datetime.timedelta(hours=1) < t <= now for t in times)


def test_root_attributes_and_status(quickstart_file):
    path, _ = quickstart_file
    with h5py.File(path, "r") as f:
        a = f.attrs
        assert a["schema"].decode() if isinstance(a["schema"], bytes) else a["schema"] == "trainscope/1"
        text = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in a.items()}
        assert text["schema"] == "trainscope/1"
        assert text["status"] == "completed"
        assert int(text["world_size"]) == 2 and int(text["num_nodes"]) == 1
        assert text["workload"] == "cv"
        assert "quickstart.ini" in text["command_line"]
        assert text["created_utc"].endswith("Z") or "+" in text["created_utc"]


def test_config_build_and_ranks(quickstart_file):
    path, _ = quickstart_file
    with h5py.File(path, "r") as f:
        cfg = {k: (v.decode() if isinstance(v, bytes) else str(v)) for k, v in f["config"].attrs.items()}
        assert cfg["run.strategy"] == "ddp-ds"
        assert cfg["train.max_iters"] == str(ITERS)
        assert cfg["data.dataset"] == "fashion-mnist"
        ini = f["config/ini"][()]
        ini = ini.decode() if isinstance(ini, bytes) else str(ini)
        assert "[train]" in ini and f"max_iters = {ITERS}" in ini
        build = {k: (v.decode() if isinstance(v, bytes) else str(v)) for k, v in f["build"].attrs.items()}
        for key in ("compiler", "libtorch", "cuda", "nccl", "mpi", "hdf5", "git_sha"):
            assert build[key], key
        assert build["libtorch"].startswith("2.")
        ranks = f["ranks"][...]
        assert list(ranks["rank"]) == [0, 1]
        assert all(d.decode() == "cpu" for d in ranks["device"])
        assert len(set(ranks["pid"])) == 2


def test_iteration_series(quickstart_file):
    path, _ = quickstart_file
    with h5py.File(path, "r") as f:
        it = f["iterations"]
        for name in PHASES + ["loss", "samples", "lr", "host_rss_bytes", "comm_bytes"]:
            ds = it[name]
            assert ds.shape == (2, ITERS), name
            assert ds.attrs["units"] not in (b"", ""), name
        step = it["step_s"][...]
        assert np.all(step > 0)
        phases = sum(it[p][...] for p in PHASES[:-1])
        assert np.all(phases <= step * 1.001 + 1e-4)  # phases nest inside the step
        assert np.all(phases >= 0.5 * step)             # and account for most of it
        assert np.array_equal(it["iteration"][0], np.arange(ITERS))
        assert np.all(it["samples"][...] == 64)
        loss = it["loss"][...]
        assert np.all(np.isfinite(loss)) and np.all(loss > 0)
        assert loss[0, 0] == pytest.approx(np.log(10), rel=0.3)  # untrained 10-class model
        # Gradients of every fp32 parameter are reduced every iteration.
        params = int(f["plan"].attrs["parameters"])
        assert np.all(it["comm_bytes"][...] == params * 4)
        # Training state on CPU: fp32 weights and gradients, AdamW's two moments per parameter.
        assert np.all(it["parameter_bytes"][...] == params * 4)
        assert np.all(it["gradient_bytes"][...] == params * 4)
        assert np.all(it["optimizer_state_bytes"][...] == 2 * params * 4)
        assert f["iterations/step_s"].attrs["units"] in (b"s", "s")
        assert np.all(it["host_rss_bytes"][...] > 50e6)
        assert np.all(np.isnan(it["device_allocated_bytes"][...]))  # CPU run: not measured


def test_epochs_and_summary(quickstart_file):
    path, _ = quickstart_file
    with h5py.File(path, "r") as f:
        assert f["epochs/val_accuracy"].shape[0] == 2
        acc = f["epochs/val_accuracy"][...]
        assert np.all((acc > 0.05) & (acc <= 1.0))
        assert acc[0, 0] == acc[1, 0]  # reduced across ranks: identical everywhere
        s = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f["summary"].attrs.items()}
        assert s["measured_iterations"] == ITERS - WARMUP
        assert s["total_iterations"] == ITERS
        step = f["iterations/step_s"][...][:, WARMUP:]
        assert s["median_step_s"] == pytest.approx(np.median(step.mean(axis=0)))
        assert s["median_slowest_rank_step_s"] == pytest.approx(np.median(step.max(axis=0)))
        assert s["throughput_samples_per_s"] == pytest.approx(128 / s["median_step_s"])
        assert 0 <= s["rank_step_imbalance"] < 1
        # The tool's own cost: the preamble's sync (the first flush always syncs) is part of
        # flush_total_s and of flush_sync_total_s; the flushes at iterations (flush_s, in the
        # row after each) are part of flush_total_s.
        assert s["flush_syncs"] >= 1 and s["flushes"] > s["flush_syncs"]
        assert 0 < s["flush_sync_total_s"] < s["flush_total_s"]
        at_iterations = f["iterations/flush_s"][...]
        assert np.all(at_iterations.sum(axis=1) <= s["flush_total_s"] + 1e-9)
        assert np.count_nonzero(at_iterations[0]) >= ITERS // 4 - 1


def test_model_matches_torchvision(quickstart_file):
    """The plan's parameter count equals torchvision's MobileNetV2 with the same width/classes."""
    torchvision = pytest.importorskip("torchvision")
    path, _ = quickstart_file
    with h5py.File(path, "r") as f:
        width = float(f["config"].attrs["cv.width_mult"])
        params = int(f["plan"].attrs["parameters"])
    ref = torchvision.models.mobilenet_v2(width_mult=width, num_classes=10)
    assert params == sum(p.numel() for p in ref.parameters())


def test_h5dump_reads_the_header(quickstart_file, h5dump):
    path, _ = quickstart_file
    out = subprocess.run([h5dump, "-H", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for group in ("/config", "/build", "/ranks", "/iterations", "/epochs", "/summary"):
        assert group.strip("/") in out.stdout


def test_summary_command(quickstart_file):
    path, _ = quickstart_file
    out = subprocess.run([sys.executable, "-m", "trainscope_post", "summary", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    header, row = out.stdout.splitlines()[:2]
    assert "median step [s]" in header and "throughput [samples/s]" in header
    assert "completed" in row and "ddp-ds" in row


@pytest.fixture(scope="module")
def profiled_file(quickstart_file):
    """The same run: it has the profiler window and fast telemetry."""
    return quickstart_file


def test_profile_window_in_the_file(profiled_file):
    path, proc = profiled_file
    with h5py.File(path, "r") as f:
        assert int(f["profile"].attrs["enabled"]) == 1
        names = [n.decode() for n in f["profile/categories/name"][...]]
        assert "cpu_op" in names
        ops = [n.decode() for n in f["profile/top_ops/name"][...]]
        assert any("convolution" in o for o in ops)
        for ds in ("profile/categories/total_s", "profile/breakdown/span_s"):
            assert f[ds].attrs["units"] not in (b"", "")
    for rank in (0, 1):
        trace = path.with_name(f"{path.stem}.rank{rank}.trace.json").read_text()
        assert f'"rank": {rank}' in trace and "ProfilerStep#6" in trace


def test_telemetry_and_accounting_in_the_file(profiled_file):
    path, proc = profiled_file
    with h5py.File(path, "r") as f:
        t = f["telemetry/t_s"][...]
        n = f["telemetry/rank_rows"][()]
        for r in range(2):
            ts = t[r, : n[r]]
            assert n[r] >= 2 and np.all(np.diff(ts) > 0)
            start = f["iterations/t_start"][r]
            assert ts[0] <= start[0] and ts[-1] >= start[-1]  # sampling spans the iterations
        assert int(f["telemetry"].attrs["gpu_available"]) == 0  # no NVML here, and it says so
        it = f["iterations"]
        params = int(f["plan"].attrs["parameters"])
        assert np.all(it["comm_bytes"][...] == params * 4)
        assert np.all(it["comm_collective_s"][...] > 0)
        assert f["comm/buckets/bytes"][...].sum() == params * 4
        s = f["summary"].attrs
        for key in ("p95_step_s", "imbalance_median", "imbalance_p95", "straggler_ranks"):
            assert key in s, key
        assert "mfu" not in s  # CPU: no peak known, so no MFU rather than a wrong one
    assert f"summary over {ITERS - WARMUP} measured iterations" in proc.stdout


def test_zero1_shards_the_optimizer_state(run_ts, tmp_path):
    """dist.zero=1 on the quickstart (AdamW): ZeRO-1 over the 2 ranks trains, the plan records the
    stage and the shards like the LLM's, and each rank holds half the AdamW moments of DDP."""
    out = tmp_path / "zero1.h5"
    proc = run_ts(2, "--config", ROOT / "inputs/quickstart.ini", f"--output.file={out}",
                  "--train.max_iters=4", "--train.eval=false", "--dist.zero=1", "--log.every=0",
                  "--telemetry.enabled=false", "--profile.warmup_iters=0", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] in ("completed", b"completed")
        plan = f["plan"].attrs
        assert int(plan["zero"]) == 1
        assert int(plan["memory_plan_optimizer_state_shards"]) == 2
        assert int(plan["memory_plan_gradient_shards"]) == 1
        it = f["iterations"]
        assert np.all(np.isfinite(it["loss"][...]))
        weights = it["parameter_bytes"][...]
        moments = it["optimizer_state_bytes"][...]
        # AdamW's two moments of a padded half of the flat weights (float32) on each rank.
        assert np.all(np.abs(moments - weights) <= 2 * 4), (moments, weights)
        # The reduce-scatter of the gradients and the all-gather of the weights: 2 x the weights.
        assert np.all(it["comm_bytes"][...] >= 2 * weights - 16)
        assert "comm/buckets" not in f  # no DDP buckets under ZeRO


def test_comm_workload(run_ts, tmp_path):
    out = tmp_path / "comm.h5"
    proc = run_ts(2, "--run.workload=comm", f"--output.file={out}", "--comm.max_bytes=65536",
                  "--comm.iters=3", "--comm.warmup=1", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] in ("completed", b"completed")
        b = f["comm/allreduce/bytes"][...]
        assert b[0] == 8 and b[-1] == 65536
        alg = f["comm/allreduce/algbw_GBps"][...]
        bus = f["comm/allreduce/busbw_GBps"][...]
        assert np.allclose(bus, alg * 2 * (2 - 1) / 2)  # nccl-tests' allreduce factor at n = 2
        assert f["comm/allreduce/time_s"].attrs["units"] in ("s", b"s")
