"""Multi-node logic for real on one machine: two emulated nodes (this host and a network + UTS
namespace, tests/multinode/netns_nodes.sh) joined by a veth pair, Open MPI launching ranks on both
through a launch agent that enters the namespace (tests/multinode/ns_agent), MPI over TCP on the
veth. trainscope must see 2 nodes x 2 local ranks, its traffic must cross the veth, and a slower
link (a token-bucket rate limit; this kernel has no netem) must show in comm_wait and in the comm
benchmark. Everything is torn down afterwards."""

import os
import subprocess

import h5py
import numpy as np
import pytest
from trainscope_jobs.launch import emulated_nodes_args, launch_env, mpirun_command

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
BUILD = __import__("pathlib").Path(os.environ.get("TRAINSCOPE_BUILD_DIR", ROOT / "build"))
BINARY = BUILD / "app" / "trainscope"
NODES = ROOT / "tests/multinode/netns_nodes.sh"
AGENT = ROOT / "tests/multinode/ns_agent"
SLOW = "40mbit"


def mpirun_two_nodes(*args, timeout=600):
    # Two slots per emulated node, so no --oversubscribe: 4 ranks must fill exactly 2 + 2.
    cmd = mpirun_command(4, BINARY, *args, oversubscribe=False,
                         mpirun_args=emulated_nodes_args(AGENT, (2, 2)))
    env = launch_env(OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def nodes(*rate):
    proc = subprocess.run(["bash", str(NODES), "up", *rate], capture_output=True, text=True,
                          timeout=60)
    if proc.returncode == 77:
        pytest.skip("emulated nodes cannot be made here: " + proc.stderr.strip())
    assert proc.returncode == 0, proc.stderr


@pytest.fixture(scope="module")
def two_nodes():
    nodes()
    yield
    subprocess.run(["bash", str(NODES), "down"], timeout=60)


def tx_bytes():
    return int(open("/sys/class/net/vts0/statistics/tx_bytes").read())


def train(out):
    return mpirun_two_nodes("--config", ROOT / "inputs/quickstart.ini", "--train.max_iters=8",
                            "--profile.warmup_iters=2", "--train.eval=false", "--log.every=0",
                            "--telemetry.enabled=false", f"--output.file={out}")


def comm(out):
    return mpirun_two_nodes("--run.workload=comm", "--comm.ops=allreduce",
                            "--comm.max_bytes=1048576", "--comm.iters=5", "--comm.warmup=1",
                            f"--output.file={out}")


def test_two_nodes_fast_then_slow_link(two_nodes, tmp_path):
    before = tx_bytes()
    proc = train(tmp_path / "fast.h5")
    crossed = tx_bytes() - before
    assert "placement: 4 rank(s) on 2 node(s)" in proc.stdout
    with h5py.File(tmp_path / "fast.h5", "r") as f:
        assert int(f.attrs["num_nodes"]) == 2 and int(f.attrs["world_size"]) == 4
        ranks = f["ranks"][...]
        assert list(ranks["node"]) == [0, 0, 1, 1]
        assert list(ranks["local_rank"]) == [0, 1, 0, 1]
        hosts = [h.decode() for h in ranks["hostname"]]
        assert hosts[2] == hosts[3] == "tsnode1" and hosts[0] == hosts[1] != "tsnode1"
        grad_bytes = f["iterations/comm_bytes"][0].sum()
        fast_wait = np.median(f["iterations/comm_wait_s"][:, 2:])
    # Every iteration's gradients must reach the other node: at least half of rank 0's
    # allreduced bytes crossed the veth (TCP), whatever the allreduce algorithm.
    assert crossed >= 0.5 * grad_bytes, (crossed, grad_bytes)
    comm(tmp_path / "comm_fast.h5")

    nodes(SLOW)  # the same nodes, link limited to 40 Mbit/s each way
    train(tmp_path / "slow.h5")
    comm(tmp_path / "comm_slow.h5")
    with h5py.File(tmp_path / "slow.h5", "r") as f:
        slow_wait = np.median(f["iterations/comm_wait_s"][:, 2:])
        params_mb = f["iterations/comm_bytes"][0, 0] / 1e6
    # 2.7 MB of fp32 gradients over 5 MB/s: at least ~0.3 s more waiting per iteration.
    assert slow_wait > fast_wait + 0.1, (fast_wait, slow_wait, params_mb)
    with h5py.File(tmp_path / "comm_fast.h5", "r") as f, \
            h5py.File(tmp_path / "comm_slow.h5", "r") as g:
        assert list(f["comm/allreduce/bytes"]) == list(g["comm/allreduce/bytes"])
        fast_bus, slow_bus = f["comm/allreduce/busbw_GBps"][-1], g["comm/allreduce/busbw_GBps"][-1]
    print(f"\ntwo nodes: {crossed / 1e6:.1f} MB crossed the veth for {grad_bytes / 1e6:.1f} MB of "
          f"rank 0 gradients; median comm_wait {fast_wait * 1e3:.1f} ms -> {slow_wait * 1e3:.1f} ms "
          f"at {SLOW}; 1 MiB allreduce busbw {fast_bus:.3f} -> {slow_bus:.4f} GB/s")
    assert slow_bus < 0.5 * fast_bus, (fast_bus, slow_bus)
