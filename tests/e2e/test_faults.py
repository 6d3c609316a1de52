"""Faults on real ranks (issue 8): a rank killed mid-run, graceful stop on SIGTERM/SIGUSR1 with a
checkpoint and --resume (whose loss sequence must equal the uninterrupted run's), crash + resume
from a periodic checkpoint across an epoch boundary, the watchdog naming a stalled rank, a second
signal, non-finite losses (skip/abort), and --resume refusing what it cannot continue.
Issue 16: a rank stopped by SIGSTOP (dist.timeout), a rank stalled before a collective run-file
flush (the watchdog's dist.timeout), a rank killed while writing a checkpoint, two
jobs sharing one checkpoint.dir, mpirun killed, damaged checkpoints (truncated or missing rank
file, garbage manifest), checkpoint.dir that is a file or read-only, and --resume with another
world size or model."""

import json
import os
import signal
import subprocess
import threading
import time

import h5py
import numpy as np
import pytest

from conftest import ROOT, launch_env, mpirun_cmd
from test_bad_input import both_ranks_said, mounts, read_only_dir  # noqa: F401 (a fixture)

QUICK = ["--config", str(ROOT / "inputs/quickstart.ini")]
# Fashion-MNIST, no evaluation, deterministic kernels, progress every iteration, frequent flushes.
SHORT = [*QUICK, "--train.eval=false", "--run.deterministic=true", "--log.every=1",
         "--output.flush_every=2", "--profile.warmup_iters=0"]
# A synthetic set of 10 iterations per epoch and rank (640 samples / (32 x 2 ranks)), so that a
# resumed run crosses epoch boundaries within seconds.
EPOCHS = [*QUICK, "--data.dataset=synthetic", "--data.synthetic_samples=640",
          "--train.batch_size=32", "--train.epochs=3", "--train.eval=false",
          "--run.deterministic=true", "--log.every=1", "--output.flush_every=1",
          "--profile.warmup_iters=0"]


def text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


class Job:
    """mpirun in the background with its output collected line by line."""

    def __init__(self, np_, *args, env=None):
        full_env = launch_env(OMP_NUM_THREADS="1", **(env or {}))
        self.proc = subprocess.Popen(mpirun_cmd(np_, *args), cwd=ROOT, env=full_env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self):
        return "".join(self.lines)

    def wait_for(self, needle, timeout=240):
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if any(needle in line for line in self.lines):
                return
            if self.proc.poll() is not None:
                self._reader.join(5)
                if any(needle in line for line in self.lines):
                    return
                raise AssertionError(f"job ended before {needle!r}:\n{self.output}")
            time.sleep(0.05)
        self.kill()
        raise AssertionError(f"no {needle!r} within {timeout} s:\n{self.output}")

    def rank_pids(self, expected):
        """{rank: pid} of trainscope processes started by this mpirun."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < 30:
            pids = {}
            out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True,
                                 text=True).stdout.split()
            for pid in map(int, out):
                try:
                    env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
                except OSError:
                    continue
                for kv in env:
                    if kv.startswith(b"OMPI_COMM_WORLD_RANK="):
                        pids[int(kv.split(b"=")[1])] = pid
            if len(pids) == expected:
                return pids
            time.sleep(0.1)
        raise AssertionError(f"could not find {expected} rank processes")

    def wait(self, timeout):
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"job still running after {timeout} s:\n{self.output}")
        self._reader.join(10)
        return rc

    def kill(self):
        subprocess.run(["pkill", "-9", "-P", str(self.proc.pid)])
        self.proc.kill()


def losses(path):
    with h5py.File(path, "r") as f:
        it = f["iterations"]
        return it["iteration"][...], it["loss"][...]


def run_to_end(*args, np_=2, timeout=300):
    job = Job(np_, *args)
    rc = job.wait(timeout)
    assert rc == 0, job.output
    return job


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted runs the interrupted ones are compared with."""
    d = tmp_path_factory.mktemp("reference")
    run_to_end(*SHORT, "--train.max_iters=24", f"--output.file={d}/short.h5")
    run_to_end(*EPOCHS, f"--output.file={d}/epochs.h5")
    return {"short": d / "short.h5", "epochs": d / "epochs.h5"}


def test_killed_rank_ends_the_whole_job_and_the_file_stays_readable(tmp_path):
    out = tmp_path / "killed.h5"
    # Every flush synced (output.sync_every_s=0), so the file holds the rows of the last one.
    job = Job(4, *QUICK, "--train.eval=false", "--log.every=1", "--output.flush_every=2",
              "--output.sync_every_s=0", "--train.batch_size=16", f"--output.file={out}")
    job.wait_for("iter 6/")
    pids = job.rank_pids(4)
    t0 = time.monotonic()
    os.kill(pids[2], signal.SIGKILL)
    rc = job.wait(60)
    elapsed = time.monotonic() - t0
    print(f"survivors exited {elapsed:.2f} s after rank 2 was killed")
    assert rc != 0
    assert elapsed < 30, f"the other ranks took {elapsed:.1f} s to exit"
    # mpirun returns once it has signalled its ranks; a SIGKILLed rank with a large address space
    # can take a moment to be torn down by the kernel (seen: still 'R' right after mpirun exited,
    # under load). A rank that still runs 5 s later was left behind.
    def alive(pid):
        try:
            return open(f"/proc/{pid}/stat").read().split()[2] != "Z"
        except FileNotFoundError:
            return False
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    for r, pid in pids.items():
        assert not alive(pid), f"rank {r} still alive 5 s after mpirun exited"
    with h5py.File(out, "r") as f:  # readable up to the last flush, and not "completed"
        assert text(f.attrs["status"]) == "running"
        assert "finished_utc" not in f.attrs
        # The extent grows in steps of the chunk rows: rank_rows says what each rank wrote.
        rows = int(f["iterations/rank_rows"][()].min())
        assert rows >= 6
        loss = f["iterations/loss"][...]
        assert loss.shape[0] == 4 and np.all(np.isfinite(loss[:, :rows]))
        assert np.all(np.isnan(loss[:, int(f["iterations/rank_rows"][()].max()):]))


@pytest.mark.parametrize("how", ["SIGTERM to every rank", "SIGUSR1 to mpirun"])
def test_signal_stops_checkpoints_and_resume_equals_uninterrupted(tmp_path, reference, how):
    out, ckpt = tmp_path / "run.h5", tmp_path / "ckpt"
    args = [*SHORT, "--train.max_iters=24", f"--checkpoint.dir={ckpt}", f"--output.file={out}"]
    job = Job(2, *args)
    job.wait_for("iter 10/")
    t0 = time.monotonic()
    if how.startswith("SIGTERM"):  # as Slurm does on pre-emption or scancel
        for pid in job.rank_pids(2).values():
            os.kill(pid, signal.SIGTERM)
    else:  # Slurm's --signal=USR1@T reaches mpirun, which forwards it
        job.proc.send_signal(signal.SIGUSR1)
    rc = job.wait(60)
    print(f"{how}: stopped and exited {time.monotonic() - t0:.2f} s after the signal")
    # 75 (EX_TEMPFAIL): stopped with a checkpoint, not finished (docs/faults.md exit codes).
    assert rc == 75, job.output
    assert time.monotonic() - t0 < 30
    with h5py.File(out, "r") as f:
        assert text(f.attrs["status"]) == "interrupted"
        stopped_at = int(f["iterations"].attrs["rows"])
    assert 10 <= stopped_at < 24
    assert (ckpt / f"ckpt-{stopped_at:09d}" / "MANIFEST.json").exists()
    assert "received: stopped after iteration" in job.output

    # --resume: same command; the continuation goes to run.resume1.h5, linked both ways.
    run_to_end(*args, "--resume")
    resumed = tmp_path / "run.resume1.h5"
    with h5py.File(resumed, "r") as f:
        assert text(f.attrs["status"]) == "completed"
        assert int(f.attrs["restart_index"]) == 1
        assert int(f.attrs["resumed_from_iteration"]) == stopped_at
        assert text(f.attrs["resumed_from_file"]) == str(out)
    with h5py.File(out, "r") as f:
        assert text(f.attrs["continued_in"]) == str(resumed)

    # The loss sequence equals the uninterrupted run's, on every rank, exactly.
    it_ref, loss_ref = losses(reference["short"])
    it_a, loss_a = losses(out)
    it_b, loss_b = losses(resumed)
    joined_it = np.concatenate([it_a, it_b], axis=1)
    joined = np.concatenate([loss_a, loss_b], axis=1)
    assert np.array_equal(joined_it, it_ref)
    diff = np.max(np.abs(joined - loss_ref))
    print(f"{how}: {joined.shape[1]} iterations x 2 ranks, max |loss - uninterrupted| = {diff}")
    assert np.array_equal(joined, loss_ref), diff


def test_crash_then_resume_from_periodic_checkpoint_across_epochs(tmp_path, reference):
    out, ckpt = tmp_path / "run.h5", tmp_path / "ckpt"
    args = [*EPOCHS, f"--checkpoint.dir={ckpt}", "--checkpoint.every=7",
            f"--output.file={out}"]
    job = Job(2, *args)
    job.wait_for("iter 17/")
    os.kill(job.rank_pids(2)[1], signal.SIGKILL)
    assert job.wait(60) != 0
    complete = sorted(p.name for p in ckpt.glob("ckpt-*") if (p / "MANIFEST.json").exists())
    assert complete[-1] == "ckpt-000000014", complete  # 7 and 14 (keep=2)
    assert len(complete) == 2

    run_to_end(*args, "--resume")
    it_ref, loss_ref = losses(reference["epochs"])
    it_b, loss_b = losses(tmp_path / "run.resume1.h5")
    assert it_b[0, 0] == 14 and it_b[0, -1] == 29  # epoch 1 from its 5th batch, then epoch 2
    assert np.array_equal(loss_b, loss_ref[:, 14:])
    with h5py.File(tmp_path / "run.resume1.h5", "r") as f:
        assert list(f["epochs/epoch"][0]) == [1, 2]


def test_watchdog_names_the_stalled_rank_and_ends_the_job(tmp_path):
    out = tmp_path / "stall.h5"
    job = Job(2, *SHORT, "--train.max_iters=50", "--run.iteration_timeout=4",
              f"--output.file={out}", env={"TRAINSCOPE_FAULT": "stall:rank=1:iteration=3"})
    t0 = time.monotonic()
    rc = job.wait(90)
    elapsed = time.monotonic() - t0
    assert rc != 0
    text_ = job.output
    assert "[rank 1/2" in text_ and "in phase 'forward'" in text_, text_
    assert "in phase 'comm_wait'" in text_, text_
    assert "run.iteration_timeout=4" in text_
    assert elapsed < 60, elapsed
    with h5py.File(out, "r") as f:
        assert text(f.attrs["status"]) == "running"


def test_signal_during_start_up_stops_after_the_first_iteration(tmp_path):
    """A resize or pre-emption may come while the ranks still load data and build the model: the
    signal is kept (not fatal), the run stops after iteration 0 with a checkpoint, exit 75."""
    ckpt = tmp_path / "ckpt"
    job = Job(2, *SHORT, "--train.max_iters=50", f"--checkpoint.dir={ckpt}",
              f"--output.file={tmp_path}/x.h5")
    job.wait_for("placement:")  # every rank is inside main, before any iteration
    assert not any("iter 1/" in line for line in job.lines)
    job.proc.send_signal(signal.SIGUSR1)
    assert job.wait(120) == 75, job.output
    assert "stopped after iteration 0 with a checkpoint" in job.output
    assert sorted(d.name for d in ckpt.glob("ckpt-*")) == ["ckpt-000000001"]
    with h5py.File(tmp_path / "x.h5", "r") as f:
        assert text(f.attrs["status"]) == "interrupted"


def test_second_signal_exits_at_once(tmp_path):
    job = Job(2, *SHORT, "--train.max_iters=50", "--run.iteration_timeout=0",
              f"--output.file={tmp_path}/x.h5",
              env={"TRAINSCOPE_FAULT": "stall:rank=1:iteration=3"})
    job.wait_for("iter 3/")
    time.sleep(1)  # rank 1 now hangs in iteration 3's forward
    pid = job.rank_pids(2)[1]
    os.kill(pid, signal.SIGTERM)  # cannot stop gracefully: it never reaches the boundary
    time.sleep(1)
    assert job.proc.poll() is None
    t0 = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    rc = job.wait(30)
    assert rc != 0 and time.monotonic() - t0 < 15


def test_nonfinite_loss_abort_and_skip(tmp_path):
    fault = {"TRAINSCOPE_FAULT": "nonfinite:rank=1:iteration=3"}
    job = Job(2, *SHORT, "--train.max_iters=8", f"--output.file={tmp_path}/abort.h5", env=fault)
    assert job.wait(120) == 6, job.output
    for rank in (0, 1):
        assert any(l.startswith(f"[rank {rank}/2 ") and "iteration 3: the loss or a gradient "
                   "is NaN/Inf" in l and "run.nonfinite=skip" in l for l in job.lines), job.output
    with h5py.File(tmp_path / "abort.h5", "r") as f:
        assert text(f.attrs["status"]) == "failed"
        # log.every=1 resolves after every iteration: found right after iteration 3, whose row
        # (NaN loss) is kept with those before it.
        assert int(f["iterations"].attrs["rows"]) == 4
        loss = f["iterations/loss"][...]
        assert np.isnan(loss[1, 3]) and np.all(np.isfinite(loss[:, :3]))  # rank 1 made it NaN
        # The abort policy's check reads nothing in the step (issue 25): no host sync.
        assert np.all(f["iterations/host_syncs"][...] == 0)

    job = Job(2, *SHORT, "--train.max_iters=8", "--run.nonfinite=skip",
              f"--output.file={tmp_path}/skip.h5", env=fault)
    assert job.wait(120) == 0, job.output
    with h5py.File(tmp_path / "skip.h5", "r") as f:
        skipped = f["iterations/nonfinite_skipped"][...]
        assert skipped.shape == (2, 8)
        assert np.array_equal(skipped[:, 3], [1, 1]) and skipped.sum() == 2
        assert int(f["summary"].attrs["nonfinite_skipped_steps"]) == 1
        loss = f["iterations/loss"][...]
        assert np.isnan(loss[1, 3]) and np.all(np.isfinite(np.delete(loss, 3, axis=1)))
        # Skipping decides before the optimizer phase: one read of the flag per iteration.
        assert np.all(f["iterations/host_syncs"][...] == 1)


def test_nonfinite_abort_found_with_the_deferred_losses(tmp_path):
    """Without progress lines or flushes in between, the flag of iteration 3 is read with the
    losses at the end of the run: the error still names iteration 3, says when it was found,
    and no checkpoint is written after it."""
    fault = {"TRAINSCOPE_FAULT": "nonfinite:rank=0:iteration=3"}
    ckpt = tmp_path / "ckpt"
    job = Job(2, *SHORT, "--train.max_iters=8", "--log.every=0", "--output.flush_every=50",
              f"--checkpoint.dir={ckpt}", "--checkpoint.every=6",
              f"--output.file={tmp_path}/late.h5", env=fault)
    assert job.wait(120) == 6, job.output
    for rank in (0, 1):
        assert any(l.startswith(f"[rank {rank}/2 ") and "iteration 3: the loss or a gradient "
                   "is NaN/Inf" in l and "resolved after iteration 5" in l
                   for l in job.lines), job.output
    # The checkpoint after iteration 5 resolves the losses first and is refused.
    assert not list(ckpt.glob("ckpt-*"))
    with h5py.File(tmp_path / "late.h5", "r") as f:
        assert text(f.attrs["status"]) == "failed"
        assert int(f["iterations"].attrs["rows"]) == 6


def test_resume_refuses_what_it_cannot_continue(tmp_path, run_ts):
    ckpt = tmp_path / "ckpt"
    proc = run_ts(2, *SHORT, "--resume", f"--checkpoint.dir={ckpt}",
                  f"--output.file={tmp_path}/a.h5", timeout=60)
    assert proc.returncode == 3
    both_ranks_said(proc, str(ckpt), "does not exist", "without --resume")
    (ckpt / ".partial-ckpt-000000002").mkdir(parents=True)  # a save that never completed
    proc = run_ts(2, *SHORT, "--resume", f"--checkpoint.dir={ckpt}",
                  f"--output.file={tmp_path}/a.h5", timeout=60)
    assert proc.returncode == 3
    both_ranks_said(proc, str(ckpt), "no complete checkpoint", "without --resume")
    proc = run_ts(2, *SHORT, "--resume", f"--output.file={tmp_path}/a.h5", timeout=60)
    assert proc.returncode == 2
    both_ranks_said(proc, "--resume needs checkpoint.dir")
    run_to_end(*SHORT, "--train.max_iters=4", f"--checkpoint.dir={ckpt}",
               "--checkpoint.every=2", f"--output.file={tmp_path}/b.h5")
    proc = run_ts(2, *SHORT, "--train.max_iters=4", "--train.lr=0.1", "--resume",
                  f"--checkpoint.dir={ckpt}", f"--output.file={tmp_path}/b.h5", timeout=60)
    assert proc.returncode == 2
    both_ranks_said(proc, "train.lr: checkpoint '0.003", "now '0.1'")
    proc = run_ts(1, *SHORT, "--train.max_iters=4", "--resume", f"--checkpoint.dir={ckpt}",
                  f"--output.file={tmp_path}/b.h5", timeout=60)
    # (another rank count is an elastic resume only with the same global batch)
    assert proc.returncode == 2 and "global batch is 64 samples per step (1 ranks)" in \
        proc.stdout + proc.stderr and "trained with 128 (2 ranks)" in proc.stdout + proc.stderr
    proc = run_ts(2, *SHORT, "--checkpoint.every=5h", f"--output.file={tmp_path}/c.h5",
                  timeout=60)
    assert proc.returncode == 2
    both_ranks_said(proc, "checkpoint.every = '5h'", "Nmin")


@pytest.mark.parametrize("method,extra", [("lora", []), ("full", ["--dist.zero=2"]),
                                          ("lora", ["--dist.zero=3"]),
                                          ("full", ["--dist.zero=3"])])
def test_llm_resume_continues_adapters_and_zero_shards(tmp_path, method, extra):
    """LoRA adapters, full fine-tuning with ZeRO-2's sharded optimizer state, and both under
    dist.zero=3 (every rank saves and restores its parameter shard): resuming from the iteration-3
    checkpoint repeats iterations 3-5 of the run that wrote it exactly."""
    out, ckpt = tmp_path / "llm.h5", tmp_path / "ckpt"
    args = ["--config", ROOT / f"inputs/llm/{method}-tiny.ini", *extra, "--train.max_iters=6",
            "--log.every=1", f"--checkpoint.dir={ckpt}", "--checkpoint.every=3",
            f"--output.file={out}"]
    run_to_end(*args)
    import shutil
    shutil.rmtree(ckpt / "ckpt-000000006")  # as if the job had died before its last checkpoint
    run_to_end(*args, "--resume")
    it_ref, loss_ref = losses(out)
    it_b, loss_b = losses(tmp_path / "llm.resume1.h5")
    assert list(it_b[0]) == [3, 4, 5]
    assert np.array_equal(loss_b, loss_ref[:, 3:]), (loss_b, loss_ref)


def test_checkpoint_period_in_minutes_is_rank_zero_wall_time(tmp_path):
    """checkpoint.every=<x>min: checkpoints come from rank 0's clock (every rank agrees through
    the per-iteration allreduce), not from iteration counts; keep=1 leaves only the newest."""
    ckpt = tmp_path / "ckpt"
    job = run_to_end(*SHORT, "--train.max_iters=16", f"--checkpoint.dir={ckpt}",
                     "--checkpoint.every=0.005min", "--checkpoint.keep=1",
                     f"--output.file={tmp_path}/t.h5")
    written = [l for l in job.lines if "resumes at iteration" in l]
    assert len(written) >= 1, job.output
    kept = [p.name for p in ckpt.iterdir() if not p.name.startswith(".")]  # not .lock
    assert kept == [written[-1].split("/")[-1].split(" ")[0]]


# ---- dist.timeout and hostile cases around checkpoints and the launcher (issue 16) ---------------

def alive(pid):
    """Whether process `pid` exists and is not a zombie."""
    try:
        return open(f"/proc/{pid}/stat").read().split()[2] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def wait_gone(pids, within):
    """Seconds until none of `pids` is alive (at most `within`); None if some still are."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < within:
        if not any(alive(p) for p in pids):
            return time.monotonic() - t0
        time.sleep(0.1)
    return None


def status_of(path):
    with h5py.File(path, "r") as f:
        return text(f.attrs["status"])


def test_sigstop_of_one_rank_ends_the_job_after_dist_timeout(tmp_path):
    """A rank stopped by SIGSTOP is alive to MPI, so nothing but dist.timeout notices it: its peer
    must report the wait it gave up on, naming dist.timeout, and the whole job must end (exit 5)
    within the timeout plus a margin; the run file must not claim completion."""
    timeout = 10
    out = tmp_path / "stopped.h5"
    job = Job(2, *SHORT, "--train.max_iters=2000", f"--dist.timeout={timeout}",
              f"--output.file={out}")
    job.wait_for("iter 6/")
    pids = job.rank_pids(2)
    t0 = time.monotonic()
    os.kill(pids[1], signal.SIGSTOP)
    try:
        rc = job.wait(timeout + 60)
        elapsed = time.monotonic() - t0
    finally:
        for pid in pids.values():  # never leave a stopped process behind
            try:
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    print(f"SIGSTOP of rank 1 with dist.timeout={timeout}: the job exited with {rc} "
          f"{elapsed:.2f} s later")
    reports = [l for l in job.lines if l.startswith("[rank 0/2 ")
               and f"did not complete within dist.timeout={timeout} s" in l]
    assert reports, job.output
    print("rank 0 reported:", reports[0].strip()[:160])
    assert "distributed error" in reports[0] and "Raise dist.timeout" in reports[0]
    assert rc == 5, job.output
    assert timeout <= elapsed < timeout + 15, elapsed
    assert wait_gone(pids.values(), 10) is not None, "a rank outlived the job"
    assert status_of(out) == "running"


def test_peer_stalled_before_a_flush_ends_the_job_after_dist_timeout(tmp_path):
    """Rank 1 hangs before a run-file flush (TRAINSCOPE_FAULT=flush_stall): rank 0 waits inside the
    collective HDF5 write, which has no deadline of its own, so the watchdog bounds it with
    dist.timeout and names it."""
    timeout = 5
    job = Job(2, *SHORT, "--train.max_iters=2000", f"--dist.timeout={timeout}",
              f"--output.file={tmp_path}/flush.h5",
              env={"TRAINSCOPE_FAULT": "flush_stall:rank=1:iteration=4"})
    t0 = time.monotonic()
    rc = job.wait(120)
    elapsed = time.monotonic() - t0
    print(f"rank 1 stalled before a flush, dist.timeout={timeout}: exit {rc} after {elapsed:.1f} s")
    assert rc == 5, job.output
    assert any(l.startswith("[rank 0/2 ") and "a run-file flush (collective HDF5 write of every "
               f"rank) did not complete within dist.timeout={timeout} s" in l
               for l in job.lines), job.output
    assert elapsed < 60


def test_peer_stalled_at_the_loss_resolution_ends_the_job_after_dist_timeout(tmp_path):
    """Rank 1 hangs in the loss resolution after its bounded synchronize, before the loss
    allreduce (TRAINSCOPE_FAULT=resolve_stall; LLM, whose resolution allreduces the deferred
    losses): rank 0's allreduce must end after dist.timeout, naming the wait, not after the
    iteration watchdog (issue 36; with NCCL the read after it is bounded by its own synchronize,
    which scripts/gpu-check runs)."""
    timeout = 5
    job = Job(2, "--config", str(ROOT / "inputs/llm/lora-tiny.ini"), "--train.max_iters=2000",
              "--llm.save_adapters=none", "--log.every=1", f"--dist.timeout={timeout}",
              f"--output.file={tmp_path}/resolve.h5",
              env={"TRAINSCOPE_FAULT": "resolve_stall:rank=1:iteration=4"})
    t0 = time.monotonic()
    rc = job.wait(120)
    elapsed = time.monotonic() - t0
    print(f"rank 1 stalled in the loss resolution, dist.timeout={timeout}: exit {rc} after "
          f"{elapsed:.1f} s")
    assert rc == 5, job.output
    assert any(l.startswith("[rank 0/2 ") and "allreduce" in l and
               f"did not complete within dist.timeout={timeout} s" in l for l in job.lines), job.output
    assert elapsed < 60


def test_rank_killed_while_writing_a_checkpoint_keeps_the_previous_one(tmp_path, reference):
    """Rank 1 is SIGKILLed half-way through writing its file of the iteration-8 checkpoint: the
    iteration-4 checkpoint stays the newest complete one, and --resume continues from it with the
    uninterrupted run's losses."""
    out, ckpt = tmp_path / "run.h5", tmp_path / "ckpt"
    args = [*SHORT, "--train.max_iters=24", f"--checkpoint.dir={ckpt}", "--checkpoint.every=4",
            f"--output.file={out}"]
    job = Job(2, *args, env={"TRAINSCOPE_FAULT": "checkpoint_stall:rank=1:iteration=8"})
    job.wait_for("TRAINSCOPE_FAULT: stalling while writing")
    os.kill(job.rank_pids(2)[1], signal.SIGKILL)
    assert job.wait(60) != 0
    half = ckpt / ".partial-ckpt-000000008" / "rank00001.pt"
    assert half.exists() and half.stat().st_size > 0  # the interrupted write is left as it was
    complete = sorted(p.name for p in ckpt.glob("ckpt-*") if (p / "MANIFEST.json").exists())
    assert complete == ["ckpt-000000004"], complete
    assert status_of(out) == "running"

    job = run_to_end(*args, "--resume")
    assert "resuming from" in job.output and "ckpt-000000004 at iteration 4" in job.output
    _, loss_ref = losses(reference["short"])
    it_b, loss_b = losses(tmp_path / "run.resume1.h5")
    assert it_b[0, 0] == 4 and it_b[0, -1] == 23
    assert np.array_equal(loss_b, loss_ref[:, 4:])
    assert not half.exists()  # the next save cleared the left-over


def test_two_jobs_cannot_share_a_checkpoint_dir(tmp_path, run_ts):
    """A second job given the checkpoint.dir of a running job is refused at start (exit 4, on
    every rank, naming the holder) and the first job is not disturbed; once it has ended the
    directory can be used again (the lock dies with its holder)."""
    ckpt = tmp_path / "ckpt"
    first = Job(2, *SHORT, "--train.max_iters=2000", f"--checkpoint.dir={ckpt}",
                f"--output.file={tmp_path}/first.h5")
    try:
        first.wait_for("iter 3/")
        t0 = time.monotonic()
        proc = run_ts(2, *SHORT, "--train.max_iters=2", f"--checkpoint.dir={ckpt}",
                      f"--output.file={tmp_path}/second.h5", timeout=90)
        elapsed = time.monotonic() - t0
        print(f"second job refused after {elapsed:.1f} s")
        assert proc.returncode == 4, proc.stdout + proc.stderr
        both_ranks_said(proc, f"checkpoint.dir = '{ckpt}' is in use by another job (pid",
                        "Give each job its own checkpoint.dir")
        assert elapsed < 40
        assert status_of(tmp_path / "second.h5") == "failed"
        assert first.proc.poll() is None, "the first job must keep running"
        first.proc.send_signal(signal.SIGUSR1)  # graceful stop: checkpoint, exit 75
        assert first.wait(60) == 75, first.output
    finally:
        if first.proc.poll() is None:
            first.kill()
    assert any((p / "MANIFEST.json").exists() for p in ckpt.glob("ckpt-*"))
    proc = run_ts(2, *SHORT, "--train.max_iters=2", f"--checkpoint.dir={ckpt}",
                  f"--output.file={tmp_path}/third.h5", timeout=90)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_sigkill_of_mpirun_leaves_no_orphan_ranks(tmp_path):
    """mpirun killed with SIGKILL (an impatient user, a scheduler's hard kill of the launcher): its
    ranks must not keep computing (and holding the checkpoint lock) unsupervised."""
    job = Job(2, *SHORT, "--train.max_iters=2000", f"--checkpoint.dir={tmp_path}/ckpt",
              f"--output.file={tmp_path}/orphans.h5")
    job.wait_for("iter 3/")
    pids = job.rank_pids(2)
    job.proc.kill()
    try:
        gone = wait_gone(pids.values(), 30)
    finally:
        for pid in pids.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    print(f"SIGKILL of mpirun: ranks gone {gone} s later")
    assert gone is not None, "ranks still alive 30 s after mpirun was killed"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A finished 2-rank run with complete checkpoints at iterations 2 and 4, copied by each test
    that damages it."""
    d = tmp_path_factory.mktemp("checkpoints")
    run_to_end(*SHORT, "--train.max_iters=4", f"--checkpoint.dir={d}/ckpt",
               "--checkpoint.every=2", f"--output.file={d}/run.h5")
    return d


def damaged_copy(checkpoints, tmp_path, damage):
    import shutil
    ckpt = tmp_path / "ckpt"
    shutil.copytree(checkpoints / "ckpt", ckpt)
    damage(ckpt / "ckpt-000000004")
    return ckpt


def resume_damaged(run_ts, tmp_path, ckpt):
    t0 = time.monotonic()
    proc = run_ts(2, *SHORT, "--train.max_iters=4", "--resume", f"--checkpoint.dir={ckpt}",
                  f"--output.file={tmp_path}/resumed.h5", timeout=90)
    assert time.monotonic() - t0 < 60
    return proc


def edit_manifest(ckpt, **values):
    m = json.loads((ckpt / "MANIFEST.json").read_text())
    m.update(values)
    (ckpt / "MANIFEST.json").write_text(json.dumps(m))


def swap_rank_files(ckpt):
    a, b = ckpt / "rank00000.pt", ckpt / "rank00001.pt"
    a.rename(ckpt / "tmp.pt")
    b.rename(a)
    (ckpt / "tmp.pt").rename(b)


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("case", [
    # (name, damage, needles every rank prints)
    ("truncated rank file", lambda c: truncate(c / "rank00001.pt"),
     ("ckpt-000000004/rank00001.pt cannot be read", "to resume from an older checkpoint")),
    ("missing rank file", lambda c: (c / "rank00001.pt").unlink(),
     ("ckpt-000000004/rank00001.pt cannot be read", "to resume from an older checkpoint")),
    # Binary garbage: the parser's message quotes it, as \xNN escapes (never raw bytes).
    ("garbage manifest", lambda c: (c / "MANIFEST.json").write_bytes(bytes(range(0x80, 0x100))),
     ("ckpt-000000004/MANIFEST.json is not valid", "\\x80", "delete that checkpoint directory")),
    ("manifest of the wrong shape", lambda c: (c / "MANIFEST.json").write_text(
        '{"next_iteration": "four", "world_size": 2}'),
     ("ckpt-000000004/MANIFEST.json is not valid", "delete that checkpoint directory")),
    # Issue 37: the manifest is data. Values out of range, rank files that disagree with it or
    # with each other, a run file outside the job's output: refused naming the file and field.
    ("negative next_iteration", lambda c: edit_manifest(c, next_iteration=-4),
     ("ckpt-000000004/MANIFEST.json: field next_iteration is -4", "resume from an older")),
    ("world_size 0", lambda c: edit_manifest(c, world_size=0),
     ("MANIFEST.json: field world_size is 0",)),
    ("absurd world_size", lambda c: edit_manifest(c, world_size=10**12),
     ("MANIFEST.json", "world_size")),
    ("negative global_batch", lambda c: edit_manifest(c, global_batch=-128),
     ("MANIFEST.json: field global_batch is -128",)),
    ("negative restart_index", lambda c: edit_manifest(c, restart_index=-1),
     ("MANIFEST.json: field restart_index is -1",)),
    ("files list too short", lambda c: edit_manifest(c, files=["rank00000.pt"]),
     ("MANIFEST.json: field files lists 1 rank files for world_size 2",)),
    ("files list renamed", lambda c: edit_manifest(c, files=["rank00001.pt", "rank00000.pt"]),
     ("MANIFEST.json: field files entry 0 is 'rank00001.pt'",)),
    ("wrong format", lambda c: edit_manifest(c, format="something-else/9"),
     ("MANIFEST.json: field format is not trainscope-checkpoint/1",)),
    ("run_file of another job", lambda c: edit_manifest(c, run_file=str(c.parent.parent / "other.h5")),
     ("MANIFEST.json: field run_file", "other.h5' is not the checkpointed job's output.file")),
    ("run_file outside", lambda c: edit_manifest(c, run_file="/etc/passwd"),
     ("field run_file '/etc/passwd' is not the checkpointed job's output.file",)),
    ("swapped rank files", swap_rank_files,
     ("ckpt-000000004/rank0000", "'s state for iteration 4, but the manifest MANIFEST.json "
      "expects rank", "rank files swapped")),
    ("rank file of another iteration", lambda c: __import__("shutil").copy(
        c.parent / "ckpt-000000002" / "rank00001.pt", c / "rank00001.pt"),
     ("ckpt-000000004/rank00001.pt holds rank 1's state for iteration 2",
      "expects rank 1 at iteration 4")),
], ids=lambda c: c[0])
def test_resume_from_a_damaged_checkpoint_is_refused_clearly(tmp_path, run_ts, checkpoints,
                                                            case):
    _, damage, needles = case
    other = tmp_path / "other.h5"
    other.write_bytes(b"another job's run file")
    ckpt = damaged_copy(checkpoints, tmp_path, damage)
    proc = resume_damaged(run_ts, tmp_path, ckpt)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    both_ranks_said(proc, *needles)
    for sign in ("Segmentation fault", "terminate called", "core dumped", "internal error"):
        assert sign not in proc.stdout + proc.stderr
    # A refused --resume leaves no continuation file and writes into no other file.
    assert not (tmp_path / "resumed.h5").exists(), proc.stdout + proc.stderr
    assert other.read_bytes() == b"another job's run file"



def test_checkpoint_dir_that_is_a_file_or_read_only(tmp_path, run_ts, mounts):
    """checkpoint.dir naming a regular file, a read-only directory, or a directory to create on a
    read-only file system: refused at start on every rank (exit 4; --resume: exit 3), naming the
    path and the problem."""
    afile = tmp_path / "not-a-dir"
    afile.write_text("a file")
    proc = run_ts(2, *SHORT, "--train.max_iters=2", f"--checkpoint.dir={afile}",
                  f"--output.file={tmp_path}/a.h5", timeout=90)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    both_ranks_said(proc, f"checkpoint.dir = '{afile}' exists but is not a directory")
    proc = run_ts(2, *SHORT, "--train.max_iters=2", "--resume", f"--checkpoint.dir={afile}",
                  f"--output.file={tmp_path}/b.h5", timeout=90)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    both_ranks_said(proc, f"--resume: checkpoint.dir = '{afile}' is not a directory")

    ro = read_only_dir(tmp_path, mounts)
    proc = run_ts(2, *SHORT, "--train.max_iters=2", f"--checkpoint.dir={ro}",
                  f"--output.file={tmp_path}/c.h5", timeout=90)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    both_ranks_said(proc, f"checkpoint.dir = '{ro}' is not writable", "Read-only file system")
    proc = run_ts(2, *SHORT, "--train.max_iters=2", f"--checkpoint.dir={ro}/sub",
                  f"--output.file={tmp_path}/d.h5", timeout=90)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    both_ranks_said(proc, f"checkpoint.dir = '{ro}/sub' cannot be created",
                    "Read-only file system")
    for name in "abcd":
        p = tmp_path / f"{name}.h5"
        assert not p.exists() or status_of(p) != "completed"


def test_resume_with_another_global_batch_or_model_is_refused(tmp_path, run_ts, checkpoints):
    """--resume of a 2-rank run on 4 ranks with the same per-rank batch (so twice the global
    batch), or with other model options: a configuration error on every rank naming what differs
    (exit 2). (Another rank count with the same global batch resumes: tests/e2e/test_elastic.py.)"""
    import shutil
    ckpt = tmp_path / "ckpt"
    shutil.copytree(checkpoints / "ckpt", ckpt)
    proc = run_ts(4, *SHORT, "--train.max_iters=4", "--resume", f"--checkpoint.dir={ckpt}",
                  f"--output.file={tmp_path}/four.h5", timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    said = proc.stdout + proc.stderr
    for rank in range(4):
        assert any(l.startswith(f"[rank {rank}/4 ") and "global batch is 256 samples per step "
                   "(4 ranks)" in l and "trained with 128 (2 ranks)" in l
                   and "train.global_batch_size=128 without train.batch_size" in l
                   for l in said.splitlines()), said
    proc = run_ts(2, *SHORT, "--train.max_iters=4", "--cv.width_mult=0.75",
                  "--cv.image_size=48", "--resume", f"--checkpoint.dir={ckpt}",
                  f"--output.file={tmp_path}/model.h5", timeout=90)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    both_ranks_said(proc, "differs from checkpoint", "in 2 option(s)",
                    "cv.image_size: checkpoint '32', now '48'",
                    "cv.width_mult: checkpoint '0.5', now '0.75'",
                    "Resume with the original configuration")
    # Memory policies do not change what is trained: a run resumed after running out of memory
    # may change them (issue 26).
    # (from the checkpoint at iteration 2: the newest, at 4, is the end of the run)
    shutil.rmtree(ckpt / "ckpt-000000004")
    proc = run_ts(2, *SHORT, "--train.max_iters=4", "--run.host_memory=release",
                  "--data.pin_memory=true", "--resume", f"--checkpoint.dir={ckpt}",
                  f"--output.file={tmp_path}/policy.h5", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert status_of(tmp_path / "policy.h5") == "completed"
    with h5py.File(tmp_path / "policy.h5", "r") as f:
        assert list(f["iterations/iteration"][0]) == [2, 3]
