"""Runs of same-shaped plain-data items, checked in C by a pattern compiled from their shape.

Why: the walker (``picklewalk``) dispatches every opcode in Python (~4M opcodes/s), and an
object-heavy pickle is mostly one item shape repeated: a list of a million
``{'a': i, 'b': str(i), 'c': [i, i + 1]}`` is one opcode sequence whose arguments differ.
At a MARK the walker hands the batch to ``fast_forward``, which reads the first items with
a small Python model of the unpickler (``learn``: the same stack, marks, memo numbering
and tuple depths as the walker, for plain opcodes only), and when two items have the same
shape compiles that shape to a regular expression and lets ``re`` (C) match the items that
follow. A shape names every opcode; only arguments vary, and only where any value reads
the same way: a number (1-8 byte integers, floats, None, bools) or a short ASCII string
(valid UTF-8 by construction); memo reads are fixed keys the walker already holds; memo
writes are MEMOIZE, or BINPUT/LONG_BINPUT keys checked to be the next ones in sequence.

Why a match proves what the walk would: the expression admits exactly the byte sequences
that tokenise, opcode by opcode, as the learned items did, with no opcode that imports,
calls, reads a persistent id or holds bytes (a nested pickle): so every matched item has
the learned item's effect on the stack and memo (its placeholders: a number or container
is opaque, a string unknown, a tuple its depth), which is applied in bulk. The walk's
other checks (frames, globals, calls, the memo bound, tuple depth) see the same state
they would have seen. Strings read here are not kept: if the walk then meets anything but
plain data (an import, an error), ``PickleWalker.walk`` walks the pickle again without
this path, so a finding never rests on a value skipped here.

Written by hand: no library tokenises pickles at C speed without building the objects
(``_pickle`` builds them: 14x the file in memory; ``pickletools`` is Python).
"""

from __future__ import annotations

import re
import struct
import sys
from array import array
from dataclasses import dataclass, replace

from hpcml.scan.walkvalues import _PUSHED, EVICTED, MAX_TUPLE_DEPTH, OPAQUE, Nested, Opaque, PickleError, Unknown

MAX_TOKENS = 96                 # opcodes in one learned unit (one item, or a key and its value)
MAX_UNIT = MAX_TOKENS * 260 + 16   # bytes one unit can span (a short string is 257, a FRAME 9)
#: pattern bytes one walk may compile before it stops trying new shapes: a count, not a
#: clock, so a scan decides alike on a busy machine (compiling costs ~1.4 us a byte: ~0.5 s)
COMPILE_BUDGET = 384 << 10
MAX_WAIT = 1 << 12              # MARKs skipped after repeated failures (doubling from 1)
MIN_RUN = 2                     # items a pattern must match for the try to count as a success
MAX_RELEARN = 16                # new shapes one batch may switch to
PROBE = 3                       # values after a unit modelled to see that none of them takes it apart
MAX_ODD = 8                     # items of no run one batch may take by the model
#: compiled patterns by shape (the patterns only: what a unit does is learned from each file)
_CACHE: dict[tuple, tuple[re.Pattern, re.Pattern]] = {}
_CACHE_MAX = 256

_U4 = struct.Struct("<I").unpack_from
_U8 = struct.Struct("<Q").unpack_from
_ATOM_LEN = {0x4B: 1, 0x4D: 2, 0x4A: 4, 0x47: 8, 0x4E: 0, 0x88: 0, 0x89: 0}
_STRUCT = frozenset(b"(}])eusat\x85\x86\x87")
_ANY = rb"[\s\S]"
#: any number: BININT1/2, BININT, BINFLOAT, NONE, NEWTRUE/NEWFALSE, LONG1 of up to 8 bytes
_ATOM_RE = (rb"(?:K" + _ANY + rb"|J" + _ANY + rb"{4}|M" + _ANY + rb"{2}|G" + _ANY + rb"{8}|N|\x88|\x89|\x8a(?:\x00|"
            + b"|".join(re.escape(bytes([n])) + _ANY + b"{%d}" % n for n in range(1, 9)) + rb"))")
#: SHORT_BINUNICODE and BINUNICODE of up to 255 bytes of ASCII text (valid UTF-8 whatever
#: the unpickler's error handler)
_STR_RE = (rb"\x8c(?:\x00|" + b"|".join(re.escape(bytes([n])) + rb"[\x00-\x7f]" + (b"{%d}" % n if n > 1 else b"")
                                        for n in range(1, 256)) + rb")")
_TEXT_RE = (rb"X(?:\x00\x00\x00\x00|" + b"|".join(re.escape(bytes([n])) + rb"\x00\x00\x00[\x00-\x7f]"
                                                    + (b"{%d}" % n if n > 1 else b"") for n in range(1, 256)) + rb")")
_POSSESSIVE = sys.version_info >= (3, 11)
_LITTLE = sys.byteorder == "little" and array("I").itemsize == 4


_OBJ, _INT = 64, 32              # bytes a str or tuple (plus its length), an int, costs the walk, at most
#: what the items of one batch may be estimated to hold before the walk itself decides: the
#: walk keeps every tuple, string and number of a batch (placeholders here), and stops at
#: its memory bound (``picklewalk.WALK_MEMORY``, 128 MiB) with an error
HELD_MAX = 64 << 20
_LONG_TEXT = "X"                # a key token no pattern has: a unit holding it is taken by the model only


class _Mark:
    __slots__ = ()


_MARK = _Mark()


@dataclass
class _Unit:
    """What one learned unit is and does: where it ends, its shape, the placeholders it
    leaves on the stack, the presence codes of its memo writes ("M" MEMOIZE, "q"/"r"
    BINPUT/LONG_BINPUT) and the frame end after it (it may cross a FRAME)."""

    end: int
    key: tuple                  # every opcode, numbers by their encoding (a fixed-size item if no string)
    pushed: tuple
    kinds: bytes
    puts: str
    fend: int
    size: int = 0               # bytes of every item of ``key`` (0: strings make it vary)
    put_at: tuple = ()          # where each BINPUT/LONG_BINPUT opcode is in such an item
    gets: tuple = ()            # (key, category, depth) of each memo read, when it was learned
    held: int = 0               # bytes of the objects the walk would hold for one item (an upper estimate)


def _generic(key: tuple) -> tuple:
    """The shape with any number in place of each number's encoding."""
    return tuple("A" if type(t) is int and (t in _ATOM_LEN or t == 0x8A) or type(t) is tuple and t[0] == 0x8A
                 else t for t in key)


@dataclass
class _Shape:
    star: re.Pattern
    each: re.Pattern
    unit: _Unit


def _entry_of(w, key: int, offset: int):
    """(category, tuple depth, placeholder) of what a memo read pushes; None if the value
    is not plain data the walker holds (a global, a call's result, bytes)."""
    try:
        v = w._memo_get(key, offset)
    except PickleError:
        return None
    t = type(v)
    if t is str:
        return ("S", 0, v)
    if t is int or t is float or t is bool or v is None or isinstance(v, Opaque):
        return ("A", 0, v)
    if t is tuple:
        return ("T", w._depth_of(v), v)
    if t is Nested:
        return ("T", v.depth, v)
    if isinstance(v, Unknown):
        return ("V", 0, v)
    return None


def _kind(e) -> int:
    """The presence code (``PickleWalker._memo_put``) of a value this path does not keep."""
    cat, depth, ph = e
    if cat == "T":
        return 3 + depth
    if cat == "S" or cat == "V" and not isinstance(ph, Opaque):
        return 2
    return 1


def _placeholder(e):
    cat, depth, ph = e
    if cat == "T":
        return _PUSHED[3 + depth] if type(ph) is not Nested else ph
    if cat == "S":
        return EVICTED
    return ph


def learn(w, buf: bytes, pos: int, fend: int, want: int, memo_base: int) -> _Unit | None:
    """One unit from ``pos``: the shortest span that leaves ``want`` values at the batch's
    level and that what follows does not take apart (a TUPLE3 after three values makes
    them one item); None if there is none the model accepts."""
    min_end = pos
    for _ in range(MAX_TOKENS):
        unit = _learn(w, buf, pos, fend, want, memo_base, min_end)
        if type(unit) is not _Unit:
            return None
        after = _learn(w, buf, unit.end, unit.fend, PROBE, memo_base + len(unit.kinds), unit.end)
        if type(after) is not int:
            return unit
        min_end = after + 1                 # the opcode there pops into this unit: extend it
    return None


def _learn(w, buf: bytes, pos: int, fend: int, want: int, memo_base: int,  # noqa: C901
           min_end: int) -> _Unit | int | None:
    """Model one unit (``want`` stack items at the batch's level, ending at or after
    ``min_end``) from ``pos``; None if it is not plain data of the supported opcodes, is
    incomplete in ``buf``, or is not what the walker would accept; the offset of an opcode
    that pops below the unit's start (it belongs to an earlier unit). ``fend`` is the
    absolute end of the current frame: a FRAME exactly there is crossed as the unpickler
    crosses it."""
    r = w.r
    base = r.base
    end = len(buf)
    stop = min(end, fend - base)
    stack: list = []
    marks = 0
    key: list = []
    kinds = bytearray()
    puts = []
    put_at: list[int] = []
    gets: list[tuple] = []
    held = 0                            # bytes of objects the walk would hold for it (see _apply)
    framed = False
    p = pos
    tokens = 0
    while True:
        if p >= stop:
            if p == fend - base and p < end and buf[p] == 0x95 and p + 9 <= end:
                size = _U8(buf, p + 1)[0]
                fend = base + p + 9 + size
                if fend > r.end:
                    return None
                framed = True
                p += 9
                stop = min(end, fend - base)
                continue
            return None
        tokens += 1
        if tokens > MAX_TOKENS:
            return None
        op = buf[p]
        n = _ATOM_LEN.get(op)
        if n is not None:
            p += 1 + n
            if p > stop:
                return None
            stack.append(("A", 0, OPAQUE))
            key.append(op)
            held += _INT
        elif op == 0x8A:                                    # LONG1
            if p + 1 >= stop or buf[p + 1] > 8:
                return None
            key.append((op, buf[p + 1]))
            p += 2 + buf[p + 1]
            if p > stop:
                return None
            stack.append(("A", 0, OPAQUE))
            held += _INT
        elif op == 0x8C or op == 0x58:                      # SHORT_BINUNICODE, BINUNICODE
            head = 2 if op == 0x8C else 5
            if p + head > stop:
                return None
            n = buf[p + 1] if op == 0x8C else _U4(buf, p + 1)[0]
            q = p + head + n
            if q > stop or n > MAX_UNIT:
                return None
            text = buf[p + head:q]
            if n < 256 and text.isascii():
                key.append("S" if op == 0x8C else "U")
            else:
                try:                                        # as the unpickler decodes it
                    text.decode("utf-8", "surrogatepass")
                except UnicodeDecodeError:
                    return None
                key.append(_LONG_TEXT)                      # taken by the model, never matched
            p = q
            stack.append(("S", 0, EVICTED))
            held += _OBJ + n
        elif op == 0x68 or op == 0x6A:                      # BINGET, LONG_BINGET
            q = p + (2 if op == 0x68 else 5)
            if q > stop:
                return None
            k = buf[p + 1] if op == 0x68 else _U4(buf, p + 1)[0]
            if k >= w.memo_len:
                return None                                 # written by this run: varies per item
            e = _entry_of(w, k, base + p)
            if e is None:
                return None
            stack.append(e)
            key.append((op, k))
            gets.append((k, e[0], e[1]))
            p = q
        elif op == 0x94 or op == 0x71 or op == 0x72:        # MEMOIZE, BINPUT, LONG_BINPUT
            if not stack or stack[-1] is _MARK:
                return None
            if op == 0x94:
                p += 1
                key.append(op)
                puts.append("M")
            else:
                q = p + (2 if op == 0x71 else 5)
                if q > stop:
                    return None
                k = buf[p + 1] if op == 0x71 else _U4(buf, p + 1)[0]
                if k != memo_base + len(puts):
                    return None                             # not the numbering a pickler writes
                put_at.append(p - pos)
                p = q
                key.append(op)
                puts.append("q" if op == 0x71 else "r")
            kinds.append(_kind(stack[-1]))
        elif op in _STRUCT:
            p += 1
            key.append(op)
            if op == 0x28:                                  # MARK
                stack.append(_MARK)
                marks += 1
            elif op == 0x7D:
                stack.append(("D", 0, OPAQUE))
            elif op == 0x5D:
                stack.append(("L", 0, OPAQUE))
            elif op == 0x29:
                stack.append(("T", 1, ()))
            elif op == 0x65 or op == 0x75 or op == 0x74:    # APPENDS, SETITEMS, TUPLE
                if not marks:
                    return None
                i = len(stack) - 1
                while stack[i] is not _MARK:
                    i -= 1
                items = stack[i + 1:]
                del stack[i:]
                marks -= 1
                if op == 0x74:
                    depth = 1 + max((e[1] for e in items), default=0)
                    if depth > MAX_TUPLE_DEPTH:
                        return None
                    stack.append(("T", depth, None))
                    held += _OBJ + 8 * len(items)
                else:
                    need = "L" if op == 0x65 else "D"
                    if not stack or stack[-1] is _MARK or stack[-1][0] != need or op == 0x75 and len(items) % 2:
                        return None
            elif op == 0x61 or op == 0x73:                  # APPEND, SETITEM
                k = 1 if op == 0x61 else 2
                if len(stack) < k + 1 or any(e is _MARK for e in stack[-k - 1:]):
                    return None
                del stack[-k:]
                if stack[-1][0] != ("L" if op == 0x61 else "D"):
                    return None
            else:                                           # TUPLE1..3
                k = op - 0x84
                if len(stack) < k and not marks:
                    return p - 1
                if len(stack) < k or any(e is _MARK for e in stack[-k:]):
                    return None
                depth = 1 + max(e[1] for e in stack[-k:])
                if depth > MAX_TUPLE_DEPTH:
                    return None
                del stack[-k:]
                stack.append(("T", depth, None))
                held += _OBJ + 8 * k
        else:
            return None
        if not marks and p >= min_end and len(stack) >= want:
            if len(stack) > want:
                return None
            # what follows belongs to the unit if it memoizes its last value, or fills the
            # container it just made (a MARK that a TUPLE closes instead fails above)
            if p < stop:
                nxt = buf[p]
                if nxt == 0x94 or nxt == 0x71 or nxt == 0x72:
                    continue
                if (nxt == 0x28 or nxt == 0x61 or nxt == 0x73) and stack[-1][0] in ("L", "D"):
                    continue
                if 0x85 <= nxt <= 0x87:             # TUPLE1..3 take the last values: not done yet
                    continue
            size = 0 if framed or "S" in key or "U" in key or _LONG_TEXT in key else p - pos
            return _Unit(p, tuple(key), tuple(_placeholder(e) for e in stack), bytes(kinds), "".join(puts), fend,
                         size, tuple(put_at), tuple(gets), held)
        if not stack:
            return None


def _compile(unit: _Unit) -> tuple[re.Pattern, re.Pattern]:
    body, plain = [], []                # with a group per BINPUT key, and without any group
    for t in unit.key:
        if t == "A":
            part = grouped = _ATOM_RE
        elif type(t) is int and t in _ATOM_LEN:
            part = grouped = re.escape(bytes([t])) + (_ANY + b"{%d}" % _ATOM_LEN[t] if _ATOM_LEN[t] else b"")
        elif type(t) is tuple and t[0] == 0x8A:
            part = grouped = b"\\x8a" + re.escape(bytes([t[1]])) + (_ANY + b"{%d}" % t[1] if t[1] else b"")
        elif t == "S":
            part = grouped = _STR_RE
        elif t == "U":
            part = grouped = _TEXT_RE
        elif type(t) is tuple:
            op, k = t
            part = grouped = re.escape(bytes([op]) + (bytes([k]) if op == 0x68 else struct.pack("<I", k)))
        elif t == 0x71:
            part, grouped = b"q" + _ANY, b"q(" + _ANY + b")"
        elif t == 0x72:
            part, grouped = b"r" + _ANY + b"{4}", b"r(" + _ANY + b"{4})"
        else:
            part = grouped = re.escape(bytes([t]))
        plain.append(part)
        body.append(grouped)
    one = b"".join(plain)
    star = re.compile((b"(?:(?>" + one + b"))*+") if _POSSESSIVE else (b"(?:" + one + b")*"))
    # findall of a pattern with one empty group returns the shared empty bytes per item
    each = re.compile(b"".join(body) if _keyed(unit) else b"()" + one)
    return star, each


def _keyed(unit: _Unit) -> bool:
    """Whether the unit writes memo keys of its own (BINPUT, LONG_BINPUT): each is checked."""
    return "q" in unit.puts or "r" in unit.puts


def _shape(w, unit: _Unit) -> _Shape | None:
    got = _CACHE.get(unit.key)
    if got is None:
        if w.ff_spent > COMPILE_BUDGET:
            return None
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.clear()
        got = _CACHE[unit.key] = _compile(unit)
        w.ff_spent += len(got[0].pattern) + len(got[1].pattern)
    return _Shape(*got, unit)


def _current(w, unit: _Unit) -> bool:
    """Whether every memo key the unit reads still holds what it held when it was learned (a
    BINPUT between two batches may have put something else there)."""
    for k, cat, depth in unit.gets:
        e = _entry_of(w, k, 0)
        if e is None or e[0] != cat or e[1] != depth:
            return False
    return True


def _keys_ok(buf: bytes, pos: int, q: int, shape: _Shape, first: int, count: int) -> bool:
    """Whether the BINPUT/LONG_BINPUT keys of ``count`` matched items are the ones a pickler
    writes: each the memo's length at that point, as MEMOIZE would number it (the unpickler
    sizes its memo by the largest key: any other key could make it allocate what the file
    never held, or put a new value under a key an item reads)."""
    unit = shape.unit
    m = len(unit.kinds)
    last = first + count * m
    where = [j for j, c in enumerate(unit.puts) if c != "M"]      # the q/r writes, in item order
    wide = [unit.puts[j] == "r" for j in where]
    if any(wide) and not _LITTLE:
        return False

    def expect(j: int, is_wide: bool) -> bytes | None:
        keys = range(first + j, last, m)
        if is_wide:
            return array("I", keys).tobytes()
        return bytes(keys) if not keys or keys[-1] < 256 else None

    if unit.size:                       # fixed-size items: every key is a strided slice of the bytes
        for j, at, is_wide in zip(where, unit.put_at, wide):
            want = expect(j, is_wide)
            if want is None:
                return False
            for b in range(4 if is_wide else 1):
                if buf[pos + at + 1 + b:q:unit.size] != (want[b::4] if is_wide else want):
                    return False
        return True
    found = shape.each.findall(buf, pos, q)
    if len(found) != count:
        return False
    for t, (j, is_wide) in enumerate(zip(where, wide)):
        want = expect(j, is_wide)
        got = b"".join(found) if len(where) == 1 else b"".join([item[t] for item in found])
        if want is None or got != want:
            return False
    return True


def _apply(w, stack: list, unit: _Unit, count: int) -> bool:
    """Give the walker ``count`` items of ``unit``'s effect (their memo keys checked);
    False, nothing changed, if they would outgrow what the walker tracks."""
    tracked = w.tracked_keys
    m = len(unit.kinds)
    first = w.memo_len
    last = first + count * m
    if last > tracked and any(k >= 5 for k in unit.kinds):
        return False                    # the walker would keep each one's depth in its memo dict
    if m:
        if first < tracked:
            whole, rest = divmod(min(last, tracked) - first, m)
            w.present.extend(unit.kinds * whole + unit.kinds[:rest])
        small = w.small
        for k in range(first, min(last, 256)):
            small[k] = _PUSHED[unit.kinds[(k - first) % m]]
        w.memo_len = last
    level, held = w.ff_held
    held = (held if level is stack else 0) + unit.held * count
    if held > HELD_MAX:
        # the walk would hold this batch's objects, and may pass its memory bound: it decides
        raise PickleError(f"a batch of items that would hold about {held >> 20} MiB in the walk")
    w.ff_held = (stack, held)
    stack.extend(unit.pushed * count)
    w.ff_items += count
    return True


def _run(w, stack: list, shape: _Shape, buf: bytes, pos: int, stop: int) -> int:
    """Apply the items of ``shape`` from ``pos``; the offset after the last (``pos``: none,
    the memo keys it reads hold other values now, or its memo keys are not the pickler's)."""
    unit = shape.unit
    if unit.gets and not _current(w, unit):
        return pos
    got = shape.star.match(buf, pos, stop)        # a starred pattern always matches, maybe nothing
    q = got.end() if got is not None else pos
    if q == pos:
        return pos
    count = (q - pos) // unit.size if unit.size else len(shape.each.findall(buf, pos, q))
    if _keyed(unit) and not _keys_ok(buf, pos, q, shape, w.memo_len, count):
        return pos
    return q if _apply(w, stack, unit, count) else pos


def _run_at(w, buf: bytes, pos: int, fend: int) -> _Unit | None:
    """The first unit at ``pos`` if the next one has its shape (a run begins), by each
    number's encoding first (fixed-size items), then any number; as single items, then as
    key-value pairs."""
    memo = w.memo_len
    for want in (1, 2):
        u1 = learn(w, buf, pos, fend, want, memo)
        if u1 is None or _LONG_TEXT in u1.key:
            continue
        u2 = learn(w, buf, u1.end, u1.fend, want, memo + len(u1.kinds))
        if u2 is None:
            continue
        if u2.key == u1.key:
            return u1
        general = _generic(u1.key)
        if _generic(u2.key) == general:
            return replace(u1, key=general, size=0)
    return None


def _advance(r, buf: bytes, unit: _Unit) -> None:
    """Move the reader past a unit learned on ``buf`` (its offsets are that buffer's)."""
    if r.buf is not buf or not r.pos <= unit.end <= len(buf):
        raise PickleError("internal: the scanner lost its place in the stream")   # walked again without this path
    r.pos = unit.end


def fast_forward(w, stack: list, fend: int) -> int:
    """From ``w.r.pos`` (just after a MARK), apply every run of same-shaped items the
    patterns match; return the frame end after them. Leaves ``w.r.pos`` at the first
    byte not applied and sets ``w.ff_wait`` (MARKs to skip before trying again)."""
    r = w.r
    done = 0
    shape: _Shape | None = w.ff_shape         # the last batch's items are likely this one's
    shapes = odd = 0
    while w.seq:
        r.fill(2 * MAX_UNIT)
        buf, pos = r.buf, r.pos
        if shape is not None and shape.unit.gets and not _current(w, shape.unit):
            shape = None                        # what it reads changed: learn it again, as it is now
        if shape is not None:
            stop = min(len(buf), fend - r.base)
            before = w.ff_items
            q = _run(w, stack, shape, buf, pos, stop)
            done += w.ff_items - before         # only matched items count as a success
            r.pos = pos = q
            if stop - q < MAX_UNIT and r.base + stop < fend:
                have = len(buf) - q              # stopped near the end of the bytes read, inside the frame
                r.fill(have + 2 * MAX_UNIT)
                if len(r.buf) - r.pos > have:
                    continue
                buf, pos = r.buf, r.pos          # a refill moves the bytes: offsets are the new buffer's
            # an item boundary the pattern did not pass: a FRAME inside the next item, or an
            # item of another shape: one unit by the model, then match on
            u1 = learn(w, buf, pos, fend, len(shape.unit.pushed), w.memo_len)
            if u1 is not None and (u1.key == shape.unit.key or _generic(u1.key) == shape.unit.key):
                if not _apply(w, stack, u1, 1):
                    break
                _advance(r, buf, u1)
                fend = u1.fend
                continue
        unit = _run_at(w, buf, pos, fend)
        if unit is not None:
            shapes += 1
            got = _shape(w, unit) if shapes <= MAX_RELEARN else None
            if got is None:
                break
            shape = w.ff_shape = got
        else:
            # an item of its own shape (a batch's first item writes the memo keys the rest
            # read; a longer or non-ASCII string inside a run): take it by the model, look after it
            odd += 1
            if odd > MAX_ODD:
                break
            unit = learn(w, buf, pos, fend, len(shape.unit.pushed) if shape else 1, w.memo_len)
            if unit is None:
                break
        if not _apply(w, stack, unit, 1):
            break
        _advance(r, buf, unit)
        fend = unit.fend
    if done > MIN_RUN:
        w.ff_fails = 0
        w.ff_wait = 0
    else:
        w.ff_fails += 1
        w.ff_wait = min(1 << w.ff_fails, MAX_WAIT)
    return fend
