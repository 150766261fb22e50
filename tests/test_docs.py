"""The documentation keeps its promises.

- ``docs/environment.md`` has a row for every ``HPCML_*`` variable that the code under
  ``src/hpcml`` names: read with ``os.environ``, kept in a constant, set for a child, built
  with an f-string (``f"HPCML_FARM_{...}"``, a family documented as ``HPCML_FARM_<...>``),
  or named in a docstring or a help text. It names none that nothing uses any more.
- The site builds with ``mkdocs build --strict`` into a temporary directory (nothing is
  written into the checkout): a broken link, a missing anchor or a page left out of the
  navigation fails.
- Every component (a package with a command line) has its page, and README.md starts with a
  table of contents that leads to every page.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tokenize
from pathlib import Path

from tests import needs

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "hpcml"
DOCS = ROOT / "docs"
NAME = re.compile(r"(?<![A-Za-z0-9_])HPCML_[A-Z0-9_]*")
#: tokens whose text may name a variable: strings (f-strings included), comments
TEXT_TOKENS = {tokenize.STRING, tokenize.COMMENT} | {getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}
#: files beside the code that may set or name one (the site hooks file sets HPCML_SSH_PORT)
DATA_SUFFIXES = {".yaml", ".yml", ".json", ".toml", ".sh", ".j2", ".txt"}


def names_in_source() -> dict[str, set[str]]:
    """Each ``HPCML_*`` name under src/hpcml -> the files that name it. Python is read token
    by token, so a Python identifier that happens to start with ``HPCML_`` (a constant such
    as ``env.model.HPCML_PREFIX``) is not a variable; a name that ends in ``_`` is the prefix
    of a family built at run time."""
    found: dict[str, set[str]] = {}
    for path in sorted(SRC.rglob("*")):
        if "__pycache__" in path.parts or not path.is_file():
            continue
        rel = str(path.relative_to(ROOT))
        if path.suffix == ".py":
            with tokenize.open(path) as f:
                texts = [t.string for t in tokenize.generate_tokens(f.readline) if t.type in TEXT_TOKENS]
        elif path.suffix in DATA_SUFFIXES:
            texts = [path.read_text(errors="replace")]
        else:
            continue
        for text in texts:
            for name in NAME.findall(text):
                found.setdefault(name, set()).add(rel)
    return found


def documented() -> tuple[set[str], set[str]]:
    """The variables with a row in docs/environment.md (the name in the row's first cell),
    and the prefixes of the families documented as ``HPCML_X_<WHAT>`` or ``HPCML_X_*``."""
    names, families = set(), set()
    for line in (DOCS / "environment.md").read_text().splitlines():
        if not line.startswith("| `HPCML_"):
            continue
        first = line.split("|")[1]
        for m in re.finditer(r"`(HPCML_[A-Z0-9_]*)(<[A-Za-z_]+>|\*)?`", first):
            (families if m.group(2) else names).add(m.group(1))
    return names, families


def test_every_variable_the_code_names_is_documented():
    names, families = documented()
    missing = []
    for name, where in sorted(names_in_source().items()):
        if name.endswith("_"):                       # a family's prefix, built at run time
            ok = any(name.startswith(f) or f.startswith(name) for f in families)
        else:
            ok = name in names or any(name.startswith(f) for f in families)
        if not ok:
            missing.append(f"{name} (named in {', '.join(sorted(where))})")
    assert not missing, "not in docs/environment.md (add a row: what it does, its default):\n" + "\n".join(missing)


def test_every_documented_variable_is_still_used():
    names, families = documented()
    assert len(names) > 40 and families, "docs/environment.md: no table rows found"
    used = names_in_source()
    for folder in ("tests", "scripts"):
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix in (".py", ".sh", ""):
                for name in NAME.findall(path.read_text(errors="replace")):
                    used.setdefault(name, set())
    stale = sorted(n for n in names if n not in used) + sorted(f + "*" for f in families if f not in used)
    assert not stale, "docs/environment.md documents variables nothing names any more: " + ", ".join(stale)


def test_the_check_sees_constants_and_f_strings_but_not_identifiers(tmp_path, monkeypatch):
    """The scanner itself: a constant and an f-string prefix count, an identifier does not."""
    pkg = tmp_path / "src" / "hpcml"
    pkg.mkdir(parents=True)
    (pkg / "m.py").write_text('HPCML_PREFIX = "com.hpcml."\nENV = "HPCML_A_B"\n'
                              'def f(x):\n    return f"HPCML_FAM_{x}"  # and HPCML_C\n')
    monkeypatch.setattr(sys.modules[__name__], "SRC", pkg)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert set(names_in_source()) == {"HPCML_A_B", "HPCML_FAM_", "HPCML_C"}


def test_the_site_builds_strictly(tmp_path):
    needs.module("mkdocs")
    site = tmp_path / "site"
    p = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                        "-d", str(site)], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})   # the hook must leave no __pycache__
    assert p.returncode == 0, p.stdout + p.stderr
    for page in [*(p.stem for p in DOCS.glob("*.md")), "readme", "contributing"]:
        built = site / "index.html" if page == "index" else site / page / "index.html"
        assert built.is_file(), f"{page}: not built"
    assert not (ROOT / "site").exists() and not list(DOCS.rglob("__pycache__"))


def test_every_component_has_its_page():
    components = sorted(p.parent.parent.name for p in SRC.glob("*/cli/__init__.py"))
    assert len(components) >= 10, components
    missing = [c for c in components if not (DOCS / f"{c}.md").is_file()]
    assert not missing, f"no page in docs/ for: {missing}"


def test_the_readme_starts_with_contents_leading_to_every_page():
    text = (ROOT / "README.md").read_text()
    first = re.search(r"^## (.+)$", text, re.M)
    assert first and first.group(1) == "Contents", "README.md's first section must be its table of contents"
    contents = text[first.end():].split("\n## ", 1)[0]
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if p.name != "index.md" and f"(docs/{p.name})" not in contents]
    assert not missing, f"README.md's contents do not link: {missing}"
    assert "(CONTRIBUTING.md)" in contents


def test_the_readme_sweep_is_the_farm_page_sweep():
    """README.md shows the farm's sweep file (tests/farm/test_sweep.py runs it); the farm's
    page shows the same one."""
    def sweep(text: str) -> str:
        return text.split("# sweep.yaml", 1)[1].split("```", 1)[0]
    assert sweep((ROOT / "README.md").read_text()) == sweep((DOCS / "farm.md").read_text())
