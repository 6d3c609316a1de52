"""postprocess/trainscope_post/schema.py and the reference tables of docs/run_file_schema.md are
generated from the binary's schema table (`trainscope --print-schema`) by scripts/gen_schema: both
must match the binary built here (after changing modules/io/src/schema_table.cpp, run
scripts/gen_schema), and the generator must name paths by its rule, match placeholders, notice a
stale page and refuse a table it cannot read."""

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GEN = ROOT / "scripts" / "gen_schema"
MODULE = ROOT / "postprocess" / "trainscope_post" / "schema.py"
PAGE = ROOT / "docs" / "run_file_schema.md"
BUILD = Path(os.environ.get("TRAINSCOPE_BUILD_DIR", ROOT / "build"))
STDLIB = {"__future__", "functools", "re"}


def gen(*args, env=None):
    return subprocess.run([sys.executable, str(GEN), *map(str, args)], capture_output=True,
                          text=True, timeout=300, env=env)


def entry(kind, path, name="", units="", type="", when="", meaning="m"):
    return {"kind": kind, "path": path, "name": name, "units": units, "type": type, "when": when,
            "meaning": meaning}


# A small table with every feature the generator handles: the root, placeholders in paths and
# names, a series, a per-rank table, datasets and a compound.
TABLE = {"schema": "trainscope/1", "entries": [
    entry("group", "/", meaning="The root. More about it."),
    entry("attribute", "/", "schema", type="str", meaning="`trainscope/1`"),
    entry("attribute", "/", "error", type="str", when="status=failed", meaning="the error"),
    entry("group", "/config"),
    entry("attribute", "/config", "{option}", type="str", meaning="one per option"),
    entry("text", "/config/ini", units="text", meaning="the INI"),
    entry("compound", "/ranks", units="1"),
    entry("field", "/ranks", "hostname", type="fixed str", meaning="host | name"),
    entry("series", "/iterations", when="run.workload=cv or llm"),
    entry("attribute", "/iterations", "rank_rows", type="int64[world_size]"),
    entry("column", "/iterations", "step_s", units="s", meaning="the step"),
    entry("column", "/iterations", "tokens", units="tokens", when="run.workload=llm",
          meaning="tokens"),
    entry("column", "/iterations", "seq_len_max", units="tokens", when="run.workload=llm, packed",
          meaning="longest"),
    entry("group", "/summary"),
    entry("attribute", "/summary", "median_{phase}_s", type="float", meaning="a phase"),
    entry("attribute", "/summary", "median_step_s", type="float", meaning="the step"),
    entry("group", "/profile"),
    entry("table", "/profile/top_ops", when="profile.enabled=true"),
    entry("column", "/profile/top_ops", "count", units="events"),
    entry("per_rank", "/profile/window_s", units="s", when="profile.enabled=true"),
    entry("per_rank", "/profile/breakdown/idle_s", units="s", when="profile.enabled=true"),
    entry("group", "/comm"),
    entry("group", "/comm/{op}", when="run.workload=comm"),
    entry("attribute", "/comm/{op}", "busbw_factor", type="float", when="run.workload=comm"),
    entry("vector", "/comm/{op}/bytes", units="B", when="run.workload=comm"),
    entry("series", "/comm/buckets"),
    entry("column", "/comm/buckets", "bucket_{k}_s", units="s"),
    entry("vector", "/comm/buckets/bytes", units="B"),
]}

PAGE_TEMPLATE = """# A page

Prose before, kept.

<!-- schema: objects / brief -->
<!-- /schema -->

<!-- schema: attributes / -->
<!-- /schema -->

<!-- schema: attributes /config -->
old text that is replaced
<!-- /schema -->

<!-- schema: fields /ranks -->
<!-- /schema -->

<!-- schema: columns /iterations when= -->
<!-- /schema -->

Between the tables, kept.

<!-- schema: columns /iterations "when=run.workload=llm*" -->
<!-- /schema -->

<!-- schema: attributes /iterations -->
<!-- /schema -->

<!-- schema: attributes /summary -->
<!-- /schema -->

<!-- schema: datasets /profile -->
<!-- /schema -->

<!-- schema: columns /profile/top_ops -->
<!-- /schema -->

<!-- schema: attributes /comm/{op} -->
<!-- /schema -->

<!-- schema: columns /comm/buckets -->
<!-- /schema -->

Prose after, kept.
"""


@pytest.fixture
def generated(tmp_path):
    """(module, page text, tmp dir) generated from TABLE and PAGE_TEMPLATE."""
    (tmp_path / "schema.json").write_text(json.dumps(TABLE))
    (tmp_path / "run_file_schema.md").write_text(PAGE_TEMPLATE)
    proc = gen("--schema-json", tmp_path / "schema.json", "--output-dir", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    spec = importlib.util.spec_from_file_location("generated_schema", tmp_path / "schema.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, (tmp_path / "run_file_schema.md").read_text(), tmp_path


def imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            out.add("." if node.level else node.module.split(".")[0])
    return out


# --- the checked-in files ------------------------------------------------------------------------
def test_schema_module_and_page_match_the_binary():
    assert (BUILD / "app" / "trainscope").exists(), f"{BUILD}/app/trainscope not built"
    proc = gen("--check", env=dict(os.environ, BUILD_DIR=str(BUILD)))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_checked_in_module_and_page_are_one_generation(tmp_path):
    """Without the binary: the checked-in module is exactly what the generator makes of its own
    ENTRIES, and the page's tables are made from the same table."""
    spec = importlib.util.spec_from_file_location("checked_in_schema", MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (tmp_path / "table.json").write_text(json.dumps(
        {"schema": module.VERSION, "entries": list(module.ENTRIES)}))
    proc = gen("--check", "--schema-json", tmp_path / "table.json")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_checked_in_module_imports_only_the_standard_library():
    assert imports(MODULE) <= STDLIB, imports(MODULE)
    assert "Generated by scripts/gen_schema" in MODULE.read_text()
    assert "scripts/gen_schema" in PAGE.read_text() and "schema_table.cpp" in PAGE.read_text()


# --- the generator on a small table --------------------------------------------------------------
def test_path_constants_follow_the_naming_rule(generated):
    s, _, tmp = generated
    assert s.VERSION == "trainscope/1"
    assert (s.ROOT, s.CONFIG, s.CONFIG_INI, s.RANKS, s.ITERATIONS) == \
        ("/", "/config", "/config/ini", "/ranks", "/iterations")
    assert s.PROFILE_BREAKDOWN_IDLE_S == "/profile/breakdown/idle_s"
    assert (s.COMM_OP, s.COMM_OP_BYTES, s.COMM_BUCKETS_BYTES) == \
        ("/comm/{op}", "/comm/{op}/bytes", "/comm/buckets/bytes")
    assert not hasattr(s, "PROFILE_BREAKDOWN")  # not declared in this table: no constant
    assert list(s.ENTRIES) == TABLE["entries"]
    assert imports(tmp / "schema.py") <= STDLIB


def test_lookup_tables(generated):
    s, _, _ = generated
    assert s.COLUMNS == {"/iterations": {"step_s": "s", "tokens": "tokens",
                                         "seq_len_max": "tokens"},
                         "/profile/top_ops": {"count": "events"},
                         "/comm/buckets": {"bucket_{k}_s": "s"}}
    assert s.UNITS["/config/ini"] == "text" and s.UNITS["/iterations/step_s"] == "s"
    assert s.UNITS["/comm/{op}/bytes"] == "B" and "/profile/top_ops" not in s.UNITS
    assert s.ATTRIBUTES["/"] == {"schema": "str", "error": "str"}
    assert s.ATTRIBUTES["/config"] == {"{option}": "str"}


def test_placeholders_are_filled_and_matched(generated):
    s, _, _ = generated
    assert s.fill(s.COMM_OP, "allreduce") == "/comm/allreduce"
    assert s.fill(s.COMM_OP_BYTES, "reduce_scatter") == "/comm/reduce_scatter/bytes"
    with pytest.raises(ValueError, match="not"):
        s.fill(s.COMM_OP, "a/b")
    with pytest.raises(ValueError, match="placeholder"):
        s.fill(s.ITERATIONS, "x")
    assert s.child(s.PROFILE_TOP_OPS, "count") == "/profile/top_ops/count"
    assert s.child(s.ROOT, "plan") == "/plan" and s.child("iterations", "x") == "/iterations/x"
    assert s.rel(s.CONFIG_INI) == "config/ini" and s.rel(s.ROOT) == ""
    assert s.normalize("comm/") == "/comm" and s.normalize("") == "/"
    assert s.matches(s.COMM_OP_BYTES, "/comm/allgather/bytes")
    assert not s.matches(s.COMM_OP_BYTES, "/comm/a/b/bytes")
    assert s.is_column(s.COMM_BUCKETS, "bucket_12_s") and s.is_column("comm/buckets", "bucket_0_s")
    assert not s.is_column(s.COMM_BUCKETS, "bucket_a/b_s")  # a placeholder is one name
    assert not s.is_column(s.COMM_BUCKETS, "bytes")  # a vector beside the series, not a column
    assert s.is_column("/iterations", "step_s") and not s.is_column("/iterations", "stepp_s")
    assert not s.is_column("/comm/allreduce", "bytes")
    assert s.units_of(s.COMM_BUCKETS, "bucket_3_s") == "s"
    assert s.units_of("comm/allreduce", "bytes") == "B"  # a dataset object under a placeholder
    assert s.units_of(s.PROFILE_TOP_OPS, "count") == "events"
    assert s.units_of(s.ROOT, "profile/window_s") == "s"
    with pytest.raises(KeyError, match="/iterations/nope"):
        s.units_of(s.ITERATIONS, "nope")
    # An exact entry wins over a placeholder: /comm/buckets is a series, not a /comm/{op}.
    assert s.entry("/comm/buckets")["kind"] == "series"
    assert s.entry("/comm/allreduce")["path"] == "/comm/{op}"
    assert s.entry(s.SUMMARY, "median_data_s")["name"] == "median_{phase}_s"
    assert s.entry(s.SUMMARY, "median_step_s")["meaning"] == "the step"
    assert s.entry("/config", "train.lr", kind="attribute")["name"] == "{option}"
    assert s.entry("/nothing") is None


def test_page_tables_are_generated_and_the_prose_kept(generated):
    _, page, _ = generated
    for kept in ("Prose before, kept.", "Between the tables, kept.", "Prose after, kept."):
        assert kept in page
    assert "old text that is replaced" not in page
    # Every row's `when` empty: no when column.
    assert "| name | type | meaning |\n| --- | --- | --- |\n| `{option}` | str | one per option |" \
        in page
    assert "| `hostname` | fixed str | host \\| name |" in page  # | escaped in a cell
    # Some rows with a `when`: the column, empty where it is.
    assert "| name | type | when | meaning |" in page
    assert "| `error` | str | status=failed | the error |" in page
    # Conditions every row shares go above the table; the column keeps the rest.
    assert "*When:* run.workload=llm\n\n| name | units | when | meaning |" in page
    assert "| `tokens` | tokens |  | tokens |" in page
    assert "| `seq_len_max` | tokens | packed | longest |" in page
    assert "*When:* run.workload=comm\n\n| name | type | meaning |" in page
    # columns /iterations when=: the rows present in every run only.
    block = page.split("<!-- schema: columns /iterations when= -->")[1].split("<!-- /schema")[0]
    assert "`step_s`" in block and "`tokens`" not in block
    # datasets: full paths, tables included, groups not; objects brief: the first sentence.
    assert "| `/profile/top_ops` | " in page and "| `/profile/breakdown/idle_s` | s |" in page
    assert "| `/` | group |  |  | The root. |" in page
    assert "| `bucket_{k}_s` | s | m |" in page


def test_check_names_a_stale_page_and_module(generated):
    _, page, tmp = generated
    args = ("--check", "--schema-json", tmp / "schema.json", "--output-dir", tmp)
    assert gen(*args).returncode == 0
    (tmp / "run_file_schema.md").write_text(page.replace("| the step |", "| edited |", 1))
    proc = gen(*args)
    assert proc.returncode == 1
    assert "run_file_schema.md is out of date" in proc.stderr and "edited" in proc.stderr
    assert "scripts/gen_schema" in proc.stderr  # says how to fix it
    # A column added to the table: the module and the page are stale, the entry is named.
    table = json.loads(json.dumps(TABLE))
    table["entries"].insert(11, entry("column", "/iterations", "loss", units="1"))
    (tmp / "schema.json").write_text(json.dumps(table))
    proc = gen(*args)
    assert proc.returncode == 1
    assert "schema.py is out of date" in proc.stderr
    assert "the table has and the module lacks: column /iterations loss" in proc.stderr


@pytest.mark.parametrize("text, message", [
    ("not json", "not JSON"),
    ('{"schema": "trainscope/1"}', "exactly the keys 'schema' and 'entries'"),
    ('{"schema": "v1", "entries": []}', "expected 'trainscope/<n>'"),
    (json.dumps({"schema": "trainscope/1", "entries": [{"kind": "group", "path": "/"}]}),
     "missing meaning, name, type, units, when"),
    (json.dumps({"schema": "trainscope/1", "entries": [entry("folder", "/x")]}),
     "unknown kind 'folder'"),
    (json.dumps({"schema": "trainscope/1", "entries": [entry("group", "plan")]}),
     "path 'plan' is not /segment"),
    (json.dumps({"schema": "trainscope/1", "entries": [entry("column", "/iterations", "x")]}),
     "/iterations is not declared as an object before it"),
    (json.dumps({"schema": "trainscope/1", "entries": [
        entry("group", "/a"), entry("column", "/a", "x")]}), "a column belongs to a series"),
    (json.dumps({"schema": "trainscope/1",
                 "entries": [entry("group", "/a"), entry("group", "/a")]}),
     "/a is declared twice"),
    (json.dumps({"schema": "trainscope/1", "entries": [
        entry("group", "/a_b"), entry("group", "/a/b")]}), "constant A_B would name both"),
])
def test_a_malformed_table_is_refused_with_a_clear_message(tmp_path, text, message):
    (tmp_path / "schema.json").write_text(text)
    (tmp_path / "run_file_schema.md").write_text(PAGE_TEMPLATE)
    proc = gen("--schema-json", tmp_path / "schema.json", "--output-dir", tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "cannot read" in proc.stderr and message in proc.stderr, proc.stderr
    assert not (tmp_path / "schema.py").exists()


@pytest.mark.parametrize("block, message", [
    ("<!-- schema: columns /nothing -->\n<!-- /schema -->", "/nothing is not an object"),
    ("<!-- schema: rows /iterations -->\n<!-- /schema -->", "expected WHAT PATH"),
    ("<!-- schema: columns /summary -->\n<!-- /schema -->", "/summary is a group, not a series"),
    ("<!-- schema: attributes / colour=red -->\n<!-- /schema -->", "filter 'colour=red'"),
    ("<!-- schema: attributes / name=nothing* -->\n<!-- /schema -->", "selects no entry"),
    ("<!-- schema: attributes / -->\nno end marker", "has no <!-- /schema -->"),
])
def test_a_bad_selector_is_refused(tmp_path, block, message):
    (tmp_path / "schema.json").write_text(json.dumps(TABLE))
    (tmp_path / "run_file_schema.md").write_text(PAGE_TEMPLATE + "\n" + block + "\n")
    proc = gen("--schema-json", tmp_path / "schema.json", "--output-dir", tmp_path)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_an_entry_no_block_shows_is_an_error(tmp_path):
    (tmp_path / "schema.json").write_text(json.dumps(TABLE))
    (tmp_path / "run_file_schema.md").write_text(
        PAGE_TEMPLATE.replace("<!-- schema: attributes /summary -->\n<!-- /schema -->\n", ""))
    proc = gen("--schema-json", tmp_path / "schema.json", "--output-dir", tmp_path)
    assert proc.returncode == 1
    assert "attribute /summary median_{phase}_s" in proc.stderr
    assert "attribute /summary median_step_s" in proc.stderr
