"""The README's tour as a newcomer copies it (issue 41): every fenced block marked `bash runnable`
runs as written, in order, in one shell, from a working directory laid out like the clone (its
build, inputs, scripts, bin, jobscripts and postprocess linked in; its runs/ and studies/ fresh),
without the MPI root overrides this suite sets elsewhere, so that a command that needs them fails
here as it would for a user. Blocks not marked say beside them what they need (a cluster, GPUs)."""

import os
import re
import subprocess
import time
from pathlib import Path

import h5py

from conftest import BUILD, ROOT

BLOCK = re.compile(r"^```bash runnable\n(.*?)^```", re.S | re.M)


def runnable_blocks(text: str) -> list[str]:
    return BLOCK.findall(text)


def test_readme_runnable_blocks_run_as_written(tmp_path):
    blocks = runnable_blocks((ROOT / "README.md").read_text())
    assert len(blocks) >= 6, "the README's tour lost its runnable blocks"
    work = tmp_path / "clone"
    work.mkdir()
    for name in ("inputs", "scripts", "bin", "jobscripts", "postprocess", "docs"):
        (work / name).symlink_to(ROOT / name)
    (work / "build").symlink_to(BUILD)
    # One shell, as a reader pastes the blocks one after another; each block's time is printed.
    # -e and -u, not pipefail: a pipe into head (as a reader types it) ends its writer early.
    script = ["set -eu"]
    for i, block in enumerate(blocks):
        script += [f"echo '### block {i}' >&2", f"SECONDS=0", block,
                   f"echo \"### block {i} took $SECONDS s\" >&2"]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "TRAINSCOPE_BUILD_DIR"))}
    env.pop("PYTHONPATH", None)
    t0 = time.monotonic()
    proc = subprocess.run(["bash", "-c", "\n".join(script)], cwd=work, env=env,
                          capture_output=True, text=True, timeout=1500)
    took = time.monotonic() - t0
    print(f"README runnable blocks: {took:.0f} s")
    print("\n".join(l for l in proc.stderr.splitlines() if l.startswith("### block")))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]

    # What the tour says it makes, it made.
    runs = work / "runs"
    for name in ("short.h5", "llm-lora-tiny.h5", "qlora-chat.h5", "comm.h5"):
        found = list(runs.glob(name))
        assert found, f"runs/{name} missing: {sorted(p.name for p in runs.iterdir())}"
        with h5py.File(found[0], "r") as f:
            s = f.attrs["status"]
            assert (s.decode() if isinstance(s, bytes) else s) == "completed", name
    assert (runs / "report.html").stat().st_size > 10_000
    assert (runs / "model.json").exists()
    assert "completed" in proc.stdout  # the python line printed the status
    studies = work / "studies"
    assert (studies / "cv-strategies-cpu" / "report.html").exists()
    assert list((studies / "quickstart-weak").rglob("run*.h5"))
