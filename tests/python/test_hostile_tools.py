"""The schema generator, the model, the advisor and the GPU check under hostile input (issue 37,
classes 6 and 7): crafted schema JSON that tries to run code when the generated module is
imported, schema files that are FIFOs, devices, not UTF-8 or not the expected shape, outputs that
are directories, links or devices, a binary that never answers; runs whose step times are all NaN;
absurd recorded values (10^12 shards, negative bytes, world sizes below 1); gpu-check options
without their value and build directories without the gpu-labelled tests. Every case asserts the
exit code, one line naming the file, field or option and the fix, no traceback, nothing written
outside the named output, and a bounded run (every subprocess has a timeout)."""

import importlib.machinery
import importlib.util
import json
import math
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from synthetic_runs import Law, write_comm, write_run

ROOT = Path(__file__).resolve().parents[2]
GEN = ROOT / "scripts" / "gen_schema"
GPU_CHECK = ROOT / "scripts" / "gpu-check"
ENV = dict(os.environ, PYTHONPATH=str(ROOT / "postprocess"))
REPO_OUTPUTS = (ROOT / "postprocess" / "trainscope_post" / "schema.py",
                ROOT / "docs" / "run_file_schema.md")


def run(cmd, timeout=120, **kw):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout,
                          **kw)


def gen(*args, timeout=60, env=None):
    return run([sys.executable, GEN, *args], timeout=timeout, env=env)


def post(*args, timeout=300):
    return run([sys.executable, "-m", "trainscope_post", *args], timeout=timeout, env=ENV)


def snapshot(d: Path) -> dict:
    """Every path under `d` with its kind, and for a file its size and mtime (links not
    followed)."""
    out = {}
    for p in sorted(d.rglob("*")):
        st = p.lstat()
        reg = stat.S_ISREG(st.st_mode)
        out[str(p)] = (stat.S_IFMT(st.st_mode), st.st_size if reg else 0,
                       st.st_mtime_ns if reg else 0)
    return out


def refused_line(proc, *fragments, code=2) -> str:
    """Asserts the exit code, no traceback, and one stderr line holding every fragment; returns
    that line."""
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text, text
    assert proc.returncode == code, text
    lines = [x for x in proc.stderr.splitlines() if all(f in x for f in fragments)]
    assert lines, (fragments, proc.stderr)
    return lines[0]


@pytest.fixture(autouse=True)
def repo_outputs_untouched():
    """No case may write the checked-in module or page."""
    before = [p.read_bytes() for p in REPO_OUTPUTS]
    yield
    assert [p.read_bytes() for p in REPO_OUTPUTS] == before


# --- scripts/gen_schema: the JSON is data ---------------------------------------------------------
def table(**change) -> dict:
    """A three-entry table (a group with one attribute, a vector), with `change` as
    {"<entry index>.<field>": text} applied."""
    entries = [
        {"kind": "group", "path": "/plan", "name": "", "units": "", "type": "", "when": "",
         "meaning": "The plan."},
        {"kind": "attribute", "path": "/plan", "name": "x", "units": "B", "type": "int",
         "when": "", "meaning": "An x."},
        {"kind": "vector", "path": "/v", "name": "", "units": "B", "type": "", "when": "",
         "meaning": "A vector."},
    ]
    for key, text in change.items():
        i, field = key.split(".")
        entries[int(i)][field] = text
    return {"schema": "trainscope/1", "entries": entries}


PAGE = """# A page

Prose, kept.

<!-- schema: objects / -->
<!-- /schema -->

<!-- schema: attributes /plan -->
<!-- /schema -->
"""


def setup_table(tmp_path: Path, doc) -> tuple[Path, Path]:
    src = tmp_path / "in"
    src.mkdir(exist_ok=True)
    js = src / "schema.json"
    js.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    page = src / "page.md"
    page.write_text(PAGE)
    return js, page


def import_generated(module_dir: Path, expr: str) -> str:
    """Imports schema.py of `module_dir` in a fresh interpreter, prints json.dumps(expr)."""
    proc = run([sys.executable, "-c", f"import json, schema; print(json.dumps({expr}))"],
               cwd=module_dir, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


# Texts that a string concatenated into code would run; as data they must come back unchanged.
INERT = [
    ("1.meaning", "'); import os; os.system('touch MARK')#"),
    ("1.meaning", '""" + __import__("os").system("touch MARK") + """'),
    ("1.when", "\\\"; __import__('os').system('touch MARK') #"),
    ("1.type", "{__import__('os').system('touch MARK')}"),
    ("2.units", "B] ; __import__('os').system('touch MARK') #"),  # the constant's comment
    ("1.units", "'''; __import__('os').system('touch MARK'); '''"),
    ("0.meaning", r"C:\new\table \x41 \u0041 \N{BULLET} \\"),  # backslashes stay backslashes
    ("1.meaning", "é ≤ 𝔘 — \"quoted\" 'single' `tick` | pipe"),
]


@pytest.mark.parametrize("key,payload", INERT, ids=[f"{k}-{i}" for i, (k, _) in enumerate(INERT)])
def test_crafted_text_reaches_the_module_as_data(tmp_path, key, payload):
    mark = tmp_path / "pwned"
    payload = payload.replace("MARK", str(mark))
    js, page = setup_table(tmp_path, table(**{key: payload}))
    out = tmp_path / "out"
    proc = gen("--schema-json", js, "--module", out / "schema.py", "--page", page)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    i, field = key.split(".")
    assert import_generated(out, f"schema.ENTRIES[{i}][{field!r}]") == payload
    assert not mark.exists()
    assert {p.name for p in out.iterdir()} - {"__pycache__"} == {"schema.py"}  # nothing else


# Texts that are refused before anything is generated: a line break, separator or control
# character would end a comment or a table row; a surrogate cannot be written as UTF-8; a
# bidirectional override hides what the source says.
REFUSED_TEXT = [
    ("2.units", "B\nimport os; os.system('touch MARK')#", "U+000A"),
    ("1.meaning", "x\rimport os; os.system('touch MARK')#", "U+000D"),
    ("1.when", "x\u2028__import__('os').system('touch MARK')", "U+2028"),
    ("1.meaning", "abc\u202edef", "U+202E"),
    ("1.type", "int\x00", "U+0000"),
    ("1.meaning", "\ud800", "surrogate"),
    ("0.meaning", "a\x85b", "U+0085"),
]


@pytest.mark.parametrize("key,payload,fragment", REFUSED_TEXT,
                         ids=[f[2] for f in REFUSED_TEXT])
def test_a_control_character_in_the_table_is_refused_by_entry_and_field(tmp_path, key, payload,
                                                                         fragment):
    mark = tmp_path / "pwned"
    js, page = setup_table(tmp_path, table(**{key: payload.replace("MARK", str(mark))}))
    before = snapshot(tmp_path)
    proc = gen("--schema-json", js, "--output-dir", tmp_path / "out", "--page", page)
    i, field = key.split(".")
    line = refused_line(proc, "--schema-json", str(js), f"entry {i}", field, fragment)
    assert "printable" in line  # what the fix is
    assert snapshot(tmp_path) == before and not mark.exists()


def load_generator():
    loader = importlib.machinery.SourceFileLoader("gen_schema_under_test", str(GEN))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.mark.parametrize("units", ["B\nimport os; os.system('touch MARK')#",
                                   "B\r__import__('os').system('touch MARK')#",
                                   "B\u2028\x85\x0c__import__('os').system('touch MARK')#"])
def test_the_module_writer_escapes_what_validation_would_refuse(tmp_path, units):
    """Defence in depth: module() itself never lets a text out of its literal or comment."""
    g = load_generator()
    mark = tmp_path / "pwned"
    units = units.replace("MARK", str(mark))
    entries = table(**{"2.units": units, "1.meaning": units})["entries"]
    (tmp_path / "schema.py").write_text(g.module("trainscope/1", entries), encoding="utf-8")
    assert import_generated(tmp_path, "[schema.ENTRIES[2]['units'], schema.UNITS['/v']]") == \
        [units, units]
    assert not mark.exists()


def test_a_module_that_would_run_code_is_not_written(tmp_path):
    g = load_generator()
    text = g.module("trainscope/1", table()["entries"])
    hostile = text.replace('VERSION = "trainscope/1"\n',
                           'VERSION = "trainscope/1"\n__import__("os").getcwd()\n', 1)
    with pytest.raises(g.FormatError, match="would run code"):
        g.check_generated(hostile)
    g.check_generated(text)  # the module as generated passes


def _big(p: Path):
    with open(p, "wb") as fh:
        fh.truncate((64 << 20) + 1)  # sparse: 64 MiB + 1 byte of zeros


BAD_JSON = [
    ("fifo", lambda p: os.mkfifo(p), "FIFO"),
    ("directory", lambda p: p.mkdir(), "is a directory"),
    ("latin-1", lambda p: p.write_bytes(json.dumps(table(**{"1.meaning": "é"}),
                                                   ensure_ascii=False).encode("latin-1")),
     "not UTF-8"),
    ("utf-16", lambda p: p.write_text(json.dumps(table()), encoding="utf-16"), "not UTF-8"),
    ("too-large", _big, "more than a schema"),
    ("empty", lambda p: p.write_text(""), "not JSON"),
    ("a-list", lambda p: p.write_text("[1, 2]"), "expected an object"),
    ("nested", lambda p: p.write_text("[" * 200000 + "]" * 200000), "nested too deeply"),
    ("duplicate-key", lambda p: p.write_text(
        '{"schema": "trainscope/1", "schema": "trainscope/2", "entries": []}'),
     "'schema' appears twice"),
    ("arabic-digit", lambda p: p.write_text(json.dumps(dict(table(), schema="trainscope/\u0661"))),
     "expected 'trainscope/<n>'"),
    ("no-entries", lambda p: p.write_text('{"schema": "trainscope/1", "entries": []}'),
     "'entries' is not a non-empty list"),
    ("number-field", lambda p: p.write_text(json.dumps(table(**{"1.units": 5}))),
     "units not a string"),
    ("missing", lambda p: None, "cannot open"),
]


@pytest.mark.parametrize("name,make,fragment", BAD_JSON, ids=[c[0] for c in BAD_JSON])
def test_a_schema_json_that_is_not_one_is_refused(tmp_path, name, make, fragment):
    js = tmp_path / "schema.json"
    make(js)
    before = snapshot(tmp_path)
    t0 = time.monotonic()
    proc = gen("--schema-json", js, "--output-dir", tmp_path / "out", timeout=60)
    assert time.monotonic() - t0 < 30  # a FIFO is never opened for a blocking read
    refused_line(proc, "--schema-json", str(js), fragment)
    assert snapshot(tmp_path) == before


def test_a_device_as_schema_json_is_refused(tmp_path):
    proc = gen("--schema-json", "/dev/zero", "--output-dir", tmp_path / "out", timeout=60)
    refused_line(proc, "--schema-json /dev/zero", "device")
    assert not (tmp_path / "out").exists()


def _outside(tmp_path: Path) -> Path:
    f = tmp_path / "elsewhere.py"
    f.write_text("keep")
    return f


BAD_OUTPUTS = [
    ("output-dir-is-a-file", lambda t: (t / "f").write_text("keep"),
     ["--output-dir", "{t}/f"], ["--output-dir", "not a directory"]),
    ("module-is-a-directory", lambda t: (t / "d").mkdir(),
     ["--module", "{t}/d", "--page", "{t}/in/page.md"], ["--module", "is a directory"]),
    ("page-is-a-fifo", lambda t: os.mkfifo(t / "p.md"),
     ["--module", "{t}/m.py", "--page", "{t}/p.md"], ["--page", "FIFO"]),
    ("page-is-a-device", lambda t: None,
     ["--module", "{t}/m.py", "--page", "/dev/null"], ["--page /dev/null", "device"]),
    ("module-is-a-link", lambda t: (t / "m.py").symlink_to(_outside(t)),
     ["--module", "{t}/m.py", "--page", "{t}/in/page.md"], ["--module", "symbolic link"]),
    ("link-in-output-dir", lambda t: ((t / "o").mkdir(),
                                      (t / "o" / "schema.py").symlink_to(_outside(t))),
     ["--output-dir", "{t}/o"], ["--output-dir", "schema.py", "symbolic link"]),
    ("under-a-file", lambda t: (t / "f").write_text("keep"),
     ["--module", "{t}/f/x/schema.py", "--page", "{t}/in/page.md"],
     ["--module", "f is not a directory"]),
    ("module-is-the-page", lambda t: None,
     ["--module", "{t}/in/page.md", "--page", "{t}/in/page.md"], ["--module and --page"]),
]


@pytest.mark.parametrize("name,make,args,fragments", BAD_OUTPUTS, ids=[c[0] for c in BAD_OUTPUTS])
def test_an_output_of_the_wrong_kind_is_refused_and_nothing_is_written(tmp_path, name, make,
                                                                       args, fragments):
    js, _ = setup_table(tmp_path, table())
    make(tmp_path)
    before = snapshot(tmp_path)
    args = [a.replace("{t}", str(tmp_path)) for a in args]
    proc = gen("--schema-json", js, *args, timeout=60)
    refused_line(proc, *fragments)
    assert snapshot(tmp_path) == before
    if (tmp_path / "elsewhere.py").exists():
        assert (tmp_path / "elsewhere.py").read_text() == "keep"


def fake_binary(tmp_path: Path, script: str) -> dict:
    b = tmp_path / "build" / "app" / "trainscope"
    b.parent.mkdir(parents=True)
    b.write_text("#!/bin/sh\n" + script)
    b.chmod(0o755)
    return dict(os.environ, BUILD_DIR=str(tmp_path / "build"))


def test_a_binary_that_never_answers_is_killed_at_the_timeout(tmp_path):
    env = fake_binary(tmp_path, f"sleep 300 &\necho $! > {tmp_path}/child\nwait\n")
    t0 = time.monotonic()
    proc = gen("--timeout", "2", "--output-dir", tmp_path / "out", env=env, timeout=60)
    assert time.monotonic() - t0 < 30
    refused_line(proc, "did not finish within 2 s", "--timeout", "--schema-json FILE")
    child = int((tmp_path / "child").read_text())
    for _ in range(50):  # the whole process group is killed, the sleep included
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"pid {child} of the binary's process group still runs")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("script,fragment", [
    ("printf '\\377\\376{}'\n", "not UTF-8"),
    ("echo boom >&2; exit 3\n", "exited 3"),
    (None, "not found"),
])
def test_a_binary_that_fails_is_named(tmp_path, script, fragment):
    env = fake_binary(tmp_path, script or "")
    if script is None:
        (tmp_path / "build" / "app" / "trainscope").unlink()
    proc = gen("--output-dir", tmp_path / "out", env=env)
    refused_line(proc, str(tmp_path / "build" / "app" / "trainscope"), fragment)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", ["0", "nan", "-5", "soon"])
def test_the_timeout_must_be_a_positive_number_of_seconds(tmp_path, value):
    proc = gen("--timeout", value, "--output-dir", tmp_path / "out")
    refused_line(proc, "--timeout", "not a number of seconds")
    assert not (tmp_path / "out").exists()


# --- trainscope-post model: runs without a step time ----------------------------------------------
def nan_study(root: Path, value: float, good: bool, every_timing: bool) -> list[Path]:
    """Configuration run.precision=fp32 at 1, 2, 4 ranks with median_step_s = value (every
    median time too with every_timing), and with `good` a bf16-mixed one that is fine. Returns
    the bad files."""
    bad = []
    for p in (1, 2, 4):
        f = write_run(root / "fp32" / f"n{p}" / "run.h5", Law(), p, 1,
                      {"run.precision": "fp32", "run.scaling": "strong"})
        with h5py.File(f, "r+") as h:
            for k in list(h["summary"].attrs):
                if k == "median_step_s" or (every_timing and k.endswith("_s")):
                    h["summary"].attrs[k] = value
        bad.append(f)
        if good:
            write_run(root / "bf16" / f"n{p}" / "run.h5", Law(), p, 1,
                      {"run.precision": "bf16-mixed", "run.scaling": "strong"})
    return bad


STEP_VALUES = [("all-nan", math.nan, True), ("inf", math.inf, False), ("zero", 0.0, False),
               ("negative", -1.0, False)]


@pytest.mark.parametrize("name,value,every", STEP_VALUES, ids=[v[0] for v in STEP_VALUES])
def test_model_names_the_configuration_it_drops(tmp_path, name, value, every):
    root = tmp_path / "study"
    bad = nan_study(root, value, good=True, every_timing=every)
    before = snapshot(root)
    out = tmp_path / "model.json"
    proc = post("model", root, "--out", out)
    line = refused_line(proc, "configuration 'run.precision=fp32' dropped", "median_step_s",
                        code=1)
    assert all(str(f) in line for f in bad), line
    assert "profile.warmup_iters" in line  # the fix
    assert "== run.precision=bf16-mixed" in proc.stdout  # the other one is modelled
    doc = json.loads(out.read_text())
    assert [c["label"] for c in doc["configurations"]] == ["run.precision=bf16-mixed"]
    assert snapshot(root) == before


@pytest.mark.parametrize("name,value,every", STEP_VALUES, ids=[v[0] for v in STEP_VALUES])
def test_model_with_nothing_left_says_why_instead_of_an_empty_answer(tmp_path, name, value,
                                                                      every):
    root = tmp_path / "study"
    bad = nan_study(root, value, good=False, every_timing=every)
    out = tmp_path / "model.json"
    proc = post("model", root, "--out", out)
    line = refused_line(proc, "no configuration can be modelled", "median_step_s")
    assert str(bad[0]) in line
    assert not out.exists()


def test_model_names_a_single_run_it_leaves_out(tmp_path):
    root = tmp_path / "study"
    for p in (1, 2, 4, 8):
        write_run(root / f"n{p}" / "run.h5", Law(), p, 1, {"run.scaling": "strong"})
    with h5py.File(root / "n8" / "run.h5", "r+") as h:
        h["summary"].attrs["median_step_s"] = math.nan
    proc = post("model", root)
    line = refused_line(proc, str(root / "n8" / "run.h5"), "median_step_s = nan",
                        "left out of the model", code=1)
    assert "configuration 'cv'" in line
    assert "runs at ranks 1,2,4;" in proc.stdout, proc.stdout  # the other three are modelled


def test_extrap_fit_names_a_series_with_nan_in_one_line(tmp_path):
    py = Path(os.environ.get("TRAINSCOPE_EXTRAP_PYTHON", Path.home() / ".cache" / "trainscope" /
                             "venv-extrap" / "bin" / "python"))
    if not py.exists():
        pytest.skip("Extra-P's environment is not installed (scripts/setup --tests)")
    req = json.dumps({"series": [{"name": "0|forward", "points": [1, 2, 4], "scaling": "strong",
                                  "values": [[math.nan], [1.0], [0.5]]}]})
    proc = subprocess.run([str(py), str(ROOT / "postprocess/trainscope_post/extrap_fit.py")],
                          input=req, capture_output=True, text=True, timeout=120)
    refused_line(proc, "series '0|forward' at p = 1", "not finite", code=1)


# --- trainscope-post advise: absurd recorded values -----------------------------------------------
@pytest.fixture(scope="module")
def template(tmp_path_factory):
    root = tmp_path_factory.mktemp("advise") / "study"
    for p in (1, 2, 4):
        write_run(root / f"n{p}" / "run.h5", Law(), p, 1, {"run.scaling": "strong"})
    return root


@pytest.fixture
def study(template, tmp_path):
    return Path(shutil.copytree(template, tmp_path / "study"))


def set_attr(group, key, value):
    def change(h):
        h[group].attrs[key] = value
    return change


def replace(path, data):
    def change(h):
        g, name = path.rsplit("/", 1)
        del h[g][name]
        h[g].create_dataset(name, data=data)
    return change


ABSURD = [
    ("shards-1e12", set_attr("plan", "memory_plan_weight_shards", np.int64(10**12)),
     "/plan@memory_plan_weight_shards", "shard count"),
    ("shards-negative", set_attr("plan", "memory_plan_optimizer_state_shards", np.int64(-1)),
     "/plan@memory_plan_optimizer_state_shards", "shard count"),
    ("shards-above-ranks", set_attr("plan", "memory_plan_gradient_shards", np.int64(8)),
     "/plan@memory_plan_gradient_shards", "world_size 2"),
    ("bytes-negative", set_attr("plan", "memory_plan_weight_bytes", -1.0),
     "/plan@memory_plan_weight_bytes", "byte count"),
    ("bytes-inf", set_attr("plan", "memory_plan_activation_bytes", math.inf),
     "/plan@memory_plan_activation_bytes", "byte count"),
    ("bytes-nan", set_attr("plan", "memory_plan_optimizer_state_bytes", math.nan),
     "/plan@memory_plan_optimizer_state_bytes", "byte count"),
    ("estimate-negative", set_attr("plan", "memory_estimate_bytes", -5.0),
     "/plan@memory_estimate_bytes", "byte count"),
    ("global-batch-negative", set_attr("plan", "global_batch", np.int64(-256)),
     "/plan@global_batch", "whole number"),
    ("batch-fraction", set_attr("plan", "batch_per_rank", 2.5), "/plan@batch_per_rank",
     "whole number"),
    ("iterations-1e15", set_attr("plan", "total_iterations", np.int64(10**15)),
     "/plan@total_iterations", "whole number"),
    ("zero-stage-7", set_attr("plan", "zero", np.int64(7)), "/plan@zero", "[0, 3]"),
    ("nodes-zero", set_attr("/", "num_nodes", np.int64(0)), "attribute num_nodes", "node count"),
    ("nodes-above-ranks", set_attr("/", "num_nodes", np.int64(9)), "attribute num_nodes",
     "node count"),
    ("world-size-zero", set_attr("/", "world_size", np.int64(0)), "attribute world_size = 0",
     "positive integer"),
    ("world-size-negative", set_attr("/", "world_size", np.int64(-4)),
     "attribute world_size = -4", "positive integer"),
    ("world-size-1e12", set_attr("/", "world_size", np.int64(10**12)), "world_size=1000000000000",
     "shape"),
    ("step-1e30", set_attr("summary", "median_step_s", 1e30), "/summary@median_step_s",
     "not a positive step time"),
    ("phase-negative", set_attr("summary", "median_forward_s", -0.1),
     "/summary@median_forward_s", "phase time"),
    ("batch-samples-zero", set_attr("summary", "global_batch_samples", 0.0),
     "/summary@global_batch_samples", "batch"),
    ("comm-bytes-negative", replace("iterations/comm_bytes", np.full((2, 12), -1.0)),
     "/iterations/comm_bytes", "byte count"),
    ("bucket-bytes-inf", replace("comm/buckets/bytes", np.array([math.inf, 1.0, 2.0])),
     "/comm/buckets/bytes", "bucket size"),
]


@pytest.mark.parametrize("name,change,field,what", ABSURD, ids=[c[0] for c in ABSURD])
def test_advise_refuses_an_absurd_recorded_value(study, name, change, field, what):
    f = study / "n2" / "run.h5"
    with h5py.File(f, "r+") as h:
        change(h)
    before = snapshot(study)
    proc = post("advise", study, "--gpus-per-node", "4", "--max-nodes", "2")
    line = refused_line(proc, str(f), field, what)
    assert "advise cannot recommend from it" in line and "leave the file out" in line
    assert "recommended:" not in proc.stdout
    assert snapshot(study) == before


def test_advise_refuses_a_comm_run_with_negative_message_sizes(study, tmp_path):
    comm = write_comm(tmp_path / "comm" / "c.h5", Law().network, 2, 1)
    with h5py.File(comm, "r+") as h:
        h["comm/allreduce/bytes"][0] = -8.0
    proc = post("advise", study, "--comm", comm, "--gpus-per-node", "4", "--max-nodes", "2")
    refused_line(proc, str(comm), "/comm/allreduce/bytes", "message size")


def test_advise_jobs_refuses_an_absurd_value_in_any_job(study, template, tmp_path):
    other = Path(shutil.copytree(template, tmp_path / "other"))
    with h5py.File(other / "n4" / "run.h5", "r+") as h:
        h["plan"].attrs["memory_plan_weight_shards"] = np.int64(10**12)
    proc = post("advise", "--jobs", study, other, "--gpus", "8", "--gpus-per-node", "4")
    refused_line(proc, str(other / "n4" / "run.h5"), "memory_plan_weight_shards", "shard count")
    assert "co-allocation" not in proc.stdout


# --- scripts/gpu-check: options and build directories ---------------------------------------------
GPU_ENV = dict(os.environ, TRAINSCOPE_VENV="/nonexistent/venv")  # never scripts/setup


def gpu_check(*args):
    """--no-build always comes first: whatever the parsing does, no build is started."""
    runs = ROOT / "runs" / "gpu-check"
    existed = runs.exists()
    proc = run(["bash", GPU_CHECK, "--no-build", *args], timeout=120, env=GPU_ENV)
    assert runs.exists() == existed  # nothing run, so no run directory made
    return proc


@pytest.mark.parametrize("args,option", [
    (["--build-dir"], "--build-dir"),
    (["--out"], "--out"),
    (["--build-dir", ""], "--build-dir"),
    (["--out", ""], "--out"),
    (["--build-dir", "--out", "/tmp/x"], "--build-dir"),
    (["--out", "--build-dir", "/tmp/x"], "--out"),
    (["--build-dir="], "--build-dir"),
    (["--out="], "--out"),
])
def test_gpu_check_option_without_its_value_prints_the_usage(args, option):
    proc = gpu_check(*args)
    line = refused_line(proc, f"{option} needs a value", "usage: scripts/gpu-check")
    assert "[--build-dir DIR]" in line
    assert "unbound variable" not in proc.stderr


def test_gpu_check_unknown_option_prints_the_usage():
    refused_line(gpu_check("--bulid-dir", "/tmp"), "unknown argument '--bulid-dir'",
                 "usage: scripts/gpu-check")


@pytest.mark.parametrize("option", ["--build-dir", "--out"])
def test_gpu_check_directory_that_is_a_file_is_refused(tmp_path, option):
    f = tmp_path / "file"
    f.write_text("keep")
    refused_line(gpu_check(option, f), f"{option} {f}", "not a directory")
    assert f.read_text() == "keep"


def fake_build(root: Path, cuda=True, binary=True, tests=(), built=()) -> Path:
    """A build directory as gpu-check sees it: app/trainscope, build_config.hpp, and a
    CTestTestfile.cmake declaring `tests` (name -> program under tests/) labelled gpu, of which
    the programs in `built` exist."""
    if binary:
        b = root / "app" / "trainscope"
        b.parent.mkdir(parents=True)
        b.write_text("#!/bin/sh\nexit 0\n")
        b.chmod(0o755)
    cfg = root / "modules/core/generated/trainscope/core/build_config.hpp"
    cfg.parent.mkdir(parents=True)
    cfg.write_text(f"#define TRAINSCOPE_HAVE_CUDA {1 if cuda else 0}\n")
    lines = []
    for name, program, mpi in tests:
        exe = root / "tests" / program
        cmd = f'"/usr/bin/mpiexec" "-n" "2" "{exe}"' if mpi else f'"{exe}"'
        lines += [f"add_test({name} {cmd})",
                  f'set_tests_properties({name} PROPERTIES LABELS "gpu")']
    (root / "CTestTestfile.cmake").write_text("\n".join(lines) + "\n")
    for program in built:
        exe = root / "tests" / program
        exe.parent.mkdir(parents=True, exist_ok=True)
        exe.write_text("#!/bin/sh\nexit 0\n")
        exe.chmod(0o755)
    return root


GPU_TESTS = (("gpu_checkpoint_np2", "mpi_tests", True), ("gpu_nf4", "unit_tests", False))


@pytest.mark.skipif(shutil.which("ctest") is None, reason="needs CMake's ctest")
@pytest.mark.parametrize("name,kw,fragments,absent", [
    ("no-gpu-tests", {}, ["no tests labelled gpu", "mpi_tests and unit_tests", "--target"], []),
    ("none-built", {"tests": GPU_TESTS}, ["not built", "mpi_tests", "unit_tests", "--target"],
     []),
    ("unit-tests-missing", {"tests": GPU_TESTS, "built": ["mpi_tests"]},
     ["not built", "build the targets unit_tests", "--target unit_tests"], ["mpi_tests"]),
    ("mpi-tests-missing", {"tests": GPU_TESTS, "built": ["unit_tests"]},
     ["not built", "build the targets mpi_tests", "--target mpi_tests"], ["unit_tests"]),
    ("without-cuda", {"cuda": False, "tests": GPU_TESTS}, ["configured without CUDA"], []),
    ("no-binary", {"binary": False, "tests": GPU_TESTS}, ["app/trainscope is not built",
                                                        "scripts/build trainscope"], []),
])
def test_gpu_check_no_build_names_what_to_build(tmp_path, name, kw, fragments, absent):
    build = fake_build(tmp_path / "build", **kw)

    def files():  # ctest keeps its Testing/ directory in the build directory it reads
        return {k: v for k, v in snapshot(tmp_path).items() if "/Testing" not in k}
    before = files()
    line = refused_line(gpu_check("--build-dir", build), str(build), *fragments)
    assert "--no-build" in line  # the other way out
    for word in absent:
        assert word not in line, line
    assert files() == before
