"""The --dry-run memory plan held against what runs measure (issue 16), so the plan cannot drift:
for every LLM method (full, lora, qlora, dpo, qat) on the tiny Llama and for the CV model, one
short CPU run writes the plan of its own configuration to /plan (memory_plan_*_bytes, the
figures --dry-run prints) and the measurements to /iterations. Per category:

  weights, gradients, optimizer state  the bytes of the live tensors (parameter_bytes, ...)
  activations (LLM: + logits)          the larger of the forward and backward phase peaks of the
                                       host tensor counter above the resting state
                                       (host_tensor_bytes at the iteration's end)
  total                                model state + the largest phase peak above the resting state

Under dist.zero=3 (2 ranks) the units in flight are a worst case: activations and total must lie
between the plan without and with them. Model state must match the plan to TOL_STATE, activations to TOL_ACT, the total to TOL_TOTAL
(relative to the measurement; reached: state exact, activations within 3.5 %, totals within
2.5 %). The buffers the gradient synchronizer (DDP) or ZeRO keeps beside the model state
(memory_plan_comm_buffer_bytes) rest between iterations with the tensors no plan counts: those
must lie within OTHER_SLACK above the planned buffers (DDP with PowerSGD and with bf16 over MPI,
ZeRO-1/2 with bf16 reduce-scatters, all at 2 ranks). Every sequence has the planned length (packed SFT data; preference pairs truncated to
max_seq_len), as the plan assumes the full max_seq_len. fp32 for every method, plus pure bf16 for
LoRA (bf16 activations, fp32 norm inputs). Run with -s to see the table of plan vs measured.

dist.zero=3 (FSDP, issue 17): the --dry-run of the Llama-3-8B lora and full inis at 4 and 8 ranks
prints a stage-3 row for every method whose per-rank shards are the model's bytes / N (computed
here from Llama-3-8B's architecture) plus the units in flight (the largest adjacent pair, the head
and a layer, with dist.prefetch), and every stage-3 total falls from 4 to 8 ranks."""

import json

import h5py
import numpy as np
import pytest

from conftest import ROOT

LLM = ROOT / "inputs/llm"

TOL_STATE = 0.01
TOL_ACT = 0.06
TOL_TOTAL = 0.05
MIB = 2**20
OTHER_SLACK = MIB // 4

LLM_COMMON = ["--log.every=0", "--profile.warmup_iters=0", "--train.max_iters=3",
              "--llm.gradient_accumulation=1", "--data.workers=1", "--data.prefetch=1"]
LLM_CASES = {
    "full": ["--llm.packed=true", "--llm.max_seq_len=128", "--train.batch_size=2"],
    "lora": ["--llm.packed=true", "--llm.max_seq_len=128", "--train.batch_size=2"],
    "qlora": ["--llm.packed=true", "--llm.max_seq_len=128", "--train.batch_size=2"],
    # Preference pairs cannot be packed: a max_seq_len below the shortest pair truncates every
    # chosen and rejected sequence to exactly max_seq_len.
    "dpo": ["--llm.max_seq_len=24", "--train.batch_size=4"],
    "qat": ["--llm.packed=true", "--llm.max_seq_len=128", "--train.batch_size=2",
            "--llm.qat.start_step=0"],
    "lora-bf16": ["--llm.packed=true", "--llm.max_seq_len=128", "--train.batch_size=2",
                  "--run.precision=bf16"],
    # dist.zero=3 at 2 ranks: shards as model state; the gathered units and a unit's gradient in
    # flight are transient, measured in the phase peaks with the activations.
    # ZeRO-1 at 2 ranks: its end-of-iteration reading once varied by a shard (the all-gather's
    # staged input was released by the progress thread after the waiter resumed; now before).
    "full-zero1": ["--llm.packed=true", "--llm.max_seq_len=128", "--train.batch_size=2",
                   "--dist.zero=1"],
    "full-zero2": ["--llm.packed=true", "--llm.max_seq_len=128", "--train.batch_size=2",
                   "--dist.zero=2"],
    "full-zero3": ["--llm.packed=true", "--llm.max_seq_len=128", "--train.batch_size=2",
                   "--dist.zero=3"],
    # Data parallelism at 2 ranks: the synchronizer's own buffers (PowerSGD's error feedback, P
    # and Q; over MPI the float32 copy of bf16 gradients) rest beside the model state.
    "full-powersgd": ["--llm.packed=true", "--llm.max_seq_len=128", "--train.batch_size=2",
                      "--dist.compress=powersgd"],
    "lora-bf16ddp": ["--llm.packed=true", "--llm.max_seq_len=128", "--train.batch_size=2",
                     "--run.precision=bf16"],
    # ZeRO-1/2 with 16-bit reduce-scatters: the 16-bit gradient shard.
    "full-zero1c": ["--llm.packed=true", "--llm.max_seq_len=128", "--train.batch_size=2",
                    "--dist.zero=1", "--dist.compress=bf16"],
    "full-zero2c": ["--llm.packed=true", "--llm.max_seq_len=128", "--train.batch_size=2",
                    "--dist.zero=2", "--dist.compress=bf16"],
    "qlora-zero3": ["--llm.packed=true", "--llm.max_seq_len=128", "--train.batch_size=2",
                    "--dist.zero=3"],
    # Activation checkpointing: the head's working set (forward) and a layer's recomputed set
    # (backward) never coexist, so the plan counts the head only beyond that set (planned 13.7
    # against 13.3 MiB measured for LoRA before, activations +7.5 %; full +33.5 %).
    "lora-ac": ["--llm.packed=true", "--llm.max_seq_len=128", "--train.batch_size=2",
                "--llm.activation_checkpointing=true"],
    "full-ac": ["--llm.packed=true", "--llm.max_seq_len=128", "--train.batch_size=2",
                "--llm.activation_checkpointing=true"],
    "dpo-ac": ["--llm.max_seq_len=24", "--train.batch_size=4",
               "--llm.activation_checkpointing=true"],
}
RANKS = {"full-zero1": 2, "full-zero2": 2, "full-zero3": 2, "qlora-zero3": 2, "full-zero1c": 2,
         "full-zero2c": 2, "full-powersgd": 2, "lora-bf16ddp": 2}
CV_ARGS = ["--config", str(ROOT / "inputs/quickstart.ini"), "--data.dataset=synthetic",
           "--data.synthetic_samples=512", "--train.batch_size=32", "--train.max_iters=3",
           "--train.eval=false", "--log.every=0", "--profile.warmup_iters=0",
           "--data.workers=1", "--data.prefetch=1"]

ROWS = {}


def measure(path):
    """(plan, measured) per category in bytes, from the last (steady-state) iteration of rank 0."""
    with h5py.File(path, "r") as f:
        p = f["plan"].attrs
        it = f["iterations"]
        last = lambda col: float(it[col][0, -1])  # noqa: E731
        plan = {k: float(p[f"memory_plan_{k}_bytes"])
                for k in ("weight", "gradient", "optimizer_state", "activation")}
        if "memory_plan_logits_bytes" in p:  # LLM: logits are activations too
            plan["activation"] += float(p["memory_plan_logits_bytes"])
        # dist.zero=3: the units in flight (gathered weights, a unit's gradient) are transient,
        # measured in the phase peaks; the plan counts their worst case.
        plan["in_flight"] = sum(float(p.get(f"memory_plan_{t}_bytes", 0.0))
                                for t in ("gathered_weight", "unit_gradient"))
        # The gradient synchronizer's (DDP) or ZeRO's own buffers live between iterations beside
        # the model state: in the resting tensors beyond it ("other", below), which the measured
        # total leaves out, so the plan's total is compared without them and they on their own.
        plan["comm"] = float(p.get("memory_plan_comm_buffer_bytes", 0.0))
        plan["total"] = float(p["memory_estimate_bytes"]) - plan["comm"]
        rest = last("host_tensor_bytes")
        state = {"weight": last("parameter_bytes"), "gradient": last("gradient_bytes"),
                 "optimizer_state": last("optimizer_state_bytes")}
        peaks = {ph: last(f"{ph}_peak_bytes") for ph in ("forward", "backward", "optimizer")}
        measured = dict(state)
        measured["activation"] = max(peaks["forward"], peaks["backward"]) - rest
        measured["total"] = sum(state.values()) + max(peaks.values()) - rest
        measured["other"] = rest - sum(state.values())  # dataset, batches: not in the plan
        measured["peak_phase"] = max(peaks, key=peaks.get)
    return plan, measured


def check(name, plan, measured, other_slack=OTHER_SLACK):
    ROWS[name] = (plan, measured)
    # The resting tensors beyond the model state: the planned comm buffers, plus what no plan
    # counts (LLM: a few KiB, the batch's index tensors and RoPE tables; CV: the dataset too).
    assert plan["comm"] <= measured["other"] <= plan["comm"] + other_slack, (
        f"{name}: resting tensors beyond the model state {measured['other'] / MIB:.3f} MiB, "
        f"planned comm buffers {plan['comm'] / MIB:.3f} MiB")
    flight = plan["in_flight"]
    for k, tol in (("weight", TOL_STATE), ("gradient", TOL_STATE),
                   ("optimizer_state", TOL_STATE), ("activation", TOL_ACT), ("total", TOL_TOTAL)):
        m, p = measured[k], plan[k]
        if k in ("activation", "total") and flight > 0:
            # Stage 3: the measurement lies between the plan without the units in flight and the
            # plan with their worst case (the total already includes it).
            low = p - (flight if k == "total" else 0.0)
            high = p + (flight if k == "activation" else 0.0)
            assert low * (1 - tol) <= m <= high * (1 + tol), (
                f"{name} {k}: measured {m / MIB:.3f} MiB outside the plan's "
                f"[{low / MIB:.3f}, {high / MIB:.3f}] MiB (units in flight {flight / MIB:.3f} MiB)")
            continue
        assert abs(p - m) <= tol * max(m, 1.0), (
            f"{name} {k}: plan {p / MIB:.3f} MiB vs measured {m / MIB:.3f} MiB "
            f"({(p - m) / max(m, 1.0):+.1%}, tolerance {tol:.0%})")


@pytest.mark.parametrize("case", list(LLM_CASES))
def test_llm_plan_matches_measured(run_ts, tmp_path, case):
    out = tmp_path / f"{case}.h5"
    method = case.split("-")[0]
    proc = run_ts(RANKS.get(case, 1), "--config", ROOT / f"inputs/llm/{method}-tiny.ini",
                  f"--output.file={out}",
                  *LLM_COMMON, *LLM_CASES[case], timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with h5py.File(out, "r") as f:
        it = f["iterations"]
        # Every batch row has the planned length (tokens + padding = sequences x max_seq_len),
        # or the plan's activations are not comparable.
        seq = int(f["plan"].attrs["max_seq_len"])
        width = it["tokens"][...] / (1 - it["padding_fraction"][...]) / it["sequences"][...]
        assert np.allclose(width, seq), width
    check(case, *measure(out))


# Issue 36: the tiny shapes with Llama-3's vocabulary (128256), where the head's logits and the
# embeddings dominate: every method at dist.zero 0 (1 rank) and 3 (2 ranks) with the default
# chunked loss (llm.loss_chunks=8); the plan's total within 3 % of the measured peak.
LLAMA3_VOCAB_TINY = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
    "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
    "tie_word_embeddings": False, "hidden_act": "silu"}
TOL_VOCAB_TOTAL = 0.03  # issue 36 asks 10 %; reached 1 %


@pytest.mark.parametrize("zero", [0, 3])
@pytest.mark.parametrize("method", ["full", "lora", "qlora", "dpo", "qat"])
def test_llm_plan_with_llama3_vocabulary(run_ts, tmp_path, method, zero):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA3_VOCAB_TINY))
    out = tmp_path / f"{method}-{zero}.h5"
    proc = run_ts(2 if zero == 3 else 1, "--config", ROOT / f"inputs/llm/{method}-tiny.ini",
                  f"--llm.model={config}", f"--output.file={out}", "--llm.save_adapters=none",
                  f"--dist.zero={zero}", *LLM_COMMON, *LLM_CASES[method], timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with h5py.File(out, "r") as f:
        assert int(f["plan"].attrs["loss_chunks"]) == 8
        assert f["plan"].attrs["sdpa_backend"] in ("flash", "math"), f["plan"].attrs["sdpa_backend"]
    plan, measured = measure(out)
    ROWS[f"{method}-v128k-z{zero}"] = (plan, measured)
    for k in ("weight", "gradient", "optimizer_state"):
        assert abs(plan[k] - measured[k]) <= TOL_STATE * max(measured[k], 1.0), (method, zero, k)
    p, m, flight = plan["total"], measured["total"], plan["in_flight"]
    low = p - flight  # stage 3: between the plan without and with the units in flight
    assert low * (1 - TOL_VOCAB_TOTAL) <= m <= p * (1 + TOL_VOCAB_TOTAL), (
        f"{method} zero {zero}: measured total {m / MIB:.1f} MiB, plan {p / MIB:.1f} MiB "
        f"(without the units in flight {low / MIB:.1f} MiB)")


# Issue 36 point 3: under dist.zero=3 the model is materialised one unit at a time and each unit is
# sharded before the next is built, so no rank ever holds the whole model. Eight decoder layers and
# a small vocabulary: the layers are most of the weights, one unit an eighth of them.
DEEP_TINY = dict(LLAMA3_VOCAB_TINY, vocab_size=1024, num_hidden_layers=8)


def test_fsdp_build_peak_falls_with_rank_count(run_ts, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(DEEP_TINY))
    peaks = {}
    for ranks in (1, 2, 4):
        out = tmp_path / f"build-{ranks}.h5"
        proc = run_ts(ranks, "--config", ROOT / "inputs/llm/lora-tiny.ini", f"--llm.model={config}",
                      f"--output.file={out}", "--llm.save_adapters=none", "--dist.zero=3",
                      *LLM_COMMON, "--train.max_iters=1", timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "model build: peak" in proc.stdout + proc.stderr
        with h5py.File(out, "r") as f:
            peaks[ranks] = float(f["plan"].attrs["build_peak_bytes"])
            weights = 4.0 * float(f["plan"].attrs["parameters"])  # fp32
    print("\nbuild peak per rank (MiB): " + ", ".join(
        f"{r} ranks {p / MIB:.2f}" for r, p in peaks.items()) + f"; model {weights / MIB:.2f}")
    # One rank holds every unit (its shards are the whole model) and one unit's flat copy.
    assert weights <= peaks[1] <= 1.5 * weights, (peaks, weights)
    assert peaks[1] > peaks[2] > peaks[4], peaks
    # At 4 ranks: a quarter of the weights and about two units in flight, never the whole model.
    assert peaks[4] < 0.6 * weights, (peaks, weights)


def test_cv_plan_matches_measured(run_ts, tmp_path):
    out = tmp_path / "cv.h5"
    proc = run_ts(1, *CV_ARGS, f"--output.file={out}", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check("cv", *measure(out), other_slack=float("inf"))  # the synthetic images rest there


# Llama-3-8B by its architecture: vocab 128256, hidden 4096, 32 layers, KV width 1024, FFN 14336.
V, H, KV, F, L = 128256, 4096, 1024, 14336, 32
LAYER = 2 * H * H + 2 * H * KV + 3 * H * F + 2 * H  # q, o, k, v, MLP, 2 norms
HEAD = V * H + H  # lm_head + final norm: the largest unit
PARAMS = V * H + L * LAYER + HEAD
ADAPTERS = L * 8 * ((H + H) + (H + KV) + (H + H) + 3 * (H + F))  # rank 8 on q, v, o, MLP
METHODS = ("full", "lora", "qlora", "dpo", "qat")
COLUMNS = ("trainable_parameters", "frozen", "nf4", "trainable", "grads", "optim", "activ",
           "logits", "gathered", "unitgrad", "cublas", "comm", "total")
GIB = 2**30


def plan_rows(stdout):
    """{(method, zero): {column: GiB per rank, "this_run": bool}} from the dry run's table."""
    rows = {}
    for line in stdout.splitlines():
        cells = line.split()
        if len(cells) >= 2 + len(COLUMNS) and cells[0] in METHODS and cells[1].isdigit():
            row = dict(zip(COLUMNS, map(float, cells[2:2 + len(COLUMNS)])))
            row["this_run"] = "<- this run" in line
            rows[(cells[0], int(cells[1]))] = row
    return rows


@pytest.mark.parametrize("method", ["lora", "full"])
def test_8b_stage3_dry_run_shards_by_rank_count(run_ts, method):
    plans = {}
    for ranks in (4, 8):
        proc = run_ts(ranks, "--config", LLM / f"llama3-8b-{method}.ini", "--dry-run",
                      "--run.device=cpu", "--dist.zero=3", timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        rows = plans[ranks] = plan_rows(proc.stdout)
        assert {(m, 3) for m in METHODS} <= rows.keys(), sorted(rows)
        assert [k for k, r in rows.items() if r["this_run"]] == [(method, 3)]
        gib = lambda b: pytest.approx(b / GIB, abs=0.006)  # noqa: E731 (printed to 0.01 GiB)
        full = rows[("full", 3)]
        assert full["trainable"] == gib(2 * PARAMS / ranks)
        assert full["grads"] == gib(2 * PARAMS / ranks)
        assert full["optim"] == gib(4 * PARAMS / ranks)
        # The head and its neighbour, a decoder layer (prefetch: the largest adjacent pair); the
        # head's gradient is summed in the chunked loss's column (llm.loss_chunks=8), the
        # embedding's (no larger) exists only after it: no unit gradient adds.
        assert full["gathered"] == gib(2 * (HEAD + LAYER))
        assert full["unitgrad"] == gib(0)
        assert full["cublas"] == 0  # no cuBLAS workspace on a CPU plan
        for m in ("lora", "dpo"):
            r = rows[(m, 3)]
            assert r["frozen"] == gib(2 * PARAMS / ranks)
            assert r["trainable"] == gib(2 * ADAPTERS / ranks)
            assert r["optim"] == gib(4 * ADAPTERS / ranks)
            assert r["gathered"] == gib(2 * (HEAD + LAYER + ADAPTERS / L))  # frozen, gathered
        qlora = rows[("qlora", 3)]
        proj = L * (LAYER - 2 * H)
        assert qlora["nf4"] == gib(proj * (0.5 + 1 / 64 + 4 / (64 * 256)) / ranks)
        assert qlora["frozen"] == gib(2 * (PARAMS - proj) / ranks)
        # Unsharded rows do not depend on the rank count; activations do not shard.
        assert rows[("lora", 0)]["frozen"] == gib(2 * PARAMS)
        assert rows[("full", 0)]["gathered"] == 0 and rows[("full", 0)]["unitgrad"] == 0
        for m in METHODS:
            assert rows[(m, 3)]["activ"] == rows[(m, 0)]["activ"], m
    for m in METHODS:
        assert plans[8][(m, 3)]["total"] < plans[4][(m, 3)]["total"], m
    # Full fine-tuning: 8 bytes of state per parameter, 1/N each.
    assert plans[4][("full", 3)]["total"] - plans[8][("full", 3)]["total"] == pytest.approx(
        8 * PARAMS * (1 / 4 - 1 / 8) / GIB, abs=0.02)


def teardown_module(module):
    if not ROWS:
        return
    print("\nmemory plan vs measured (MiB per rank; measured / plan)")
    print(f"  {'case':9} {'weights':>17} {'gradients':>17} {'optimizer':>17} "
          f"{'activations':>17} {'total':>17}  peak phase, other tensors")
    for name, (plan, m) in ROWS.items():
        cells = [f"{m[k] / MIB:8.3f}/{plan[k] / MIB:8.3f}"
                 for k in ("weight", "gradient", "optimizer_state", "activation", "total")]
        print(f"  {name:9} " + " ".join(cells) + f"  {m['peak_phase']}, {m['other'] / MIB:.3f}"
              f" (planned comm buffers {plan.get('comm', 0.0) / MIB:.3f})")
