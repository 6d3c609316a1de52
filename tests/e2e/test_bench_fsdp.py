"""Smoke test of `scripts/bench fsdp --quick` (issue 17's acceptance tables, benchmarks/fsdp.py):
the script runs its methods under ddp-ds and stage 3 at 1 and 2 ranks plus the prefetch-off runs,
prints every row of both tables, and the stage-3 figures it reads are real (traffic moved, state
sharded). Three methods cover the script's paths (full weights, LoRA, DPO's preference data; qlora
and qat differ only inside trainscope, tested in test_llm.py): about 40 s on 2 cores."""

import json
import os
import re
import subprocess
import sys

from conftest import BUILD, ROOT

METHODS = ("full", "lora", "dpo")


def test_fsdp_bench_quick_prints_every_row(trainscope, tmp_path):
    raw = tmp_path / "fsdp.json"
    env = dict(os.environ, BUILD_DIR=str(BUILD), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT / "postprocess"),
                                           os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, str(ROOT / "benchmarks/fsdp.py"), "--quick", "--methods",
           ",".join(METHODS), "--json", str(raw)]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert "WARNING" not in out, out
    for m in METHODS:
        for n in (1, 2):
            assert re.search(rf"^\| {m} \| {n} \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| "
                             rf"[0-9.]+ \| [0-9.]+ \|$", out, re.M), f"table A row {m}/{n}:\n{out}"
        assert re.search(rf"^  {m} +(yes|NO ) +peak x 1\.00 / ", out, re.M), out
    for m in ("lora", "full"):
        for pf in ("on", "off"):
            # All-gather and reduce-scatter time, exposed time and hidden share (each kind and
            # both together) are numbers.
            row = (rf"^\| {m} \| 2 \| {pf} \| [0-9.]+ \| [0-9.]+ \| -?[0-9]+ % \| [0-9.]+ \| "
                   rf"[0-9.]+ \| -?[0-9]+ % \| -?[0-9]+ % \| [0-9.]+ \| [0-9.]+ \|$")
            assert re.search(row, out, re.M), f"table B row {m}/{pf}:\n{out}"

    runs = json.loads(raw.read_text())["runs"]
    # 3 methods x 2 rank counts x (ddp-ds, stage 3) + lora and full without prefetch.
    assert len(runs) == 14
    by = {(r["method"], r["ranks"], r["zero"], r["prefetch"]): r for r in runs}
    for m in METHODS:
        one, two = by[(m, 1, 3, True)], by[(m, 2, 3, True)]
        ddp = by[(m, 2, 0, None)]
        assert two["median_allgather_bytes"] > 0 and two["median_reduce_scatter_bytes"] > 0, m
        # ddp-ds has no all-gather accounting; stage 3 holds about half the state at 2 ranks.
        assert all(x is None for row in ddp["columns"]["allgather_bytes"] for x in row), m
        assert two["state_bytes"] < 0.75 * one["state_bytes"], (m, two, one)
