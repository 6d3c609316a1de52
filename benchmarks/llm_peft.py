"""trainscope's LoRA step vs Hugging Face transformers + peft (tokens/s), and peak memory by method.

Fairness rules (printed with the results):
- One model: the script builds a Llama config and random weights with transformers, saves them as
  config.json + model.safetensors, and trainscope loads that directory (llm.init=checkpoint).
- Same step: LoRA rank 8 / alpha 16 / dropout 0 on q, v, o and the MLP (torchtune's default), fp32
  (or --precision bf16-mixed: bf16 autocast over fp32 weights on both sides), --device cpu or cuda,
  AdamW lr 3e-4 weight decay 0.01, --batch sequences of exactly --seq tokens (trainscope: text
  samples longer than --seq, cut to it, so no padding and plain causal attention; HF: token ids of
  the same length), no gradient accumulation.
- Same threads: --threads intra-op threads on both sides (torch.set_num_threads / run.threads), 1
  MPI rank, OMP_NUM_THREADS=1 for everything else. On a GPU both sides time each step with CUDA
  events on the stream and never synchronize inside the loop (trainscope's PhaseTimer).
- Same clock: the median step time after --warmup steps; tokens/s = batch x seq / median step.
  The two sides alternate --repeats times and the best (lowest) median of each side is compared.
- Same arithmetic: both sides' FLOP rate is the model's training FLOPs per token (/plan's
  flops_per_token: 4 N_matmul + 2 N_trainable + attention, the MFU convention) x tokens / step
  time, printed against the machine's GEMM peak measured here (torch.mm: fp32 on the same threads;
  on a GPU in the step's matrix dtype), so a ratio near 1 with both near the peak says the step is
  GEMM-bound on both sides.
  trainscope runs its default chunked loss (llm.loss_chunks=8: the same head FLOPs, in 8 smaller
  GEMMs, each chunk's gradients computed in forward); --loss-chunks 1 measures the unchunked head.
- --profile (an extra run of each side, after the timed ones): the operators that take the step's
  time, side by side in ms per step: trainscope's Kineto window over the measured steps
  (/profile/top_ops of the run file, self time) and torch.profiler's key_averages (self CPU time)
  around the same steps on the HF side.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from trainscope_post import RunFile, schema
from trainscope_jobs.launch import launch_env, mpirun_command

ROOT = Path(__file__).resolve().parents[1]
BUILD = Path(os.environ.get("BUILD_DIR", ROOT / "build"))
BINARY = BUILD / "app" / "trainscope"
TOKENIZER = ROOT / "inputs/llm/data/tiny_tokenizer.model"
TEXT = ROOT / "inputs/llm/data/text.jsonl"
TARGETS = ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def parse():
    p = argparse.ArgumentParser(prog="scripts/bench llm_peft", description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--ffn", type=int, default=1536)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where both sides train (cuda: one GPU; --threads then only sets the "
                        "host threads)")
    p.add_argument("--precision", choices=["fp32", "bf16-mixed"], default="fp32",
                   help="fp32 (the CPU default) or bf16-mixed: fp32 weights, bf16 autocast on "
                        "both sides (torch.autocast / run.precision=bf16-mixed)")
    p.add_argument("--loss-chunks", type=int, default=8,
                   help="trainscope's llm.loss_chunks (default: its default, 8)")
    p.add_argument("--profile", action="store_true",
                   help="also profile one run of each side and print the top operators")
    p.add_argument("--profile-top", type=int, default=15)
    p.add_argument("--memory-steps", type=int, default=3,
                   help="steps of each method's run for the memory table (0 = skip it)")
    p.add_argument("--mem-hidden", type=int, default=1024)
    p.add_argument("--mem-ffn", type=int, default=2816)
    p.add_argument("--mem-layers", type=int, default=8)
    p.add_argument("--mem-batch", type=int, default=2)
    p.add_argument("--mem-seq", type=int, default=128)
    return p.parse_args()


def hf_config(a, hidden, ffn, layers, seq):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=a.vocab, hidden_size=hidden, intermediate_size=ffn,
                       num_hidden_layers=layers, num_attention_heads=a.heads,
                       num_key_value_heads=a.kv_heads, rms_norm_eps=1e-5, rope_theta=500000.0,
                       max_position_embeddings=max(2048, seq), tie_word_embeddings=False)


def make_model_dir(a, where):
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(hf_config(a, a.hidden, a.ffn, a.layers, a.seq))
    model.save_pretrained(where, safe_serialization=True)


def hf_step_times(a, model_dir, profile=False):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    torch.set_num_threads(a.threads)
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                             attn_implementation="sdpa")
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                             target_modules=TARGETS))
    model.to(a.device)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=3e-4, weight_decay=0.01)
    g = torch.Generator().manual_seed(1)
    times = []
    prof = None
    # On a GPU, as trainscope's PhaseTimer: CUDA events around each step on the stream and no
    # synchronize inside the loop (the host may run ahead of the device); on the CPU the clock.
    events = []
    for i in range(a.warmup + a.steps):
        ids = torch.randint(0, 1000, (a.batch, a.seq), generator=g).to(a.device)
        if profile and i == a.warmup:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            prof.__enter__()
        if a.device == "cuda":
            events.append((torch.cuda.Event(enable_timing=True),
                           torch.cuda.Event(enable_timing=True)))
            events[-1][0].record()
        t0 = time.perf_counter()
        with torch.autocast(a.device, dtype=torch.bfloat16,
                            enabled=a.precision == "bf16-mixed"):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        if a.device == "cuda":
            events[-1][1].record()
        elif i >= a.warmup:
            times.append(time.perf_counter() - t0)
    if a.device == "cuda":
        sync(a)
        times = [b.elapsed_time(e) / 1e3 for b, e in events[a.warmup:]]
    if prof is not None:
        prof.__exit__(None, None, None)
        rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
        return [(e.key, e.self_cpu_time_total / 1e6 / a.steps, e.count / a.steps) for e in rows]
    return float(np.median(times))


def sync(a):
    if a.device == "cuda":
        torch.cuda.synchronize()


def long_texts(where, samples, seq):
    """Text samples of the shipped paragraphs joined until each is longer than `seq` tokens (the
    tiny tokenizer averages > 1 character per token, so 8 x seq characters is plenty)."""
    paras = [json.loads(l)["text"] for l in open(TEXT) if l.strip()]
    out = Path(where) / "bench_text.jsonl"
    with open(out, "w") as fh:
        k = 0
        for _ in range(samples):
            text = ""
            while len(text) < 8 * seq:
                text += paras[k % len(paras)] + " "
                k += 1
            fh.write(json.dumps({"text": text}) + "\n")
    return out


def long_preferences(where, samples, seq):
    """Preference pairs whose chosen and rejected answers are cut to `seq` tokens, like the text."""
    paras = [json.loads(l)["text"] for l in open(TEXT) if l.strip()]
    out = Path(where) / "bench_pref.jsonl"
    with open(out, "w") as fh:
        for i in range(samples):
            a = " ".join(paras[(i + j) % len(paras)] for j in range(12))
            b = " ".join(paras[(i + j + 5) % len(paras)] for j in range(12))
            fh.write(json.dumps({"prompt": "Continue the notes.", "chosen": a[:8 * seq],
                                 "rejected": b[:8 * seq]}) + "\n")
    return out


def mpirun(*args):
    # --bind-to none: Open MPI binds a rank to one core by default, which would squeeze the
    # --threads intra-op threads onto it (the HF side is not bound).
    return mpirun_command(1, BINARY, *args, mpirun_args=["--bind-to", "none"])


def trainscope_run(a, model_dir, data, out, method, steps, batch, seq, init="checkpoint",
                   profile=False):
    fmt = "preference" if method == "dpo" else "text"
    args = ["--run.workload=llm", f"--run.device={a.device}", f"--run.precision={a.precision}",
            f"--run.threads={a.threads}", f"--llm.model={model_dir}", f"--llm.init={init}",
            f"--llm.tokenizer={TOKENIZER}", f"--llm.method={method}",
            f"--llm.dataset.path={data}", f"--llm.dataset.format={fmt}",
            f"--llm.max_seq_len={seq}", "--llm.lora.rank=8", "--llm.lora.alpha=16",
            f"--llm.lora.targets={','.join(TARGETS)}", "--llm.gradient_accumulation=1",
            f"--train.batch_size={batch}", "--train.optimizer=adamw", "--train.lr=3e-4",
            "--train.weight_decay=0.01", "--train.schedule=constant",
            f"--train.max_iters={steps}", f"--profile.warmup_iters={min(a.warmup, steps - 1)}",
            "--llm.save_adapters=none", "--log.every=0", f"--output.file={out}",
            "--output.overwrite=true", f"--llm.loss_chunks={a.loss_chunks}"]
    if profile:
        args += ["--profile.enabled=true", f"--profile.start_iter={a.warmup}",
                 f"--profile.iters={a.steps}", "--profile.top_n=60"]
    proc = subprocess.run(mpirun(*args), capture_output=True, text=True,
                          env=launch_env(OMP_NUM_THREADS="1"))
    if proc.returncode != 0:
        sys.exit(f"trainscope failed:\n{proc.stdout}\n{proc.stderr}")
    with RunFile(out) as run:
        s = run.require_completed().summary
        if profile:
            names = run.ragged(schema.child(schema.PROFILE_TOP_OPS, "name"), 0)
            self_s = run.ragged(schema.child(schema.PROFILE_TOP_OPS, "self_s"), 0)
            count = run.ragged(schema.child(schema.PROFILE_TOP_OPS, "count"), 0)
            return [(str(n), float(t) / a.steps, float(c) / a.steps)
                    for n, t, c in sorted(zip(names, self_s, count), key=lambda x: -x[1])]
        it = run.recorded  # a column over the recorded iterations, [ranks, n]
        return {"median_step_s": float(s["median_step_s"]),
                "flops_per_token": float(run.plan["flops_per_token"]),
                "padding": float(np.max(it("padding_fraction"))),
                # Training memory: the largest RSS sampled at the end of an iteration (the
                # process-lifetime peak would include loading and, for QLoRA, the dense weights
                # before quantisation).
                "rss": float(np.nanmax(it("host_rss_bytes")[0])),
                # Peak bytes of live tensors within an iteration: the CPU tensor counter's (on
                # GPUs the caching allocator's allocated peak), the figure torch.cuda's
                # max_memory_allocated gives.
                "tensor_peak": float(np.nanmax(it("host_tensor_peak_bytes")[0])),
                "state": float(np.nanmax(it("parameter_bytes")[0] + it("gradient_bytes")[0] +
                                         it("optimizer_state_bytes")[0]))}


def gemm_peak(a):
    """The best FLOP rate of torch.mm over a few square sizes: fp32 on `--threads` threads on the
    CPU; on a GPU in the matrix dtype of the step (bf16 under bf16-mixed, else fp32)."""
    torch.set_num_threads(a.threads)
    dtype = torch.bfloat16 if a.precision == "bf16-mixed" else torch.float32
    sizes, work = ((1024, 2048, 3072), 4e10) if a.device == "cpu" else ((4096, 8192), 2e13)
    best = 0.0
    for n in sizes:
        x = torch.randn(n, n, device=a.device, dtype=dtype)
        y = torch.randn(n, n, device=a.device, dtype=dtype)
        for _ in range(2):
            x @ y
        reps = max(3, int(work / (2 * n**3)))
        sync(a)
        t0 = time.perf_counter()
        for _ in range(reps):
            x @ y
        sync(a)
        best = max(best, 2 * n**3 * reps / (time.perf_counter() - t0))
    return best


def main():
    a = parse()
    if not BINARY.exists():
        sys.exit(f"{BINARY} not built: scripts/build")
    print(__doc__.split("\n\n", 1)[1])
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        make_model_dir(a, model_dir)
        data = long_texts(tmp, (a.warmup + a.steps) * a.batch + 8, a.seq)
        ts, hf = [], []
        flops_per_token = 0.0
        for r in range(a.repeats):
            run = trainscope_run(a, model_dir, data, Path(tmp) / "ts.h5", "lora",
                                 a.warmup + a.steps, a.batch, a.seq)
            assert run["padding"] == 0, "trainscope's batches were padded: longer texts needed"
            ts.append(run["median_step_s"])
            flops_per_token = run["flops_per_token"]
            hf.append(hf_step_times(a, model_dir))
            print(f"  repeat {r + 1}: trainscope {ts[-1] * 1e3:.1f} ms/step, "
                  f"HF+peft {hf[-1] * 1e3:.1f} ms/step", flush=True)
        tokens = a.batch * a.seq
        ts_tps, hf_tps = tokens / min(ts), tokens / min(hf)
        where = f"{a.threads} thread(s)" if a.device == "cpu" else \
            f"GPU {torch.cuda.get_device_name()}"
        print(f"\nLoRA step, Llama hidden {a.hidden} x {a.layers} layers, FFN {a.ffn}, heads "
              f"{a.heads}/{a.kv_heads}, vocab {a.vocab}; batch {a.batch} x seq {a.seq}, "
              f"{a.precision}, {where}")
        print(f"  trainscope      {ts_tps:10.0f} tokens/s  ({min(ts) * 1e3:.1f} ms/step)")
        print(f"  HF + peft       {hf_tps:10.0f} tokens/s  ({min(hf) * 1e3:.1f} ms/step)")
        print(f"  ratio trainscope / HF = {ts_tps / hf_tps:.3f} (target >= 1.15)", flush=True)
        peak = gemm_peak(a)
        gemm = (f"torch.mm fp32, {a.threads} threads" if a.device == "cpu" else
                f"torch.mm {'bf16' if a.precision == 'bf16-mixed' else 'fp32'} on the GPU")
        print(f"  step FLOP rate ({flops_per_token / 1e6:.1f} MFLOP per token, the same model "
              f"FLOPs for both): trainscope {ts_tps * flops_per_token / 1e9:.1f} GFLOP/s "
              f"({ts_tps * flops_per_token / peak:.0%} of peak), HF + peft "
              f"{hf_tps * flops_per_token / 1e9:.1f} GFLOP/s ({hf_tps * flops_per_token / peak:.0%});"
              f" GEMM peak {peak / 1e9:.1f} GFLOP/s ({gemm})",
              flush=True)

        if a.profile:
            top_ts = trainscope_run(a, model_dir, data, Path(tmp) / "ts_prof.h5", "lora",
                                    a.warmup + a.steps, a.batch, a.seq, profile=True)
            top_hf = hf_step_times(a, model_dir, profile=True)
            print(f"\nwhere the step goes (self time per step, top {a.profile_top}; profiled "
                  f"runs, so slower than the timed ones)")
            for label, rows in (("trainscope (Kineto window, /profile/top_ops)", top_ts),
                                ("HF + peft (torch.profiler key_averages)", top_hf)):
                total = sum(r[1] for r in rows)
                print(f"  {label}: {total * 1e3:.1f} ms self time per step in all operators")
                for name, t, c in rows[:a.profile_top]:
                    print(f"    {name[:48]:48} {t * 1e3:9.2f} ms  {c:7.1f} calls")

        if a.memory_steps > 0:
            # A larger model (weights and optimizer state dominate the runtime's own memory),
            # randomly initialised from config.json alone.
            mem_dir = Path(tmp) / "mem_model"
            mem_dir.mkdir()
            hf_config(a, a.mem_hidden, a.mem_ffn, a.mem_layers, a.mem_seq).to_json_file(
                mem_dir / "config.json")
            n = a.memory_steps * a.mem_batch + 4
            text = long_texts(tmp, n, a.mem_seq)
            pref = long_preferences(tmp, n, a.mem_seq)
            print(f"\ntraining memory by method (Llama hidden {a.mem_hidden} x {a.mem_layers} "
                  f"layers, FFN {a.mem_ffn}; batch {a.mem_batch} x seq {a.mem_seq}, fp32, "
                  f"{a.memory_steps} steps, 1 rank; from the run files' /iterations)")
            print(f"  {'method':8} {'peak tensors [MiB]':>18} {'model state [MiB]':>18} "
                  f"{'RSS [MiB]':>10}")
            rows = {}
            for method in ("qlora", "lora", "dpo", "full", "qat"):
                r = trainscope_run(a, mem_dir, pref if method == "dpo" else text,
                                   Path(tmp) / f"{method}.h5", method, a.memory_steps,
                                   a.mem_batch, a.mem_seq, init="random")
                rows[method] = r
                print(f"  {method:8} {r['tensor_peak'] / 2**20:18.1f} {r['state'] / 2**20:18.1f} "
                      f"{r['rss'] / 2**20:10.1f}", flush=True)
            order = ["qlora", "lora", "dpo", "full"]
            peak = [rows[m]["tensor_peak"] for m in order]
            ok = all(x < y for x, y in zip(peak, peak[1:])) and \
                rows["qat"]["tensor_peak"] >= rows["full"]["tensor_peak"]
            print("  expected (the studies): qlora < lora < dpo < full <= qat; by peak tensor "
                  "memory: " + ("holds" if ok else "DOES NOT hold"))
            st = {m: rows[m]["state"] for m in rows}
            ok_state = st["qlora"] < st["lora"] == st["dpo"] < st["full"] == st["qat"]
            print("  model state (weights + gradients + optimizer state, from /iterations): "
                  "qlora < lora = dpo < full = qat: " + ("holds" if ok_state else "DOES NOT hold"))
            print("  (peak tensors: the largest host_tensor_peak_bytes, live LibTorch CPU tensor "
                  "storage within an iteration; RSS: the largest at an iteration's end, which also "
                  "holds freed heap glibc keeps, e.g. QLoRA's per-step dequantisation buffers)")


if __name__ == "__main__":
    main()
