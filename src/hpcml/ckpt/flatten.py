"""A training state as JSON structure plus raw tensor bytes: tensors are never pickled.

``flatten`` turns nested dicts, lists and tuples of torch tensors, numpy arrays, bytes and
JSON scalars (a ``model.state_dict()``, an optimizer's ``state_dict()``, RNG states) into a
skeleton that JSON can hold, where each array is ``{"__t": i}``, and the list of arrays. A
leaf that is none of these (a user object) is pickled on its own and read back through
``hpcml.scan``'s restricted loader, so a checkpoint cannot import anything the scan policy
refuses. ``unflatten`` rebuilds the state from the skeleton and the shard's bytes.

A ``Counter``, ``OrderedDict`` or ``defaultdict`` (with a ``default_factory`` that has a
name: ``int``, ``list``, ...) is stored with its type and loads back as one; any other dict
subclass is refused at save, naming its place: it would load back as a plain dict.

``PerRank(value)`` (and a ``ShardDataset``'s resume state, recognised by its schema tag) is
a rank's own value inside a replicated state: with ``own`` given, ``flatten`` leaves
``{"__own": i}`` in its place and appends the value to ``own``, which each rank then writes
in its own file (``hpcml.ckpt.checkpointer``).
"""

from __future__ import annotations

import builtins
import collections
import io
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpcml import schemas
from hpcml.ckpt import leafcheck
from hpcml.ckpt.shardread import CheckedRead as CheckedRead
from hpcml.ckpt.shardread import ChecksumMismatch as ChecksumMismatch
from hpcml.ckpt.shardread import CorruptShard as CorruptShard
from hpcml.ckpt.shardread import RefusedLeaf as RefusedLeaf
from hpcml.errors import UsageError

ALIGN = 4096
#: how deeply a state may nest (each dict, list and tuple a level): far beyond a training
#: state's, and far below the interpreter's recursion limit that the walks which rebuild and
#: name a skeleton would otherwise hit, on a different node at save, verify and load
MAX_DEPTH = 100
#: a ShardDataset's resume state: always a rank's own (it records its rank and position)
DATA_STATE = schemas.tag("data.state", 1)
#: dict subclasses stored with their type (``{"__m": name, "__v": the items}``)
_MAPPINGS: dict[str, type] = {"Counter": collections.Counter, "OrderedDict": collections.OrderedDict,
                              "defaultdict": collections.defaultdict}
#: a defaultdict's ``default_factory``, stored by name
_FACTORIES: dict[str, Any] = {
    **{name: getattr(builtins, name) for name in ("int", "float", "complex", "str", "bytes", "bool", "list",
                                                   "dict", "set", "frozenset", "tuple")},
    "collections.Counter": collections.Counter, "collections.OrderedDict": collections.OrderedDict}
RESIZE = ("refuse", "none")


class PerRank:
    """``PerRank(value)``: this rank's own value in a replicated checkpoint (its RNG state,
    anything that differs between ranks). Rank 0 writes the replicated state once and every
    rank writes its own values beside it, in the same step; at load each rank gets its own
    value back in this place (the wrapper is gone). At another world size such a value is
    refused in one line (``on_resize="refuse"``) or loads as ``None``
    (``on_resize="none"``: the code then starts it afresh, e.g. reseeds). A
    ``ShardLoader``'s state needs no wrapper. In a sharded checkpoint every value is the
    rank's own: the wrapper is dropped."""

    __slots__ = ("value", "on_resize")

    def __init__(self, value: Any, *, on_resize: str = "refuse") -> None:
        if on_resize not in RESIZE:
            raise UsageError(f"expected one of {', '.join(RESIZE)}, not {on_resize!r}", key="on_resize")
        self.value, self.on_resize = value, on_resize

    def __repr__(self) -> str:
        return f"PerRank({self.value!r}, on_resize={self.on_resize!r})"


def is_data_state(value: Any) -> bool:
    return type(value) is dict and value.get("schema") == DATA_STATE


@dataclass
class Leaf:
    """One array of the state and where its bytes go in the rank's file."""

    value: Any            # torch.Tensor, np.ndarray or bytes
    kind: str             # "torch", "numpy", "bytes", "pickle"
    dtype: str
    shape: list[int]
    nbytes: int
    offset: int = 0


def _torch():
    import sys
    return sys.modules.get("torch")        # a state with tensors has imported torch already


#: the torch dtypes a shard may hold (as it records them: ``float32``, not ``torch.float32``)
#: and their bytes per element: checked without torch (``layout.index_problem``), and the
#: only names a load looks up in the torch module (quantized dtypes are not: their bytes are
#: not a plain view)
TORCH_ITEMSIZE = {
    **dict.fromkeys(("float64", "int64", "uint64", "complex64"), 8), "complex128": 16,
    **dict.fromkeys(("float32", "int32", "uint32", "complex32"), 4),
    **dict.fromkeys(("float16", "bfloat16", "int16", "uint16", "bits16"), 2),
    **dict.fromkeys(("uint8", "int8", "bool", "bits8", "bits1x8", "bits2x4", "bits4x2", "float8_e4m3fn",
                     "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2",
                     *(f"{u}int{b}" for u in ("", "u") for b in range(1, 8))), 1)}


def array_itemsize(dtype: Any) -> int | None:
    """Bytes per element of a plain numpy dtype as a shard records it (``<f4``): no object,
    no sub-array, not empty; None for any other."""
    if not isinstance(dtype, str):
        return None
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError):
        return None
    return dt.itemsize if not dt.hasobject and dt.shape == () and dt.itemsize > 0 else None


def _structured(value: Any) -> bool:
    """A structured array or record whose fields hold no objects: what has padding to clean."""
    return isinstance(value, (np.ndarray, np.void)) and value.dtype.fields is not None and not value.dtype.hasobject


def without_padding(value: Any) -> Any:
    """A structured array or record (no objects in it) as its fields, copied into zeros, as a
    plain ``ndarray`` or ``np.void``; other values as they are. numpy leaves the padding
    between an aligned dtype's fields uninitialised, and its bytes (the process's heap:
    pointers, whatever it last held) went to disk as they were."""
    if _structured(value):
        dtype = value.dtype if value.dtype.type is np.void else np.dtype((np.void, value.dtype))
        clean = np.zeros(np.shape(value), dtype=dtype)
        clean[...] = value
        return clean if isinstance(value, np.ndarray) else clean[()]
    return value


class _CleanPickler(pickle.Pickler):
    """``pickle.dumps`` of a pickled leaf, with every structured array or record in it, at any
    depth (a ``np.void`` taken from an array, one inside a namedtuple), pickled from its copy in
    zeros (``without_padding``)."""

    def reducer_override(self, obj: Any) -> Any:
        return without_padding(obj).__reduce__() if _structured(obj) else NotImplemented


def _pickled(value: Any) -> bytes:
    buf = io.BytesIO()
    _CleanPickler(buf, protocol=4).dump(value)
    return buf.getvalue()


def _leaf(value: Any, leaves: list[Leaf], path: str) -> dict[str, int] | None:
    torch = _torch()
    if torch is not None and isinstance(value, torch.Tensor):
        if value.layout != torch.strided or value.is_nested:     # sparse, mkldnn, nested: no flat bytes
            kind = "nested" if value.is_nested else str(value.layout).removeprefix("torch.")
            raise UsageError(f"a tensor of layout {kind}: a checkpoint holds dense tensors as bytes; convert it "
                             "(.to_dense(), .to_padded_tensor())", key=path or "state")
        if value.is_meta:
            raise UsageError("a tensor on the meta device: it has no values to save", key=path or "state")
        t = value.detach().resolve_conj().resolve_neg()     # a lazy conjugate or negation: its values
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in TORCH_ITEMSIZE:             # it would save, and never load
            raise UsageError(f"a tensor of dtype {dtype}: not one a checkpoint holds as bytes; convert it "
                             "(a quantized one: .dequantize() or .int_repr())", key=path or "state")
        leaves.append(Leaf(t, "torch", dtype, list(t.shape), t.numel() * t.element_size()))
    elif isinstance(value, np.ndarray):
        if type(value).__module__.startswith("numpy.ma"):
            raise UsageError("a masked array: a checkpoint holds an array's values, and its mask would be lost; "
                             "store .data and .mask (or .filled()) instead", key=path or "state")
        if array_itemsize(value.dtype.str) is None:     # objects, an empty dtype: pickled
            return None
        value = without_padding(value)                  # a structured one: its padding zeros
        leaves.append(Leaf(value, "numpy", value.dtype.str, list(value.shape), value.nbytes))
    elif isinstance(value, (bytes, bytearray)):
        leaves.append(Leaf(bytes(value), "bytes", "u1", [len(value)], len(value)))
    else:
        return None
    return {"__t": len(leaves) - 1}


def _mapping_kind(v: dict, path: str) -> tuple[str, str | None] | None:
    """``(type name, factory name)`` of a dict subclass stored with its type; None for a
    plain dict; a dict subclass that would load back as a plain dict is refused here."""
    if type(v) is dict:
        return None
    for name, cls in _MAPPINGS.items():
        if type(v) is cls:
            if name != "defaultdict":
                return name, None
            factory = v.default_factory          # type: ignore[attr-defined]
            if factory is None:
                return name, None
            for fname, f in _FACTORIES.items():
                if factory is f:
                    return name, fname
            raise UsageError(f"a defaultdict whose default_factory is {getattr(factory, '__qualname__', factory)!r}: "
                             "it cannot be stored by name; use a plain dict, or a factory such as int or list",
                             key=path or "state")
    raise UsageError(f"a {type(v).__module__}.{type(v).__qualname__} (a dict subclass) would load back as a plain "
                     "dict; store dict(...) of it, or a Counter, OrderedDict or defaultdict",
                     key=path or "state")


def flatten(state: Any, own: list[PerRank] | None = None, *, leaves_too: bool = True) -> tuple[Any, list[Leaf]]:
    """``(skeleton, leaves)`` of ``state``. ``own``: a replicated state's per-rank values
    (``PerRank``, data-loader states) go there, each leaving ``{"__own": i}``; without it a
    ``PerRank`` is stored in place. ``leaves_too=False`` only collects ``own`` (a rank other
    than 0 of a replicated state: no leaf is built, nothing is pickled)."""
    leaves: list[Leaf] = []

    def walk(v: Any, path: str, depth: int = 0) -> Any:
        def at(k: Any) -> str:
            return f"{path}.{k}" if path else str(k)
        if depth > MAX_DEPTH:                   # it would save, and never load
            raise UsageError(f"nested more than {MAX_DEPTH} levels deep", key=path or "state")
        if v is None or isinstance(v, (bool, int, str)):
            return v
        if isinstance(v, float):
            return v if v == v and v not in (float("inf"), float("-inf")) else {"__f": repr(v)}
        if isinstance(v, PerRank) or own is not None and is_data_state(v):
            mine = v if isinstance(v, PerRank) else PerRank(v)
            if own is None:
                return walk(mine.value, path, depth)
            own.append(mine)
            return {"__own": len(own) - 1, "resize": mine.on_resize, "at": path}
        if isinstance(v, dict):
            kind = _mapping_kind(v, path)
            if all(type(k) is str for k in v):
                node: dict[str, Any] = {"__d": {k: walk(x, at(k), depth + 1) for k, x in v.items()}}
            else:
                node = {"__kv": [[walk(k, at(k), depth + 1), walk(x, at(k), depth + 1)] for k, x in v.items()]}
            if kind is None:
                return node
            return {"__m": kind[0], "__v": node, **({"factory": kind[1]} if kind[1] else {})}
        if isinstance(v, list):
            return [walk(x, at(i), depth + 1) for i, x in enumerate(v)]
        if type(v) is tuple:
            return {"__tu": [walk(x, at(i), depth + 1) for i, x in enumerate(v)]}
        if not leaves_too:
            return None
        ref = _leaf(v, leaves, path)
        if ref is not None:
            return ref
        data = _pickled(v)
        if len(data) > (top := leafcheck.limit()):      # it would save, verify, and never load
            from hpcml.units import fmt_bytes
            raise UsageError(f"a {type(v).__module__}.{type(v).__qualname__} that pickles to {len(data)} bytes: "
                             f"over the {top} ({fmt_bytes(top)}) a pickled leaf may be "
                             "(it would never load); store its bytes or arrays as leaves of their own",
                             key=path or "state")
        leaves.append(Leaf(data, "pickle", "u1", [len(data)], len(data)))
        return {"__t": len(leaves) - 1}

    return walk(state, ""), leaves


def own_slots(skeleton: Any) -> list[dict[str, Any]]:
    """The ``{"__own": i, "resize": ..., "at": path}`` nodes of a replicated skeleton, in order."""
    out: list[dict[str, Any]] = []

    def walk(v: Any) -> None:
        if isinstance(v, list):
            for x in v:
                walk(x)
        elif isinstance(v, dict):
            if type(v.get("__own")) is int:
                out.append(v)
            else:
                for x in v.values():
                    walk(x)

    walk(skeleton)
    return out


def layout(leaves: list[Leaf]) -> int:
    """Give each leaf an aligned offset; the file's size."""
    offset = 0
    for leaf in leaves:
        leaf.offset = offset
        offset += -(-leaf.nbytes // ALIGN) * ALIGN
    return offset


def describe(leaves: list[Leaf]) -> list[dict[str, Any]]:
    return [{"kind": f.kind, "dtype": f.dtype, "shape": f.shape, "offset": f.offset, "nbytes": f.nbytes}
            for f in leaves]


def leaf_paths(skeleton: Any) -> dict[int, str]:
    """Each leaf's place in the state as a dotted path (``model.layer.weight``,
    ``optimizer.state.0.exp_avg``): the tensor names of an export and what a scan finding
    names. A reference that is not a leaf index is left out (the reader reports it)."""
    out: dict[int, str] = {}

    def walk(v: Any, path: str) -> None:
        def join(k: Any) -> str:
            return f"{path}.{k}" if path else str(k)
        if isinstance(v, list):
            for i, x in enumerate(v):
                walk(x, join(i))
        elif isinstance(v, dict):
            if type(v.get("__t")) is int:
                out.setdefault(v["__t"], path)
            elif isinstance(v.get("__d"), dict):
                for k, x in v["__d"].items():
                    walk(x, join(k))
            elif isinstance(v.get("__tu"), list):
                walk(v["__tu"], path)
            elif isinstance(v.get("__m"), str) and isinstance(v.get("__v"), dict):
                walk(v["__v"], path)
            elif isinstance(v.get("__kv"), list):
                for i, pair in enumerate(v["__kv"]):
                    if isinstance(pair, list) and len(pair) == 2:
                        key = pair[0] if isinstance(pair[0], (str, int, float, bool)) else f"[{i}]"
                        walk(pair[1], join(key))

    walk(skeleton, "")
    return out


class _Bad(Exception):
    """A skeleton node that does not rebuild: where in the state (``at``) and why."""

    def __init__(self, at: str, problem: str) -> None:
        at = at if len(at) <= 160 else f"{at[:100]}...{at[-50:]}"      # one line, however deep
        super().__init__(f"at {at or 'the top'}: {problem}")
        self.at, self.problem = at, problem


def _rebuild(skeleton: Any, leaf: Callable[[int, str], Any], own: Callable[[Any, str], Any]) -> Any:
    """The one walk of a skeleton, for the load (``unflatten``) and for the check that
    ``verify`` and ``hpcml scan`` make of it (``skeleton_problem``): what one refuses the
    other does. ``leaf(i, at)`` and ``own(i, at)`` give a leaf's and a per-rank value's
    value; ``_Bad`` for any node that does not rebuild."""
    def walk(v: Any, path: str, depth: int) -> Any:
        def at(k: Any) -> str:
            return f"{path}.{k}" if path else str(k)
        if depth > MAX_DEPTH:
            raise _Bad(path, f"nested more than {MAX_DEPTH} levels deep")
        if isinstance(v, list):
            return [walk(x, at(i), depth + 1) for i, x in enumerate(v)]
        if not isinstance(v, dict):
            return v
        if "__t" in v:
            if type(v["__t"]) is not int:
                raise _Bad(path, f"leaf {v['__t']!r} is not a leaf number")
            return leaf(v["__t"], path)
        if "__d" in v:
            if not isinstance(v["__d"], dict):
                raise _Bad(path, "a dict node without an object of items")
            return {k: walk(x, at(k), depth + 1) for k, x in v["__d"].items()}
        if "__kv" in v:
            pairs = v["__kv"]
            if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
                raise _Bad(path, "a dict node whose items are not [key, value] pairs")
            out: dict[Any, Any] = {}
            for i, (k, x) in enumerate(pairs):
                name = at(k if isinstance(k, (str, int, float, bool)) else f"[{i}]")
                key = walk(k, name, depth + 1)
                try:
                    hash(key)
                except TypeError:
                    raise _Bad(name, "a key that cannot be a dict's key") from None
                out[key] = walk(x, name, depth + 1)
            return out
        if "__tu" in v:
            if not isinstance(v["__tu"], list):
                raise _Bad(path, "a tuple node without a list of items")
            return tuple(walk(x, at(i), depth + 1) for i, x in enumerate(v["__tu"]))
        if "__f" in v:
            try:
                return float(v["__f"])
            except (TypeError, ValueError):
                raise _Bad(path, f"{v['__f']!r} is not a float") from None
        if "__m" in v:                          # the type wraps its items' node: one level, as at save
            items = v.get("__v")
            if not isinstance(items, dict) or not ("__d" in items or "__kv" in items):
                raise _Bad(path, "a typed mapping node without a dict node of items")     # (a chain would nest unbounded)
            return _mapping(v, walk(items, path, depth), path)
        if "__own" in v:
            return own(v["__own"], path)
        raise _Bad(path, f"unknown node {sorted(v)[:3]}")

    return walk(skeleton, "", 0)


class _Array:
    """What a numpy leaf stands in as in ``skeleton_problem``: an array is no dict key."""

    __hash__ = None  # type: ignore[assignment]


def skeleton_problem(skeleton: Any, entries: list[dict[str, Any]], *, own: bool) -> tuple[str, str] | None:
    """``(place in the state, problem)`` when ``skeleton`` would not rebuild from ``entries``
    (checked already: each a leaf with its bytes in the shard): a leaf it lacks, a node of no
    known kind, a key that is no dict key, nesting deeper than ``MAX_DEPTH``. ``own``:
    per-rank value places are allowed (a replicated state's). Nothing is read nor built."""
    used: set[int] = set()

    def leaf(i: int, at: str) -> Any:
        if not 0 <= i < len(entries):
            raise _Bad(at, f"leaf {i} does not exist (the index lists {len(entries)})")
        used.add(i)
        return _Array() if entries[i].get("kind") == "numpy" else object()

    def own_value(i: Any, at: str) -> Any:
        if not own or type(i) is not int or i < 0:
            raise _Bad(at, f"per-rank value {i!r} outside a replicated state's values")
        return None

    try:
        _rebuild(skeleton, leaf, own_value)
    except _Bad as exc:
        return exc.at, exc.problem
    if len(used) < len(entries):          # hpcml writes none: bytes no load reads, which a scan would judge
        unused = min(set(range(len(entries))) - used)
        return "", f"leaf {unused} is in no place of the state (the index lists {len(entries)}, the state places {len(used)})"
    return None


def unflatten(skeleton: Any, entries: list[dict[str, Any]], fd: int, *, source: str,
              map_location: Any = "cpu", policy: Any = None, own: list[Any] | None = None,
              crc: int | None = None) -> Any:
    """Rebuild the state from the shard open as ``fd`` (its index checked: ``layout.index_problem``),
    each leaf read from its offset straight into its own memory: nothing is allocated for
    the file as a whole, nor from anything but a leaf's checked size. The leaves are read
    first, once, in file order (``CheckedRead``), and with ``crc`` (the manifest's) the
    bytes read must be the checksummed ones before any pickled leaf is unpickled or the
    state built. ``own``: the values of a replicated state's ``{"__own": i}`` places."""
    read = CheckedRead(fd, os.fstat(fd).st_size, source)
    loaded = _read_leaves(entries, read, map_location)
    read.finish(crc)
    _judge_pickled(skeleton, entries, loaded, source, policy)
    cache: dict[int, Any] = {}

    def array(i: int, at: str) -> Any:
        if i in cache:
            return cache[i]
        if not 0 <= i < len(entries):
            raise _Bad(at, f"leaf {i} does not exist (the index lists {len(entries)})")
        out = loaded.pop(i)
        if entries[i]["kind"] == "pickle":
            try:
                out = _safe_unpickle(out, policy)
            except pickle.UnpicklingError as exc:
                name = leaf_paths(skeleton).get(i, f"#{i}")
                raise RefusedLeaf(f"{source}: pickled leaf {name}: {exc}") from None
        cache[i] = out
        return out

    def own_value(i: Any, at: str) -> Any:
        if own is None or type(i) is not int or not 0 <= i < len(own):
            raise _Bad(at, f"per-rank value {i!r} is not in this rank's file")
        return own[i]

    try:
        return _rebuild(skeleton, array, own_value)
    except _Bad as exc:
        raise CorruptShard(f"{source}: {exc}") from None


def _read_leaves(entries: list[dict[str, Any]], read: CheckedRead, map_location: Any) -> dict[int, Any]:
    """Every leaf of the index read once, in file order (non-overlapping: checked), as the
    value it loads as (a pickled leaf as its bytes, unpickled once they are proven)."""
    torch = None
    out: dict[int, Any] = {}
    for i in sorted(range(len(entries)), key=lambda j: entries[j]["offset"]):
        e = entries[i]
        if e["kind"] in ("bytes", "pickle"):
            buf = bytearray(e["nbytes"])
            read.into(e["offset"], memoryview(buf))
            out[i] = bytes(buf)         # a pickle's too: judged and unpickled from it, never copied again
        elif e["kind"] == "numpy":
            arr = np.empty(e["shape"], dtype=np.dtype(e["dtype"]))
            read.into(e["offset"], arr.reshape(-1).view(np.uint8).data)
            out[i] = arr
        else:
            if torch is None:
                import torch as _t
                torch = _t
            t = torch.empty(e["shape"], dtype=getattr(torch, e["dtype"]))
            if e["nbytes"]:
                read.into(e["offset"], t.view(-1).view(torch.uint8).numpy().data)
            out[i] = t if map_location in (None, "cpu") else t.to(map_location)
    return out


def _judge_pickled(skeleton: Any, entries: list[dict[str, Any]], loaded: dict[int, Any], source: str,
                   policy: Any) -> None:
    """``RefusedLeaf`` unless every pickled leaf, as read into memory (the bytes then
    unpickled), passes the rule ``verify`` and ``hpcml scan`` apply (``leafcheck.judge``),
    all judged before any is unpickled: what verify refuses never loads."""
    pickled = [i for i, e in enumerate(entries) if e["kind"] == "pickle"]
    if not pickled:
        return
    names = leaf_paths(skeleton)
    fs = leafcheck.new_scan(source, policy)
    for i in pickled:
        data = loaded[i]
        leafcheck.judge(fs, io.BytesIO(data), 0, len(data), f"leaf {names.get(i, f'#{i}')}")
    refused = leafcheck.refusals(fs.finish())
    if refused:
        more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
        raise RefusedLeaf(f"{source}: {refused[0]}{more}")


def _mapping(node: dict[str, Any], items: Any, at: str) -> Any:
    cls = _MAPPINGS.get(node["__m"]) if isinstance(node["__m"], str) else None
    if cls is None or not isinstance(items, dict):
        raise _Bad(at, f"unknown mapping type {node['__m']!r}")
    if cls is collections.defaultdict:
        factory = node.get("factory")
        if factory is not None and (not isinstance(factory, str) or factory not in _FACTORIES):
            raise _Bad(at, f"unknown defaultdict factory {factory!r}")
        return collections.defaultdict(_FACTORIES[factory] if factory else None, items)
    return cls(items)


def _safe_unpickle(data: bytes | bytearray, policy: Any = None) -> Any:
    """A pickled leaf, through the scan's policy (the default one unless given): a refused
    global raises ``UnpicklingError`` before anything is imported."""
    from hpcml.scan.loader import RestrictedUnpickler
    from hpcml.scan.policy import default_policy
    stream = io.BytesIO(data)
    value = RestrictedUnpickler(stream, policy=policy or default_policy()).load()
    if stream.tell() != len(data):         # bytes after its STOP, which hpcml scan judges too: refused alike
        raise pickle.UnpicklingError(f"refused: {len(data) - stream.tell()} bytes after the pickle's end")
    return value
