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
import time
from pathlib import Path

from trainscope_post import RunFile
from trainscope_post.launch import emulated_nodes_args, launch_env, mpirun_command

ROOT = Path(__file__).resolve().parent.parent
NODES = ROOT / "tests/multinode/netns_nodes.sh"
AGENT = ROOT / "tests/multinode/ns_agent"
LINK = Path("/sys/class/net/vts0/statistics")

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


def run_file_name(slots, rep) -> str:
    return f"r{sum(slots)}_n{len(slots)}_rep{rep}.h5"


def launch(binary, slots, options, out: Path, timeout: float) -> tuple[float, list[str]]:
    """One run at the placement `slots`; its wall time and command. The job runs in its own
    process group so that a timeout or a signal to this script stops every rank."""
    cmd = mpirun_command(sum(slots), binary, *options, *COMMON, f"--output.file={out}",
                         oversubscribe=False, mpirun_args=emulated_nodes_args(AGENT, slots))
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=launch_env(OMP_NUM_THREADS="1"), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except BaseException as e:
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
    return time.monotonic() - start, cmd


def check_run(path: Path, slots):
    """The run completed where it was asked to: world size, node count and each rank's node."""
    with RunFile(path) as run:
        run.require_completed()
        nodes_of_ranks = [int(n) for n in run.ranks()["node"]]
        num_nodes = int(run.attrs("/").get("num_nodes", 0))
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
            for study, placements, options in studies(args.quick):
                (out / study).mkdir(parents=True, exist_ok=True)
                for slots in placements:
                    path = out / study / run_file_name(slots, rep)
                    before = link_bytes()
                    wall, cmd = launch(binary, slots, options, path, args.timeout)
                    crossed = link_bytes() - before
                    check_run(path, slots)
                    print(f"{path.relative_to(out)}: {wall:.1f} s, {crossed / 1e6:.1f} MB over "
                          "the link", flush=True)
                    manifest["runs"].append({
                        "file": str(path.relative_to(out)), "study": study, "rep": rep,
                        "ranks": sum(slots), "nodes": len(slots), "ranks_per_node": list(slots),
                        "wall_s": round(wall, 2), "link_bytes": crossed,
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
    collective = run.measured("comm_collective_s").mean(axis=0)
    compute = sum(float(s.get(f"median_{p}_s", 0.0)) for p in
                  ("data", "h2d", "forward", "backward", "optimizer"))
    return {"step": float(s["median_step_s"]), "wait": float(s["median_comm_wait_s"]),
            "collective": statistics.median(collective) if collective.size else float("nan"),
            "compute": compute}


def table(out: Path) -> int:
    """Per run file, then per placement over the repeats (median, and the spread max - min)."""
    out = Path(out)
    groups, comm = {}, []
    print(f"{'file':<24} {'ranks':>5} {'nodes':>5} {'median_step_s':>13} {'comm_wait_s':>11} "
          f"{'comm_collective_s':>17} {'wait/step':>9}")
    for study in ("cv", "llm"):
        for path in sorted((out / study).glob("*.h5")):
            with RunFile(path) as run:
                run.require_completed()
                key = (study, run.world_size, int(run.attrs("/")["num_nodes"]))
                row = train_row(run)
            groups.setdefault(key, []).append(row)
            print(f"{study + '/' + path.name:<24} {key[1]:>5} {key[2]:>5} {row['step']:>13.4f} "
                  f"{row['wait']:>11.4f} {row['collective']:>17.4f} "
                  f"{row['wait'] / row['step']:>9.0%}")
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
            times = {op: (run.series(f"comm/{op}", "bytes").values,
                          run.series(f"comm/{op}", "time_s").values)
                     for op in ("allreduce", "allgather", "reduce_scatter")}
            comm.append((path.name, run.world_size, int(run.attrs("/")["num_nodes"]), times))
    if comm:
        sizes = comm[0][3]["allreduce"][0]
        print(f"\ncomm: ms per operation at {sizes[0]:.0f} B / {sizes[-1] / 2**20:g} MiB")
        print(f"{'file':<18} {'ranks':>5} {'nodes':>5} " +
              " ".join(f"{op:>20}" for op in comm[0][3]))
        for name, ranks, n, times in comm:
            cells = " ".join(f"{t[0] * 1e3:>9.2f} /{t[-1] * 1e3:>9.1f}" for _, t in times.values())
            print(f"{name:<18} {ranks:>5} {n:>5} {cells}")
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
