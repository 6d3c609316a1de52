"""Runs for the allocation advisor's held-out check: CV, LLM and comm on two emulated nodes.

Issue 19's validation: fit `trainscope-post model` to 1- and 2-rank runs plus the comm workload,
predict the held-out 4-rank point (2 nodes x 2 ranks) and compare with its measurement. `collect`
makes the two emulated nodes of tests/multinode/netns_nodes.sh (this host and a network namespace
joined by a veth pair limited to --rate) and runs, --repeats times, in rotating order:

  cv    inputs/quickstart.ini, strong scaling at a global batch of 64 images
  llm   inputs/llm/lora-tiny.ini, packed 128-token sequences, strong scaling at 8 per step
        (gradient accumulation 1, so the 8 are one optimizer step at every rank count)
  comm  run.workload=comm: allreduce, allgather, reduce_scatter from 1 KiB to 8 MiB

at the placements 1 rank (node 0; not for comm), 2 ranks on node 0 (intra), 1 + 1 over the two
nodes (inter) and the held-out 2 + 2. Files: OUT/<study>/r<ranks>_n<nodes>_rep<k>.h5, and
OUT/manifest.json with the rate, the cores, each run's command, wall time and the bytes that
crossed the link. Every rank computes in one thread (OMP_NUM_THREADS=1, run.threads=1, batches
built in the training thread: data.workers=0) and is not bound to a core; MPI is TCP on the veth's
subnet for every placement, between ranks of one node too. Note that both nodes share this
machine's cores: 2 + 2 single-thread ranks on 2 cores compute at about half speed each.
`table OUT` prints the tables of an existing campaign again.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from trainscope_post import RunFile, schema
from trainscope_jobs.launch import emulated_nodes_args, launch_env, mpirun_command

ROOT = Path(__file__).resolve().parent.parent
NODES = ROOT / "tests/multinode/netns_nodes.sh"
AGENT = ROOT / "tests/multinode/ns_agent"
LINK = Path("/sys/class/net/vts0/statistics")
NETNS = Path("/run/netns/tsnode1")  # the second node's network namespace
HZ = os.sysconf("SC_CLK_TCK")

# Ranks per emulated node; the last one is the held-out point.
TRAIN_PLACEMENTS = [(1,), (2,), (1, 1), (2, 2)]
COMM_PLACEMENTS = [(2,), (1, 1), (2, 2)]
COMMON = ["--run.threads=1", "--data.workers=0", "--telemetry.enabled=false", "--train.eval=false",
          "--log.every=0", "--output.overwrite=true"]


class CampaignError(Exception):
    """A step of the campaign failed; the message says which and why."""


def studies(quick: bool):
    """(name, placements, trainscope options) of the three studies; --quick: fewer iterations."""
    cv_iters, cv_warm = (8, 2) if quick else (30, 5)
    llm_iters, llm_warm = (6, 2) if quick else (20, 4)
    comm_max, comm_iters, comm_warm = (1 << 20, 2, 1) if quick else (8 << 20, 5, 2)
    cv = ["--config", ROOT / "inputs/quickstart.ini", "--run.scaling=strong",
          "--run.global_batch=64", f"--train.max_iters={cv_iters}",
          f"--profile.warmup_iters={cv_warm}"]
    # Packed sequences are all max_seq_len tokens, so every rank count computes the same tokens
    # per step (padded batches would pad to their longest sample: more padding in larger batches).
    llm = ["--config", ROOT / "inputs/llm/lora-tiny.ini", "--llm.max_seq_len=128",
           "--llm.packed=true", "--llm.gradient_accumulation=1", "--run.scaling=strong",
           "--run.global_batch=8", "--train.epochs=1000", f"--train.max_iters={llm_iters}",
           f"--profile.warmup_iters={llm_warm}", "--llm.save_adapters=none"]
    comm = ["--run.workload=comm", "--comm.ops=allreduce,allgather,reduce_scatter",
            "--comm.min_bytes=1024", f"--comm.max_bytes={comm_max}",
            f"--comm.iters={comm_iters}", f"--comm.warmup={comm_warm}"]
    return [("cv", TRAIN_PLACEMENTS, cv), ("llm", TRAIN_PLACEMENTS, llm),
            ("comm", COMM_PLACEMENTS, comm)]


def nodes(*args):
    proc = subprocess.run(["bash", str(NODES), *args], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise CampaignError(f"tests/multinode/netns_nodes.sh {' '.join(args)} failed "
                            f"({proc.returncode}): {proc.stderr.strip()}")


def link_bytes() -> int:
    return sum(int((LINK / f).read_text()) for f in ("tx_bytes", "rx_bytes"))


def cpu_seconds() -> tuple[float, float, float]:
    """The whole machine's CPU seconds since boot (/proc/stat): (user-space and system-call time,
    interrupt and softirq time, time stolen by the hypervisor). Interrupts and softirqs are kept
    apart: the kernel's network stack runs there (the veth and the token bucket carry every byte
    between the emulated nodes, ~15-23 % of the cores at 1 Gbit), work the job itself causes."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = \
        map(int, Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9])
    return (user + nice + system) / HZ, (irq + softirq) / HZ, steal / HZ


PF_KTHREAD = 0x00200000  # /proc/<pid>/stat flags: a kernel thread (ksoftirqd, kworker, ...)


class CpuWatch(threading.Thread):
    """The CPU seconds the machine spent on other processes while one job ran (other users' work
    distorts a run on 2 shared cores; the campaign records how much there was). The job's
    processes: the tree under its mpirun, this script, and everything in the second node's
    namespace (the daemon the launch agent starts there leaves mpirun's tree, and its ranks'
    CPU time never reaches this script's rusage). The kernel's own work (interrupts, softirqs
    and kernel threads such as ksoftirqd: the network stack moving the job's bytes) is counted
    apart, not as another process's: on an idle machine it was 15-23 % of the cores at 1 Gbit,
    which flagged every fast-link comm run as disturbed. Sampled from /proc every 0.2 s, so a
    process that ends loses at most its last 0.2 s: a slight overestimate."""

    def __init__(self):
        super().__init__(daemon=True)
        self.netns = f"net:[{NETNS.stat().st_ino}]"
        self.root = os.getpid()
        self.first, self.last, self.ours, self.kernel = {}, {}, set(), set()
        self.done = threading.Event()
        self.busy_before = cpu_seconds()
        self.sample()  # processes alive now count from here, later ones from 0

    def sample(self):
        procs = {}  # pid: (key, parent pid, in the node's namespace)
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                stat = Path(entry.path, "stat").read_text()
                net = os.readlink(Path(entry.path, "ns/net"))
            except OSError:  # ended meanwhile
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            key = (entry.name, fields[19])  # (pid, start time): a reused pid is another process
            self.last[key] = (int(fields[11]) + int(fields[12])) / HZ  # utime + stime
            self.first.setdefault(key, 0.0 if self.is_alive() else self.last[key])
            if int(fields[6]) & PF_KTHREAD:
                self.kernel.add(key)
            procs[int(entry.name)] = (key, int(fields[1]), net == self.netns)
        for pid, (key, ppid, in_node) in procs.items():
            while ppid in procs and pid != self.root:
                pid, ppid = ppid, procs[ppid][1]
            if in_node or pid == self.root:
                self.ours.add(key)

    def run(self):
        while not self.done.wait(0.2):
            self.sample()

    def stop(self) -> tuple[float, float, float]:
        """Stops watching: (CPU seconds of other processes, CPU seconds of the kernel's own work:
        interrupts, softirqs and kernel threads, CPU seconds stolen by the hypervisor)."""
        self.done.set()
        self.join()
        self.sample()
        busy, irq, steal = (a - b for a, b in zip(cpu_seconds(), self.busy_before))
        ours = sum(self.last[k] - self.first[k] for k in self.ours)
        threads = sum(self.last[k] - self.first[k] for k in self.kernel)
        return max(0.0, busy - ours - threads), irq + threads, steal


def wait_quiet(limit: float, max_wait: float) -> float:
    """Waits (at most max_wait s) until other processes use less than `limit` cores over 2 s: the
    runs share 2 cores, so another job's load distorts them. Returns the cores last measured."""
    deadline = time.monotonic() + max_wait
    while True:
        before = cpu_seconds()[0]
        time.sleep(2)
        busy = (cpu_seconds()[0] - before) / 2
        if busy < limit or time.monotonic() > deadline:
            return busy
        print(f"  waiting for a quiet machine: other processes use {busy:.2f} cores", flush=True)
        time.sleep(8)


def rotated(items, rep):
    """items started at position rep (mod len): repeat k runs them in the k-th rotation."""
    k = rep % len(items)
    return list(items[k:]) + list(items[:k])


def run_file_name(slots, rep) -> str:
    return f"r{sum(slots)}_n{len(slots)}_rep{rep}.h5"


def launch(binary, slots, options, out: Path, timeout: float):
    """One run at the placement `slots`: its wall time, command, and the CPU seconds of other
    processes, of the kernel and stolen meanwhile (CpuWatch). The job runs in its own process group so that a timeout or
    a signal to this script stops every rank."""
    cmd = mpirun_command(sum(slots), binary, *options, *COMMON, f"--output.file={out}",
                         oversubscribe=False, mpirun_args=emulated_nodes_args(AGENT, slots))
    watch = CpuWatch()
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=launch_env(OMP_NUM_THREADS="1"), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    watch.start()
    try:
        output, _ = proc.communicate(timeout=timeout)
    except BaseException as e:
        watch.done.set()
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if isinstance(e, subprocess.TimeoutExpired):
            raise CampaignError(f"{out}: stopped after --timeout {timeout:g} s\n  "
                                f"{' '.join(cmd)}") from None
        raise
    if proc.returncode != 0:
        tail = "\n".join(output.splitlines()[-25:])
        raise CampaignError(f"{out}: trainscope exited {proc.returncode}\n  {' '.join(cmd)}\n"
                            f"{tail}")
    wall = time.monotonic() - start
    return wall, cmd, *watch.stop()


def check_run(path: Path, slots):
    """The run completed where it was asked to: world size, node count and each rank's node."""
    with RunFile(path) as run:
        run.require_completed()
        nodes_of_ranks = [int(n) for n in run.ranks()["node"]]
        num_nodes = int(run.attrs(schema.ROOT).get("num_nodes", 0))
        world_size = run.world_size
    want = [node for node, n in enumerate(slots) for _ in range(n)]
    if world_size != sum(slots) or num_nodes != len(slots) or nodes_of_ranks != want:
        raise CampaignError(f"{path}: placed as world_size={world_size}, num_nodes="
                            f"{num_nodes}, rank nodes {nodes_of_ranks}; asked for {want}")


def collect(args) -> int:
    out = Path(args.out_dir).resolve()
    binary = Path(args.binary).resolve()
    if not binary.is_file():
        raise CampaignError(f"no trainscope binary at {binary}: build it, or give --binary "
                            "(default $BUILD_DIR/app/trainscope)")
    if LINK.exists():
        raise CampaignError("the emulated nodes are up already (vts0 exists): another test or "
                            "campaign may be using them; if not, run "
                            "tests/multinode/netns_nodes.sh down")
    repeats = 1 if args.quick else args.repeats
    manifest = {"rate": args.rate, "repeats": repeats, "quick": args.quick,
                "cores": os.cpu_count(), "binary": str(binary),
                "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": []}
    start = time.monotonic()
    # SIGTERM (e.g. a killed background job) must still tear the nodes down.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        nodes("up", args.rate)  # inside the try: a half-made pair is torn down too
        for rep in range(repeats):
            for study, placements, options in rotated(studies(args.quick), rep):
                (out / study).mkdir(parents=True, exist_ok=True)
                # Placements rotate from one repeat to the next (and the studies with them), so
                # a slow drift of the machine does not always fall on the same placement.
                for slots in rotated(placements, rep):
                    path = out / study / run_file_name(slots, rep)
                    for attempt in range(1, args.attempts + 1):
                        idle_before = wait_quiet(args.quiet, args.quiet_wait)
                        before = link_bytes()
                        wall, cmd, other, kernel, steal = launch(binary, slots, options,
                                                                 path, args.timeout)
                        crossed = link_bytes() - before
                        other_share = other / (wall * os.cpu_count())
                        check_run(path, slots)
                        kernel_share = kernel / (wall * os.cpu_count())
                        print(f"{path.relative_to(out)}: {wall:.1f} s, {crossed / 1e6:.1f} MB "
                              f"over the link, other CPU {other_share:.0%}, kernel "
                              f"{kernel_share:.0%}", flush=True)
                        # A run of 1 s shows ~15 % from its own ending (CpuWatch): also ask
                        # for half a CPU second.
                        if other_share <= args.max_other or other < 0.5:
                            break
                        if attempt < args.attempts:
                            print(f"  other processes used {other_share:.0%} of the cores (more "
                                  f"than --max-other {args.max_other:.0%}): again", flush=True)
                    manifest["runs"].append({
                        "file": str(path.relative_to(out)), "study": study, "rep": rep,
                        "ranks": sum(slots), "nodes": len(slots), "ranks_per_node": list(slots),
                        "wall_s": round(wall, 2), "link_bytes": crossed,
                        "other_cpu_s": round(other, 2), "other_cpu_share": round(other_share, 3),
                        "kernel_cpu_s": round(kernel, 2),
                        "kernel_cpu_share": round(kernel_share, 3),
                        "steal_s": round(steal, 2), "busy_cores_before": round(idle_before, 2),
                        "attempts": attempt,
                        "command": [str(c) for c in cmd]})
                    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    finally:
        subprocess.run(["bash", str(NODES), "down"], timeout=60)
    manifest["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    manifest["wall_s"] = round(time.monotonic() - start, 1)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(f"campaign: {len(manifest['runs'])} runs in {manifest['wall_s']:.0f} s at {args.rate}\n")
    return table(out)


def train_row(run: RunFile) -> dict:
    s = run.summary
    collective = run.over_ranks("comm_collective_s")  # per iteration, mean over all ranks
    compute = sum(float(s.get(f"median_{p}_s", 0.0)) for p in
                  ("data", "h2d", "forward", "backward", "optimizer"))
    return {"step": float(s["median_step_s"]), "wait": float(s["median_comm_wait_s"]),
            "collective": statistics.median(collective) if collective.size else float("nan"),
            "compute": compute}


def table(out: Path) -> int:
    """Per run file, then per placement over the repeats (median, and the spread max - min)."""
    out = Path(out)
    groups, comm = {}, []
    # The share of the cores other processes used during each run (manifest.json, if written).
    manifest = out / "manifest.json"
    runs = json.loads(manifest.read_text())["runs"] if manifest.exists() else []
    other = {r["file"]: f"{r['other_cpu_share']:.0%}" for r in runs if "other_cpu_share" in r}
    print(f"{'file':<24} {'ranks':>5} {'nodes':>5} {'median_step_s':>13} {'comm_wait_s':>11} "
          f"{'comm_collective_s':>17} {'wait/step':>9} {'other CPU':>9}")
    for study in ("cv", "llm"):
        for path in sorted((out / study).glob("*.h5")):
            with RunFile(path) as run:
                run.require_completed()
                key = (study, run.world_size, int(run.attrs(schema.ROOT)["num_nodes"]))
                row = train_row(run)
            groups.setdefault(key, []).append(row)
            print(f"{study + '/' + path.name:<24} {key[1]:>5} {key[2]:>5} {row['step']:>13.4f} "
                  f"{row['wait']:>11.4f} {row['collective']:>17.4f} "
                  f"{row['wait'] / row['step']:>9.0%} {other.get(f'{study}/{path.name}', '-'):>9}")
    print(f"\n{'study':<6} {'ranks':>5} {'nodes':>5} {'runs':>4} {'median_step_s':>13} "
          f"{'spread':>7} {'comm_wait share':>15} {'compute share':>13}")
    for (study, ranks, n), rows in groups.items():
        steps = [r["step"] for r in rows]
        step = statistics.median(steps)
        wait = statistics.median(r["wait"] for r in rows)
        compute = statistics.median(r["compute"] for r in rows)
        print(f"{study:<6} {ranks:>5} {n:>5} {len(rows):>4} {step:>13.4f} "
              f"{(max(steps) - min(steps)) / step:>7.1%} {wait / step:>15.0%} "
              f"{compute / step:>13.0%}")
    for path in sorted((out / "comm").glob("*.h5")):
        with RunFile(path) as run:
            run.require_completed()
            times = {op: (run.series(schema.fill(schema.COMM_OP, op), "bytes").values,
                          run.series(schema.fill(schema.COMM_OP, op), "time_s").values)
                     for op in ("allreduce", "allgather", "reduce_scatter")}
            nodes = int(run.attrs(schema.ROOT)["num_nodes"])
            comm.append((path.name, run.world_size, nodes, times))
    if comm:
        sizes = comm[0][3]["allreduce"][0]
        print(f"\ncomm: ms per operation at {sizes[0]:.0f} B / {sizes[-1] / 2**20:g} MiB")
        print(f"{'file':<18} {'ranks':>5} {'nodes':>5} " +
              " ".join(f"{op:>20}" for op in comm[0][3]) + f" {'other CPU':>9}")
        for name, ranks, n, times in comm:
            cells = " ".join(f"{t[0] * 1e3:>9.2f} /{t[-1] * 1e3:>9.1f}" for _, t in times.values())
            print(f"{name:<18} {ranks:>5} {n:>5} {cells} {other.get(f'comm/{name}', '-'):>9}")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(prog="scripts/bench advisor_runs", description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect", help="make the nodes, run the campaign, print the tables")
    c.add_argument("out_dir")
    c.add_argument("--rate", default="100mbit", help="the link's rate each way (tc tbf rate)")
    c.add_argument("--repeats", type=int, default=3)
    c.add_argument("--quick", action="store_true", help="one repeat, few iterations (smoke test)")
    c.add_argument("--quiet", type=float, default=0.15, help="wait before each run until other "
                   "processes use fewer cores than this")
    c.add_argument("--quiet-wait", type=float, default=600, help="... but at most this many s")
    c.add_argument("--max-other", type=float, default=0.10, help="run again when other processes "
                   "used more than this share of the cores during a run ...")
    c.add_argument("--attempts", type=int, default=5, help="... up to this many times in all")
    c.add_argument("--timeout", type=float, default=900, help="seconds per run before it is "
                   "stopped")
    build = os.environ.get("BUILD_DIR") or os.environ.get("TRAINSCOPE_BUILD_DIR") or ROOT / "build"
    c.add_argument("--binary", default=Path(build) / "app/trainscope")
    t = sub.add_parser("table", help="print the tables of an existing campaign")
    t.add_argument("out_dir")
    args = p.parse_args()
    try:
        return collect(args) if args.cmd == "collect" else table(Path(args.out_dir))
    except CampaignError as e:
        print(f"advisor_runs: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
