"""A blueprint and the services it depends on, loaded, checked and put in start order."""

from __future__ import annotations

from pathlib import Path

from hpcml.errors import UsageError
from hpcml.service import catalogue
from hpcml.service.blueprint import Blueprint, load
from hpcml.service.checks import check


def _find_dep(name: str, beside: Path) -> Path:
    local = beside.parent / f"{name}.yaml"     # a dependency beside the blueprint wins
    return local if local.is_file() else catalogue.find(name)


def with_dependencies(ref: str, options: dict[str, str] | None = None) -> list[Blueprint]:
    """The blueprint ``ref`` (a name or a file) last, its dependencies before it (deepest
    first); a missing dependency or a cycle is exit 2 naming ``depends_on``. ``options``
    (``--set``) apply to ``ref`` itself. Every command taking a blueprint (validate, up,
    render) loads it here, so each runs the same checks (``checks.check``)."""
    order: list[Blueprint] = []
    seen: dict[str, Blueprint] = {}

    def visit(path: Path, chain: tuple[str, ...]) -> Blueprint:
        bp = load(path)
        if bp.name in chain:
            raise UsageError(f"dependency cycle: {' -> '.join((*chain, bp.name))}", file=str(path), key="depends_on")
        if bp.name in seen:
            return seen[bp.name]
        for dep in bp.depends_on:
            try:
                dep_path = _find_dep(dep, path)
            except UsageError:
                raise UsageError(f"no blueprint called '{dep}'", file=str(path), key="depends_on") from None
            visit(dep_path, (*chain, bp.name))
        seen[bp.name] = bp
        order.append(bp)
        return bp

    visit(catalogue.find(ref), ())
    if options:
        order[-1] = order[-1].with_options(options)
    check(order)
    return order
