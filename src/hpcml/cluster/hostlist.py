"""Slurm hostlists (``n[001-004,007]``), expanded and folded with Slurm's own semantics.

Order is meaning here: SLURM_JOB_NODELIST lists a job's nodes in slurmctld's node order
(slurm.conf's, or by name or topology rank from Slurm 22.05) and srun gives rank 0 the
first. So ``expand`` does what Slurm's ``hostlist_create`` (src/common/hostlist.c) does:
input order kept, duplicates kept, a range padded to the width of its first bound
(``n[009-11]`` is ``n009,n010,n011``), several bracket groups in one name expanded in
Slurm's order (the last group varies fastest, then the first, second, ...), text after the
last bracket kept (Slurm 23.02+), blanks and commas as separators, and Slurm's limit of
65536 hosts per range. ``fold`` is Slurm's ``hostlist_ranged_string``: order kept, so
``expand(fold(nodes)) == nodes``; ``fold(nodes, sort=True)`` is the set, sorted and
deduplicated, for where order means nothing (people, ``srun --exclude``).

Written by hand: ClusterShell's NodeSet sorts and deduplicates; python-hostlist drops
duplicates unless told, orders the product of three or more bracket groups otherwise than
Slurm and is GPL (hpcml is BSD). Stricter than Slurm where Slurm takes a typo only by
accident of its C parsing (``n]``, ``n[[1]``, ``n[1-]``, ``n[+1]``, blanks in brackets):
Slurm never writes them, and a person who types them meant something else. Beyond Slurm,
one expression may not expand to more than ``MAX_HOSTS`` hosts (memory, not syntax).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from hpcml.errors import UsageError
from hpcml.words import natural_key

MAX_RANGE = 65536            # Slurm's MAX_RANGE: hosts in one lo-hi range
MAX_HOSTS = 1 << 20          # hpcml's: hosts from one expression (n[1-65536][1-65536] is 4e9)
MAX_GROUPS = 16              # hpcml's: bracket groups in one name (a 3-D torus needs 3)
MAX_NAME = 255               # characters of one expanded name (a DNS name's limit; Slurm's are 64)
_SEPARATORS = " \t\n,"       # Slurm's hostlist_create: "\t, \n"
_RANGE = re.compile(r"([0-9]{1,18})(?:-([0-9]{1,18}))?")    # 18 digits: a number Slurm's C reads
_NUMBERED = re.compile(r"(.*?)([0-9]+)")


def _bad(hostlist: str, problem: str) -> UsageError:
    return UsageError(f"not a valid hostlist '{hostlist}': {problem}")


def _tokens(hostlist: str) -> Iterator[str]:
    """Names and bracketed names, split on separators outside brackets (Slurm's _next_tok)."""
    token, inside = "", False
    for ch in hostlist:
        if ch == "[":
            if inside:
                raise _bad(hostlist, "'[' inside brackets")
            inside = True
        elif ch == "]":
            if not inside:
                raise _bad(hostlist, "']' without '['")
            inside = False
        elif ch in _SEPARATORS and not inside:
            if token:
                yield token
            token = ""
            continue
        token += ch
    if inside:
        raise _bad(hostlist, "'[' without ']'")
    if token:
        yield token


def _values(hostlist: str, inner: str) -> list[str]:
    """``"1-3,07"`` -> ``["1", "2", "3", "07"]``: each range padded to its first bound's width."""
    out: list[str] = []
    for part in inner.split(","):
        m = _RANGE.fullmatch(part)
        if not m:
            raise _bad(hostlist, f"'{part}' in [{inner}] is not a number or a range lo-hi")
        lo_text, hi_text = m.group(1), m.group(2)
        lo, hi = int(lo_text), int(hi_text if hi_text is not None else lo_text)
        if lo > hi:
            raise _bad(hostlist, f"range {part} goes down")
        if hi - lo + 1 > MAX_RANGE:
            raise _bad(hostlist, f"range {part} has more than {MAX_RANGE} hosts (Slurm's limit)")
        width = len(lo_text)
        out += [f"{n:0{width}d}" for n in range(lo, hi + 1)]
    return out


def _count(hostlist: str, inner: str) -> int:
    """How many values ``_values`` would make of a bracket group, without making them."""
    n = 0
    for part in inner.split(","):
        m = _RANGE.fullmatch(part)
        if not m:
            raise _bad(hostlist, f"'{part}' in [{inner}] is not a number or a range lo-hi")
        n += max(int(m.group(2) if m.group(2) is not None else m.group(1)) - int(m.group(1)) + 1, 1)
    return n


def _expand_token(hostlist: str, token: str, room: int, limit: int = MAX_HOSTS) -> list[str]:
    """One name; with bracket groups g1..gn, Slurm's order: gn fastest, then g1, g2 ... gn-1."""
    pieces = re.split(r"\[([^\]]*)\]", token)       # literal, group, literal, ..., literal
    if len(pieces) == 1:
        if len(token) > MAX_NAME:
            raise _bad(hostlist, f"a name longer than {MAX_NAME} characters")
        return [token]
    if len(pieces) // 2 > MAX_GROUPS:
        raise _bad(hostlist, f"more than {MAX_GROUPS} bracket groups in one name")
    total, longest = 1, sum(map(len, pieces[0::2]))
    for g in pieces[1::2]:
        total *= _count(hostlist, g)      # counted before anything is made
        longest += max(len(n) for n in re.findall(r"[0-9]+", g)) if re.search(r"[0-9]", g) else 0
    if longest > MAX_NAME:
        raise _bad(hostlist, f"names longer than {MAX_NAME} characters")
    if total > room:
        raise _bad(hostlist, f"more than {limit} hosts")
    lits, groups = pieces[0::2], [_values(hostlist, g) for g in pieces[1::2]]
    last, out = groups[-1], list[str]()

    def push(k: int, tail: str) -> None:           # groups[0..k-1] still to choose; tail follows lits[k]
        if k == 0:
            out.extend(f"{tail}{v}{lits[-1]}" for v in last)
            return
        for v in groups[k - 1]:
            push(k - 1, f"{lits[k - 1]}{v}{tail}")

    push(len(groups) - 1, lits[-2])
    return out


def expand(hostlist: str, limit: int = MAX_HOSTS) -> list[str]:
    """``"n[1-3],gpu7"`` -> ``["n1", "n2", "n3", "gpu7"]``: Slurm's order, duplicates kept.
    More than ``limit`` hosts (at most ``MAX_HOSTS``) is refused before they are made."""
    limit = min(limit, MAX_HOSTS)
    hosts: list[str] = []
    for token in _tokens(hostlist or ""):
        room = limit - len(hosts)
        if room <= 0:
            raise _bad(hostlist, f"more than {limit} hosts")
        hosts += _expand_token(hostlist, token, room, limit)
    return hosts


def fold(nodes: Iterable[str], *, sort: bool = False) -> str:
    """``["n1", "n2", "n3", "n7"]`` -> ``"n[1-3,7]"`` (``""`` for none), in the nodes' order
    as Slurm's ``hostlist_ranged_string`` folds, so Slurm reads back the same list.
    ``sort=True``: the set, in natural order without duplicates, for people and options
    where order means nothing."""
    names = [n for n in nodes if n]
    for name in names:
        if any(c in name for c in "[]" + _SEPARATORS):
            raise UsageError(f"not a node name '{name}': a hostlist's brackets or separators in it")
    if sort:
        names = sorted(set(names), key=_natural)
    runs: list[tuple[str, int, int, int] | str] = []   # (prefix, lo, hi, width), or a name without number
    for name in names:
        m = _NUMBERED.fullmatch(name)
        if m is None:
            runs.append(name)
            continue
        prefix, digits = m.group(1), m.group(2)
        num, last = int(digits), runs[-1] if runs else None
        if (isinstance(last, tuple) and last[0] == prefix and last[2] + 1 == num
                and f"{num:0{last[3]}d}" == digits):
            runs[-1] = (prefix, last[1], num, last[3])
        else:
            runs.append((prefix, num, num, len(digits)))
    return ",".join(_bracketed(runs))


def _bracketed(runs: list[tuple[str, int, int, int] | str]) -> Iterator[str]:
    """Consecutive runs of one prefix in one bracket, as Slurm's _get_bracketed_list."""
    i = 0
    while i < len(runs):
        run = runs[i]
        if isinstance(run, str):
            yield run
            i += 1
            continue
        group = [run]
        while i + len(group) < len(runs):
            nxt = runs[i + len(group)]
            if not isinstance(nxt, tuple) or nxt[0] != run[0]:
                break
            group.append(nxt)
        i += len(group)
        parts = [f"{lo:0{w}d}" if lo == hi else f"{lo:0{w}d}-{hi:0{w}d}" for _, lo, hi, w in group]
        yield f"{run[0]}{parts[0]}" if len(group) == 1 and run[1] == run[2] else f"{run[0]}[{','.join(parts)}]"


def _natural(name: str) -> tuple[tuple[str | int, ...], int, int, int]:
    """Slurm's ``hostlist_sort``: prefixes in natural order, a name without number first,
    then by width of the number (``n9``, ``n10``, ``n09``: 09 is another host than 9), then value."""
    m = _NUMBERED.fullmatch(name)
    prefix, digits = (name, "") if m is None else (m.group(1), m.group(2))
    return tuple(natural_key(prefix)), int(m is not None), len(digits), int(digits or 0)
