"""A pickled numpy dtype read as numpy reads it: ``numpy.dtype(descr, align, copy)`` then
BUILD with a state tuple ``(version, byteorder, subarray, names, fields, elsize,
alignment, flags[, metadata])``, which ``dtype.__setstate__`` takes as given.

Why: the name ``numpy.dtype`` is harmless, its state is not. numpy believes the state's
flags and sizes: an object dtype whose flags say "no objects" makes numpy read pointers as
bytes (joblib then skips a nested pickle the scan never saw), a plain dtype whose flags say
"holds objects" makes numpy dereference eight bytes of the file (SIGSEGV at an address the
file chose). So a state is accepted only where it is one numpy itself writes for that
description: compared field by field with ``numpy.dtype(descr).__reduce__()`` for plain
types (in each byte order), and for structured and subarray types checked against the
component dtypes the pickle built (each checked at its own BUILD before).
"""

from __future__ import annotations

import functools
from typing import Any

from hpcml.scan.model import Verdict

#: state versions numpy writes today, and their lengths (4 adds metadata: datetimes, dtype(metadata=))
_LENGTHS = {3: 8, 4: 9}
#: flag bits of a dtype (numpy's ndarraytypes.h)
ITEM_HASOBJECT = 0x01
ALIGNED_STRUCT = 0x80
#: what numpy writes for a structured dtype: NEEDS_PYAPI, plus each field's flags among
#: NPY_FROM_FIELDS (NEEDS_INIT|LIST_PICKLE|REFCOUNT|NEEDS_PYAPI: 0x1B), plus ALIGNED_STRUCT for
#: align=True. A field of objects brings all of them (27); a unicode one NEEDS_INIT (24)
_STRUCT_BASE, _FROM_FIELDS = 0x10, 0x1B

Problem = tuple[Verdict, str]
#: fields of one structured dtype checked against each other (a record of this many is not a model's)
MAX_FIELDS = 4096


@functools.lru_cache(maxsize=1024)
def _canonical(descr: str) -> frozenset[tuple] | None:
    """``(byteorder, subarray, names, fields, elsize, alignment, flags)`` as numpy writes
    them for ``numpy.dtype(descr)`` in each byte order it can have; None where numpy makes
    no plain dtype of this text (it raises at load, or it is a structured one's 'V' size)."""
    import numpy as np
    try:
        d = np.dtype(descr)
    except (TypeError, ValueError, SyntaxError):
        return None
    if d.names is not None or d.subdtype is not None:
        return None
    out = set()
    for x in (d, d.newbyteorder("<"), d.newbyteorder(">")):
        state = x.__reduce__()[2]
        out.add(tuple(state[1:8]))
    return frozenset(out)


def flags_of(dtype: Any) -> int | None:
    """The flags of a pickled dtype (a walk ``Call`` of ``numpy.dtype``): its state's, which
    its BUILD checked, else what numpy gives its description; None where it is not one."""
    from hpcml.scan.walkvalues import Call, Ref
    if type(dtype) is not Call or type(dtype.func) is not Ref or dtype.func.dotted != "numpy.dtype":
        return None
    state = dtype.state
    if type(state) is tuple and len(state) >= 8 and type(state[7]) is int:
        return state[7]
    args = dtype.args
    if type(args) is tuple and args and type(args[0]) is str:
        canon = _canonical(args[0])
        if canon:
            return int(next(iter(canon))[6])
    return None


def itemsize_of(dtype: Any) -> int | None:
    """The bytes one item of a pickled dtype takes: its checked state's size, else what
    numpy gives its description; None where it is not one."""
    from hpcml.scan.walkvalues import Call
    if type(dtype) is not Call or flags_of(dtype) is None:
        return None
    state = dtype.state
    if type(state) is tuple and len(state) >= 8 and type(state[5]) is int and state[5] > 0:
        return state[5]
    args = dtype.args
    if type(args) is tuple and args and type(args[0]) is str:
        import numpy as np
        try:
            return int(np.dtype(args[0]).itemsize)
        except (TypeError, ValueError, SyntaxError):
            return None
    return None


def has_object(dtype: Any) -> bool | None:
    """Whether a pickled dtype holds objects, as its checked state says; None where it is not one."""
    flags = flags_of(dtype)
    return None if flags is None else bool(flags & ITEM_HASOBJECT)


def _literal(v: Any) -> bool:
    """Data written in the file (bytes as protocols 0-2 write them, ``_codecs.encode(text,
    'latin1')``, included): a datetime's unit ``(None, (b'ns', 1, 1, 1))``, a dict."""
    from hpcml.scan import argchecks
    if type(v) is tuple:
        return all(_literal(x) for x in v)
    return argchecks._latin1_text(v) or not argchecks.built_at_load(v)


def state_problem(descr: object, state: object, tracked: bool) -> Problem | None:
    """What is wrong with BUILD of ``numpy.dtype(descr, ...)`` with ``state``: None where it
    is a state numpy writes. Raises ``picklewalk.NeedTracking`` for a structured state whose fields the
    walk did not follow (``tracked`` False)."""
    if type(descr) is not str:
        return (Verdict.UNKNOWN, "numpy.dtype of a description that is not text written in the file")
    if type(state) is not tuple or len(state) < 8 or type(state[0]) is not int \
            or _LENGTHS.get(state[0]) != len(state):
        return (Verdict.DANGEROUS, f"numpy.dtype('{descr[:40]}') with a state of a form numpy does not write "
                                   "(numpy trusts a dtype's state: sizes and flags it never checks)")
    byteorder, subarray, names, fields, elsize, alignment, flags = state[1:8]
    if len(state) == 9 and not _literal(state[8]):
        return (Verdict.UNKNOWN, f"numpy.dtype('{descr[:40]}') with metadata built at load time")
    if type(flags) is not int or type(elsize) is not int or type(alignment) is not int:
        return (Verdict.DANGEROUS, f"numpy.dtype('{descr[:40]}'): sizes or flags that are not numbers written in the file")
    if subarray is None and names is None and fields is None:
        canon = _canonical(descr)
        if canon is None or (byteorder, None, None, None, elsize, alignment, flags) not in canon:
            return (Verdict.DANGEROUS, f"numpy.dtype('{descr[:40]}') with a state numpy never writes for it "
                                       f"(byte order {byteorder!r}, element size {elsize}, alignment {alignment}, "
                                       f"flags {flags}): numpy would read objects as bytes or bytes as pointers")
        return None
    if subarray is not None:
        if names is not None or fields is not None or type(subarray) is not tuple or len(subarray) != 2:
            return (Verdict.DANGEROUS, f"numpy.dtype('{descr[:40]}'): a subarray state numpy never writes")
        return _subarray_problem(descr, subarray, elsize, flags)
    return _struct_problem(descr, names, fields, elsize, alignment, flags, tracked)


def _subarray_problem(descr: str, subarray: tuple, elsize: int, flags: int) -> Problem | None:
    base = flags_of(subarray[0])
    if base is None:
        return (Verdict.UNKNOWN, f"numpy.dtype('{descr[:40]}'): a subarray whose base hpcml cannot read")
    if flags != base:
        return (Verdict.DANGEROUS, f"numpy.dtype('{descr[:40]}'): subarray flags {flags}, its base's {base} "
                                   "(numpy writes the base's): numpy would read objects as bytes or bytes as pointers")
    shape, size = subarray[1], itemsize_of(subarray[0])
    if type(shape) is int:
        shape = (shape,)
    if type(shape) is not tuple or not all(type(n) is int and n >= 0 for n in shape) or size is None:
        return (Verdict.UNKNOWN, f"numpy.dtype('{descr[:40]}'): a subarray shape hpcml cannot read")
    count = 1
    for n in shape:
        count *= n
    if elsize != size * count:
        return (Verdict.DANGEROUS, f"numpy.dtype('{descr[:40]}'): {elsize} bytes for {count} items of {size} "
                                   "(numpy would read past each item)")
    return None


def _struct_problem(descr: str, names: Any, fields: Any, elsize: int, alignment: int, flags: int,
                    tracked: bool) -> Problem | None:
    if type(names) is not tuple or not all(type(n) is str for n in names):
        return (Verdict.DANGEROUS, f"numpy.dtype('{descr[:40]}'): field names numpy never writes")
    if type(fields) is not dict:
        if not tracked:
            from hpcml.scan.walkvalues import NeedTracking
            raise NeedTracking
        return (Verdict.UNKNOWN, f"numpy.dtype('{descr[:40]}'): fields hpcml could not read")
    if len(names) > MAX_FIELDS:
        return (Verdict.UNKNOWN, f"numpy.dtype('{descr[:40]}'): more than {MAX_FIELDS} fields, which hpcml does not check")
    objects = False
    expected = _STRUCT_BASE
    spans: list[tuple[int, int, bool, str]] = []
    for name in names:
        field = fields.get(name)
        if type(field) is not tuple or len(field) not in (2, 3):
            return (Verdict.UNKNOWN, f"numpy.dtype('{descr[:40]}'): field {name[:40]!r} that hpcml cannot read")
        part, size, offset, own = has_object(field[0]), itemsize_of(field[0]), field[1], flags_of(field[0])
        if part is None or size is None or own is None or type(offset) is not int:
            return (Verdict.UNKNOWN, f"numpy.dtype('{descr[:40]}'): field {name[:40]!r} whose type hpcml cannot read")
        if offset < 0 or offset + size > elsize:
            return (Verdict.DANGEROUS, f"numpy.dtype('{descr[:40]}'): field {name[:40]!r} at bytes {offset}-{offset + size} "
                                       f"of a {elsize}-byte item (numpy would read and write past it)")
        spans.append((offset, offset + size, part, name))
        objects = objects or part
        expected |= own & _FROM_FIELDS
    for a in spans:                                      # objects overlapping anything: bytes read as pointers
        for b in spans:
            if a is not b and (a[2] or b[2]) and a[0] < b[1] and b[0] < a[1]:
                return (Verdict.DANGEROUS, f"numpy.dtype('{descr[:40]}'): fields {a[3][:40]!r} and {b[3][:40]!r} "
                                           "overlap and one holds objects (numpy refuses to make such a type)")
    if alignment < 1 or alignment > 64:
        return (Verdict.DANGEROUS, f"numpy.dtype('{descr[:40]}'): alignment {alignment} numpy never writes")
    if flags & ~ALIGNED_STRUCT != expected:
        return (Verdict.DANGEROUS, f"numpy.dtype('{descr[:40]}'): flags {flags} of a structured type whose fields "
                                   f"{'hold' if objects else 'hold no'} objects (numpy writes "
                                   f"{expected}): numpy would read objects as bytes or bytes as pointers")
    return None


def array_problem(state: object, walker: Any) -> Problem | None:
    """BUILD of an array ``_reconstruct`` made: ``(version, shape, dtype, is_fortran,
    data)``. numpy copies an object array's items from ``data`` as many times as the shape
    says, without counting the list: a shape larger than the list reads past it (SIGSEGV,
    found by the differential harness). Raises ``picklewalk.NeedTracking`` when the list
    is not followed (untracked)."""
    from hpcml.scan.walkvalues import NeedTracking
    if type(state) is not tuple or len(state) not in (4, 5):
        return None                                     # numpy refuses other forms itself
    shape, dtype, data = state[-4], state[-3], state[-1]
    objects = has_object(dtype)
    if not objects:
        return None                                     # bytes: numpy checks their length itself
    if type(shape) is int:
        shape = (shape,)
    if type(shape) is not tuple or not all(type(n) is int and n >= 0 for n in shape):
        return (Verdict.UNKNOWN, "an object array whose shape hpcml cannot read")
    count = 1
    for n in shape:
        count *= n
    if type(data) is not list:
        if not walker.track:
            raise NeedTracking
        return (Verdict.UNKNOWN, "an object array whose items hpcml cannot count")
    have = walker.length(data)
    if have != count:
        return (Verdict.DANGEROUS, f"an object array of shape {shape} ({count} items) built from a list of {have}: "
                                   "numpy reads past the list (a crash, or objects from memory the file chose)")
    return None
