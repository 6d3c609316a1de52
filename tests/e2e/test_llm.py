"""LLM fine-tuning end to end on 2 real CPU ranks: every method on the tiny Llama, every dataset
type, packing, the --dry-run memory plan of Llama-3-8B on 4 ranks, and bad input refused on every
rank. Each run's file is read back and checked for the values the issue asks to record."""

import json
import re
import struct

import numpy as np
import h5py
import pytest

from conftest import ROOT
from test_bad_input import both_ranks_said

LLM = ROOT / "inputs/llm"


def tiny_run(run_ts, tmp_path, method, *args, iters=None, ranks=2):
    out = tmp_path / f"{method}.h5"
    extra = [f"--train.max_iters={iters}"] if iters else []
    proc = run_ts(ranks, "--config", LLM / f"{method}-tiny.ini", f"--output.file={out}",
                  "--log.every=0", *extra, *args, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    f = h5py.File(out, "r")
    assert f.attrs["status"] in ("completed", b"completed")
    return f, proc


def text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def safetensors_header(path):
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        return json.loads(fh.read(n))


def common_checks(f, max_seq_len=256):
    it = f["iterations"]
    tokens, labels = it["tokens"][...], it["label_tokens"][...]
    assert tokens.shape[0] == 2 and tokens.shape[1] >= 3
    assert np.all(tokens > 0) and np.all(labels > 0) and np.all(labels <= tokens)
    pad = it["padding_fraction"][...]
    assert np.all((pad >= 0) & (pad < 1))
    assert np.all(it["seq_len_max"][...] <= max_seq_len)
    assert np.all(it["seq_len_min"][...] <= it["seq_len_max"][...])
    assert np.all(np.isfinite(it["loss"][...]))
    for col in ("tokens", "label_tokens", "padding_fraction", "frozen_weight_bytes"):
        assert it[col].attrs["units"] is not None
    # Memory on CPU: the host tensor counter's peaks. Model state is all live in the optimizer
    # phase, so its peak holds at least weights + gradients + optimizer state; the iteration's
    # peak is the largest phase peak or above.
    state = it["parameter_bytes"][...] + it["gradient_bytes"][...] + \
        it["optimizer_state_bytes"][...]
    phases = np.stack([it[f"{p}_peak_bytes"][...] for p in ("forward", "backward", "optimizer")])
    assert np.all(np.isfinite(phases)) and np.all(phases > 0)
    assert np.all(it["optimizer_peak_bytes"][...] >= state)
    assert np.all(it["host_tensor_peak_bytes"][...] >= phases.max(axis=0))
    assert np.all(it["host_tensor_bytes"][...] <= it["host_tensor_peak_bytes"][...])
    s = f["summary"].attrs
    assert float(s["peak_host_tensor_bytes"]) == np.max(it["host_tensor_peak_bytes"][...])
    assert float(s["throughput_tokens_per_s"]) > 0
    assert float(s["tokens"]) == pytest.approx(
        tokens[:, int(s["warmup_iterations"]):int(s["warmup_iterations"]) +
               int(s["measured_iterations"])].sum())


def test_lora_trains_adapters_only_and_saves_them(run_ts, tmp_path):
    f, _ = tiny_run(run_ts, tmp_path, "lora")
    with f:
        common_checks(f)
        plan = f["plan"].attrs
        assert text(plan["method"]) == "lora" and text(plan["dataset_format"]) == "instruct"
        trainable, params = int(plan["trainable_parameters"]), int(plan["parameters"])
        assert 0 < trainable < params / 10
        it = f["iterations"]
        assert np.all(it["trainable_weight_bytes"][...] == trainable * 4)  # fp32 adapters
        assert np.all(it["frozen_weight_bytes"][...] > it["trainable_weight_bytes"][...])
        # Only adapters are reduced: fp32 gradients of the trainable parameters.
        assert np.all(it["comm_bytes"][...] == trainable * 4)
        loss = it["loss"][0]
        assert loss[-3:].mean() < loss[:3].mean()  # over-fitting a small dataset
        adapters = text(plan["adapters_dir"])
    header = safetensors_header(f"{adapters}/adapter_model.safetensors")
    config = json.loads(open(f"{adapters}/adapter_config.json").read())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 8, 16)
    names = [k for k in header if k != "__metadata__"]
    assert any(k.endswith("layers.0.self_attn.q_proj.lora_A.weight") for k in names)
    assert all(k.startswith("base_model.model.") for k in names)
    assert sum(np.prod(header[k]["shape"]) for k in names) == trainable


def loss_falls(f):
    """Over-fitting the small dataset: the last iterations' loss is below the first ones'."""
    loss = f["iterations/loss"][0]
    assert loss[-3:].mean() < loss[:3].mean(), loss


def test_full_qlora_dpo_qat(run_ts, tmp_path):
    f, _ = tiny_run(run_ts, tmp_path, "full")
    with f:
        common_checks(f)
        loss_falls(f)
        p = f["plan"].attrs
        assert int(p["trainable_parameters"]) == int(p["parameters"])
        assert np.all(f["iterations/frozen_weight_bytes"][...] == 0)
        full_state = f["iterations/optimizer_state_bytes"][0, -1]
        assert full_state == 2 * 4 * int(p["parameters"])  # AdamW moments, fp32
    f, _ = tiny_run(run_ts, tmp_path, "qlora")
    with f:
        common_checks(f)
        loss_falls(f)
        assert "nf4" in text(f["plan"].attrs["projections"])
        nf4 = f["iterations/nf4_weight_bytes"][...]
        assert np.all(nf4 > 0)
    f, _ = tiny_run(run_ts, tmp_path, "dpo")
    with f:
        common_checks(f)
        loss_falls(f)
        it = f["iterations"]
        for col in ("dpo_reward_chosen", "dpo_reward_rejected", "dpo_reward_margin",
                    "dpo_reward_accuracy"):
            assert np.all(np.isfinite(it[col][...])), col
        acc = it["dpo_reward_accuracy"][...]
        assert np.all((acc >= 0) & (acc <= 1))
        assert text(f["plan"].attrs["dataset_format"]) == "preference"
    f, _ = tiny_run(run_ts, tmp_path, "qat")
    with f:
        common_checks(f)
        loss_falls(f)
        on = f["iterations/qat_enabled"][0]
        assert list(on[:4]) == [0, 0, 1, 1] and np.all(on[2:] == 1)  # llm.qat.start_step = 2


@pytest.mark.parametrize("precision", ["bf16", "fp16-mixed"])
def test_lora_in_low_precision(run_ts, tmp_path, precision):
    """torchtune's default bf16 (weights, adapters and optimizer state in bf16) and fp16 mixed
    (fp32 weights, fp16 autocast, dynamic loss scaling) train on CPU with finite losses."""
    f, _ = tiny_run(run_ts, tmp_path, "lora", f"--run.precision={precision}", iters=6)
    with f:
        it = f["iterations"]
        assert np.all(np.isfinite(it["loss"][...]))
        trainable = int(f["plan"].attrs["trainable_parameters"])
        scale = it["loss_scale"][...]
        if precision == "bf16":
            assert np.all(it["trainable_weight_bytes"][...] == trainable * 2)  # bf16 adapters
            assert np.all(np.isnan(scale))
            assert np.all(it["host_syncs"][...] == 0)  # the step reads nothing from the device
        else:
            assert np.all(it["trainable_weight_bytes"][...] == trainable * 4)  # fp32 master
            assert np.all(scale > 0) and np.all(np.isfinite(scale))
            assert np.all(np.isin(it["step_skipped"][...], [0, 1]))
            assert np.all(it["host_syncs"][...] == 1)  # the scaler's verdict, once per step


@pytest.mark.parametrize("precision", ["bf16-mixed", "fp16-mixed"])
def test_qlora_in_mixed_precision(run_ts, tmp_path, precision):
    """QLoRA under autocast: the NF4 projection's backward gets a gradient in the autocast dtype
    and must multiply it by the dequantised weight in that dtype (it crashed with exit 70,
    'expected m1 and m2 to have the same dtype', before)."""
    f, _ = tiny_run(run_ts, tmp_path, "qlora", f"--run.precision={precision}", iters=4)
    with f:
        assert np.all(np.isfinite(f["iterations"]["loss"][...]))


@pytest.mark.parametrize("zero", [1, 2])
def test_zero_shards_the_optimizer_state(run_ts, tmp_path, zero):
    f, _ = tiny_run(run_ts, tmp_path, "full", f"--dist.zero={zero}", iters=4)
    with f:
        common_checks(f)
        n = int(f["plan"].attrs["parameters"])
        it = f["iterations"]
        shard = (n + 1) // 2
        assert np.all(it["optimizer_state_bytes"][...] == 2 * 4 * shard)  # half per rank
        grads = it["gradient_bytes"][...]
        # Stage 1 keeps the full gradient buffer next to the shard; stage 2 only the shard.
        assert np.all(grads == 4 * shard + (4 * 2 * shard if zero == 1 else 0))
        assert np.all(it["comm_bytes"][...] > 0)


@pytest.mark.parametrize("method", ["lora", "full"])
def test_zero3_shards_the_weights_and_records_its_traffic(run_ts, tmp_path, method):
    """dist.zero=3 (FSDP) at 2 ranks: each rank stores half of the weights, the run file counts
    the per-unit all-gathers and gradient reduce-scatters, and the adapters still load whole."""
    f, _ = tiny_run(run_ts, tmp_path, method, "--dist.zero=3", iters=3)
    (tmp_path / "ref").mkdir()
    ref, _ = tiny_run(run_ts, tmp_path / "ref", method, iters=1)  # unsharded
    with f, ref:
        common_checks(f)
        it, it0 = f["iterations"], ref["iterations"]
        # Per rank about half of the unsharded weights (padding: a few elements per group).
        half = it0["parameter_bytes"][:, 0] / 2
        assert np.all(np.abs(it["parameter_bytes"][...] - half[:, None]) < 4096)
        ag, rs = it["allgather_bytes"][...], it["reduce_scatter_bytes"][...]
        # Every unit is gathered at least once per forward: at least this rank's shard of all.
        assert np.all(ag >= it["parameter_bytes"][...] * 0.99)
        assert np.all(rs > 0) and np.all(it["comm_bytes"][...] == ag + rs)
        for col in ("allgather_s", "reduce_scatter_s"):
            assert np.all(it[col][...] > 0)
        for col in ("allgather_exposed_s", "reduce_scatter_exposed_s"):
            assert np.all(it[col][...] >= 0)
        assert np.all(it["gathered_weight_bytes"][...] == 0)
        assert it["allgather_bytes"].attrs["units"] in ("B", b"B")
        assert np.all(np.isnan(it0["allgather_bytes"][...]))
        if method == "lora":
            adapter = tmp_path / "lora.h5.adapter"
            header = safetensors_header(adapter / "adapter_model.safetensors")
            a = [k for k in header if k.endswith("lora_A.weight")][0]
            assert header[a]["shape"][0] == 8  # the full rank-8 adapter, not a shard


def test_qat_with_lora_and_activation_checkpointing(run_ts, tmp_path):
    f, _ = tiny_run(run_ts, tmp_path, "qat", "--llm.qat.lora=true",
                    "--llm.activation_checkpointing=true", iters=4)
    with f:
        common_checks(f)
        assert "qat+lora" in text(f["plan"].attrs["projections"])
        assert int(f["plan"].attrs["trainable_parameters"]) < int(f["plan"].attrs["parameters"])


@pytest.mark.parametrize("data", ["summarize", "grammar", "chat", "sharegpt", "text"])
def test_each_dataset_type(run_ts, tmp_path, data):
    f, _ = tiny_run(run_ts, tmp_path, "lora", "--config", LLM / f"data-{data}.ini", iters=3)
    with f:
        common_checks(f)
        fmt = "chat" if data == "sharegpt" else data
        assert text(f["plan"].attrs["dataset_format"]) == fmt
        if data == "text":  # completion: every token but the first has a label
            it = f["iterations"]
            assert np.all(it["label_tokens"][...] == it["tokens"][...] - it["sequences"][...])


def test_packed_sequences_have_no_padding_inside(run_ts, tmp_path):
    f, _ = tiny_run(run_ts, tmp_path, "lora", "--llm.packed=true", "--llm.max_seq_len=128",
                    iters=3)
    with f:
        it = f["iterations"]
        # Packs are filled up to 128 tokens: little padding, no pack longer than 128.
        assert np.all(it["seq_len_max"][...] <= 128) and np.all(it["seq_len_max"][...] > 64)
        assert np.all(it["padding_fraction"][...] < 0.5)
        assert int(f["plan"].attrs["packed"]) == 1


def test_dry_run_prints_the_8b_memory_plan_on_4_ranks(run_ts, tmp_path):
    proc = run_ts(4, "--config", LLM / "llama3-8b-lora.ini", "--dry-run", "--run.device=cpu",
                  timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "8030261248 parameters" in out
    assert "19660800 trainable parameters" in out
    for method in ("full", "lora", "qlora", "dpo", "qat"):
        assert f"    {method}" in out, method
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("method", ["full", "qlora", "dpo", "qat"])
def test_every_8b_recipe_plans_on_4_ranks(run_ts, method):
    proc = run_ts(4, "--config", LLM / f"llama3-8b-{method}.ini", "--dry-run", "--run.device=cpu",
                  timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"method {method}" in proc.stdout and "this run" in proc.stdout


def test_bad_llm_input_is_refused_on_every_rank(run_ts, tmp_path):
    out = f"--output.file={tmp_path}/x.h5"
    proc = run_ts(2, "--config", LLM / "lora-tiny.ini", "--llm.method=dpo", out, timeout=120)
    assert proc.returncode != 0
    both_ranks_said(proc, "llm.method=dpo", "llm.dataset.format=preference")
    proc = run_ts(2, "--config", LLM / "lora-tiny.ini", "--llm.dataset.path=/nonexistent.jsonl",
                  out, timeout=120)
    assert proc.returncode != 0
    both_ranks_said(proc, "llm.dataset.path", "/nonexistent.jsonl")
    proc = run_ts(2, "--config", LLM / "lora-tiny.ini", "--llm.lora.targets=q_proj,qkv", out,
                  timeout=120)
    assert proc.returncode != 0
    both_ranks_said(proc, "qkv")
    proc = run_ts(2, "--config", LLM / "lora-tiny.ini", "--dist.zero=1", out, timeout=120)
    assert proc.returncode != 0
    both_ranks_said(proc, "dist.zero=1", "set dist.zero=0")
    # dist.zero=3 has no loss scaler; the sharding options mean nothing to other workloads.
    proc = run_ts(2, "--config", LLM / "lora-tiny.ini", "--dist.zero=3",
                  "--run.precision=fp16-mixed", out, timeout=120)
    assert proc.returncode == 2
    both_ranks_said(proc, "dist.zero=3 has no loss scaler", "bf16-mixed")
    proc = run_ts(2, "--config", LLM / "lora-tiny.ini", "--dist.zero=3", "--train.optimizer=sgd",
                  out, timeout=120)
    assert proc.returncode == 2
    both_ranks_said(proc, "dist.zero=3 implements AdamW", "train.optimizer=adamw")
    proc = run_ts(2, "--config", ROOT / "inputs/quickstart.ini", "--dist.prefetch=false", out,
                  timeout=120)
    assert proc.returncode == 2
    both_ranks_said(proc, "dist.prefetch (set at command line)", "run.workload=llm")
    assert not (tmp_path / "x.h5").exists()


def test_workload_defaults_are_recorded_as_run(run_ts, tmp_path):
    """An LLM run that leaves train.optimizer, train.lr, train.weight_decay and run.precision
    unset trains with torchtune's values (AdamW 3e-4, 0.01, bf16), and /config, /config/ini and
    --print-config say so: the recorded INI reruns the same job (it said the CV defaults, SGD 0.05
    fp32, before)."""
    unset = ("optimizer", "lr", "weight_decay", "precision")
    lines = (LLM / "full-tiny.ini").read_text().splitlines()
    ini = tmp_path / "defaults.ini"
    kept = [l for l in lines if l.split("=")[0].strip() not in unset]
    # The shipped file names its data relative to itself (inputs/llm/): absolute in the copy.
    kept = [re.sub(r"^(\s*(?:tokenizer|dataset\.path)\s*=\s*)(data/\S+)", rf"\g<1>{LLM}/\2", l)
            for l in kept]
    ini.write_text("\n".join(kept) + "\n")
    out = tmp_path / "defaults.h5"
    proc = run_ts(1, "--config", ini, f"--output.file={out}", "--log.every=0",
                  "--train.max_iters=2", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "run.workload=llm defaults (torchtune) for options left unset: train.optimizer=adamw, " \
           "train.lr=3e-4, train.weight_decay=0.01, run.precision=bf16" in proc.stdout + proc.stderr
    with h5py.File(out, "r") as f:
        cfg = f["config"].attrs
        assert text(cfg["train.optimizer"]) == "adamw"
        assert float(cfg["train.lr"]) == pytest.approx(3e-4)
        assert float(cfg["train.weight_decay"]) == pytest.approx(0.01)
        assert text(cfg["run.precision"]) == "bf16"
        recorded = f["config/ini"].asstr()[()]
        lr = f["iterations/lr"][0, :]  # the schedule's base is 3e-4, not the CV's 0.05
        assert np.all(lr > 0) and lr.max() <= 3e-4 * (1 + 1e-9)
    for line in ("optimizer = adamw", "lr = 3e-4", "weight_decay = 0.01", "precision = bf16"):
        assert line in recorded.splitlines(), recorded
    # An option given keeps its value; --print-config shows the same resolution as the run.
    shown = run_ts(1, "--config", ini, "--train.lr=0.002", "--print-config")
    assert shown.returncode == 0, shown.stderr
    assert "lr = 0.002" in shown.stdout and "optimizer = adamw" in shown.stdout
