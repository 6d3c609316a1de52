"""Issue 39 (g): start-up and resume read each weight or checkpoint file once per node, not once
per rank. Two emulated nodes x 2 ranks (this host and a network + UTS namespace,
tests/multinode/netns_nodes.sh, as tests/jobscripts/test_two_nodes.py), every rank under
`strace -f -e trace=openat,open`, one trace file per rank named by its node's host name:

- an LLM job (ddp-ds, full fine-tuning) from a sharded safetensors checkpoint that transformers
  saved (model.safetensors.index.json + shards), checkpointing every 2 iterations;
- its --resume from the iteration-2 checkpoint (the safetensors again, and rank 0's rank file,
  which holds the replicated weights and optimizer every rank restores).

Each shard, the index and rank00000.pt must be opened for reading exactly once on each node (all
four ranks opened each before), a rank's own file by that rank only, and the resumed losses must
equal the uninterrupted run's bit for bit.
"""

import collections
import re
import shutil
import subprocess

import h5py
import numpy as np
import pytest
from trainscope_jobs.launch import emulated_nodes_args, launch_env, mpirun_command

from conftest import BINARY, ROOT

NODES = ROOT / "tests/multinode/netns_nodes.sh"
AGENT = ROOT / "tests/multinode/ns_agent"
TOKENIZER = ROOT / "inputs/llm/data/tiny_tokenizer.model"
TEXT = ROOT / "inputs/llm/data/text.jsonl"
# openat(AT_FDCWD, "<path>", <flags>...: a call whether it completes on this line or later.
OPEN = re.compile(r'\bopen(?:at)?\((?:[^,]+, )?"([^"]+)", ([A-Z_|]+)')


@pytest.fixture(scope="module")
def two_nodes():
    if not shutil.which("strace"):
        pytest.fail("strace missing: scripts/setup installs it")
    proc = subprocess.run(["bash", str(NODES), "up"], capture_output=True, text=True, timeout=60)
    if proc.returncode == 77:
        pytest.skip("emulated nodes cannot be made here: " + proc.stderr.strip())
    assert proc.returncode == 0, proc.stderr
    yield
    subprocess.run(["bash", str(NODES), "down"], timeout=60)


def sharded_llama(where):
    """A tiny random Llama saved by transformers in several safetensors shards with an index."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(5)
    cfg = transformers.LlamaConfig(
        vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, rope_theta=500000.0,
        max_position_embeddings=256, tie_word_embeddings=False)
    transformers.LlamaForCausalLM(cfg).save_pretrained(where, safe_serialization=True,
                                                       max_shard_size="200KB")
    shards = sorted(where.glob("*.safetensors"))
    assert len(shards) >= 2 and (where / "model.safetensors.index.json").exists(), shards
    return shards


def traced_run(traces, *args, timeout=300):
    """trainscope on 2 + 2 ranks of the emulated nodes, each rank under strace writing
    traces/<host>.<pid>."""
    traces.mkdir(exist_ok=True)
    wrapper = traces / "strace-rank.sh"
    wrapper.write_text('#!/bin/sh\nexec strace -f -qq -e trace=openat,open '
                       f'-o "{traces}/$(hostname).$$" "$@"\n')
    wrapper.chmod(0o755)
    cmd = mpirun_command(4, wrapper, BINARY, *args, oversubscribe=False,
                         mpirun_args=emulated_nodes_args(AGENT, (2, 2)))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=launch_env(OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def reads_per_node(traces, paths):
    """{host: Counter(path: opens for reading)} over every rank's trace, for the given paths."""
    wanted = {str(p) for p in paths}
    per_node = collections.defaultdict(collections.Counter)
    files = [t for t in traces.iterdir() if t.name != "strace-rank.sh"]
    assert len(files) == 4, files  # one trace per rank
    for trace in files:
        host = trace.name.rsplit(".", 1)[0]
        for m in OPEN.finditer(trace.read_text()):
            path, flags = m.groups()
            if path in wanted and ("O_RDONLY" in flags or "O_RDWR" in flags):
                per_node[host][path] += 1
    return per_node


def test_weights_and_rank_files_are_opened_once_per_node(two_nodes, tmp_path):
    model = tmp_path / "model"
    shards = sharded_llama(model)
    out, ckpt = tmp_path / "llm.h5", tmp_path / "ckpt"
    args = ["--config", ROOT / "inputs/llm/full-tiny.ini", f"--llm.model={model}",
            "--llm.init=checkpoint", f"--llm.tokenizer={TOKENIZER}", f"--llm.dataset.path={TEXT}",
            "--llm.dataset.format=text", "--llm.max_seq_len=64", "--train.batch_size=1",
            "--llm.gradient_accumulation=1", "--train.max_iters=4", "--train.eval=false",
            "--telemetry.enabled=false", "--log.every=1", f"--checkpoint.dir={ckpt}",
            "--checkpoint.every=2", f"--output.file={out}"]
    traced_run(tmp_path / "start", *args)
    shutil.rmtree(ckpt / "ckpt-000000004")  # as if the job had died before its last checkpoint
    traced_run(tmp_path / "resume", *args, "--resume")

    weights = [*shards, model / "model.safetensors.index.json"]
    saved = ckpt / "ckpt-000000002"
    rank_files = [saved / f"rank{r:05d}.pt" for r in range(4)]
    start = reads_per_node(tmp_path / "start", weights)
    resume = reads_per_node(tmp_path / "resume", [*weights, *rank_files])
    short = {str(p): p.name for p in [*weights, *rank_files]}
    for name, opens in (("start-up", start), ("resume", resume)):
        print(f"\nopens for reading per node ({name}):",
              {h: {short[p]: n for p, n in sorted(c.items())} for h, c in opens.items()})
    assert len(start) == 2, start  # both emulated nodes traced
    for host, opens in start.items():
        assert opens == {str(p): 1 for p in weights}, (host, opens)
    hosts = sorted(resume, key=lambda h: h == "tsnode1")  # node 0 (this host), then node 1
    assert len(hosts) == 2 and hosts[1] == "tsnode1", resume
    for node, host in enumerate(hosts):
        # rank 0's file once per node, each rank's own file by that rank.
        mine = {str(rank_files[r]): 1 for r in (2 * node, 2 * node + 1)}
        want = {**{str(p): 1 for p in weights}, str(rank_files[0]): 1, **mine}
        assert resume[host] == want, (host, resume[host])

    with h5py.File(out, "r") as f, h5py.File(tmp_path / "llm.resume1.h5", "r") as g:
        assert list(g["iterations/iteration"][0]) == [2, 3]
        assert np.array_equal(g["iterations/loss"][...], f["iterations/loss"][:, 2:])
