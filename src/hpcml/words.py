"""Counted nouns in messages ("1 node", "2 nodes"): a researcher reads the line, and
"1 nodes" or "node(s)" reads as careless; names sorted and printed as a reader expects them.
Only the standard library's ``re``, so the fast paths (scan) may use it."""

from __future__ import annotations

import re


def plural(n: int, word: str, words: str | None = None) -> str:
    """``plural(1, "node")`` -> "1 node"; ``plural(3, "check")`` -> "3 checks"; ``words`` for
    irregular ones (``plural(2, "was", "were")``)."""
    return f"{n} {word if n == 1 else (words or word + 's')}"


def ranges(numbers: list[int] | set[int]) -> str:
    """Ranks as a reader scans them: ``0, 1, 4-7, 9`` (sorted; runs of three or more folded)."""
    ranks = sorted(set(numbers))
    out: list[str] = []
    start = None
    for i, r in enumerate(ranks):
        start = r if start is None else start
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            out += [f"{start}-{r}"] if r - start >= 2 else [str(q) for q in range(start, r + 1)]
            start = None
    return ", ".join(out)


def printable(name: str, limit: int = 120) -> str:
    """A name from a file or a peer as printed: escapes instead of newlines and control
    characters (no fake lines, no terminal escape sequences), cut to ``limit``."""
    text = name if name.isprintable() else ascii(name)[1:-1]
    return text if len(text) <= limit else text[:limit] + "..."


#: a sentence of ours that carries names (a finding, a summary line): printed whole
LINE_MAX = 4000


def shown(value: object, limit: int = 120) -> str:
    """A name from a file or a peer inside Rich output: ``printable``, and escaped so that
    Rich reads none of it as markup (``[/x]`` would end the command with an error,
    ``[link=...]`` make a hyperlink, ``[green]`` fake a verdict)."""
    from rich.markup import escape
    return escape(printable(str(value), limit))


def natural_key(s: str) -> list:
    """Sort key that puts ``nid2`` before ``nid10`` (node, rank and file names)."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", s)]


def node_name(name: object) -> str:
    """A node's name for a sentence: "an unknown node" where no record named it, never "None"."""
    return str(name) if name else "an unknown node"
