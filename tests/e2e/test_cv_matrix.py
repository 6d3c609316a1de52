"""The CV matrix end to end on 2 (or 1) real CPU ranks: precisions, layouts, preprocessing,
strategies and an image folder, each a short real run whose file is read back; and the
combinations that cannot work, refused on every rank with the option named."""

import shutil

import numpy as np
import h5py
import pytest

from conftest import ROOT
from test_bad_input import both_ranks_said, run_bad

BASE = ["--config", str(ROOT / "inputs/cv/base.ini"), "--train.eval=false", "--log.every=0"]


def short_run(run_ts, tmp_path, name, *args, ranks=2, iters=8):
    out = tmp_path / f"{name}.h5"
    proc = run_ts(ranks, *BASE, f"--train.max_iters={iters}", f"--output.file={out}", *args,
                  timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    f = h5py.File(out, "r")
    assert f.attrs["status"] in ("completed", b"completed")
    return f


def test_fp16_mixed_records_the_loss_scale(run_ts, tmp_path):
    with short_run(run_ts, tmp_path, "fp16", "--config", ROOT / "inputs/cv/precision-fp16-mixed.ini",
                   "--profile.warmup_iters=0") as f:
        it = f["iterations"]
        scale = it["loss_scale"][...]
        skipped = it["step_skipped"][...]
        assert scale[0, 0] == 65536.0  # PyTorch GradScaler's initial scale
        # Every change of the scale is a halving after a skipped step (no growth in 8 steps).
        for r in range(2):
            for i in range(1, scale.shape[1]):
                expect = scale[r, i - 1] * (0.5 if skipped[r, i - 1] else 1.0)
                assert scale[r, i] == expect, (r, i, scale[r], skipped[r])
        assert np.array_equal(skipped[0], skipped[1])  # ranks skip together
        assert np.all(np.isfinite(it["loss"][...]))
        assert f["plan"].attrs["precision"] in ("fp16-mixed", b"fp16-mixed")
        # One host read per step: the scaler's verdict (and the scale) in the control phase.
        assert np.all(it["host_syncs"][...] == 1)
        assert float(f["summary"].attrs["host_syncs_per_iteration"]) == 1.0


def test_bf16_nhwc_device_preprocessing(run_ts, tmp_path):
    with short_run(run_ts, tmp_path, "bf16", "--config", ROOT / "inputs/cv/precision-bf16.ini",
                   "--config", ROOT / "inputs/cv/layout-nhwc.ini",
                   "--config", ROOT / "inputs/cv/preprocess-device.ini") as f:
        it = f["iterations"]
        assert np.all(np.isnan(it["loss_scale"][...]))
        assert np.all(it["step_skipped"][...] == 0)
        # No host read in the step of a bf16 run: the non-finite flag waits for the loss.
        assert np.all(it["host_syncs"][...] == 0)
        params = int(f["plan"].attrs["parameters"])
        # bf16 gradients travel as fp32 on the MPI backend: 4 bytes per parameter.
        assert np.all(it["comm_bytes"][...] == params * 4)
        assert float(f["iterations/parameter_bytes"][0, 0]) == params * 2
        loss = it["loss"][...]
        assert np.all(np.isfinite(loss)) and loss[:, -3:].mean() < loss[:, :3].mean()


def test_sync_bn_and_fp64(run_ts, tmp_path):
    with short_run(run_ts, tmp_path, "syncbn", "--cv.sync_bn=true",
                   "--config", ROOT / "inputs/cv/precision-fp64.ini") as f:
        params = int(f["plan"].attrs["parameters"])
        assert np.all(f["iterations/comm_bytes"][...] == params * 8)
        assert f["config"].attrs["cv.sync_bn"] in ("true", b"true")


def test_dp_on_one_rank_with_two_cpu_replicas(run_ts, tmp_path):
    with short_run(run_ts, tmp_path, "dp", "--config", ROOT / "inputs/cv/strategy-dp.ini",
                   "--dp.devices=2", ranks=1) as f:
        assert f["plan"].attrs["strategy"] in ("dp", b"dp")
        assert int(f["plan"].attrs["global_batch"]) == 128
        assert np.all(f["iterations/comm_bytes"][...] == 0)  # one process: no communication


def test_impossible_combinations_are_refused_on_every_rank(run_ts, tmp_path):
    out = f"--output.file={tmp_path}/x.h5"
    proc = run_bad(run_ts, "--run.strategy=dp", out)
    both_ranks_said(proc, "run.strategy=dp", "mpirun -np 1")
    proc = run_bad(run_ts, "--run.precision=tf32", out)
    both_ranks_said(proc, "run.precision", "tf32")
    proc = run_bad(run_ts, "--run.strategy=ddp", "--cv.sync_bn=false", "--run.deterministic=true",
                   "--run.cudnn_benchmark=true", out)
    both_ranks_said(proc, "run.deterministic", "run.cudnn_benchmark")
    proc = run_bad(run_ts, "--cv.image_size=1024", out)
    both_ranks_said(proc, "cv.image_size")
    assert not (tmp_path / "x.h5").exists()


def write_image_folder(root, classes=3, per_class=4):
    """A tiny ImageNet-layout folder of PNGs (matplotlib writes them), distinct colours per
    class so that a few iterations can already tell them apart."""
    import matplotlib.image as mpimg

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for c in range(classes):
            d = root / split / f"class{c}"
            d.mkdir(parents=True)
            for i in range(per_class):
                img = np.zeros((40 + 3 * i, 48, 3))
                img[..., c] = 0.8
                img += 0.1 * rng.random(img.shape)
                mpimg.imsave(d / f"img{i}.png", np.clip(img, 0, 1))


def test_image_folder_dataset(run_ts, tmp_path):
    write_image_folder(tmp_path / "folder")
    out = tmp_path / "folder.h5"
    proc = run_ts(2, *BASE, "--data.dataset=imagefolder", f"--data.path={tmp_path / 'folder'}",
                  "--train.batch_size=2", "--train.epochs=2", "--train.eval=true",
                  "--train.eval_batch_size=4", f"--output.file={out}", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with h5py.File(out, "r") as f:
        assert int(f["plan"].attrs["train_samples"]) == 12
        assert int(f["plan"].attrs["test_samples"]) == 12
        acc = f["epochs/val_accuracy"][...]
        assert np.all((acc >= 0) & (acc <= 1))
    proc = run_bad(run_ts, "--data.dataset=imagefolder", f"--data.path={tmp_path / 'folder'}",
                   "--data.preprocess=device", f"--output.file={tmp_path}/y.h5")
    both_ranks_said(proc, "data.preprocess")


def test_pipeline_two_stages_dry_run_and_run(run_ts, tmp_path):
    pipe = ["--config", ROOT / "inputs/cv/strategy-pipeline.ini"]
    proc = run_ts(2, *BASE, *pipe, "--dry-run", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 stages x 1 replica(s)" in proc.stdout and "features.0" in proc.stdout
    with short_run(run_ts, tmp_path, "pipe", *pipe) as f:
        assert int(f["plan"].attrs["pipeline_stages"]) == 2
        assert int(f["plan"].attrs["global_batch"]) == 128
        loss = f["iterations/loss"][...]
        assert np.all(np.isnan(loss[0])) and np.all(np.isfinite(loss[1]))  # last stage only
        assert np.all(f["iterations/comm_bytes"][...] == 0)  # one replica: no gradient traffic


def test_pipeline_with_two_replicas(run_ts, tmp_path):
    pipe = ["--config", ROOT / "inputs/cv/strategy-pipeline.ini", "--train.batch_size=32",
            "--run.deterministic=true", f"--checkpoint.dir={tmp_path}/ckpt", "--checkpoint.every=2"]
    with short_run(run_ts, tmp_path, "pipe4", *pipe, ranks=4, iters=4) as f:
        uninterrupted = f["iterations/loss"][...]
        assert int(f["plan"].attrs["pipeline_replicas"]) == 2
        assert int(f["plan"].attrs["global_batch"]) == 64
        stage_bytes = f["iterations/parameter_bytes"][:, 0]
        # Each stage's gradients are averaged with the same stage of the other replica.
        assert np.all(f["iterations/comm_bytes"][:, 0] == stage_bytes)
        assert stage_bytes[0] == stage_bytes[2] and stage_bytes[1] == stage_bytes[3]
        assert stage_bytes[0] + stage_bytes[1] == 4 * int(f["plan"].attrs["parameters"])
    # Resumed from iteration 2: each stage's replica-0 rank wrote the stage's weights and
    # optimizer (read back through its data-parallel group), every rank its RNG: the last two
    # losses are the uninterrupted run's, bit for bit.
    shutil.rmtree(tmp_path / "ckpt" / "ckpt-000000004")
    proc = run_ts(4, *BASE, "--train.max_iters=4", f"--output.file={tmp_path}/pipe4.h5", *pipe,
                  "--resume", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with h5py.File(tmp_path / "pipe4.resume1.h5", "r") as f:
        assert np.array_equal(f["iterations/loss"][...], uninterrupted[:, 2:], equal_nan=True)
