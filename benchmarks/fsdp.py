"""dist.zero=3 (FSDP) vs ddp-ds on a mid-size CPU Llama: per-rank memory, step time, overlap.

Issue 17's acceptance tables 2 and 3, read back from the run files (trainscope_post.RunFile):
- Table A: for every --methods method at every --ranks count, ddp-ds (dist.zero=0, the whole model
  on every rank) against stage 3 (dist.zero=3: parameters, gradients and optimizer state sharded per
  decoder layer, embedding and head): median step time, peak CPU tensor bytes per rank, and the
  model state per rank (parameter + gradient + optimizer bytes). Below it, one line per method:
  does the stage-3 peak per rank fall with N (the acceptance criterion), with the ratios to the
  fewest ranks.
- Table B: stage 3 with dist.prefetch=true against false (--overlap-methods at --overlap-ranks):
  per iteration the all-gather and reduce-scatter times, their exposed parts and the hidden share
  = 1 - exposed / total. "Exposed" is the time the training thread waited for a collective (the
  part the progress thread had not finished behind compute); the rest ran while the training
  thread computed. On the MPI backend the collectives run on the progress thread: on an
  oversubscribed machine (4 ranks on 2 cores) it competes with the ranks' compute for the cores,
  so less is hidden there than on a machine with a spare core per rank, and a rank waiting for a
  descheduled peer counts as exposed time. The progress thread runs the collectives in issue
  order, so a wait also covers collectives queued ahead (an all-gather behind a unit's
  reduce-scatter): exposed can exceed the collective's own time, and the hidden share go
  negative. The step's last wait for the reduce-scatters is in comm_wait (printed beside them):
  for SFT methods the label-token allreduce there queues behind them and takes that wait.

Fairness rules (printed with the results):
- One model: a Llama config.json written to a temporary directory (default hidden 1024 x 8 layers,
  FFN 2816, 16 heads / 8 KV heads of 64, vocabulary 1024 = the tiny tokenizer's), randomly
  initialised with the same seed in every run (llm.init=random, run.seed=42).
- Same data and step: text samples (DPO: preference pairs) joined from inputs/llm/data/text.jsonl
  until longer than --seq tokens and cut to it, so every sequence is exactly --seq tokens (no
  padding: checked); --batch sequences per rank per step (the global batch grows with N, so the
  per-rank work is the same at every N), no gradient accumulation, no activation checkpointing,
  fp32, AdamW lr 1e-4 constant; LoRA rank 8 / alpha 16 on q, v, o and the MLP (lora, qlora, dpo).
- Same threads: run.threads=--threads per rank, OMP_NUM_THREADS=1, mpirun --oversubscribe
  --bind-to none (ranks and progress threads float over the cores). With more ranks than cores the
  ranks time-share them: step times at N > cores measure that sharing, not scaling; the memory
  figures do not depend on it.
- Same clock: a run's step time is its /summary median_step_s (per iteration the mean over ranks,
  median over the iterations after --warmup); the peak is the largest host_tensor_peak_bytes of
  any rank over the measured iterations (live LibTorch CPU tensor storage, what
  torch.cuda.max_memory_allocated is on a GPU); model state the largest parameter + gradient +
  optimizer bytes of any rank. Each configuration runs --repeats times (the configurations of one
  repeat in turn), and the lowest median step time is kept (memory is the same in every repeat).
"""

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from llm_peft import long_preferences, long_texts  # the same no-padding samples as llm_peft
from trainscope_post import RunFile, schema
from trainscope_jobs.launch import launch_env, mpirun_command

ROOT = Path(__file__).resolve().parents[1]
BUILD = Path(os.environ.get("BUILD_DIR", ROOT / "build"))
BINARY = BUILD / "app" / "trainscope"
TOKENIZER = ROOT / "inputs/llm/data/tiny_tokenizer.model"
METHODS = ("full", "lora", "qlora", "dpo", "qat")
MiB = 2**20

# The /iterations columns kept per run (--json): the stage-3 communication accounting (NaN unless
# dist.zero=3), the phases and the memory counters.
COLUMNS = ("step_s", "forward_s", "backward_s", "comm_wait_s", "allgather_bytes", "allgather_s",
           "allgather_exposed_s", "reduce_scatter_bytes", "reduce_scatter_s",
           "reduce_scatter_exposed_s", "gathered_weight_bytes", "host_tensor_peak_bytes",
           "parameter_bytes", "gradient_bytes", "optimizer_state_bytes", "forward_peak_bytes",
           "backward_peak_bytes", "optimizer_peak_bytes", "padding_fraction")


def int_list(text):
    return [int(x) for x in text.split(",") if x]


def parse():
    p = argparse.ArgumentParser(prog="scripts/bench fsdp", description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--methods", default=",".join(METHODS),
                   help="comma-separated llm.method values for table A (default: all)")
    p.add_argument("--ranks", type=int_list, default=[1, 2, 4], help="rank counts (default 1,2,4)")
    p.add_argument("--overlap-methods", default="lora,full",
                   help="methods of table B, prefetch on vs off ('' = skip the table)")
    p.add_argument("--overlap-ranks", type=int_list, default=[2, 4])
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--ffn", type=int, default=2816)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=1024,
                   help="vocabulary (the tiny tokenizer's 1024 ids; not smaller)")
    p.add_argument("--batch", type=int, default=2, help="sequences per rank per step")
    p.add_argument("--seq", type=int, default=128, help="tokens per sequence")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    p.add_argument("--iters", type=int, default=5, help="measured iterations per run")
    p.add_argument("--warmup", type=int, default=2, help="warm-up iterations per run")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--timeout", type=float, default=1800,
                   help="seconds one trainscope run may take before it is killed (default 1800)")
    p.add_argument("--json", type=Path, help="write every run's raw figures to this file")
    p.add_argument("--quick", action="store_true",
                   help="smoke configuration: hidden 256 x 2 layers (FFN 512, 4/2 heads), 1-2 "
                        "ranks, 2 measured iterations after 1 warm-up, seq 64, timeout 300 s")
    a = p.parse_args()
    if a.quick:
        a.hidden, a.ffn, a.layers, a.heads, a.kv_heads = 256, 512, 2, 4, 2
        a.ranks = [r for r in a.ranks if r <= 2] or [1, 2]
        a.overlap_ranks = [2]
        a.iters, a.warmup, a.seq, a.repeats = 2, 1, 64, 1
        a.timeout = min(a.timeout, 300)
    a.methods = [m for m in a.methods.split(",") if m]
    a.overlap_methods = [m for m in a.overlap_methods.split(",") if m]
    for m in a.methods + a.overlap_methods:
        if m not in METHODS:
            p.error(f"method '{m}': use one of {', '.join(METHODS)}")
    if not a.ranks or min(a.ranks + a.overlap_ranks or [1]) < 1:
        p.error("--ranks / --overlap-ranks: positive rank counts, e.g. 1,2,4")
    if a.iters < 1 or a.warmup < 0:
        p.error("--iters must be >= 1 and --warmup >= 0")
    if a.hidden % a.heads or a.heads % a.kv_heads:
        p.error(f"--hidden {a.hidden} must be a multiple of --heads {a.heads}, and --heads of "
                f"--kv-heads {a.kv_heads}")
    if a.vocab < 1024:
        p.error(f"--vocab {a.vocab}: the tiny tokenizer has 1024 ids (768 + 256 special)")
    a.ranks = sorted(set(a.ranks))
    a.overlap_ranks = sorted(set(a.overlap_ranks))
    return a


def write_model(a, where):
    """config.json of a Llama-3-shaped model (untied head, rope theta 500000); no weights: the runs
    initialise them (llm.init=random)."""
    where.mkdir()
    (where / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": a.hidden, "intermediate_size": a.ffn, "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
        "head_dim": a.hidden // a.heads, "vocab_size": a.vocab, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "max_position_embeddings": max(2048, a.seq),
        "tie_word_embeddings": False, "hidden_act": "silu"}, indent=2))


def run_trainscope(cmd, timeout):
    """Runs one job in its own process group; on a timeout kills the group (mpirun and its ranks)
    and exits with the output so far. Returns (stdout, stderr, seconds)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=launch_env(OMP_NUM_THREADS="1"), cwd=ROOT,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                out, err = proc.communicate(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            out, err = "", ""
        sys.exit(f"trainscope timed out after {timeout:g} s (--timeout) and was killed:\n"
                 f"  {' '.join(map(str, cmd))}\n{out}\n{err}")
    if proc.returncode != 0:
        sys.exit(f"trainscope failed with exit {proc.returncode}:\n  {' '.join(map(str, cmd))}\n"
                 f"--- stdout\n{out}\n--- stderr\n{err}")
    return out, err, time.perf_counter() - t0


def measure(a, model_dir, data, out, method, ranks, zero, prefetch=True):
    """One trainscope run; its medians and peaks (see the docstring's rules) and raw columns."""
    fmt = "preference" if method == "dpo" else "text"
    args = ["--run.workload=llm", "--run.strategy=ddp-ds", "--run.device=cpu",
            "--run.precision=fp32", "--run.seed=42", f"--run.threads={a.threads}",
            f"--llm.model={model_dir}", "--llm.init=random", f"--llm.tokenizer={TOKENIZER}",
            f"--llm.method={method}", f"--llm.dataset.path={data[fmt]}",
            f"--llm.dataset.format={fmt}", f"--llm.max_seq_len={a.seq}", "--llm.lora.rank=8",
            "--llm.lora.alpha=16", "--llm.gradient_accumulation=1", "--llm.save_adapters=none",
            f"--train.batch_size={a.batch}", "--train.optimizer=adamw", "--train.lr=1e-4",
            "--train.weight_decay=0.01", "--train.schedule=constant",
            f"--train.max_iters={a.warmup + a.iters}",
            f"--profile.warmup_iters={a.warmup}", f"--dist.zero={zero}",
            "--telemetry.enabled=false", "--log.every=0", f"--output.file={out}",
            "--output.overwrite=true"]
    if zero == 3:
        args.append(f"--dist.prefetch={'true' if prefetch else 'false'}")
    cmd = mpirun_command(ranks, BINARY, *args, mpirun_args=["--bind-to", "none"])
    _, _, wall = run_trainscope(cmd, a.timeout)
    with RunFile(out) as run:
        s = run.require_completed().summary
        w = int(s["warmup_iterations"])
        cols = {c: run.recorded(c)[:, w:] for c in COLUMNS if c in run.columns(schema.ITERATIONS)}
    missing = [c for c in COLUMNS if c not in cols]
    if missing and zero == 3:
        sys.exit(f"{out}: /iterations has no {', '.join(missing)}: this binary predates the "
                 f"stage-3 engine (rebuild: scripts/build trainscope)")
    if cols["step_s"].shape[1] == 0:
        sys.exit(f"{out}: no measured iteration (warm-up {w}): raise --iters")
    if np.nanmax(cols["padding_fraction"]) > 0:
        sys.exit(f"{out}: padded batches (padding fraction up to "
                 f"{np.nanmax(cols['padding_fraction']):.3f}): the samples must be longer")
    state = cols["parameter_bytes"] + cols["gradient_bytes"] + cols["optimizer_state_bytes"]

    def per_iter_median(name):
        # Per iteration the mean over ranks, then the median (as /summary's median_<phase>_s).
        return float(np.median(np.mean(cols[name], axis=0))) if name in cols else math.nan

    r = {
        "method": method, "ranks": ranks, "zero": zero, "prefetch": prefetch if zero == 3 else None,
        "wall_s": wall, "median_step_s": float(s["median_step_s"]),
        "warmup_iterations": w, "measured_iterations": int(s["measured_iterations"]),
        "tensor_peak_bytes": float(np.nanmax(cols["host_tensor_peak_bytes"])),
        "state_bytes": float(np.nanmax(state)),
        **{f"median_{c}": per_iter_median(c) for c in
           ("allgather_s", "allgather_exposed_s", "reduce_scatter_s", "reduce_scatter_exposed_s",
            "allgather_bytes", "reduce_scatter_bytes", "gathered_weight_bytes", "comm_wait_s")},
        # Raw [ranks, measured iterations] columns; NaN becomes null in the JSON.
        "columns": {c: [[None if math.isnan(x) else x for x in row] for row in v.tolist()]
                    for c, v in cols.items()},
    }
    # A stage-3 run across ranks must move parameters and gradients; if it did not, the engine
    # ignored the option or its accounting is missing, and the tables would compare nothing.
    if zero == 3 and ranks > 1:
        for c in ("allgather_bytes", "reduce_scatter_bytes", "allgather_s", "reduce_scatter_s"):
            if not r[f"median_{c}"] > 0:
                r.setdefault("warnings", []).append(f"{out.name}: median {c} = {r[f'median_{c}']}"
                                                    f" (expected > 0 under dist.zero=3)")
    return r


def mib(x):
    return "n/a" if math.isnan(x) else f"{x / MiB:.1f}"


def hidden_share(total, exposed):
    return math.nan if not total > 0 else 1.0 - exposed / total


def pct(x):
    return "n/a" if math.isnan(x) else f"{100 * x:.0f} %"


def ms(x):
    return "n/a" if math.isnan(x) else f"{x * 1e3:.1f}"


def main():
    a = parse()
    if not BINARY.exists():
        sys.exit(f"{BINARY} not built: scripts/build trainscope")
    print("Fairness rules" + __doc__.split("Fairness rules", 1)[1])
    t_start = time.perf_counter()
    results = {}  # (method, ranks, zero, prefetch) -> best run of the repeats

    def run(method, ranks, zero, prefetch=True):
        key = (method, ranks, zero, prefetch if zero == 3 else None)
        name = f"{method}_np{ranks}_zero{zero}" + ("" if zero != 3 else
                                                    "_pf" if prefetch else "_nopf")
        r = measure(a, model_dir, data, Path(tmp) / f"{name}.h5", method, ranks, zero, prefetch)
        r["repeat"] = rep
        print(f"  {name:<24} {r['median_step_s'] * 1e3:9.1f} ms/step  peak "
              f"{mib(r['tensor_peak_bytes']):>9} MiB  ({r['wall_s']:.1f} s)", flush=True)
        for w in r.get("warnings", []):
            print(f"  WARNING {w}", flush=True)
        runs.append(r)
        if key not in results or r["median_step_s"] < results[key]["median_step_s"]:
            results[key] = r

    runs = []
    print(f"Llama hidden {a.hidden} x {a.layers} layers, FFN {a.ffn}, heads {a.heads}/"
          f"{a.kv_heads}, vocab {a.vocab}; batch {a.batch} x seq {a.seq} per rank, fp32, "
          f"{a.threads} thread(s) per rank; {a.iters} measured iterations after {a.warmup} "
          f"warm-up, {a.repeats} repeat(s)\n")
    with tempfile.TemporaryDirectory(prefix="ts-fsdp-") as tmp:
        model_dir = Path(tmp) / "model"
        write_model(a, model_dir)
        n = (a.warmup + a.iters) * a.batch * max(a.ranks + a.overlap_ranks) + 8
        data = {"text": long_texts(tmp, n, a.seq), "preference": long_preferences(tmp, n, a.seq)}
        for rep in range(a.repeats):
            for method in a.methods:
                for ranks in a.ranks:
                    run(method, ranks, 0)
                    run(method, ranks, 3)
            for method in a.overlap_methods:
                for ranks in a.overlap_ranks:
                    # Prefetch on is table A's stage-3 run when table A has this point.
                    if method not in a.methods or ranks not in a.ranks:
                        run(method, ranks, 3, True)
                    run(method, ranks, 3, False)

    print(f"\nTable A: ddp-ds (dist.zero=0) vs stage 3 (dist.zero=3), per rank; peak = largest "
          f"host_tensor_peak_bytes, state = parameter + gradient + optimizer bytes")
    print("| method | ranks | step ddp-ds [s] | step stage 3 [s] | peak ddp-ds [MiB] | "
          "peak stage 3 [MiB] | state ddp-ds [MiB] | state stage 3 [MiB] |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for method in a.methods:
        for ranks in a.ranks:
            d, z = results[(method, ranks, 0, None)], results[(method, ranks, 3, True)]
            print(f"| {method} | {ranks} | {d['median_step_s']:.3f} | {z['median_step_s']:.3f} | "
                  f"{mib(d['tensor_peak_bytes'])} | {mib(z['tensor_peak_bytes'])} | "
                  f"{mib(d['state_bytes'])} | {mib(z['state_bytes'])} |")
    verdicts = {}
    if len(a.ranks) > 1:
        print(f"\nstage-3 peak per rank falls with N (acceptance 2; ratios to {a.ranks[0]} "
              f"rank(s)):")
        for method in a.methods:
            peaks = [results[(method, r, 3, True)]["tensor_peak_bytes"] for r in a.ranks]
            states = [results[(method, r, 3, True)]["state_bytes"] for r in a.ranks]
            falls = all(y < x for x, y in zip(peaks, peaks[1:]))
            verdicts[method] = falls
            print(f"  {method:6} {'yes' if falls else 'NO '}  peak x " +
                  " / ".join(f"{p / peaks[0]:.2f}" for p in peaks) + "  state x " +
                  " / ".join(f"{s / states[0]:.2f}" for s in states) +
                  f"  (at {'/'.join(map(str, a.ranks))} ranks)")

    if a.overlap_methods:
        print("\nTable B: stage 3, prefetch on vs off; per iteration (mean over ranks, median over "
              "the measured iterations); hidden = 1 - exposed / total; both = the two kinds "
              "together (one MPI progress thread runs them in issue order, so a wait for one may "
              "include the other)")
        print("| method | ranks | prefetch | all-gather [ms] | exposed [ms] | hidden | "
              "reduce-scatter [ms] | exposed [ms] | hidden | both hidden | comm_wait [ms] | "
              "step [ms] |")
        print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for method in a.overlap_methods:
            for ranks in a.overlap_ranks:
                for pf in (True, False):
                    r = results[(method, ranks, 3, pf)]
                    ag, age = r["median_allgather_s"], r["median_allgather_exposed_s"]
                    rs, rse = r["median_reduce_scatter_s"], r["median_reduce_scatter_exposed_s"]
                    print(f"| {method} | {ranks} | {'on' if pf else 'off'} | {ms(ag)} | "
                          f"{ms(age)} | {pct(hidden_share(ag, age))} | {ms(rs)} | {ms(rse)} | "
                          f"{pct(hidden_share(rs, rse))} | "
                          f"{pct(hidden_share(ag + rs, age + rse))} | "
                          f"{ms(r['median_comm_wait_s'])} | "
                          f"{ms(r['median_step_s'])} |")
    warnings = [w for r in runs for w in r.get("warnings", [])]
    if warnings:
        print(f"\nWARNING: {len(warnings)} implausible stage-3 figure(s), the tables above are "
              f"suspect:\n  " + "\n  ".join(warnings))
    total = time.perf_counter() - t_start
    print(f"\n{len(runs)} runs in {total:.0f} s. The table figures belong in a note with the "
          f"machine they were measured on (CPU model, cores, other load).")
    if a.json:
        a.json.write_text(json.dumps({
            "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
            "peak_falls_with_ranks": verdicts, "runs": runs}, indent=1))
        print(f"raw figures: {a.json}")


if __name__ == "__main__":
    main()
