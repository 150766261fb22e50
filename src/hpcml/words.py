"""Counted nouns in messages ("1 node", "2 nodes"): a researcher reads the line, and
"1 nodes" or "node(s)" reads as careless. No imports, so the fast paths (scan) may use it."""

from __future__ import annotations


def plural(n: int, word: str, words: str | None = None) -> str:
    """``plural(1, "node")`` -> "1 node"; ``plural(3, "check")`` -> "3 checks"; ``words`` for
    irregular ones (``plural(2, "was", "were")``)."""
    return f"{n} {word if n == 1 else (words or word + 's')}"
