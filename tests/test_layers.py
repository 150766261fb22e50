"""No import cycle between hpcml's packages, lazy (function-level) imports included.

A package is the first level under ``hpcml`` (``hpcml.observe``, ``hpcml.samplers``, a
top-level module such as ``hpcml.files``). The command lines are one layer above all of
them: ``hpcml.cli*``, ``hpcml.__main__`` and every ``hpcml.<component>.cli`` count as
``CLI`` (a component's CLI may use any library package; no library package may use a CLI).
The graph is grimp's (the engine of import-linter), which reads every import statement of
every module, inside functions too.
"""

from __future__ import annotations

import collections

import grimp

#: cycles known and not yet broken, each with the reason; a new cycle, or a known one
#: grown by another package, fails. None today.
KNOWN: set[frozenset[str]] = set()


def layer(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) < 2:
        return None
    if parts[1] in ("cli", "cli_app", "cli_support", "cli_report", "__main__") or parts[2:3] == ["cli"]:
        return "CLI"
    return parts[1]


def package_graph() -> dict[str, dict[str, list[tuple[str, str]]]]:
    graph = grimp.build_graph("hpcml", cache_dir=None)
    edges: dict[str, dict[str, list[tuple[str, str]]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    for module in graph.modules:
        a = layer(module)
        for imported in graph.find_modules_directly_imported_by(module):
            b = layer(imported)
            if a and b and a != b:
                edges[a][b].append((module, imported))
    return edges


def cycles(edges) -> list[set[str]]:
    """Strongly connected components of more than one package (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in list(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in list(edges):
        if v not in index:
            visit(v)
    return out


def test_no_package_imports_back_into_a_package_that_imports_it():
    edges = package_graph()
    found = [c for c in cycles(edges) if frozenset(c) not in KNOWN]
    detail = [f"{a} -> {b}: {', '.join(f'{m} imports {i}' for m, i in edges[a][b][:3])}"
              for c in found for a in sorted(c) for b in sorted(edges[a]) if b in c]
    assert not found, "import cycles between packages:\n" + "\n".join(detail)


def test_no_library_package_imports_a_command_line():
    edges = package_graph()
    up = [f"{a} -> CLI: {edges[a]['CLI'][:3]}" for a in edges if a != "CLI" and "CLI" in edges[a]]
    assert not up, "\n".join(up)


def module_graph() -> dict[str, dict[str, list[tuple[str, str]]]]:
    """Every import between two files (a package's ``__init__`` counts as its own file)."""
    graph = grimp.build_graph("hpcml", cache_dir=None)
    edges: dict[str, dict[str, list[tuple[str, str]]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            if imported != module and not module.startswith(imported + "."):   # a file's own package
                edges[module][imported].append((module, imported))
    return edges


def test_no_file_imports_back_into_a_file_that_imports_it():
    """Inside a package too: each circle was over one name that belonged lower (issue 64)."""
    edges = module_graph()
    found = cycles(edges)
    detail = [f"{a} -> {b}" for c in found for a in sorted(c) for b in sorted(edges[a]) if b in c]
    assert not found, "import circles between files:\n" + "\n".join(detail)


def test_the_check_sees_a_lazy_cycle():
    """The checker itself: a function-level import back is a cycle."""
    edges: dict = collections.defaultdict(lambda: collections.defaultdict(list))
    edges["a"]["b"].append(("hpcml.a.x", "hpcml.b.y"))
    edges["b"]["a"].append(("hpcml.b.y", "hpcml.a.x"))
    edges["b"]["c"].append(("hpcml.b.y", "hpcml.c.z"))
    assert cycles(edges) == [{"a", "b"}]
