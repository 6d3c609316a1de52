"""LLM validation (llm.val_fraction / llm.val_dataset.path) end to end on 2 real CPU ranks: every
method evaluates a held-out split after each epoch into /epochs (val_loss; SFT: val_perplexity =
exp(val_loss); DPO: val_accuracy = reward accuracy), also under dist.zero=3 with shards of unequal
size (every rank must run the same number of eval forwards); evaluation time is its own column and
is no part of any iteration; bad values are refused on every rank naming the option. The value
itself is checked against transformers in test_hf_clients.py."""

import math

import h5py
import numpy as np
import pytest

from conftest import ROOT
from test_bad_input import both_ranks_said, no_completed_run_file

LLM = ROOT / "inputs/llm"
# 24 samples, 0.2 held out: 5 validation samples (3 on rank 0, 2 on rank 1: uneven shards), 19
# for training (9 per rank: 2 iterations of 2 x 2 per epoch).
SPLIT = ["--llm.max_samples=24", "--llm.val_fraction=0.2", "--train.epochs=2"]


def run(run_ts, tmp_path, method, *args):
    out = tmp_path / f"{method}.h5"
    proc = run_ts(2, "--config", LLM / f"{method}-tiny.ini", f"--output.file={out}",
                  "--log.every=0", *SPLIT, *args, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return h5py.File(out, "r"), proc


@pytest.mark.parametrize("method,zero,packed", [
    ("full", 0, False), ("lora", 0, False), ("qlora", 0, False), ("dpo", 0, False),
    ("qat", 0, False), ("lora", 3, False), ("dpo", 3, False), ("lora", 0, True)])
def test_every_method_reports_validation_per_epoch(run_ts, tmp_path, method, zero, packed):
    f, proc = run(run_ts, tmp_path, method, f"--dist.zero={zero}", f"--llm.packed={packed}")
    with f:
        assert f.attrs["status"] in ("completed", b"completed")
        plan = f["plan"].attrs
        assert int(plan["val_samples"]) == 5 and int(plan["train_samples"]) == 19
        idx = f["plan/val_indices"][...]
        assert len(idx) == 5 and len(set(idx)) == 5 and np.all((idx >= 0) & (idx < 24))
        e = f["epochs"]
        val = e["val_loss"][...]  # [rank, epoch]
        assert val.shape == (2, 2)
        assert np.all(np.isfinite(val)) and np.all(val > 0)
        assert np.all(val[0] == val[1])  # reduced over ranks: one value
        ppl, acc = e["val_perplexity"][...], e["val_accuracy"][...]
        if method == "dpo":
            assert np.all(np.isnan(ppl))
            assert np.all((acc >= 0) & (acc <= 1))
            # 5 pairs: the accuracy is a count of pairs over 5.
            assert np.allclose(acc * 5, np.round(acc * 5))
        else:
            assert np.allclose(ppl, np.exp(val), rtol=1e-12)
            assert np.all(np.isnan(acc))
        # Evaluation has its own time, inside the epoch's, outside every iteration.
        ev, ep = e["eval_s"][...], e["epoch_s"][...]
        assert np.all(ev > 0) and np.all(ev < ep)
        it = f["iterations"]
        if not packed:
            assert it["loss"].shape[1] == 4  # 2 iterations per epoch: 19 // 2 // 4
        else:  # packs of the 19 training samples (how many depends on their lengths)
            assert it["loss"].shape[1] >= 2
        assert float(f["summary"].attrs["final_val_loss"]) == val[0, -1]
        if method != "dpo":
            assert float(f["summary"].attrs["final_val_perplexity"]) == pytest.approx(
                math.exp(val[0, -1]))
    assert "val_loss" in proc.stdout + proc.stderr


def test_no_validation_by_default(run_ts, tmp_path):
    out = tmp_path / "lora.h5"
    proc = run_ts(2, "--config", LLM / "lora-tiny.ini", f"--output.file={out}", "--log.every=0",
                  "--llm.max_samples=24", "--train.max_iters=2", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with h5py.File(out, "r") as f:
        assert int(f["plan"].attrs["val_samples"]) == 0
        assert int(f["plan"].attrs["train_samples"]) == 24
        for col in ("val_loss", "val_perplexity", "eval_s"):
            assert np.all(np.isnan(f["epochs"][col][...])), col


def test_val_dataset_path_evaluates_that_file(run_ts, tmp_path):
    """Its own file: every sample of it is evaluated, the training set is untouched."""
    val = tmp_path / "val.jsonl"
    lines = (LLM / "data/instruct.jsonl").read_text().splitlines()
    val.write_text("\n".join(lines[-3:]) + "\n")
    f, _ = run(run_ts, tmp_path, "lora", "--llm.val_fraction=0", f"--llm.val_dataset.path={val}")
    with f:
        plan = f["plan"].attrs
        assert int(plan["val_samples"]) == 3 and int(plan["train_samples"]) == 24
        assert "val_indices" not in f["plan"]
        assert np.all(np.isfinite(f["epochs/val_loss"][...]))


def bad(run_ts, tmp_path, *args):
    out = tmp_path / f"x{len(list(tmp_path.iterdir()))}.h5"  # a fresh name per case
    proc = run_ts(2, "--config", LLM / "lora-tiny.ini", f"--output.file={out}", *args,
                  timeout=120)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    # Option errors stop before the run file; data-dependent ones (found once the dataset is
    # read) leave it with status "failed".
    no_completed_run_file(tmp_path)
    return proc


def test_bad_validation_settings_are_refused_on_every_rank(run_ts, tmp_path):
    for v in ("1", "1.5", "-0.1"):
        proc = bad(run_ts, tmp_path, f"--llm.val_fraction={v}")
        assert proc.returncode == 2
        both_ranks_said(proc, "llm.val_fraction")
    # 0.01 of 24 samples rounds to none.
    proc = bad(run_ts, tmp_path, "--llm.max_samples=24", "--llm.val_fraction=0.01")
    assert proc.returncode == 2
    both_ranks_said(proc, "llm.val_fraction", "holds out none")
    proc = bad(run_ts, tmp_path, "--llm.val_dataset.path=/nonexistent/val.jsonl")
    assert proc.returncode == 3
    both_ranks_said(proc, "llm.val_dataset.path", "/nonexistent/val.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    proc = bad(run_ts, tmp_path, f"--llm.val_dataset.path={empty}")
    both_ranks_said(proc, str(empty))
    proc = bad(run_ts, tmp_path, "--llm.val_fraction=0.1",
               f"--llm.val_dataset.path={LLM / 'data/instruct.jsonl'}")
    assert proc.returncode == 2
    both_ranks_said(proc, "llm.val_fraction", "llm.val_dataset.path")
