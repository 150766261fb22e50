"""A training state as JSON structure plus raw tensor bytes: tensors are never pickled.

``flatten`` turns nested dicts, lists and tuples of torch tensors, numpy arrays, bytes and
JSON scalars (a ``model.state_dict()``, an optimizer's ``state_dict()``, RNG states) into a
skeleton that JSON can hold, where each array is ``{"__t": i}``, and the list of arrays. A
leaf that is none of these (a user object) is pickled on its own and read back through
``hpcml.scan``'s restricted loader, so a checkpoint cannot import anything the scan policy
refuses. ``unflatten`` rebuilds the state from the skeleton and a buffer.

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
import pickle
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpcml import schemas
from hpcml.errors import HpcmlError, UsageError

ALIGN = 4096
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


def _leaf(value: Any, leaves: list[Leaf]) -> dict[str, int] | None:
    torch = _torch()
    if torch is not None and isinstance(value, torch.Tensor):
        t = value.detach()
        leaves.append(Leaf(t, "torch", str(t.dtype).removeprefix("torch."), list(t.shape),
                           t.numel() * t.element_size()))
    elif isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            return None
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

    def walk(v: Any, path: str) -> Any:
        def at(k: Any) -> str:
            return f"{path}.{k}" if path else str(k)
        if v is None or isinstance(v, (bool, int, str)):
            return v
        if isinstance(v, float):
            return v if v == v and v not in (float("inf"), float("-inf")) else {"__f": repr(v)}
        if isinstance(v, PerRank) or own is not None and is_data_state(v):
            mine = v if isinstance(v, PerRank) else PerRank(v)
            if own is None:
                return walk(mine.value, path)
            own.append(mine)
            return {"__own": len(own) - 1, "resize": mine.on_resize, "at": path}
        if isinstance(v, dict):
            kind = _mapping_kind(v, path)
            if all(type(k) is str for k in v):
                node: dict[str, Any] = {"__d": {k: walk(x, at(k)) for k, x in v.items()}}
            else:
                node = {"__kv": [[walk(k, at(k)), walk(x, at(k))] for k, x in v.items()]}
            if kind is None:
                return node
            return {"__m": kind[0], "__v": node, **({"factory": kind[1]} if kind[1] else {})}
        if isinstance(v, list):
            return [walk(x, at(i)) for i, x in enumerate(v)]
        if type(v) is tuple:
            return {"__tu": [walk(x, at(i)) for i, x in enumerate(v)]}
        if not leaves_too:
            return None
        ref = _leaf(v, leaves)
        if ref is not None:
            return ref
        data = pickle.dumps(v, protocol=4)
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


class CorruptShard(HpcmlError):
    """A shard whose structure does not match its bytes."""


class RefusedLeaf(CorruptShard):
    """A pickled leaf the scan's policy refuses to load (a global, or an argument: the same
    judgement as ``hpcml scan``): the checkpoint is not loaded."""


def unflatten(skeleton: Any, entries: list[dict[str, Any]], buf: memoryview, *, source: str,
              map_location: Any = "cpu", policy: Any = None, own: list[Any] | None = None) -> Any:
    """Rebuild the state; tensors are copies (the buffer may be reused). ``own``: the
    values of a replicated state's ``{"__own": i}`` places (this rank's own)."""
    torch = None
    cache: dict[int, Any] = {}

    def array(i: int) -> Any:
        nonlocal torch
        if i in cache:
            return cache[i]
        if not 0 <= i < len(entries):
            raise CorruptShard(f"{source}: entry {i} does not exist")
        e = entries[i]
        raw = buf[e["offset"]:e["offset"] + e["nbytes"]]
        if len(raw) != e["nbytes"]:
            raise CorruptShard(f"{source}: entry {i} runs past the end of the file")
        if e["kind"] == "bytes":
            out: Any = bytes(raw)
        elif e["kind"] == "pickle":
            try:
                out = _safe_unpickle(bytes(raw), policy)
            except pickle.UnpicklingError as exc:
                name = leaf_paths(skeleton).get(i, f"#{i}")
                raise RefusedLeaf(f"{source}: pickled leaf {name}: {exc}") from None
        elif e["kind"] == "numpy":
            out = np.frombuffer(raw, dtype=np.dtype(e["dtype"])).reshape(e["shape"]).copy()
        else:
            if torch is None:
                import torch as _t
                torch = _t
            dtype = getattr(torch, e["dtype"])
            t = torch.empty(e["shape"], dtype=dtype)
            if e["nbytes"]:
                t.view(-1).view(torch.uint8).copy_(torch.frombuffer(raw, dtype=torch.uint8))
            out = t if map_location in (None, "cpu") else t.to(map_location)
        cache[i] = out
        return out

    def walk(v: Any) -> Any:
        if isinstance(v, list):
            return [walk(x) for x in v]
        if not isinstance(v, dict):
            return v
        if "__t" in v:
            return array(v["__t"])
        if "__d" in v:
            return {k: walk(x) for k, x in v["__d"].items()}
        if "__kv" in v:
            return {walk(k): walk(x) for k, x in v["__kv"]}
        if "__tu" in v:
            return tuple(walk(x) for x in v["__tu"])
        if "__f" in v:
            return float(v["__f"])
        if "__m" in v:
            return _mapping(v, walk(v.get("__v")), source)
        if "__own" in v:
            i = v["__own"]
            if own is None or type(i) is not int or not 0 <= i < len(own):
                raise CorruptShard(f"{source}: per-rank value {i!r} is not in this rank's file")
            return own[i]
        raise CorruptShard(f"{source}: unknown node {sorted(v)[:3]}")

    return walk(skeleton)


def _mapping(node: dict[str, Any], items: Any, source: str) -> Any:
    cls = _MAPPINGS.get(node["__m"]) if isinstance(node["__m"], str) else None
    if cls is None or not isinstance(items, dict):
        raise CorruptShard(f"{source}: unknown mapping type {node['__m']!r}")
    if cls is collections.defaultdict:
        factory = node.get("factory")
        if factory is not None and factory not in _FACTORIES:
            raise CorruptShard(f"{source}: unknown defaultdict factory {factory!r}")
        return collections.defaultdict(_FACTORIES[factory] if factory else None, items)
    return cls(items)


def _safe_unpickle(data: bytes, policy: Any = None) -> Any:
    """A pickled leaf, through the scan's policy (the default one unless given): a refused
    global raises ``UnpicklingError`` before anything is imported."""
    from hpcml.scan.loader import RestrictedUnpickler
    from hpcml.scan.policy import default_policy
    return RestrictedUnpickler(io.BytesIO(data), policy=policy or default_policy()).load()
