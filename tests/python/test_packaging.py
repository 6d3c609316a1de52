"""Packaging facts a user relies on before running anything: the Python the post-processing
package declares (pyproject's requires-python) is the one its code needs, as vermin (a static
minimum-version analyser) reads it from every module; analysis (trainscope_post) does not depend
on job execution (trainscope_jobs), and no module finds the clone by counting directories."""

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
POST = ROOT / "postprocess" / "trainscope_post"
JOBS = ROOT / "postprocess" / "trainscope_jobs"


def test_requires_python_is_what_the_code_needs():
    pytest.importorskip("vermin", reason="scripts/setup --tests installs vermin")
    declared = tomllib.loads((ROOT / "postprocess/pyproject.toml").read_text())
    spec = declared["project"]["requires-python"]
    m = re.fullmatch(r">=\s*3\.(\d+)", spec.strip())
    assert m, f"requires-python {spec!r}: expected '>=3.N'"
    vermin = Path(sys.executable).with_name("vermin")  # the venv's console script
    proc = subprocess.run([str(vermin), "--no-tips", "--eval-annotations", str(POST), str(JOBS)],
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    found = re.search(r"Minimum required versions: (?:[^,\n]*, )?3\.(\d+)", out)
    assert found, out
    # The declared minimum is exactly what the code needs: not lower (it would install and then
    # fail at `import tomllib`), not higher (it would refuse a Python that works).
    assert int(m.group(1)) == int(found.group(1)), (spec, out)


def _modules(package: Path) -> dict[str, ast.Module]:
    return {str(f.relative_to(package.parent)): ast.parse(f.read_text(), str(f))
            for f in sorted(package.rglob("*.py"))}


def _imported(tree: ast.Module, package: str, module: str) -> set[str]:
    """The top-level packages a module imports (relative imports resolved within `package`;
    `module` is its path relative to postprocess/)."""
    depth = module.count("/")  # trainscope_jobs/schedulers/slurm.py: 2
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                out.add(node.module.split(".")[0])
            elif node.level > depth:  # `from ...x` above the package: into the clone
                out.add("<above the package>")
            else:
                out.add(package)
    return out


def test_analysis_does_not_import_job_execution():
    """trainscope_post (run files, tables, report, model, advise) imports nothing of
    trainscope_jobs (sweeps, studies, co-allocation, schedulers); the reverse is allowed."""
    post, jobs = _modules(POST), _modules(JOBS)
    assert "trainscope_post/runfile.py" in post and "trainscope_jobs/sweep.py" in jobs
    assert "trainscope_jobs/schedulers/slurm.py" in jobs
    bad = [f"{m} imports {sorted(found)}" for m, tree in post.items()
           if (found := _imported(tree, "trainscope_post", m) & {"trainscope_jobs",
                                                                  "<above the package>"})]
    bad += [f"{m} imports from above its package" for m, tree in jobs.items()
            if "<above the package>" in _imported(tree, "trainscope_jobs", m)]
    assert not bad, bad
    # Every relative import names a module of its own package (one left from before the split,
    # inside a function, would fail only when that function runs).
    for package in (POST, JOBS):
        for m, tree in _modules(package).items():
            here = (package.parent / m).parent
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.level:
                    base = here
                    for _ in range(node.level - 1):
                        base = base.parent
                    names = [node.module] if node.module else [a.name for a in node.names]
                    for name in names:
                        target = base.joinpath(*name.split("."))
                        if not (target.with_suffix(".py").is_file() or target.is_dir()):
                            bad.append(f"{m}:{node.lineno}: from {'.' * node.level}{name}")
    assert not bad, bad
    # The moved modules are not left behind as shims.
    for name in ("sweep", "study_runner", "study_cmd", "coalloc", "launch"):
        assert not (POST / f"{name}.py").exists(), name
        assert (JOBS / f"{name}.py").exists(), name


def test_no_module_counts_parent_directories_to_find_the_clone():
    """Only trainscope_jobs/paths.py locates the tree (TRAINSCOPE_ROOT, else the directory above
    the package holding jobscripts/); nothing takes `parents[N]` or `.parent.parent`, and
    `__file__` elsewhere names only a file beside the module (package data: .with_name)."""
    bad = []
    for m, tree in {**_modules(POST), **_modules(JOBS)}.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and \
                    node.value.attr == "parents":
                bad.append(f"{m}:{node.lineno}: parents[...]")
            if isinstance(node, ast.Attribute) and node.attr == "parent" and \
                    isinstance(node.value, ast.Attribute) and node.value.attr == "parent":
                bad.append(f"{m}:{node.lineno}: .parent.parent")
        text = ast.unparse(tree)
        if m != "trainscope_jobs/paths.py":
            uses = re.findall(r"__file__\)?(\.\w+)?", text)
            bad += [f"{m}: __file__{u}" for u in uses if u != ".with_name"]
    assert not bad, bad


def test_one_default_binary_and_root_rule(tmp_path, monkeypatch):
    """paths.default_binary(): TRAINSCOPE_BINARY, else <root>/build/app/trainscope when built,
    else trainscope on PATH, else <root>/build/app/trainscope (reported as not built); root():
    TRAINSCOPE_ROOT, else the tree the package sits in (this clone)."""
    sys.path.insert(0, str(ROOT / "postprocess"))
    from trainscope_jobs import paths
    monkeypatch.delenv("TRAINSCOPE_ROOT", raising=False)
    monkeypatch.delenv("TRAINSCOPE_BINARY", raising=False)
    assert paths.root() == ROOT.resolve()
    tree = tmp_path / "tree"
    monkeypatch.setenv("TRAINSCOPE_ROOT", str(tree))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert paths.root() == tree and paths.jobscripts() == tree / "jobscripts"
    built = tree / "build" / "app" / "trainscope"
    assert paths.default_binary() == built  # nothing anywhere: the name the error will give
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "trainscope").write_text("#!/bin/sh\n")
    (tmp_path / "bin" / "trainscope").chmod(0o755)
    assert paths.default_binary() == (tmp_path / "bin" / "trainscope").resolve()
    built.parent.mkdir(parents=True)
    built.write_text("")
    assert paths.default_binary() == built  # the tree's own build wins over PATH
    monkeypatch.setenv("TRAINSCOPE_BINARY", "/opt/ts/bin/trainscope")
    assert paths.default_binary() == Path("/opt/ts/bin/trainscope")
    assert paths.under_root("inputs/a.ini") == tree / "inputs/a.ini"
    assert paths.under_root("/abs/a.ini") == Path("/abs/a.ini")


def _anchors(md: Path) -> set[str]:
    """GitHub's anchors of a Markdown file: <a id="..."> elements, and its headings' (lower case,
    punctuation dropped, spaces to dashes, a -N suffix for repeats)."""
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    text = md.read_text()
    out.update(re.findall(r'<a id="([^"]+)"', text))  # explicit anchors
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip()
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_every_relative_link_in_the_docs_reaches_a_file_and_anchor():
    """README, docs/ and jobscripts/README.md: every relative link names a file that exists and,
    with #anchor, a heading of that file (a renamed section breaks the links into it)."""
    pages = [ROOT / "README.md", ROOT / "jobscripts/README.md",
             *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # http:, https:, mailto:
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
