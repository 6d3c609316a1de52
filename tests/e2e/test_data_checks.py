"""Checks on what a run is given and what its summary can claim, on 2 real ranks (issue 16):
an IDX label file holding labels beyond the dataset's 10 classes is refused (it used to train
silently with val accuracy ~0), and a run whose iterations are all warm-up says so, at start on
rank 0 and in /summary, instead of writing statistics "over 0 measured iterations" silently."""

import time

import h5py

from test_bad_input import (FAIL_WITHIN_S, QUICK, both_ranks_said, idx, mnist_dir,
                            no_completed_run_file)

# A small synthetic CV run: no dataset files, a few iterations of a narrow MobileNetV2.
SMALL_CV = QUICK + ["--data.dataset=synthetic", "--data.synthetic_samples=256",
                    "--train.batch_size=8", "--cv.width_mult=0.25", "--log.every=0"]


def text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def test_idx_label_beyond_the_classes_is_refused(run_ts, tmp_path):
    """Fashion-MNIST has 10 classes: a training label 200 at index 17 stops the job with exit 3
    on both ranks, naming the file, the label, its index and the class count."""
    labels = bytearray((i * 7) % 10 for i in range(64))
    labels[17] = 200
    data = mnist_dir(tmp_path, **{"train-labels-idx1-ubyte.gz": idx([64], bytes(labels))})
    t0 = time.monotonic()
    proc = run_ts(2, *QUICK, f"--data.path={data}", f"--output.file={tmp_path}/run.h5",
                  timeout=120)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert elapsed < FAIL_WITHIN_S, f"took {elapsed:.0f} s to fail"
    both_ranks_said(proc, f"IDX file '{data}/train-labels-idx1-ubyte.gz': label 200 at index 17 "
                          "is not a class of this dataset (10 classes, labels 0 to 9)",
                    "download or install it again")
    no_completed_run_file(tmp_path)


def run_cv(run_ts, out, iters, warmup):
    proc = run_ts(2, *SMALL_CV, f"--output.file={out}", f"--train.max_iters={iters}",
                  f"--profile.warmup_iters={warmup}", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def warnings_of(proc):
    return [l for l in (proc.stdout + proc.stderr).splitlines() if "profile.warmup_iters=" in l
            and "every iteration is warm-up" in l]


def test_all_warmup_run_warns_and_marks_the_summary(run_ts, tmp_path):
    """profile.warmup_iters equal to the iterations run (the boundary): rank 0 alone warns at
    start naming both numbers; /summary holds measured_iterations 0 and a `warning`, and the
    printed summary repeats it. One more iteration than warm-up: no warning anywhere."""
    out = tmp_path / "warm.h5"
    proc = run_cv(run_ts, out, iters=3, warmup=3)
    lines = warnings_of(proc)
    assert len(lines) == 1 and lines[0].startswith("[rank 0/2 "), proc.stdout + proc.stderr
    assert "profile.warmup_iters=3 but this run trains 3 iteration(s)" in lines[0]
    assert "set profile.warmup_iters below 3" in lines[0]
    assert "WARNING: no measured iterations: all 3 iteration(s) run were warm-up " \
           "(profile.warmup_iters=3)" in proc.stdout + proc.stderr
    with h5py.File(out, "r") as f:
        assert text(f.attrs["status"]) == "completed"
        s = f["summary"].attrs
        assert int(s["measured_iterations"]) == 0
        assert int(s["warmup_iterations"]) == 3 and int(s["total_iterations"]) == 3
        assert "no measured iterations" in text(s["warning"])
        assert "profile.warmup_iters=3" in text(s["warning"])
        assert f["iterations/step_s"].shape == (2, 3)  # the iterations are still recorded

    out = tmp_path / "measured.h5"
    proc = run_cv(run_ts, out, iters=3, warmup=2)
    assert not warnings_of(proc) and "WARNING" not in proc.stdout
    with h5py.File(out, "r") as f:
        s = f["summary"].attrs
        assert int(s["measured_iterations"]) == 1 and "warning" not in s
