"""docs/options.md is generated from `trainscope --help` by scripts/gen_options_doc: the page must
match the binary built here (after adding or changing an option, run scripts/gen_options_doc), and
the generator must keep every option and refuse --help output it cannot read."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GEN = ROOT / "scripts" / "gen_options_doc"
BUILD = Path(os.environ.get("TRAINSCOPE_BUILD_DIR", ROOT / "build"))

HELP = """usage: trainscope [--config FILE.ini]...

Options by section:

[run]
  --run.workload=<cv|llm|comm>  (default: cv)
      what to run
  --run.seed=<integer, >= 0>  (default: 42)
      random seed

[output]
  --output.tag=<string>  (default: "")
      free text
"""


def gen(*args, env=None):
    return subprocess.run([sys.executable, str(GEN), *map(str, args)], capture_output=True,
                          text=True, timeout=300, env=env)


def test_docs_options_md_matches_the_binary():
    assert (BUILD / "app" / "trainscope").exists(), f"{BUILD}/app/trainscope not built"
    proc = gen("--check", env=dict(os.environ, BUILD_DIR=str(BUILD)))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_option_becomes_a_table_row_and_check_names_what_changed(tmp_path):
    (tmp_path / "help.txt").write_text(HELP)
    page = tmp_path / "options.md"
    assert gen("--help-text", tmp_path / "help.txt", "--output", page).returncode == 0
    text = page.read_text()
    assert "| `run.workload` | `cv\\|llm\\|comm` | `cv` | what to run |" in text
    assert "| `run.seed` | `integer, >= 0` | `42` | random seed |" in text
    assert '| `output.tag` | `string` | `""` | free text |' in text
    assert gen("--check", "--help-text", tmp_path / "help.txt", "--output", page).returncode == 0

    (tmp_path / "help.txt").write_text(HELP.replace("run.seed", "run.new_seed"))
    proc = gen("--check", "--help-text", tmp_path / "help.txt", "--output", page)
    assert proc.returncode == 1
    assert "run.new_seed" in proc.stderr and "run.seed" in proc.stderr
    assert "scripts/gen_options_doc" in proc.stderr  # says how to fix it


def test_unreadable_help_output_is_an_error(tmp_path):
    (tmp_path / "help.txt").write_text(HELP.replace("  --run.seed=", "  -run.seed="))
    proc = gen("--help-text", tmp_path / "help.txt", "--output", tmp_path / "options.md")
    assert proc.returncode == 2 and "-run.seed" in proc.stderr
    assert not (tmp_path / "options.md").exists()
