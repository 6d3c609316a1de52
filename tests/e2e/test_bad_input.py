"""Bad input on 2 real ranks, tried systematically. CASES is the table of the issue's "bad input"
list: every row is one mpirun of the real binary that must fail within its timeout with the
documented exit code (2 configuration, 3 input, 4 output; docs/faults.md "Errors and exit
codes"), say the needles (option, file, line, value, fix) on every rank, never crash, and never
leave a run file that claims "completed". Full and read-only file systems are real tmpfs mounts made by the test
(root in CI), unmounted in teardown even when the test fails."""

import gzip
import json
import os
import random
import struct
import subprocess
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import h5py
import pytest

from conftest import ROOT

QUICK = ["--config", str(ROOT / "inputs/quickstart.ini")]
LLM = ["--config", str(ROOT / "inputs/llm/lora-tiny.ini"), "--train.max_iters=2", "--log.every=0"]
TOKENIZER = ROOT / "inputs/llm/data/tiny_tokenizer.model"
INSTRUCT = ROOT / "inputs/llm/data/instruct.jsonl"
# A rank that fails must not take longer than this to end the job (start-up included).
FAIL_WITHIN_S = 45
# No output line may be longer: messages quote the start of a bad value, not all of it.
MAX_LINE = 2000
CRASH_SIGNS = ("Segmentation fault", "core dumped", "terminate called", "Aborted (signal",
               "exited on signal", "free(): ", "double free")


def both_ranks_said(proc, *needles):
    text = proc.stdout + proc.stderr
    for rank in (0, 1):
        lines = [l for l in text.splitlines() if l.startswith(f"[rank {rank}/2 ")]
        joined = "\n".join(lines)
        for n in needles:
            assert n in joined, f"rank {rank} did not report {n!r}:\n{text}"


def some_rank_said(proc, *needles):
    text = proc.stdout + proc.stderr
    lines = "\n".join(l for l in text.splitlines() if l.startswith("[rank "))
    for n in needles:
        assert n in lines, f"no rank reported {n!r}:\n{text}"


def run_bad(run_ts, *args, timeout=60):
    t0 = time.monotonic()
    proc = run_ts(2, *QUICK, *args, timeout=timeout)
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert elapsed < FAIL_WITHIN_S, f"took {elapsed:.0f} s to fail"
    return proc


def status_of(path):
    with h5py.File(path, "r") as f:
        s = f.attrs["status"]
        return s.decode() if isinstance(s, bytes) else str(s)


def no_completed_run_file(where):
    """No HDF5 file under `where` claims success (a file that is not HDF5 is not a run file)."""
    for p in Path(where).rglob("*"):
        if p.is_file() and not p.is_symlink() and p.read_bytes()[:8] == b"\x89HDF\r\n\x1a\n":
            assert status_of(p) != "completed", f"{p} claims completed after a failed run"


# ---- input files, written into the test's tmp_path ----------------------------------------------

def idx(dims, payload=None, type_code=0x08, zero=b"\0\0"):
    """IDX bytes: magic 00 00 <type> <ndims>, big-endian uint32 dims, then the payload."""
    n = 1
    for d in dims:
        n *= d
    body = bytes((i * 7) % 10 for i in range(n)) if payload is None else payload
    return zero + bytes([type_code, len(dims)]) + struct.pack(f">{len(dims)}I", *dims) + body


def mnist_dir(tmp, n_train=64, n_test=16, side=28, **replace):
    """A small valid MNIST-layout directory; `replace` maps file names to contents: bytes (gzipped
    for a .gz name unless prefixed b"raw:"), None to omit the file, "dir" for a directory."""
    d = tmp / "data"
    d.mkdir(exist_ok=True)
    files = {
        "train-images-idx3-ubyte.gz": idx([n_train, side, side]),
        "train-labels-idx1-ubyte.gz": idx([n_train]),
        "t10k-images-idx3-ubyte.gz": idx([n_test, side, side]),
        "t10k-labels-idx1-ubyte.gz": idx([n_test]),
    }
    files.update(replace)
    for name, content in files.items():
        if content is None:
            continue
        if content == "dir":
            (d / name).mkdir()
        elif name.endswith(".gz") and content[:2] != b"\x1f\x8b" and not content.startswith(b"raw:"):
            (d / name).write_bytes(gzip.compress(content))
        else:
            (d / name).write_bytes(content[4:] if content.startswith(b"raw:") else content)
    return d


def png(width=8, height=8, truncate_idat=False):
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(
            ">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    raw = b"".join(b"\0" + bytes((x * 30 + y * 20) % 256 for x in range(width * 3))
                   for y in range(height))
    data = zlib.compress(raw)
    if truncate_idat:
        data = data[: len(data) // 2]
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", data) + (b"" if truncate_idat else chunk(b"IEND", b"")))


def image_folder(tmp, bad=None, empty_class=False, no_val=False):
    """data/{train,val}/{a,b}/*.png (8x8); `bad` = (split, class, name, bytes) adds one bad file."""
    root = tmp / "images"
    for split in ("train",) + (() if no_val else ("val",)):
        for cls in ("a", "b"):
            d = root / split / cls
            d.mkdir(parents=True)
            for i in range(4):
                (d / f"{i}.png").write_bytes(png())
    if empty_class:
        (root / "train" / "c").mkdir()
        (root / "val" / "c").mkdir()
    if bad:
        split, cls, name, content = bad
        (root / split / cls / name).write_bytes(content)
    return root


def imagefolder_args(root):
    return [f"--data.dataset=imagefolder", f"--data.path={root}", "--train.batch_size=2",
            "--train.eval_batch_size=2", "--train.max_iters=4", "--cv.image_size=32",
            "--data.workers=0", "--log.every=0"]


def tiny_model_dir(tmp, safetensors_bytes):
    d = tmp / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 1024,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False}))
    (d / "model.safetensors").write_bytes(safetensors_bytes)
    return ["--llm.model=" + str(d), "--llm.init=checkpoint"]


def tiny_model_dir_args(tmp):
    return ["--llm.model=" + str(tmp / "model"), "--llm.init=checkpoint"]


def safetensors(header, data=b"", length=None):
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(h) if length is None else length) + h + data


def write(tmp, name, content):
    p = tmp / name
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    return p


def jsonl_with_bad_line(tmp, line_no, bad):
    lines = INSTRUCT.read_text().splitlines()
    lines[line_no - 1] = bad
    return write(tmp, "data.jsonl", "\n".join(lines) + "\n")


def jsonl_with_bad_bytes(tmp, line_no, bad):
    """instruct.jsonl with line `line_no` replaced by raw bytes (invalid UTF-8 and the like)."""
    lines = INSTRUCT.read_bytes().splitlines()
    lines[line_no - 1] = bad
    return write(tmp, "data.jsonl", b"\n".join(lines) + b"\n")


def jsonl_of(tmp, records):
    return write(tmp, "data.jsonl", "".join(json.dumps(r) + "\n" for r in records))


def png_declaring(width, height):
    """A PNG whose IHDR declares width x height but holds one tiny IDAT: decoding must refuse it
    from the header, before allocating width * height pixels."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(
            ">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b""))


def fifo(tmp, name):
    os.mkfifo(tmp / name)
    return tmp / name


def not_utf8(text_bytes):
    """A command-line argument holding these raw bytes (Python passes it through os.fsencode)."""
    return os.fsdecode(text_bytes)


def class_without_images(tmp):
    """A class directory 'c' (in train and val) holding a text file and an empty sub-directory."""
    root = image_folder(tmp)
    for split in ("train", "val"):
        (root / split / "c" / "empty").mkdir(parents=True)
        (root / split / "c" / "notes.txt").write_text("no images here")
    return root


def symlink(tmp, name, target, content=None):
    """tmp/name -> target; the target is created with `content` unless None (a dangling link)."""
    if content is not None:
        Path(target).write_bytes(content)
    os.symlink(target, tmp / name)
    return tmp / name


def tokenizer_with(tmp, edit):
    lines = TOKENIZER.read_text().splitlines()
    return write(tmp, "tok.model", "\n".join(edit(lines)) + "\n")


# ---- file systems: tmpfs mounts made and removed by the test --------------------------------------

class Mounts:
    """tmpfs mounts for one test; every mount is removed in teardown, also after a failure."""

    def __init__(self):
        self.points = []

    def tmpfs(self, where, size="1m"):
        where.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.fail(f"cannot mount a tmpfs at {where} (the full and read-only file system "
                        f"tests need root with CAP_SYS_ADMIN): {proc.stderr.strip()}")
        self.points.append(where)
        return where

    def read_only(self, where):
        subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)

    def cleanup(self):
        for p in reversed(self.points):
            subprocess.run(["umount", "-l", str(p)], capture_output=True)


@pytest.fixture
def mounts():
    m = Mounts()
    yield m
    m.cleanup()


def fill(fs, leave_bytes):
    """Fills file system `fs` with one file so that about `leave_bytes` stay free."""
    st = os.statvfs(fs)
    free = st.f_bavail * st.f_frsize
    with open(fs / "filler", "wb") as f:
        f.write(b"\0" * max(0, free - leave_bytes))
    return os.statvfs(fs).f_bavail * os.statvfs(fs).f_frsize


def read_only_dir(tmp, mounts, existing=None):
    """A read-only tmpfs at tmp/ro, holding the file `existing` if given."""
    d = mounts.tmpfs(tmp / "ro", "1m")
    if existing:
        (d / existing).write_bytes(b"an older run")
    mounts.read_only(d)
    return d


# ---- the table ------------------------------------------------------------------------------------

@dataclass
class Case:
    id: str
    code: int                                  # expected exit code of mpirun
    needles: tuple                             # must appear in rank-prefixed lines; "{tmp}" = tmp_path
    args: tuple = ()                           # after the base config; "{tmp}" = tmp_path
    setup: Optional[Callable] = None           # setup(tmp, mounts) -> extra args
    base: tuple = tuple(QUICK)
    every_rank: bool = True                    # False: an error only one rank can see (see below)
    output: bool = True                        # add --output.file={tmp}/out.h5
    timeout: float = FAIL_WITHIN_S
    check: Optional[Callable] = None           # check(tmp) after the run
    env: dict = field(default_factory=dict)    # environment variables of the launch


C, I, O = 2, 3, 4

CASES = [
    # -- configuration: types, ranges, unknown keys (exit 2) --
    Case("unknown-option", C, ("unknown option 'train.batchsize'",
                               "did you mean 'train.batch_size'"), ("--train.batchsize=3",)),
    Case("int-not-a-number", C, ("train.batch_size = 'abc'", "expected an integer"),
         ("--train.batch_size=abc",)),
    Case("int-negative", C, ("train.batch_size = '-1'", "an integer between 1 and"),
         ("--train.batch_size=-1",)),
    Case("int-zero", C, ("train.epochs = '0'", "an integer between 1 and 100000"),
         ("--train.epochs=0",)),
    Case("int-overflow", C, ("train.max_iters = '99999999999999999999'", "an integer"),
         ("--train.max_iters=99999999999999999999",)),
    Case("float-not-a-number", C, ("train.lr = 'fast'", "a number between 0 and 100"),
         ("--train.lr=fast",)),
    Case("float-nan", C, ("train.lr = 'nan'", "a number"), ("--train.lr=nan",)),
    Case("float-inf", C, ("train.weight_decay = 'inf'", "a number"),
         ("--train.weight_decay=inf",)),
    Case("float-out-of-range", C, ("train.momentum = '1.5'", "a number between 0 and 1"),
         ("--train.momentum=1.5",)),
    Case("float-zero-where-positive", C, ("dist.bucket_mb = '0'", "> 0"),
         ("--dist.bucket_mb=0",)),
    Case("first-bucket-zero", C, ("dist.first_bucket_mb = '0'", "> 0"),
         ("--dist.first_bucket_mb=0",)),
    # dist.compress (issue 40): impossible combinations name the options, the values and the fix.
    Case("powersgd-rank-zero", C, ("dist.powersgd_rank = '0'", "an integer between 1 and"),
         ("--dist.compress=powersgd", "--dist.powersgd_rank=0")),
    Case("powersgd-with-zero", C, ("dist.compress=powersgd", "dist.zero=3", "use dist.zero=0"),
         ("--dist.compress=powersgd", "--dist.zero=3"), base=tuple(LLM)),
    Case("powersgd-option-without-powersgd", C,
         ("dist.powersgd_rank = '4'", "set dist.compress=powersgd"), ("--dist.powersgd_rank=4",)),
    Case("powersgd-with-loss-scaling", C, ("dist.compress=powersgd", "run.precision=fp16-mixed"),
         ("--dist.compress=powersgd", "--run.precision=fp16-mixed")),
    # dist.zero on the CV workload (issue 40): ZeRO-1/2 under ddp/ddp-ds with AdamW only.
    Case("cv-zero3", C, ("dist.zero=3", "use dist.zero=1 or 2"), ("--dist.zero=3",)),
    Case("cv-zero-pipeline", C, ("dist.zero=1", "run.strategy=pipeline", "set dist.zero=0"),
         ("--dist.zero=1", "--run.strategy=pipeline")),
    Case("cv-zero-sgd", C, ("dist.zero=2", "train.optimizer=sgd", "set train.optimizer=adamw"),
         ("--dist.zero=2", "--train.optimizer=sgd")),
    Case("bool-not-a-bool", C, ("train.nesterov = 'maybe'", "true or false"),
         ("--train.nesterov=maybe",)),
    Case("choice-unknown", C, ("run.strategy = 'zero3'", "one of ddp-ds, ddp"),
         ("--run.strategy=zero3",)),
    Case("positional-argument", C, ("unexpected argument 'inputs/quickstart.ini'", "--config FILE"),
         ("inputs/quickstart.ini",)),
    # -- configuration: conflicting values (exit 2) --
    Case("global-batch-not-divisible", C, ("train.global_batch_size=101", "2 ranks",
                                           "multiple of 2"), ("--train.global_batch_size=101",)),
    Case("batch-and-global-batch-disagree", C,
         ("train.batch_size=16 x 2 ranks != train.global_batch_size=64", "set only one of them"),
         ("--train.batch_size=16", "--train.global_batch_size=64")),
    Case("deterministic-and-benchmark", C, ("run.deterministic=true and run.cudnn_benchmark=true",
                                            "set one of them to false"),
         ("--run.deterministic=true", "--run.cudnn_benchmark=true")),
    Case("dp-with-two-ranks", C, ("run.strategy=dp", "2 ranks were launched", "mpirun -np 1"),
         ("--run.strategy=dp",)),
    Case("cuda-without-gpu", C, ("run.device=cuda but no CUDA device is visible",
                                 "or use run.device=cpu"), ("--run.device=cuda",)),
    # run.device=auto where the scheduler granted GPUs that CUDA cannot use (here: none at all)
    # must not train on the CPU: the variable, CUDA's reason and the fix (issue 25).
    Case("auto-device-gpus-granted-by-slurm", C,
         ("run.device=auto would fall back to the CPU although SLURM_GPUS_ON_NODE=1 says this "
          "job was given GPUs", "CUDA is unavailable here (",
          "set run.device=cpu to train on the CPU on purpose"),
         ("--run.device=auto",), env={"SLURM_GPUS_ON_NODE": "1"}),
    Case("auto-device-gpus-granted-by-cuda-visible-devices", C,
         ("run.device=auto would fall back to the CPU although CUDA_VISIBLE_DEVICES=0 says this "
          "job was given GPUs", "Fix the driver, container or device visibility"),
         ("--run.device=auto",), env={"CUDA_VISIBLE_DEVICES": "0"}),
    Case("sync-bn-with-pipeline", C, ("cv.sync_bn=true needs run.strategy=ddp or ddp-ds",
                                      "set cv.sync_bn=false"),
         ("--run.strategy=pipeline", "--cv.sync_bn=true", "--pipeline.stages=2")),
    Case("scaling-global-not-divisible", C, ("run.global_batch=65 does not divide over 2 ranks",),
         ("--run.scaling=strong", "--run.global_batch=65")),
    Case("scaling-and-batch-on-command-line", C,
         ("remove --train.batch_size from the command line",),
         ("--run.scaling=strong", "--run.global_batch=64", "--train.batch_size=16")),
    Case("batch-larger-than-shard", C, ("train.batch_size=100000 is larger than the",
                                        "use a smaller batch or data.drop_last=false"),
         ("--train.batch_size=100000",)),
    Case("llm-dpo-needs-preference-data", C, ("llm.method=dpo", "llm.dataset.format=preference"),
         ("--llm.method=dpo",), base=tuple(LLM)),
    # -- configuration files (exit 2) --
    Case("config-missing", C, ("cannot read config file '{tmp}/none.ini'",
                               "check the path given to --config"),
         ("--config", "{tmp}/none.ini")),
    Case("config-is-a-directory", C, ("config file '{tmp}'", "is a directory"),
         ("--config", "{tmp}")),
    Case("config-read-error", C, ("cannot read config file '/proc/self/mem'",
                                  "Input/output error"), ("--config", "/proc/self/mem")),
    Case("config-malformed", C, ("config file '{tmp}/bad.ini'", "[section] headers"),
         setup=lambda tmp, m: ["--config", write(tmp, "bad.ini", "[train\nbatch_size = 3\n")]),
    Case("config-unknown-section", C, ("config file '{tmp}/sec.ini'", "unknown option "
                                       "'trian.batch_size'", "did you mean 'train.batch_size'"),
         setup=lambda tmp, m: ["--config", write(tmp, "sec.ini", "[trian]\nbatch_size = 3\n")]),
    # -- configuration files that are no regular UTF-8 INI file, keys set twice (exit 2) --
    Case("config-fifo", C, ("config file '{tmp}/fifo.ini' is a FIFO (named pipe), not a regular "
                            "file", "give --config the path of an INI file"),
         setup=lambda tmp, m: ["--config", fifo(tmp, "fifo.ini")]),  # opening it would block
    Case("config-character-device", C, ("config file '/dev/zero' is a character device",
                                        "give --config the path of an INI file"),
         ("--config", "/dev/zero")),  # reading it would never end
    Case("config-not-utf8", C, ("config file '{tmp}/latin1.ini' line 3 is not UTF-8 text "
                                "(byte \\xf6 at column 5)", "save the file as UTF-8"),
         setup=lambda tmp, m: ["--config", write(tmp, "latin1.ini",
                                                 b"[train]\nepochs = 1\n# Gr\xf6\xdfe\n")]),
    Case("config-utf16", C, ("config file '{tmp}/utf16.ini' is UTF-16 text", "save it as UTF-8"),
         setup=lambda tmp, m: ["--config", write(tmp, "utf16.ini",
                                                 "[train]\nepochs = 1\n".encode("utf-16"))]),
    Case("config-path-not-utf8", C, ("config file path '{tmp}/caf\\xe9.ini' is not UTF-8 text",
                                     "rename the file"),
         setup=lambda tmp, m: ["--config", write(tmp, not_utf8(b"caf\xe9.ini"), "[train]\n")]),
    Case("config-key-twice-in-one-file", C, ("config file '{tmp}/dup.ini' sets train.batch_size "
                                             "twice, on line 2 and line 4", "keep one of them"),
         setup=lambda tmp, m: ["--config", write(tmp, "dup.ini", "[train]\nbatch_size = 16\n"
                                                 "lr = 0.1\nbatch_size = 32\n")]),
    # -- numbers and values of every option type: 1e100, inf, 0x10, empty, 100 KB, not UTF-8 --
    Case("int-1e100", C, ("train.batch_size = '1e100'", "an integer between 1 and 1048576"),
         ("--train.batch_size=1e100",)),
    Case("int-empty", C, ("train.batch_size = ''", "an integer"), ("--train.batch_size=",)),
    Case("int-100kb", C, ("option train.max_iters = '999", "... (100000 bytes)",
                          "at most 4096 bytes, not 100000"), ("--train.max_iters=" + "9" * 100000,)),
    Case("float-hex", C, ("train.lr = '0x10'", "a number between 0 and 100"), ("--train.lr=0x10",)),
    Case("float-minus-inf", C, ("train.min_lr = '-inf'", "a number"), ("--train.min_lr=-inf",)),
    Case("float-1e100-unbounded-option", C,
         ("dist.bucket_mb = '1e100'", "a number between 0 and 1048576"), ("--dist.bucket_mb=1e100",)),
    Case("bool-number", C, ("train.nesterov = '0x1'", "true or false"), ("--train.nesterov=0x1",)),
    Case("choice-empty-in-file", C, ("config file '{tmp}/e.ini' line 2: option run.strategy = '' is "
                                     "invalid", "one of ddp-ds"),
         setup=lambda tmp, m: ["--config", write(tmp, "e.ini", "[run]\nstrategy =\n")]),
    Case("choice-not-utf8", C, ("run.strategy = 'ddp\\xff' is not UTF-8 text (byte \\xff at "
                                "offset 3)",), (not_utf8(b"--run.strategy=ddp\xff"),)),
    Case("path-not-utf8", C, ("data.path = '{tmp}/caf\\xe9' is not UTF-8 text",
                              "rename the file or directory"),
         setup=lambda tmp, m: [(tmp / not_utf8(b"caf\xe9")).mkdir()
                               or not_utf8(b"--data.path=" + bytes(tmp) + b"/caf\xe9")]),
    Case("string-100kb", C, ("option output.file = '{tmp}/", "at most 4096 bytes, not 100"),
         output=False, setup=lambda tmp, m: [f"--output.file={tmp}/{'x' * 100000}.h5"]),
    # -- more data-parallel ranks than training samples (exit 2) --
    Case("more-ranks-than-samples", C, ("the training set has 1 sample but 2 data-parallel ranks "
                                        "(run.strategy=ddp-ds)", "launch at most 1 ranks"),
         ("--data.dataset=synthetic", "--data.synthetic_samples=1", "--train.batch_size=1")),
    Case("more-ranks-than-samples-padded", C, ("the training set has 1 sample but 2 data-parallel "
                                               "ranks", "run.strategy=ddp"),
         ("--data.dataset=synthetic", "--data.synthetic_samples=1", "--train.batch_size=1",
          "--data.drop_last=false")),
    Case("more-ranks-than-samples-llm", C, ("the dataset has 1 sample, fewer than the 2 ranks",
                                            "use more samples or fewer ranks"), base=tuple(LLM),
         setup=lambda tmp, m: ["--llm.dataset.path=" + str(write(
             tmp, "one.jsonl", INSTRUCT.read_text().splitlines()[0] + "\n")),
             "--train.batch_size=1"]),
    # -- datasets: missing, unreadable, truncated or corrupt IDX files (exit 3) --
    Case("data-path-missing", I, ("{tmp}/no-such-dir", "dataset-fashion-mnist"),
         ("--data.path={tmp}/no-such-dir",)),
    Case("idx-is-a-directory", I, ("'{tmp}/data/train-images-idx3-ubyte' is not a regular file "
                                   "but a directory", "replace it by the IDX file"),
         setup=lambda tmp, m: [f"--data.path={mnist_dir(tmp, **{'train-images-idx3-ubyte.gz': None, 'train-images-idx3-ubyte': 'dir'})}"]),
    # A read that fails (EIO): /proc/self/mem opens but cannot be read at offset 0, even by root.
    Case("idx-read-error", I, ("cannot read IDX file '{tmp}/data/train-labels-idx1-ubyte.gz'",
                               "Input/output error"),
         setup=lambda tmp, m: [f"--data.path={mnist_dir(tmp, **{'train-labels-idx1-ubyte.gz': None})}",
                               os.symlink("/proc/self/mem", tmp / "data/train-labels-idx1-ubyte.gz")
                               or "--log.every=0"]),
    Case("idx-wrong-magic", I, ("train-images-idx3-ubyte.gz' is not an IDX file",
                                "magic 0x12340803", "expected 0x00000803"),
         setup=lambda tmp, m: [f"--data.path={mnist_dir(tmp, **{'train-images-idx3-ubyte.gz': idx([64, 28, 28], zero=bytes([0x12, 0x34]))})}"]),
    Case("idx-truncated-payload", I, ("t10k-images-idx3-ubyte.gz' is truncated",
                                      "header says 16x28x28 = 12544 bytes, file has 1000"),
         setup=lambda tmp, m: [f"--data.path={mnist_dir(tmp, **{'t10k-images-idx3-ubyte.gz': idx([16, 28, 28])[:16 + 1000]})}"]),
    Case("idx-dims-disagree", I, ("train-labels-idx1-ubyte.gz' is too long",
                                  "header says 60 = 60 bytes, file has 64"),
         setup=lambda tmp, m: [f"--data.path={mnist_dir(tmp, **{'train-labels-idx1-ubyte.gz': idx([60], bytes(64))})}"]),
    Case("idx-label-count-differs", I, ("has 64 images but", "has 63 labels",
                                        "do not belong together"),
         setup=lambda tmp, m: [f"--data.path={mnist_dir(tmp, **{'train-labels-idx1-ubyte.gz': idx([63])})}"]),
    Case("idx-corrupt-gzip", I, ("train-images-idx3-ubyte.gz': gzip stream corrupt",
                                 "download or install the file again"),
         setup=lambda tmp, m: [f"--data.path={mnist_dir(tmp, **{'train-images-idx3-ubyte.gz': b'raw:' + gzip.compress(idx([64, 28, 28], random.Random(0).randbytes(64 * 28 * 28)))[:600]})}"]),
    Case("idx-images-without-pixels", I, ("train-images-idx3-ubyte.gz' holds 64x0x0 images",
                                          "images without pixels"),
         setup=lambda tmp, m: [f"--data.path={mnist_dir(tmp, **{'train-images-idx3-ubyte.gz': idx([64, 0, 0]), 't10k-images-idx3-ubyte.gz': idx([16, 0, 0])})}"]),
    Case("idx-train-test-shapes-differ", I, ("training images are", "test images are",
                                             "different datasets"),
         setup=lambda tmp, m: [f"--data.path={mnist_dir(tmp, **{'t10k-images-idx3-ubyte.gz': idx([16, 20, 20])})}"]),
    # -- image folders (exit 3) --
    Case("imagefolder-empty-class", I, ("class directory '{tmp}/images/train/c' holds no "
                                        ".jpg/.jpeg/.png file", "add its images or remove it"),
         setup=lambda tmp, m: imagefolder_args(image_folder(tmp, empty_class=True))),
    Case("imagefolder-missing-val", I, ("'{tmp}/images/val' not found", "ImageNet layout"),
         setup=lambda tmp, m: imagefolder_args(image_folder(tmp, no_val=True))),
    # A corrupt image is decoded during training by the one rank whose shard holds it: that rank
    # names it and aborts the job (the other rank is waiting in the gradient allreduce).
    Case("imagefolder-corrupt-png", I, ("{tmp}/images/train/a/bad.png",
                                        "corrupt or truncated PNG", "replace or remove it"),
         setup=lambda tmp, m: imagefolder_args(image_folder(
             tmp, bad=("train", "a", "bad.png", png(truncate_idat=True)))) + ["--train.eval=false",
                                                                              "--train.max_iters=6"],
         every_rank=False),
    Case("imagefolder-corrupt-jpeg", I, ("{tmp}/images/val/b/bad.jpg", "corrupt", "JPEG",
                                         "replace or remove it"),
         setup=lambda tmp, m: imagefolder_args(image_folder(
             tmp, bad=("val", "b", "bad.jpg", b"\xff\xd8\xff\xe0" + bytes(200)))) + [
             "--train.max_iters=1"],
         every_rank=False),
    Case("imagefolder-class-without-images", I, ("class directory '{tmp}/images/train/c' holds no "
                                                 ".jpg/.jpeg/.png file",),
         setup=lambda tmp, m: imagefolder_args(class_without_images(tmp))),
    Case("imagefolder-zero-byte-jpeg", I, ("{tmp}/images/train/b/empty.jpg", "is empty (0 bytes",
                                           "replace or remove it"),
         setup=lambda tmp, m: imagefolder_args(image_folder(
             tmp, bad=("train", "b", "empty.jpg", b""))) + ["--train.eval=false",
                                                           "--train.max_iters=6"],
         every_rank=False),
    Case("imagefolder-png-declares-100000x100000", I, ("{tmp}/images/train/a/huge.png",
                                                       "100000x100000 pixels",
                                                       "downscale, replace or remove it"),
         setup=lambda tmp, m: imagefolder_args(image_folder(
             tmp, bad=("train", "a", "huge.png", png_declaring(100000, 100000)))) + [
             "--train.eval=false", "--train.max_iters=6"],
         every_rank=False),
    Case("imagefolder-png-cut-in-header", I, ("{tmp}/images/train/a/cut.png",
                                              "corrupt or truncated PNG", "replace or remove it"),
         setup=lambda tmp, m: imagefolder_args(image_folder(
             tmp, bad=("train", "a", "cut.png", png()[:20]))) + ["--train.eval=false",
                                                                "--train.max_iters=6"],
         every_rank=False),
    # -- LLM inputs: tokenizer, JSONL dataset, safetensors checkpoint (exit 3) --
    Case("tokenizer-missing", I, ("llm.tokenizer = '{tmp}/none.model'", "no such file"),
         ("--llm.tokenizer={tmp}/none.model",), base=tuple(LLM)),
    Case("tokenizer-read-error", I, ("cannot read tokenizer file '/proc/self/mem'",
                                     "Input/output error"),
         ("--llm.tokenizer=/proc/self/mem",), base=tuple(LLM)),
    Case("tokenizer-bad-rank-line", I, ("tokenizer file '{tmp}/tok.model' line 7",
                                        "expected '<base64 token> <rank>'"),
         setup=lambda tmp, m: [f"--llm.tokenizer={tokenizer_with(tmp, lambda l: l[:6] + ['QUJD x'] + l[7:])}"],
         base=tuple(LLM)),
    Case("tokenizer-rank-gap", I, ("tokenizer file '{tmp}/tok.model' has 767 tokens but ranks "
                                   "up to 767", "without gaps"),
         setup=lambda tmp, m: [f"--llm.tokenizer={tokenizer_with(tmp, lambda l: l[:300] + l[301:])}"],
         base=tuple(LLM)),
    Case("tokenizer-json-corrupt", I, ("tokenizer file '{tmp}/tokenizer.json' is not valid JSON",),
         setup=lambda tmp, m: ["--llm.tokenizer=" + str(write(tmp, "tokenizer.json", '{"model": {"vocab": '))],
         base=tuple(LLM)),
    # Non-regular files (issue 26): a FIFO blocks the reader, /dev/zero never ends; both are named
    # for what they are, not reported missing, and never opened.
    Case("tokenizer-fifo", I, ("llm.tokenizer = '{tmp}/tok.model' is a FIFO (named pipe), not a "
                               "file",), base=tuple(LLM),
         setup=lambda tmp, m: [f"--llm.tokenizer={fifo(tmp, 'tok.model')}"]),
    Case("tokenizer-dev-zero", I, ("llm.tokenizer = '/dev/zero' is a character device",),
         ("--llm.tokenizer=/dev/zero",), base=tuple(LLM)),
    Case("tokenizer-fifo-in-model-dir", I, ("tokenizer file '{tmp}/m/tokenizer.json' is a FIFO "
                                            "(named pipe), not a regular file",), base=tuple(LLM),
         setup=lambda tmp, m: [(tmp / "m").mkdir() or fifo(tmp / "m", "tokenizer.json")
                               and f"--llm.tokenizer={tmp}/m"]),
    Case("dataset-fifo", I, ("llm.dataset.path = '{tmp}/d.jsonl': is a FIFO (named pipe)",),
         setup=lambda tmp, m: [f"--llm.dataset.path={fifo(tmp, 'd.jsonl')}"], base=tuple(LLM)),
    Case("val-dataset-dev-zero", I, ("llm.val_dataset.path = '/dev/zero': is a character "
                                     "device",), ("--llm.val_dataset.path=/dev/zero",),
         base=tuple(LLM)),
    Case("imagefolder-split-fifo", I, ("'{tmp}/images/val' is a FIFO (named pipe), "
                                       "not a directory",),
         setup=lambda tmp, m: imagefolder_args(image_folder(tmp, no_val=True))
         + [fifo(tmp / "images", "val") and "--log.every=0"]),
    # llm.max_seq_len shorter than every prompt: 0/0 = NaN loss; refused at start (issue 26).
    Case("max-seq-len-masks-every-label", C, ("llm.max_seq_len = 12 leaves no trained token in "
                                              "any of the 64 training samples",
                                              "the shortest prompt", "raise llm.max_seq_len above",
                                              "llm.train_on_input=true"),
         ("--llm.max_seq_len=12",), base=tuple(LLM)),
    Case("validation-all-masked", C, ("leaves no trained token in any of the 3 validation samples "
                                      "of {tmp}/data.jsonl", "raise llm.max_seq_len above"),
         setup=lambda tmp, m: ["--llm.val_dataset.path=" + str(jsonl_of(tmp, [
             {"instruction": "describe " * 400, "input": "", "output": "ok"}] * 3)),
             "--llm.max_seq_len=128"], base=tuple(LLM)),
    Case("val-fraction-leaves-fewer-than-ranks", C, ("llm.val_fraction = 0.99 holds out 63 of 64",
                                                     "leaving 1 to train on, fewer than the 2 "
                                                     "ranks", "lower llm.val_fraction"),
         ("--llm.val_fraction=0.99",), base=tuple(LLM)),
    Case("dataset-missing", I, ("llm.dataset.path = '{tmp}/none.jsonl'", "no such file"),
         ("--llm.dataset.path={tmp}/none.jsonl",), base=tuple(LLM)),
    Case("dataset-is-a-directory", I, ("llm.dataset.path = '{tmp}/d.jsonl'", "is a directory"),
         setup=lambda tmp, m: [(tmp / "d.jsonl").mkdir() or f"--llm.dataset.path={tmp}/d.jsonl"],
         base=tuple(LLM)),
    Case("dataset-read-error", I, ("cannot read dataset '{tmp}/mem.jsonl'", "Input/output error"),
         setup=lambda tmp, m: [os.symlink("/proc/self/mem", tmp / "mem.jsonl")
                               or f"--llm.dataset.path={tmp}/mem.jsonl"], base=tuple(LLM)),
    Case("jsonl-broken-line", I, ("dataset '{tmp}/data.jsonl' line 17 is not valid JSON",),
         setup=lambda tmp, m: ["--llm.dataset.path=" + str(jsonl_with_bad_line(tmp, 17, '{"instruction": "x", '))],
         base=tuple(LLM)),
    Case("jsonl-missing-field", I, ("dataset '{tmp}/data.jsonl' line 5", "\"output\""),
         setup=lambda tmp, m: [f"--llm.dataset.path={jsonl_with_bad_line(tmp, 5, json.dumps({'instruction': 'x', 'input': ''}))}"],
         base=tuple(LLM)),
    # An unterminated 5 MB string: the message quotes the start of it, not 5 MB per rank.
    Case("jsonl-5mb-line", I, ("dataset '{tmp}/data.jsonl' line 9 is not valid JSON", "bytes)"),
         setup=lambda tmp, m: ["--llm.dataset.path=" + str(jsonl_with_bad_line(
             tmp, 9, '{"instruction": "' + "x" * (5 << 20)))], base=tuple(LLM)),
    Case("jsonl-invalid-utf8", I, ("dataset '{tmp}/data.jsonl' line 3 is not valid JSON",
                                   "ill-formed UTF-8"),
         setup=lambda tmp, m: ["--llm.dataset.path=" + str(jsonl_with_bad_bytes(
             tmp, 3, b'{"instruction": "caf\xe9", "output": "x"}'))], base=tuple(LLM)),
    Case("jsonl-nested-100k-deep", I, ("dataset '{tmp}/data.jsonl' line 2",
                                       'field "instruction" is not a string'),
         setup=lambda tmp, m: ["--llm.dataset.path=" + str(jsonl_with_bad_line(
             tmp, 2, '{"instruction": ' + "[" * 100000 + "]" * 100000 + ', "output": "x"}'))],
         base=tuple(LLM)),
    Case("jsonl-line-is-an-array", I, ("dataset '{tmp}/data.jsonl' line 4: the record is not a "
                                       "JSON object",),
         setup=lambda tmp, m: ["--llm.dataset.path=" + str(jsonl_with_bad_line(
             tmp, 4, json.dumps(["instruction", "output"])))], base=tuple(LLM)),
    Case("dataset-empty", I, ("dataset '{tmp}/empty.jsonl' has no records",),
         setup=lambda tmp, m: [f"--llm.dataset.path={write(tmp, 'empty.jsonl', chr(10) * 3)}"],
         base=tuple(LLM)),
    Case("safetensors-truncated-header", I, ("safetensors file '{tmp}/model/model.safetensors'",
                                             "exceeds the file", "truncated"),
         setup=lambda tmp, m: tiny_model_dir(tmp, safetensors(
             {"lm_head.weight": {"dtype": "F32", "shape": [1024, 64],
                                 "data_offsets": [0, 262144]}})[:40]), base=tuple(LLM)),
    Case("safetensors-not-json", I, ("safetensors file '{tmp}/model/model.safetensors'",
                                     "header is not valid JSON"),
         setup=lambda tmp, m: tiny_model_dir(tmp, safetensors(b"this is not json at all")),
         base=tuple(LLM)),
    Case("safetensors-offsets-past-end", I, ("model.safetensors': tensor 'lm_head.weight' "
                                             "data_offsets [0, 262144]", "truncated file?"),
         setup=lambda tmp, m: tiny_model_dir(tmp, safetensors(
             {"lm_head.weight": {"dtype": "F32", "shape": [1024, 64],
                                 "data_offsets": [0, 262144]}}, bytes(1000))),
         base=tuple(LLM)),
    Case("safetensors-absurd-header-length", I, ("header length 1152921504606846976",
                                                 "not a safetensors file"),
         setup=lambda tmp, m: tiny_model_dir(tmp, safetensors(b"{}", length=1 << 60)),
         base=tuple(LLM)),
    # -- model files (issue 37): FIFOs and devices refused before opening, not read forever --
    Case("model-is-a-device", I, ("llm.model = '/dev/zero' is a character device",
                                  "Hugging Face model directory"),
         ("--llm.model=/dev/zero",), base=tuple(LLM)),
    Case("model-is-a-fifo", I, ("llm.model = '{tmp}/m.json' is a FIFO", "config.json"),
         base=tuple(LLM), setup=lambda tmp, m: [f"--llm.model={fifo(tmp, 'm.json')}"]),
    Case("model-config-json-is-a-fifo", I, ("config.json is a FIFO (named pipe), not a regular "
                                            "file",), base=tuple(LLM),
         setup=lambda tmp, m: [(tmp / "md").mkdir() or fifo(tmp / "md", "config.json")
                               and f"--llm.model={tmp}/md"]),
    Case("model-safetensors-is-a-fifo", I, ("model.safetensors is a FIFO (named pipe), not a "
                                            "regular file",), base=tuple(LLM),
         setup=lambda tmp, m: tiny_model_dir(tmp, b"") and (tmp / "model" / "model.safetensors").unlink()
         or [*tiny_model_dir_args(tmp), str(fifo(tmp / "model", "model.safetensors")) and "--log.every=0"]),
    Case("model-safetensors-is-a-device", I, ("model.safetensors is a character device",),
         base=tuple(LLM),
         setup=lambda tmp, m: tiny_model_dir(tmp, b"") and (tmp / "model" / "model.safetensors").unlink()
         or [*tiny_model_dir_args(tmp), os.symlink("/dev/zero", tmp / "model" / "model.safetensors")
             or "--log.every=0"]),
    Case("model-index-is-a-fifo", I, ("model.safetensors.index.json is a FIFO",), base=tuple(LLM),
         setup=lambda tmp, m: tiny_model_dir(tmp, b"") and (tmp / "model" / "model.safetensors").unlink()
         or [*tiny_model_dir_args(tmp), str(fifo(tmp / "model", "model.safetensors.index.json"))
             and "--log.every=0"]),
    Case("model-shard-is-a-fifo", I, ("shard-1.safetensors': is a FIFO", "not a regular file"),
         base=tuple(LLM),
         setup=lambda tmp, m: tiny_model_dir(tmp, b"") and (tmp / "model" / "model.safetensors").unlink()
         or [*tiny_model_dir_args(tmp), write(tmp / "model", "model.safetensors.index.json", json.dumps(
             {"weight_map": {"lm_head.weight": "shard-1.safetensors"}}))
             and str(fifo(tmp / "model", "shard-1.safetensors")) and "--log.every=0"]),
    # -- output (exit 4): the run file is never overwritten; unwritable places are named --
    Case("output-exists", O, ("output file '{tmp}/keep.h5' exists", "output.overwrite=true"),
         ("--output.file={tmp}/keep.h5",), output=False,
         setup=lambda tmp, m: [write(tmp, "keep.h5", b"precious") and "--log.every=0"],
         check=lambda tmp: (tmp / "keep.h5").read_bytes() == b"precious" or pytest.fail(
             "the existing output file was changed")),
    Case("adapters-file-exists", O, ("LoRA adapter directory '{tmp}/out.h5.adapter' "
                                     "exists", "output.overwrite=true"), base=tuple(LLM),
         setup=lambda tmp, m: [write(tmp, "out.h5.adapter", b"older adapters")
                               and "--log.every=0"],
         check=lambda tmp: (tmp / "out.h5.adapter").read_bytes() == b"older adapters"
         or pytest.fail("the existing adapters file was changed")),
    # llm.save_adapters is written after training: a place it cannot go is refused at start.
    Case("adapters-at-the-run-file", O, ("llm.save_adapters={tmp}/out.h5 is the run file itself",
                                         "choose another path"), base=tuple(LLM),
         args=("--llm.save_adapters={tmp}/out.h5",)),
    Case("adapters-parent-is-a-file", O, ("'{tmp}/f.txt' is not a directory "
                                          "(llm.save_adapters={tmp}/f.txt/a)",), base=tuple(LLM),
         setup=lambda tmp, m: [write(tmp, "f.txt", "x") and f"--llm.save_adapters={tmp}/f.txt/a"]),
    Case("adapters-read-only", O, ("directory '{tmp}/ro' is not writable "
                                   "(llm.save_adapters={tmp}/ro/a)",), base=tuple(LLM),
         setup=lambda tmp, m: [f"--llm.save_adapters={read_only_dir(tmp, m)}/a"]),
    # Root passes access(), /proc does not take a directory: refused at start, not after training.
    Case("adapters-under-proc", O, ("directory '/proc' is not writable "
                                    "(llm.save_adapters=/proc/adapters)", "llm.save_adapters=none"),
         base=tuple(LLM), args=("--llm.save_adapters=/proc/adapters",)),
    Case("output-directory-missing", O, ("directory '{tmp}/missing/dir' does not exist",
                                         "mkdir -p {tmp}/missing/dir"),
         ("--output.file={tmp}/missing/dir/x.h5",), output=False),
    Case("output-is-a-directory", O, ("output file '{tmp}' is a directory",),
         ("--output.file={tmp}",), output=False),
    Case("output-in-proc", O, ("/proc/trainscope.h5",), ("--output.file=/proc/trainscope.h5",),
         output=False),
    Case("output-empty-name", O, ("output.file is empty",), output=False,
         setup=lambda tmp, m: ["--config", write(tmp, "o.ini", "[output]\nfile =\n")]),
    Case("output-symlink-to-existing-file", O, ("output file '{tmp}/link.h5' (a symbolic link to "
                                                "'{tmp}/precious.h5') exists",
                                                "output.overwrite=true"), output=False,
         setup=lambda tmp, m: [f"--output.file={symlink(tmp, 'link.h5', tmp / 'precious.h5', b'precious')}"],
         check=lambda tmp: (tmp / "precious.h5").read_bytes() == b"precious" or pytest.fail(
             "the symbolic link's target was changed")),
    Case("output-dangling-symlink", O, ("output file '{tmp}/link.h5' (a symbolic link to "
                                        "'{tmp}/elsewhere.h5') is a dangling link",
                                        "remove the link"), output=False,
         setup=lambda tmp, m: [f"--output.file={symlink(tmp, 'link.h5', tmp / 'elsewhere.h5')}",
                               "--output.overwrite=true"],
         check=lambda tmp: not (tmp / "elsewhere.h5").exists() or pytest.fail(
             "the dangling link's target was created")),
    Case("output-symlink-to-directory", O, ("output file '{tmp}/link.h5' (a symbolic link to "
                                            "'{tmp}/d') is a directory",), output=False,
         setup=lambda tmp, m: [(tmp / "d").mkdir() or f"--output.file={symlink(tmp, 'link.h5', tmp / 'd')}"]),
    # Opening a FIFO for writing blocks until a reader comes: must be refused, not hang.
    Case("output-fifo-with-overwrite", O, ("output file '{tmp}/fifo.h5' exists and is not a regular "
                                           "file",), output=False,
         setup=lambda tmp, m: [f"--output.file={fifo(tmp, 'fifo.h5')}", "--output.overwrite=true"]),
    Case("output-parent-is-a-file", O, ("'{tmp}/file.txt' is not a directory",), output=False,
         setup=lambda tmp, m: [write(tmp, "file.txt", "x") and f"--output.file={tmp}/file.txt/x.h5"]),
    Case("output-read-only-filesystem", O, ("cannot create output file '{tmp}/ro/x.h5'",
                                            "Read-only file system"),
         setup=lambda tmp, m: [f"--output.file={read_only_dir(tmp, m)}/x.h5"], output=False),
    Case("output-read-only-overwrite", O, ("cannot overwrite output file '{tmp}/ro/old.h5'",
                                           "Read-only file system"),
         setup=lambda tmp, m: [f"--output.file={read_only_dir(tmp, m, 'old.h5')}/old.h5",
                               "--output.overwrite=true"], output=False),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_table(run_ts, tmp_path, mounts, case):
    args = [a.replace("{tmp}", str(tmp_path)) for a in case.args]
    if case.setup:
        args += [str(a) for a in case.setup(tmp_path, mounts)]
    if case.output:
        args.append(f"--output.file={tmp_path}/out.h5")
    t0 = time.monotonic()
    try:
        proc = run_ts(2, *case.base, *args, timeout=case.timeout + 30, env=case.env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{case.id}: no exit within {case.timeout + 30:.0f} s (a hang)")
    elapsed = time.monotonic() - t0
    text = proc.stdout + proc.stderr
    assert proc.returncode == case.code, f"exit code {proc.returncode}, expected {case.code}:\n{text}"
    assert elapsed < case.timeout, f"took {elapsed:.0f} s to fail:\n{text}"
    for sign in CRASH_SIGNS:
        assert sign not in text, f"crash sign {sign!r}:\n{text}"
    # A message quotes the start of a bad value, never all of it (100 KB values, 5 MB JSON lines).
    longest = max(map(len, text.splitlines()), default=0)
    assert longest < MAX_LINE, f"a {longest}-character line:\n{text[:3000]}"
    needles = [n.replace("{tmp}", str(tmp_path)) for n in case.needles]
    (both_ranks_said if case.every_rank else some_rank_said)(proc, *needles)
    no_completed_run_file(tmp_path)
    if case.check:
        case.check(tmp_path)


def test_the_table_covers_the_issue():
    assert len(CASES) >= 95
    assert len({c.id for c in CASES}) == len(CASES)
    assert {c.code for c in CASES} == {2, 3, 4}


# ---- beyond the table: full disk, races, successful runs next to the failing ones ----------------

def test_full_filesystem_ends_the_job_with_exit_4(run_ts, tmp_path, mounts):
    """The run file's directory fills up during training: the first writes (file, config, ranks)
    fit, the first flush of iteration rows does not (a run of 2,000 iterations gets chunks of
    2,048 rows, which the flush fills with the rows and NaN: 2.5 MB). The ranks write their rows
    independently, so one may hit ENOSPC where the other does not: every rank raises it at the
    next flush (or status change), naming the file, the full file system and the fix, and ends
    the job: every rank must
    be gone within seconds, mpirun's exit code 4, no crash, and the file must not claim
    "completed". (Below 1 MiB free a flush refuses to start, so that HDF5 never runs out of space
    inside a sync, which it cannot undo on one rank only.)"""
    fs = mounts.tmpfs(tmp_path / "full", "4m")
    free = fill(fs, 1536 * 1024)
    out = fs / "run.h5"
    t0 = time.monotonic()
    proc = run_ts(2, *QUICK, "--data.dataset=synthetic", "--data.synthetic_samples=512",
                  "--train.batch_size=8", "--train.epochs=100", "--train.max_iters=2000",
                  "--output.flush_every=2",
                  "--train.eval=false", "--log.every=0", "--telemetry.enabled=false",
                  f"--output.file={out}", timeout=120)
    elapsed = time.monotonic() - t0
    text = proc.stdout + proc.stderr
    assert proc.returncode == 4, f"exit {proc.returncode} ({free} bytes were free):\n{text}"
    assert elapsed < 30, f"ranks took {elapsed:.0f} s to end:\n{text}"
    for sign in CRASH_SIGNS:
        assert sign not in text, text
    some_rank_said(proc, str(out), "No space left on device", "free space")
    assert "placement: 2 rank(s)" in proc.stdout, "the run should have started writing:\n" + text
    if out.exists():
        assert status_of(out) != "completed"
    print(f"full file system: {free} bytes free at start, all ranks ended after {elapsed:.1f} s")


def test_second_job_racing_for_the_same_run_file_does_not_overwrite_it(trainscope, tmp_path):
    """Two jobs start together with the same output.file: one creates it, the other must refuse
    (exit 4) instead of truncating the first job's file (H5F_ACC_EXCL)."""
    from conftest import launch_env, mpirun_cmd
    out = tmp_path / "race.h5"
    cmd = mpirun_cmd(2, *QUICK, "--data.dataset=synthetic", "--data.synthetic_samples=256",
                     "--train.batch_size=8", "--train.max_iters=3", "--train.eval=false",
                     "--log.every=0", f"--output.file={out}")
    env = launch_env(OMP_NUM_THREADS="1")
    jobs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    results = [(j.wait(timeout=300), j.stdout.read()) for j in jobs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 4], results
    loser = next(text for code, text in results if code == 4)
    assert str(out) in loser and "output.overwrite" in loser, loser
    assert status_of(out) == "completed"


def test_scaling_point_sets_the_per_rank_batch(run_ts, tmp_path):
    out = tmp_path / "strong.h5"
    proc = run_ts(2, *QUICK, "--run.scaling=strong", "--run.global_batch=48",
                  "--train.max_iters=3", "--log.every=0", f"--output.file={out}", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "placement: 2 rank(s) on 1 node(s)" in proc.stdout
    with h5py.File(out, "r") as f:
        assert int(f["config"].attrs["train.batch_size"]) == 24  # the INI's 64 replaced
        assert (f["iterations/samples"][...] == 24).all()
        assert int(f["summary"].attrs["global_batch_samples"]) == 48


def test_dry_run_prints_the_plan_and_writes_nothing(run_ts, tmp_path):
    out = tmp_path / "dry.h5"
    proc = run_ts(2, *QUICK, "--dry-run", f"--output.file={out}", timeout=120)
    assert proc.returncode == 0, proc.stderr
    for needle in ("2 on 1 node", "rank 0", "rank 1", "64 per rank x 2 = 128", "700490 parameters",
                   "iterations per epoch", "memory/rank"):
        assert needle in proc.stdout, proc.stdout
    assert not out.exists()


def test_print_config_shows_each_value_and_where_it_came_from(run_ts, tmp_path):
    """The documented precedence, visible: a later file wins over an earlier one, the command line
    over files, and of one option given twice on the command line the last; --print-config names
    each value's origin (file:line, command line, default), and its text parses back."""
    a = write(tmp_path, "a.ini", "[train]\nbatch_size = 16\n\nlr = 0.1  # mine\nepochs = 2\n")
    b = write(tmp_path, "b.ini", "[train]\n# second file\nepochs = 3\n")
    proc = run_ts(1, "--config", a, "--config", b, "--train.lr=0.2", "--train.warmup_iters= 5 ",
                  "--train.lr=0.3", "--print-config", timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = set(proc.stdout.splitlines())
    for line in (f"batch_size = 16  # {a}:2", f"epochs = 3  # {b}:3",
                 "lr = 0.3  # command line, the last of 2 --train.lr",
                 "warmup_iters = 5  # command line", "momentum = 0.9  # default"):
        assert line in lines, f"{line!r} not printed:\n{proc.stdout}"
    again = run_ts(1, "--config", write(tmp_path, "resolved.ini", proc.stdout), "--print-config",
                   timeout=60)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "lr = 0.3  # " + str(tmp_path / "resolved.ini") in again.stdout


def test_help_and_version(run_ts):
    proc = run_ts(1, "--help", timeout=60)
    assert proc.returncode == 0
    assert "--train.batch_size=<integer" in proc.stdout and "(default: 64)" in proc.stdout
    assert "[output]" in proc.stdout and "--output.overwrite" in proc.stdout
    proc = run_ts(1, "--version", timeout=60)
    assert proc.returncode == 0 and "libtorch: 2." in proc.stdout


@pytest.mark.parametrize("how", ["two ranks", "unknown option", "bad value", "/dev/full",
                                 "closed pipe"])
def test_print_schema_prints_once_and_fails_on_bad_input(run_ts, trainscope, tmp_path, how):
    """--print-schema (issue 37): once per job (rank 0), the rest of the command line validated,
    a failed write an output error (exit 4) rather than a silent truncation."""
    if how == "two ranks":
        proc = run_ts(2, "--print-schema", timeout=60)
        assert proc.returncode == 0, proc.stderr
        json.loads(proc.stdout)  # one document: a second rank's copy would not parse
        return
    if how in ("unknown option", "bad value"):
        extra = "--no-such-option=1" if how == "unknown option" else "--train.batch_size=-3"
        proc = subprocess.run([str(trainscope), "--print-schema", extra], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stdout == "" and "configuration error" in proc.stderr
        assert extra.split("=")[0].lstrip("-") in proc.stderr, proc.stderr
        return
    if how == "/dev/full":
        with open("/dev/full", "w") as full:
            proc = subprocess.run([str(trainscope), "--print-schema"], stdout=full,
                                  stderr=subprocess.PIPE, text=True, timeout=60)
        assert proc.returncode == 4, proc.stderr
        assert "output error: --print-schema could not write to standard output" in proc.stderr
        assert "No space left on device" in proc.stderr
        return
    # A reader that went away: not exit 0 (SIGPIPE, or EPIPE reported as an output error).
    p = subprocess.Popen([str(trainscope), "--print-schema"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()
    _, err = p.communicate(timeout=60)
    assert p.returncode != 0, err
    assert b"Traceback" not in err and b"terminate called" not in err


def test_cpu_on_purpose_trains_where_gpus_were_granted_and_says_pinning_was_dropped(run_ts, tmp_path):
    """Issue 25: where the scheduler granted GPUs that CUDA cannot use, run.device=auto is refused
    (the table's auto-device-* rows) but run.device=cpu trains; data.pin_memory=true cannot apply
    on the CPU, which rank 0 says once and /plan records (pin_memory 0), as does the dry run."""
    out = tmp_path / "cpu.h5"
    args = [*QUICK, "--run.device=cpu", "--data.pin_memory=true", "--train.max_iters=2",
            f"--output.file={out}"]
    proc = run_ts(2, *args, env={"CUDA_VISIBLE_DEVICES": "0", "SLURM_GPUS_ON_NODE": "1"})
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    said = [l for l in text.splitlines() if "data.pin_memory=true is dropped" in l]
    assert len(said) == 1 and said[0].startswith("[rank 0/2 "), text
    assert status_of(out) == "completed"
    with h5py.File(out, "r") as f:
        assert f["plan"].attrs["pin_memory"] == 0 and f["plan"].attrs["device"] in ("cpu", b"cpu")
    proc = run_ts(2, *args, "--dry-run")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pageable host memory (data.pin_memory=true dropped: device cpu)" in proc.stdout
