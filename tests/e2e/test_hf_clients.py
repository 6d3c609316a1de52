"""trainscope against the real Hugging Face clients (transformers, peft, tiktoken from the project
venv) on tiny random Llamas that transformers builds and saves itself: GQA, Llama-3.1 rope scaling
with a short original context (all three frequency bands occur), tied and untied heads, non-unit
norm scales and weights large enough that attention is far from uniform.

- Per-sample training loss: trainscope trains one epoch with batch 1 and lr 0 (the weights never
  move), so every iteration's /iterations/loss is one sample's loss; samples have distinct token
  counts, so /iterations/tokens says which sample it was. transformers computes the same sample's
  loss (labels = input ids, shifted inside); both must agree to REL_TOL.
- rope: a config.json written in transformers 5's form (rope_parameters only) gives bit-identical
  losses to the older form; theta 10000 without scaling (the old silent default) would not.
- LoRA adapters: trainscope trains an epoch (step schedule, gamma 0: the second epoch runs at lr 0,
  so its losses are the saved adapters' losses) and writes a PEFT directory; peft's
  PeftModel.from_pretrained loads it (every adapter tensor, bit-equal) and reproduces those
  losses to REL_TOL.
- Refusals on 2 ranks: attention_bias / mlp_bias checkpoints, a stray tensor, and hostile
  checkpoints (sizes that do not divide, truncated safetensors, wrong shapes, missing tensors,
  config.json that is not JSON, no rope theta, a tied head that differs from the embedding): each
  ends within seconds with the documented exit code and a message naming the file/key and the fix
  on every rank, and leaves no run file claiming "completed".
"""

import json
import shutil
import time
from pathlib import Path

import h5py
import numpy as np
import peft
import pytest
import safetensors.torch as safetensors_torch
import tiktoken
import tiktoken.load
import torch
import transformers

from conftest import ROOT
from test_bad_input import CRASH_SIGNS, both_ranks_said, no_completed_run_file

TOKENIZER = ROOT / "inputs/llm/data/tiny_tokenizer.model"
TEXT = ROOT / "inputs/llm/data/text.jsonl"
# Llama-3's split pattern (docs/llm.md): trainscope runs it on PCRE2, tiktoken on its own engine.
SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
         r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Measured: 5e-8 (per-sample loss) and 3e-8 (peft) relative; fp32 on both sides, summed in
# other orders.
REL_TOL = 1e-6
SAMPLES = 6
ROPE_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
FAIL_WITHIN_S = 30


# ---- models, data and tokens, built once for the module ---------------------------------------

def save_model(where, tied, **config):
    """A random Llama saved by transformers itself (config.json + model.safetensors)."""
    torch.manual_seed(7 if tied else 3)
    cfg = transformers.LlamaConfig(
        vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling=dict(ROPE_SCALING), max_position_embeddings=256, tie_word_embeddings=tied,
        initializer_range=0.2, **config)
    model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():  # non-unit norm scales, so a norm applied in the wrong place shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(where, safe_serialization=True)
    return Path(where)


def tokenizer():
    ranks = tiktoken.load.load_tiktoken_bpe(str(TOKENIZER))
    enc = tiktoken.Encoding("trainscope-tiny", pat_str=SPLIT, mergeable_ranks=ranks,
                            special_tokens={})
    return enc, len(ranks), len(ranks) + 1  # encoder, BOS, EOS (the first two specials)


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    where = tmp_path_factory.mktemp("hf")
    enc, bos, eos = tokenizer()
    # Growing prefixes of one paragraph: strictly increasing token counts.
    words = " ".join(json.loads(l)["text"] for l in TEXT.read_text().splitlines()[:3]).split()
    texts = [" ".join(words[:4 + 6 * i]) for i in range(SAMPLES)]
    data = where / "text.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    samples = {}
    for t in texts:
        ids = [bos] + enc.encode(t) + [eos]
        samples[len(ids)] = ids
    assert len(samples) == SAMPLES and max(samples) < 128, sorted(samples)
    return {"untied": save_model(where / "untied", tied=False),
            "tied": save_model(where / "tied", tied=True), "data": data, "samples": samples}


def hf_losses(model, samples):
    """transformers' loss per sample (mean over the shifted label tokens), by token count."""
    model.eval()
    with torch.no_grad():
        return {n: float(model(input_ids=torch.tensor([ids]), labels=torch.tensor([ids])).loss)
                for n, ids in samples.items()}


def load_hf(model_dir, **config):
    return transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                         **config)


# ---- trainscope runs ----------------------------------------------------------------------------

def base_args(model_dir, data, out):
    return ["--run.workload=llm", "--run.strategy=ddp-ds", "--run.device=cpu",
            "--run.precision=fp32", "--run.threads=1", f"--llm.model={model_dir}",
            "--llm.init=checkpoint", f"--llm.tokenizer={TOKENIZER}",
            f"--llm.dataset.path={data}", "--llm.dataset.format=text", "--llm.max_seq_len=128",
            "--train.batch_size=1", "--llm.gradient_accumulation=1", "--profile.warmup_iters=0",
            "--log.every=0", f"--output.file={out}"]


def per_sample_losses(run_ts, model_dir, data, out, *args):
    """trainscope's recorded loss of every iteration (batch 1), keyed by the sample's tokens."""
    proc = run_ts(1, *base_args(model_dir, data, out), *args, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] in ("completed", b"completed")
        loss, tokens = f["iterations/loss"][0], f["iterations/tokens"][0]
        plan = dict(f["plan"].attrs)
    return [(int(n), float(l)) for n, l in zip(tokens, loss)], plan, proc


def lr0_losses(run_ts, model_dir, data, out):
    rows, _, proc = per_sample_losses(run_ts, model_dir, data, out, "--llm.method=full",
                                      "--train.lr=0", "--train.epochs=1",
                                      "--train.schedule=constant", "--train.optimizer=adamw")
    assert len(rows) == SAMPLES, rows
    return dict(rows), proc


def assert_close(ts, ref, what):
    assert sorted(ts) == sorted(ref), (what, sorted(ts), sorted(ref))
    rel = {n: abs(ts[n] - ref[n]) / abs(ref[n]) for n in ref}
    print(f"{what}: max relative difference {max(rel.values()):.2e} over {len(rel)} samples")
    assert max(rel.values()) < REL_TOL, (what, ts, ref)
    return max(rel.values())


@pytest.mark.parametrize("kind", ["untied", "tied"])
def test_per_sample_loss_equals_transformers(run_ts, tmp_path, hf, kind):
    ts, proc = lr0_losses(run_ts, hf[kind], hf["data"], tmp_path / "run.h5")
    ref = hf_losses(load_hf(hf[kind]), hf["samples"])
    assert_close(ts, ref, f"{kind} head vs transformers")


@pytest.mark.parametrize("split", ["fraction", "fraction-zero3", "file"])
def test_validation_loss_equals_transformers(run_ts, tmp_path, hf, split):
    """lr 0 on 2 ranks (the weights never move): /epochs val_loss is the summed token loss of the
    held-out samples over their label tokens (torchtune's normalisation), as transformers computes
    it sample by sample; under dist.zero=3 too, with shards of unequal size. With a split, no rank
    ever trains on a held-out sample (batch 1: /iterations/tokens names each trained sample)."""
    out = tmp_path / "run.h5"
    batch = 2 if split == "file" else 1
    args = [a for a in base_args(hf["untied"], hf["data"], out) if "batch_size" not in a]
    args += ["--llm.method=full", "--train.lr=0", "--train.epochs=2", f"--train.batch_size={batch}",
             "--train.schedule=constant", "--train.optimizer=adamw"]
    if split == "file":  # all 6: 3 per rank, eval batches of 2 and 1 (padding inside a batch)
        args.append(f"--llm.val_dataset.path={hf['data']}")
    else:  # 3 held out: 2 on rank 0, 1 (and a stand-in forward) on rank 1
        args.append("--llm.val_fraction=0.5")
    if split.endswith("zero3"):
        args.append("--dist.zero=3")
    proc = run_ts(2, *args, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    by_line = sorted(hf["samples"])  # token counts grow with the line: line i has by_line[i]
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] in ("completed", b"completed")
        val = f["epochs/val_loss"][...]
        held = ([int(i) for i in f["plan/val_indices"][...]] if split != "file"
                else list(range(SAMPLES)))
        trained = f["iterations/tokens"][...]  # [rank, iteration]
    assert val.shape == (2, 2) and np.all(val == val[0, 0])  # lr 0: both epochs alike
    held_tokens = {by_line[i] for i in held}
    if split != "file":
        assert len(held) == 3
        for rank in (0, 1):
            assert not held_tokens & {int(t) for t in trained[rank]}, (rank, held, trained)
    ref_losses = hf_losses(load_hf(hf["untied"]), {n: hf["samples"][n] for n in held_tokens})
    ref = sum(ref_losses[n] * (n - 1) for n in held_tokens) / sum(n - 1 for n in held_tokens)
    rel = abs(val[0, 0] - ref) / ref
    print(f"{split}: val_loss {val[0, 0]:.8f} vs transformers {ref:.8f}, relative {rel:.1e}")
    assert rel < REL_TOL


def test_rope_parameters_form_reads_like_the_old_form(run_ts, tmp_path, hf):
    """transformers 5 writes {"rope_parameters": {"rope_type", "rope_theta", scaling keys}} and
    no top-level rope_theta / rope_scaling; the installed 4.x writes the old form."""
    new_dir = tmp_path / "rope_parameters"
    shutil.copytree(hf["untied"], new_dir)
    cfg = json.loads((new_dir / "config.json").read_text())
    assert cfg["rope_theta"] == 500000.0 and cfg["rope_scaling"]["rope_type"] == "llama3"
    cfg["rope_parameters"] = {"rope_theta": cfg.pop("rope_theta"), **cfg.pop("rope_scaling")}
    (new_dir / "config.json").write_text(json.dumps(cfg, indent=2))
    old, _ = lr0_losses(run_ts, hf["untied"], hf["data"], tmp_path / "old.h5")
    new, _ = lr0_losses(run_ts, new_dir, hf["data"], tmp_path / "new.h5")
    assert new == old  # the same model: bit-identical losses
    ref = hf_losses(load_hf(hf["untied"]), hf["samples"])
    assert_close(new, ref, "rope_parameters config vs transformers")
    # What the loss would be had theta defaulted to 10000 without scaling: far outside REL_TOL,
    # so the comparison above does see the rotary settings.
    wrong = hf_losses(load_hf(hf["untied"], rope_theta=10000.0, rope_scaling=None),
                      hf["samples"])
    off = max(abs(wrong[n] - ref[n]) / ref[n] for n in ref)
    print(f"theta 10000 without scaling would be off by {off:.1e} (relative)")
    assert off > 1000 * REL_TOL


def test_lora_adapter_directory_loads_in_peft_and_reproduces_the_loss(run_ts, tmp_path, hf):
    out = tmp_path / "lora.h5"
    targets = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,lm_head"
    rows, plan, _ = per_sample_losses(
        run_ts, hf["untied"], hf["data"], out, "--llm.method=lora", "--llm.lora.rank=4",
        "--llm.lora.alpha=8", f"--llm.lora.targets={targets}", "--train.optimizer=adamw",
        "--train.lr=0.02", "--train.weight_decay=0.01", "--train.epochs=2",
        "--train.schedule=step", "--train.step_epochs=1", "--train.gamma=0")
    assert len(rows) == 2 * SAMPLES
    # Epoch 2 runs at lr 0: its losses are those of the adapters written at the end.
    trained = dict(rows[SAMPLES:])
    base = hf_losses(load_hf(hf["untied"]), hf["samples"])
    assert sum(trained.values()) < sum(base.values()), (trained, base)  # the adapters learnt
    adapter = Path(plan["adapters_dir"].decode() if isinstance(plan["adapters_dir"], bytes)
                   else plan["adapters_dir"])
    assert adapter == Path(f"{out}.adapter")
    assert sorted(p.name for p in adapter.iterdir()) == ["adapter_config.json",
                                                         "adapter_model.safetensors"]
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert (config["peft_type"], config["task_type"], config["r"], config["lora_alpha"],
            config["lora_dropout"]) == ("LORA", "CAUSAL_LM", 4, 8, 0)
    assert sorted(config["target_modules"]) == sorted(targets.split(","))
    assert config["base_model_name_or_path"] == str(hf["untied"])
    saved = safetensors_torch.load_file(adapter / "adapter_model.safetensors")
    assert "base_model.model.lm_head.lora_A.weight" in saved
    assert "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight" in saved

    model = peft.PeftModel.from_pretrained(load_hf(hf["untied"]), adapter)
    # Every adapter tensor of the loaded model is the file's, bit for bit (none left at init).
    loaded = {k: v for k, v in model.state_dict().items() if "lora_" in k}
    assert len(loaded) == len(saved) == 2 * (7 * 2 + 1)
    for name, t in saved.items():
        key = name.replace(".lora_A.weight", ".lora_A.default.weight").replace(
            ".lora_B.weight", ".lora_B.default.weight")
        assert torch.equal(loaded[key], t), name
    assert_close(trained, hf_losses(model, hf["samples"]), "peft with trainscope's adapters")


# ---- refusals: unsupported and hostile checkpoints, 2 ranks -------------------------------------

def edit_config(model_dir, edit):
    cfg = json.loads((model_dir / "config.json").read_text())
    edit(cfg)
    (model_dir / "config.json").write_text(json.dumps(cfg))


def edit_tensors(model_dir, edit):
    path = model_dir / "model.safetensors"
    tensors = safetensors_torch.load_file(path)
    edit(tensors)
    safetensors_torch.save_file(tensors, path, metadata={"format": "pt"})


def copy_of(hf, kind, tmp):
    d = tmp / "model"
    shutil.copytree(hf[kind], d)
    return d


def biased(hf, tmp, **flag):
    return save_model(tmp / "model", tied=False, **flag)


def truncated(hf, tmp):
    d = copy_of(hf, "untied", tmp)
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[:-1000])  # an interrupted download
    return d


def edited(kind, editor, edit):
    """A case's setup: a copy of the `kind` model with editor(dir, edit) applied."""
    def setup(hf, tmp):
        d = copy_of(hf, kind, tmp)
        editor(d, edit)
        return d
    return setup


def config_edit(kind, edit):
    return edited(kind, edit_config, edit)


def tensors_edit(kind, edit):
    return edited(kind, edit_tensors, edit)


def not_json(hf, tmp):
    d = copy_of(hf, "untied", tmp)
    (d / "config.json").write_text('{"hidden_size": 64, "num_attention_heads": 4,')
    return d


def odd_heads(cfg):
    cfg.update(hidden_size=66)
    del cfg["head_dim"]  # transformers 4.x writes it; HF would derive 66 // 4 = 16 silently


def no_rope(cfg):
    del cfg["rope_theta"], cfg["rope_scaling"]


C, I = 2, 3
# id, exit code, setup(hf, tmp) -> model dir, needles ("{dir}" = the model directory)
REFUSALS = [
    ("attention-bias", C, lambda hf, tmp: biased(hf, tmp, attention_bias=True),
     ("'{dir}/config.json': attention_bias=true", "has no attention biases",
      "use a checkpoint without attention biases")),
    ("mlp-bias", C, lambda hf, tmp: biased(hf, tmp, mlp_bias=True),
     ("'{dir}/config.json': mlp_bias=true", "use a checkpoint without MLP biases")),
    ("stray-tensor", I, tensors_edit("untied", lambda t: t.update(
        {"model.layers.1.self_attn.o_proj.bias": torch.zeros(64)})),
     ("checkpoint '{dir}' holds 1 tensor(s) trainscope's Llama does not use "
      "('model.layers.1.self_attn.o_proj.bias')", "has no biases",
      "use a Llama-3 / 3.1 / 3.2 checkpoint")),
    ("hidden-not-divisible-by-heads", C, config_edit("untied", odd_heads),
     ("'{dir}/config.json': hidden_size = 66 is not a multiple of num_attention_heads = 4",
      "give head_dim explicitly")),
    ("kv-heads-do-not-divide-heads", C,
     config_edit("untied", lambda c: c.update(num_key_value_heads=3)),
     ("'{dir}/config.json': num_attention_heads = 4 is not a multiple of num_key_value_heads = 3",
      "fix num_key_value_heads or num_attention_heads")),
    ("safetensors-offsets-beyond-the-file", I, truncated,
     ("safetensors file '{dir}/model.safetensors'", "outside the data section",
      "copy or download it again")),
    ("tensor-with-wrong-shape", I,
     config_edit("untied", lambda c: c.update(intermediate_size=96)),
     ("model.layers.0.mlp.gate_proj.weight' in '{dir}/model.safetensors' has shape [128, 64] but "
      "the model expects [96, 64]", "use the config.json that came with these weights")),
    ("missing-tensor", I, tensors_edit("untied", lambda t: t.pop("model.norm.weight")),
     ("checkpoint '{dir}' has no tensor 'model.norm.weight'",
      "use a complete Llama checkpoint")),
    ("config-not-json", C, not_json,
     ("'{dir}/config.json' is not valid JSON", "fix or replace the file")),
    ("no-rope-theta", C, config_edit("untied", no_rope),
     ("'{dir}/config.json': no rotary base found", "\"rope_parameters\": {\"rope_theta\": ...}",
      "top-level \"rope_theta\"")),
    ("unsupported-rope-type", C, config_edit("untied", lambda c: c.update(
        rope_scaling={"rope_type": "yarn", "factor": 4.0})),
     ("'{dir}/config.json': \"rope_scaling\" has rope type 'yarn'", "use a Llama-3")),
    ("tied-head-differs-from-embedding", I, tensors_edit("tied", lambda t: t.update(
        {"lm_head.weight": t["model.embed_tokens.weight"] + 1})),
     ("tie_word_embeddings=true but the stored 'lm_head.weight' differs",
      "set tie_word_embeddings to false")),
]


@pytest.mark.parametrize("case", REFUSALS, ids=[c[0] for c in REFUSALS])
def test_refused_on_every_rank(run_ts, tmp_path, hf, case):
    _, code, setup, needles = case
    model_dir = setup(hf, tmp_path)
    t0 = time.monotonic()
    proc = run_ts(2, *base_args(model_dir, hf["data"], tmp_path / "out.h5"), "--llm.method=lora",
                  "--train.max_iters=2", timeout=FAIL_WITHIN_S + 30)
    elapsed = time.monotonic() - t0
    text = proc.stdout + proc.stderr
    assert proc.returncode == code, f"exit {proc.returncode}, expected {code}:\n{text}"
    assert elapsed < FAIL_WITHIN_S, f"took {elapsed:.0f} s to fail:\n{text}"
    for sign in CRASH_SIGNS:
        assert sign not in text, f"crash sign {sign!r}:\n{text}"
    both_ranks_said(proc, *[n.replace("{dir}", str(model_dir)) for n in needles])
    no_completed_run_file(tmp_path)
