"""joblib's arrays as the pickle walk sees them: ``joblib.dump`` writes each numpy array as
a ``NumpyArrayWrapper`` object followed by the array's raw bytes (or, for object arrays, a
nested pickle that ``joblib.load`` unpickles). To walk on after an array the walk must know
its byte size, which it reads from the wrapper's state (shape and dtype) without importing
numpy. ``pickles`` walks every pickle with these hooks; ``formats.joblib`` reads joblib's
compressed files.
"""

from __future__ import annotations

import math
import re

from hpcml.scan import dtypes
from hpcml.scan.picklewalk import Call, Event, NeedTracking, PickleError, PickleWalker, Ref

WRAPPER = "joblib.numpy_pickle.NumpyArrayWrapper"
#: joblib < 0.10 kept each array in a file of its own beside the pickle, named in this wrapper
FILE_WRAPPER = "joblib.numpy_pickle_compat.NDArrayWrapper"
HOOKS = frozenset({WRAPPER, FILE_WRAPPER})
#: a tracked dict keeps its first 64 items: one that may hold more is not read whole
FULLY_TRACKED = 60
UNREADABLE = object()
_DESCR = re.compile(r"^[<>|=]?([a-zA-Z]+)(\d+)$")


def _dtype(dtype) -> tuple[int, bool]:
    """(itemsize, has objects) of a pickled ``numpy.dtype(descr, False, True)`` + state, as
    numpy and then joblib compute them: the state was checked at its BUILD to be one numpy
    writes for the description (``scan.dtypes``), so its flags and size are numpy's own."""
    if type(dtype) is not Call or type(dtype.func) is not Ref or dtype.func.dotted != "numpy.dtype" \
            or not dtype.args or type(dtype.args[0]) is not str:
        raise PickleError("joblib array wrapper: its dtype is not a numpy.dtype(...) call")
    descr, state = dtype.args[0], dtype.state
    has_object = dtypes.has_object(dtype)
    if has_object is None:
        raise PickleError(f"joblib array wrapper: cannot read dtype '{descr}'")
    elsize = state[5] if type(state) is tuple and len(state) > 5 and type(state[5]) is int else -1
    if elsize <= 0:
        m = _DESCR.match(descr)
        if not m:
            raise PickleError(f"joblib array wrapper: cannot size dtype '{descr}'")
        elsize = int(m.group(2))
    return elsize, has_object


def _opened_file(walker: PickleWalker, obj: Call, state) -> None:
    """``NDArrayWrapper.read`` runs ``np.load(join(dirname, filename), allow_pickle=True)``:
    the file it names is part of what the load runs (``pickles`` scans it)."""
    if not walker.track:
        raise NeedTracking
    parts = state if type(state) is tuple and len(state) == 2 else (state,)     # (__dict__, slots)
    name: object = None
    for part in parts:
        if part is None or part == {}:
            continue
        if type(part) is not dict or len(part) >= FULLY_TRACKED:   # built at load time, or not followed whole
            name = UNREADABLE
            break
        name = part.get("filename", name)
    if name is None and type(obj.func) is Ref and obj.func.dotted == FILE_WRAPPER and type(obj.args) is tuple \
            and obj.args:
        name = obj.args[0]                              # NDArrayWrapper(filename, subclass): __init__ set it
    here = walker.r.base + walker.r.pos - 1
    if type(name) is not str:
        walker.result.events.append(Event(
            "argument-dangerous", "joblib.numpy_pickle_compat", "NDArrayWrapper", here, "BUILD",
            "opens a file whose name hpcml cannot read from the pickle (np.load with allow_pickle=True)"))
        return
    walker.result.opened.append((name, here))


def on_build(walker: PickleWalker, obj, state) -> None:
    """After BUILD of a wrapper: skip its array bytes, or walk its nested object pickle;
    for the old file wrapper, name the file it opens."""
    if type(obj) is not Call:
        return
    if walker._built_class(obj) == FILE_WRAPPER:
        _opened_file(walker, obj, state)
        return
    if walker._built_class(obj) != WRAPPER:     # joblib asks isinstance: copyreg's builders too
        return
    if not walker.track:
        raise NeedTracking
    # BUILD merges into the wrapper's __dict__ and joblib sizes the array from the merged
    # state; the walk reads this BUILD's state alone. joblib.dump builds each wrapper once
    # (the memo may hand it out again, the BUILD never comes twice), so a second is refused.
    # The wrappers themselves are kept, so an id is never reused for another.
    built = walker.hooked.setdefault("joblib-wrappers-built", {})
    if id(obj) in built:
        raise PickleError("a joblib array wrapper BUILT twice (joblib.dump never writes one): joblib would size "
                          "its array from both states merged")
    built[id(obj)] = obj
    if type(state) is not dict:
        raise PickleError("joblib array wrapper without a readable state")
    if len(state) >= FULLY_TRACKED:              # a tracked dict keeps its first items only
        raise PickleError(f"joblib array wrapper: a state of {len(state)} or more items is not read whole")
    if type(obj.func) is Ref and obj.func.dotted == WRAPPER and obj.args not in ((), None):
        # NumpyArrayWrapper(...) called with arguments: its __init__ sets attributes (the
        # padding among them) that joblib reads and its state may not say
        raise PickleError("joblib array wrapper built by a call with arguments: joblib.dump never writes one")
    shape = state.get("shape")
    if type(shape) is not tuple or not all(type(n) is int and n >= 0 for n in shape):
        raise PickleError(f"joblib array wrapper: bad shape {shape!r}")
    itemsize, has_object = _dtype(state.get("dtype"))
    r = walker.r
    here = r.base + r.pos
    walker.result.skipped.append((here, has_object))
    if has_object:
        # joblib reads it with a fresh plain unpickler (1.2-1.5: pickle.load(file_handle);
        # 1.6: Unpickler(file_handle)), never its own: a wrapper BUILT in there is an object,
        # and the bytes after it are opcodes, not array data
        inner = PickleWalker(r.fh, here, r.end, track_containers=walker.track).walk()
        walker.result.events.extend(inner.events)
        walker.result.nested.extend(inner.nested)
        walker.result.loaded.extend(inner.loaded)
        if inner.error:
            raise PickleError(f"object array pickle at offset {here}: {inner.error}")
        r.seek_to(inner.end)
        return
    if state.get("numpy_array_alignment_bytes") is not None:
        if not r.fill(1):
            raise PickleError("truncated in a joblib array's padding")
        pad = r.buf[r.pos]
        r.pos += 1
        r.skip(pad)
    r.skip(math.prod(shape) * itemsize)
