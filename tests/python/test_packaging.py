"""Packaging facts a user relies on before running anything: the Python the post-processing
package declares (pyproject's requires-python) is the one its code needs, as vermin (a static
minimum-version analyser) reads it from every module."""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "postprocess" / "trainscope_post"


def test_requires_python_is_what_the_code_needs():
    pytest.importorskip("vermin", reason="scripts/setup --tests installs vermin")
    declared = tomllib.loads((ROOT / "postprocess/pyproject.toml").read_text())
    spec = declared["project"]["requires-python"]
    m = re.fullmatch(r">=\s*3\.(\d+)", spec.strip())
    assert m, f"requires-python {spec!r}: expected '>=3.N'"
    vermin = Path(sys.executable).with_name("vermin")  # the venv's console script
    proc = subprocess.run([str(vermin), "--no-tips", "--eval-annotations", str(PACKAGE)],
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    found = re.search(r"Minimum required versions: (?:[^,\n]*, )?3\.(\d+)", out)
    assert found, out
    # The declared minimum is exactly what the code needs: not lower (it would install and then
    # fail at `import tomllib`), not higher (it would refuse a Python that works).
    assert int(m.group(1)) == int(found.group(1)), (spec, out)


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
