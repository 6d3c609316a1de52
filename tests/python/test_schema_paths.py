"""The readers name run-file paths through the generated module trainscope_post.schema, never by
spelling them: a string literal in postprocess/, jobscripts/, benchmarks/ or scripts/ (*.py and
extensionless python scripts) that is a run-file path fails this test with file:line.

A path literal is a string equal to a group or dataset of the schema, with or without its leading
"/", or with a placeholder filled ("comm/allreduce/bytes", f"comm/{op}"). A single-segment name
without a slash ("plan", "iterations", "ranks", ...) and the root "/" are also ordinary words and
dict keys, so they count only where they address the file: as the first argument of RunFile's
.group/.has/.attrs/.rank_rows/.columns/.series, as the group argument of .recorded/.measured/
.units, as the default of a parameter named group or path, and as a subscript, `in` operand or
.get/.create_group/.create_dataset/.require_group argument of an h5py object (a name bound to
h5py.File(...), to a subscript or .get of one, or to RunFile.group(...); per function, with the
enclosing functions' names). The parse is `ast`, not text: comments never count, and neither
does prose that mentions a path (a docstring is not equal to one). Not scanned: an f-string
nested in another f-string's {expression}."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "postprocess"))
from trainscope_post import schema  # noqa: E402

DIRS = ("postprocess", "jobscripts", "benchmarks", "scripts")
EXEMPT = {ROOT / "postprocess" / "trainscope_post" / "schema.py"}
# RunFile methods whose first argument is a path, and those whose `group` (2nd) argument is one.
PATH_FIRST = {"group", "has", "attrs", "rank_rows", "columns", "series", "ragged"}
GROUP_SECOND = {"recorded", "measured", "units"}
# Parameters whose default, when a literal, is a path.
PATH_PARAMETERS = {"group", "path", "group_path", "dataset_path"}
# h5py methods whose first argument is a path, on an h5py object.
H5_PATH_FIRST = {"get", "create_group", "create_dataset", "require_group", "require_dataset"}
# Every group and dataset of the schema: the objects and the series/table columns.
PATHS = sorted({e["path"] for e in schema.ENTRIES
                if e["kind"] not in ("attribute", "column", "field")} | set(schema.UNITS))
WILD = "\0"  # an f-string's {expression}: matches one name, like a placeholder


def python_files(dirs=DIRS, root=ROOT) -> list[Path]:
    out = []
    for d in dirs:
        for p in sorted((root / d).rglob("*")):
            if not p.is_file() or "__pycache__" in p.parts or p in EXEMPT:
                continue
            if p.suffix == ".py":
                out.append(p)
            elif not p.suffix:
                with open(p, "rb") as f:
                    first = f.readline()
                if first.startswith(b"#!") and b"python" in first:
                    out.append(p)
    return out


def segment_matches(template: str, segment: str) -> bool:
    """One path segment against one of the table's; WILD (an f-string expression) matches a name
    or a placeholder."""
    if WILD not in segment:
        return schema.matches(template, segment)
    rx = re.compile("".join("[A-Za-z0-9_.{}-]+" if part == WILD else re.escape(part)
                            for part in re.split(f"({WILD})", segment)))
    filled = re.sub(r"\{[A-Za-z_][A-Za-z0-9_]*\}", "x", template)
    return bool(rx.fullmatch(template) or rx.fullmatch(filled))


def is_path(text: str) -> bool:
    """`text` (a literal; WILD for an f-string's expressions) names a schema group or dataset."""
    if text == "/":
        return True  # the root
    segments = ("/" + text.removeprefix("/")).split("/")
    if not all(segments[1:]):
        return False  # "//", "a//b", "comm/": not a path
    return any(len(p.split("/")) == len(segments) and
               all(segment_matches(q, s) for q, s in zip(p.split("/"), segments))
               for p in PATHS)


def literal(node) -> str | None:
    """The text of a str constant, or of an f-string that starts with literal text (WILD for its
    expressions); None otherwise (an f-string starting with an expression, e.g. f"{group}/x",
    names no path by itself)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        return "".join(v.value if isinstance(v, ast.Constant) else WILD for v in node.values)
    return None


class Scanner(ast.NodeVisitor):
    def __init__(self):
        self.hits: list[tuple[int, str]] = []
        self.scopes: list[set[str]] = [set()]

    # --- which expressions are h5py objects --------------------------------------------------
    def h5(self, node) -> bool:
        if isinstance(node, ast.Name):
            return any(node.id in s for s in self.scopes)
        if isinstance(node, ast.Attribute):
            return node.attr == "_h5" or (node.attr in ("parent", "file") and self.h5(node.value))
        if isinstance(node, ast.Subscript):
            return self.h5(node.value)
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr == "File" and \
                    isinstance(f.value, ast.Name) and f.value.id == "h5py":
                return True
            if isinstance(f, ast.Attribute) and f.attr in H5_PATH_FIRST | {"require_group"}:
                return self.h5(f.value)
            if isinstance(f, ast.Attribute) and f.attr == "group":  # RunFile.group
                return True
        return False

    def bind(self, target, value) -> None:
        if isinstance(target, ast.Name) and self.h5(value):
            self.scopes[-1].add(target.id)

    def collect(self, body) -> None:
        """Names bound to h5py objects in `body` (not inside nested functions), to a fixpoint."""
        nodes = []
        stack = list(body)
        while stack:
            n = stack.pop()
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                continue
            nodes.append(n)
            stack.extend(ast.iter_child_nodes(n))
        for _ in range(4):
            before = set(self.scopes[-1])
            for n in nodes:
                if isinstance(n, ast.Assign):
                    for t in n.targets:
                        self.bind(t, n.value)
                elif isinstance(n, (ast.AnnAssign, ast.NamedExpr)) and n.value is not None:
                    self.bind(n.target, n.value)
                elif isinstance(n, ast.withitem) and n.optional_vars is not None:
                    self.bind(n.optional_vars, n.context_expr)
            if self.scopes[-1] == before:
                break

    def visit_Module(self, node):
        self.collect(node.body)
        self.generic_visit(node)

    def visit_FunctionDef(self, node):
        # Defaults of path parameters: def rank_rows(self, group: str = "iterations").
        args = node.args.posonlyargs + node.args.args
        for arg, default in zip(args[len(args) - len(node.args.defaults):], node.args.defaults):
            if arg.arg in PATH_PARAMETERS:
                self.flag(default)
        for arg, default in zip(node.args.kwonlyargs, node.args.kw_defaults):
            if default is not None and arg.arg in PATH_PARAMETERS:
                self.flag(default)
        self.scopes.append(set())
        self.collect(node.body)
        self.generic_visit(node)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    # --- literals ----------------------------------------------------------------------------
    def flag(self, node, anywhere_only: bool = False) -> None:
        text = literal(node)
        if text is None or not text:
            return
        addressed = not anywhere_only
        if ("/" in text.strip("/") or text.startswith("/") and text != "/" or addressed) and \
                is_path(text):
            hit = (node.lineno, text.replace(WILD, "{...}"))
            if hit not in self.hits:
                self.hits.append(hit)

    def visit_Constant(self, node):
        self.flag(node, anywhere_only=True)

    def visit_JoinedStr(self, node):
        self.flag(node, anywhere_only=True)  # its parts are not paths on their own

    def visit_Subscript(self, node):
        if self.h5(node.value):
            self.flag(node.slice)
        self.generic_visit(node)

    def visit_Compare(self, node):
        if len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn)) and \
                self.h5(node.comparators[0]):
            self.flag(node.left)
        self.generic_visit(node)

    def visit_Call(self, node):
        f = node.func
        if isinstance(f, ast.Attribute):
            if f.attr in PATH_FIRST and node.args:
                self.flag(node.args[0])
            if f.attr in GROUP_SECOND:
                if len(node.args) > 1:
                    self.flag(node.args[1])
                for k in node.keywords:
                    if k.arg == "group":
                        self.flag(k.value)
            if f.attr in H5_PATH_FIRST and node.args and self.h5(f.value):
                self.flag(node.args[0])
        if isinstance(f, ast.Attribute) and f.attr in PATH_FIRST:
            for k in node.keywords:
                if k.arg in ("group", "path"):
                    self.flag(k.value)
        self.generic_visit(node)


def scan(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    s = Scanner()
    s.visit(tree)
    rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    return [f"{rel}:{line}: {text!r}" for line, text in sorted(s.hits)]


def test_readers_name_run_file_paths_through_the_schema_module():
    files = python_files()
    assert len(files) > 30, files  # the scan finds the scripts at all
    hits = [h for p in files for h in scan(p)]
    assert not hits, ("run-file path literals; use trainscope_post.schema's constants "
                      "(schema.PLAN, schema.fill(schema.COMM_OP, op), ...):\n  "
                      + "\n  ".join(hits))


def test_extensionless_python_scripts_are_scanned():
    files = set(python_files())
    assert ROOT / "jobscripts" / "study" in files and ROOT / "scripts" / "gen_schema" in files
    assert ROOT / "scripts" / "build" not in files  # a bash script
    assert ROOT / "jobscripts" / "reframe" / "trainscope_check.py" in files


PLANTED = '''#!/usr/bin/env python3
import h5py
from trainscope_post import RunFile

def read(path, op, group):
    with h5py.File(path, "r") as f:
        it = f["iterations"]                         # 7: an h5py subscript
        ini = f["config/ini"]                        # 8: a path anywhere
        if "summary" in f:                           # 9: membership in an h5py object
            pass
        g = f.get("/profile")                        # 11
        x = it["step_s"]                             # a column name: fine
    rf = RunFile(path)
    rf.attrs("/plan")                                # 14
    rf.recorded("loss", "epochs")                    # 15: the group argument
    rf.series(f"comm/{op}", "bytes")                 # 16: a placeholder filled by an f-string
    rf.has("/comm/allreduce/bytes")                  # 17
    rf.group("profile/top_ops")                      # 18
    rf.rank_rows(group="telemetry")                  # 19
    rf.attrs("/")                                    # 20: the root, addressed
    rows = {"plan": 1, "ranks": 2}                   # dict keys: fine
    rows["ranks"] += 1                               # not an h5py object: fine
    "/".join(["a", "b"]); path.split("/")            # not addressed: fine
    doc = "see /comm/<op>/bytes"                     # prose: fine
    f"{group}/step_s"                                # an expression first: fine
    "iterations/step_s"                              # 26: a column dataset


def rows(run, group="telemetry", *, path="/comm"):  # 29: defaults of path parameters
    return "///"                                     # a hatch pattern: fine
'''


def test_a_planted_path_literal_is_found(tmp_path):
    script = tmp_path / "planted"
    script.write_text(PLANTED)
    (tmp_path / "fine.py").write_text("from trainscope_post import schema\n"
                                      "x = schema.PLAN\ny = schema.fill(schema.COMM_OP, 'a')\n")
    (tmp_path / "notpython").write_text("#!/bin/bash\necho '/plan'\n")
    files = python_files([""], tmp_path)
    assert set(files) == {script, tmp_path / "fine.py"}
    assert scan(tmp_path / "fine.py") == []
    lines = [int(h.split(":")[1]) for h in scan(script)]
    assert lines == [7, 8, 9, 11, 14, 15, 16, 17, 18, 19, 20, 26, 29, 29], scan(script)


@pytest.mark.parametrize("text, found", [
    ("/plan", True), ("plan/val_indices", True), ("comm/allreduce", True),
    ("/comm/reduce_scatter/busbw_GBps", True), ("comm/buckets/bucket_3_s", True),
    ("/comm/{op}/bytes", True), ("iterations/step_s", True), ("profile/top_ops/self_s", True),
    ("comm/" + WILD, True), ("/comm/" + WILD + "/time_s", True),
    ("build/app/trainscope", False), ("inputs/cv/base.ini", False), ("/comm/<op>", False),
    ("profile/nothing", False), ("comm/a/b/c", False), ("///", False), ("comm/", False),
    ("iterations//step_s", False)])
def test_what_counts_as_a_path(text, found):
    assert is_path(text) is found


# --- the C++ writers ------------------------------------------------------------------------------
# Outside modules/io (the table and RunFile), C++ names run-file objects through the path constants
# of trainscope/io/schema.hpp: a string literal that is a schema path with its leading "/" (or a
# multi-segment one without it), or a single-segment group name passed to a RunFile writer, fails.
CPP_DIRS = ("modules", "app")
CPP_STRING = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
RUNFILE_CALL = re.compile(r"\b(?:set_attributes|write_string_dataset|declare_series|append|rows|"
                          r"columns|write_ragged|write_ragged_strings|write_per_rank|write_vector)"
                          r"\(\s*\"([^\"]*)\"")


def cpp_files(root=ROOT) -> list[Path]:
    return [p for d in CPP_DIRS for p in sorted((root / d).rglob("*"))
            if p.suffix in (".cpp", ".hpp", ".h", ".cu") and p.is_file()
            and (root / "modules" / "io") not in p.parents]


def code_of(line: str) -> str:
    """The line without a trailing // comment (a // inside a string literal is kept)."""
    masked = CPP_STRING.sub(lambda m: '"' + "x" * len(m.group(1)) + '"', line)
    cut = masked.find("//")
    return line if cut < 0 else line[:cut]


def cpp_scan(path: Path, shown: str = "") -> list[str]:
    """file:line: literal for each run-file path spelled in the C++ file."""
    found = []
    shown = shown or str(path.relative_to(ROOT))
    for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        code = code_of(line)
        for m in CPP_STRING.finditer(code):
            text = m.group(1)
            if text != "/" and (text.startswith("/") or "/" in text.strip("/")) and is_path(text):
                found.append(f"{shown}:{no}: {text!r}")
        for m in RUNFILE_CALL.finditer(code):
            found.append(f"{shown}:{no}: {m.group(1)!r} passed to a RunFile writer")
    return found


def test_cpp_writers_name_run_file_paths_through_the_schema_constants():
    files = cpp_files()
    assert any(p.name == "run_file_tables.cpp" for p in files)  # the writers are scanned
    assert not any(p.name == "schema_table.cpp" for p in files)  # the table may spell them
    found = [f for p in files for f in cpp_scan(p)]
    assert not found, ("run-file paths spelled in C++ outside modules/io; use the constants of "
                       "trainscope/io/schema.hpp (schema::kPlan, schema::with_part(...)):\n"
                       + "\n".join(found))


def test_a_planted_cpp_path_literal_is_found(tmp_path):
    planted = tmp_path / "writer.cpp"
    planted.write_text('void f(io::RunFile& file) {\n'
                       '    file.set_attributes("/plan", {});\n'
                       '    file.declare_series("iterations", {});\n'
                       '    file.write_vector("/comm/allreduce/bytes", {}, "B");\n'
                       '    log("see /tmp, a/b and the rank"); // "/plan" in a comment\n'
                       '    file.set_attributes(schema::kPlan, {{"global_batch", 1}});\n'
                       '    o << dir << "/rank" << r;\n'
                       '}\n')
    found = cpp_scan(planted, "writer.cpp")
    assert sorted({int(f.split(":")[1]) for f in found}) == [2, 3, 4], found
