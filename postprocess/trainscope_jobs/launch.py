"""How this project starts MPI jobs on one machine: the mpirun flags and environment shared by the
tests, the benchmarks, scripts/demo and the shell wrapper scripts/mpirun (which runs this file).

Open MPI refuses to run as root (containers, CI) without --allow-run-as-root and refuses more ranks
than cores without --oversubscribe; both are needed on a 2-core test machine. Every rank gets
OMP_NUM_THREADS=1 unless the caller set it: ranks share the cores, and trainscope chooses its own
intra-op threads (run.threads). Standard library only, so that scripts/mpirun works with any
python3. Cluster job scripts (jobscripts/) do not use this: they bind and place ranks per site.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping

MPIRUN = "mpirun"


def mpirun_flags(oversubscribe: bool = True) -> list[str]:
    """The flags every local launch needs: root allowed, more ranks than cores allowed."""
    flags = []
    if os.geteuid() == 0:
        flags.append("--allow-run-as-root")
    if oversubscribe:
        flags.append("--oversubscribe")
    return flags


def mpirun_command(np_: int, program, *args, mpirun_args: Iterable[str] = (),
                   oversubscribe: bool = True) -> list[str]:
    """`mpirun <flags> [mpirun_args] -np N program args...` as a list of strings.
    mpirun_args go to mpirun itself (e.g. "--bind-to", "none" or a --host list)."""
    return [MPIRUN, *mpirun_flags(oversubscribe), *map(str, mpirun_args), "-np", str(np_),
            str(program), *map(str, args)]


# The two emulated nodes of tests/multinode/netns_nodes.sh: this host and a network namespace
# joined to it by a veth pair (optionally rate-limited). MPI runs over TCP on the veth's subnet,
# also between ranks of one node, so that what crosses the nodes crosses the link.
EMULATED_NODES = ("10.77.0.1", "10.77.0.2")
EMULATED_SUBNET = "10.77.0.0/24"


def emulated_nodes_args(agent, slots: Iterable[int]) -> list[str]:
    """mpirun arguments that place slots[i] ranks on emulated node i (node 0 is this host; the
    other is started through the launch agent `agent`, tests/multinode/ns_agent). Both nodes share
    this machine's cores, which MPI cannot see, so: ranks are not bound (each node's daemon would
    bind its ranks from core 0 on: 1 + 1 ranks would share one core), and a rank waiting inside MPI
    yields the core (a progress thread spinning through a slow transfer otherwise took a computing
    rank's core: backward 1.8x slower at 1 + 1 ranks over 100 Mbit/s)."""
    slots = list(slots)
    if not 0 < len(slots) <= len(EMULATED_NODES):
        raise ValueError(f"emulated nodes: {len(slots)} slot counts given, there are "
                         f"{len(EMULATED_NODES)} nodes")
    hosts = ",".join(f"{host}:{n}" for host, n in zip(EMULATED_NODES, slots) if n)
    return ["--host", hosts, "--mca", "plm_rsh_agent", str(agent), "--mca", "btl", "tcp,self",
            "--mca", "btl_tcp_if_include", EMULATED_SUBNET, "--mca", "oob_tcp_if_include",
            EMULATED_SUBNET, "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1"]


def launch_env(base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """The environment for a launch: `base` (default os.environ) with OMP_NUM_THREADS=1 unless
    it is set, then `extra`."""
    env = dict(os.environ if base is None else base)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


def main(argv: list[str]) -> int:
    """scripts/mpirun: exec mpirun with the flags and environment above and the given arguments
    (the same process, so signals sent to it reach mpirun, which forwards them to the ranks)."""
    if argv[:1] in (["-h"], ["--help"]):
        print("usage: scripts/mpirun -np N PROGRAM [ARGS...]   (any mpirun arguments)\n"
              f"runs: {' '.join([MPIRUN, *mpirun_flags()])} ARGS... with OMP_NUM_THREADS=1 "
              "unless set")
        return 0
    cmd = [MPIRUN, *mpirun_flags(), *argv]
    os.execvpe(cmd[0], cmd, launch_env())
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
