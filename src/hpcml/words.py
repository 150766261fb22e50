"""Counted nouns in messages ("1 node", "2 nodes"): a researcher reads the line, and
"1 nodes" or "node(s)" reads as careless. No imports, so the fast paths (scan) may use it."""

from __future__ import annotations


def plural(n: int, word: str, words: str | None = None) -> str:
    """``plural(1, "node")`` -> "1 node"; ``plural(3, "check")`` -> "3 checks"; ``words`` for
    irregular ones (``plural(2, "was", "were")``)."""
    return f"{n} {word if n == 1 else (words or word + 's')}"


def ranges(numbers: list[int] | set[int]) -> str:
    """Ranks as a reader scans them: ``0-3, 5, 8-15`` (sorted, runs folded)."""
    out: list[str] = []
    run: list[int] = []
    for n in sorted(set(numbers)):
        if run and n == run[-1] + 1:
            run.append(n)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [n]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(out)
