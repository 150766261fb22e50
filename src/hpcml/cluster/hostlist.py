"""Slurm hostlists (``n[001-004,007]``), expanded and folded by ClusterShell's NodeSet.

ClusterShell is the field's well-kept implementation of the hostlist syntax (multi-range,
padding, several bracket groups); we only give it names that read well here.
"""

from __future__ import annotations

from collections.abc import Iterable

from hpcml.errors import UsageError


def expand(hostlist: str) -> list[str]:
    """``"n[1-3],gpu7"`` -> ``["n1", "n2", "n3", "gpu7"]`` in Slurm's order."""
    if not hostlist or not hostlist.strip():
        return []
    from ClusterShell.NodeSet import NodeSet, NodeSetParseError  # ~50 ms: when a list is read
    try:
        return list(NodeSet(hostlist.strip()))
    except NodeSetParseError as exc:
        raise UsageError(f"not a valid hostlist '{hostlist}': {exc}") from None


def fold(nodes: Iterable[str]) -> str:
    """``["n1", "n2", "n3"]`` -> ``"n[1-3]"`` (empty string for no nodes)."""
    names = [n for n in nodes if n]
    if not names:
        return ""
    from ClusterShell.NodeSet import NodeSet
    return str(NodeSet.fromlist(names))
