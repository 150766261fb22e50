"""A training state as JSON structure plus raw tensor bytes: tensors are never pickled.

``flatten`` turns nested dicts, lists and tuples of torch tensors, numpy arrays, bytes and
JSON scalars (a ``model.state_dict()``, an optimizer's ``state_dict()``, RNG states) into a
skeleton that JSON can hold, where each array is ``{"__t": i}``, and the list of arrays. A
leaf that is none of these (a user object) is pickled on its own and read back through
``hpcml.scan``'s restricted loader, so a checkpoint cannot import anything the scan policy
refuses. ``unflatten`` rebuilds the state from the skeleton and a buffer.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpcml.errors import HpcmlError

ALIGN = 4096


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


def flatten(state: Any) -> tuple[Any, list[Leaf]]:
    leaves: list[Leaf] = []

    def walk(v: Any) -> Any:
        if v is None or isinstance(v, (bool, int, str)):
            return v
        if isinstance(v, float):
            return v if v == v and v not in (float("inf"), float("-inf")) else {"__f": repr(v)}
        if isinstance(v, dict):
            if all(type(k) is str for k in v):
                return {"__d": {k: walk(x) for k, x in v.items()}}
            return {"__kv": [[walk(k), walk(x)] for k, x in v.items()]}
        if isinstance(v, list):
            return [walk(x) for x in v]
        if type(v) is tuple:
            return {"__tu": [walk(x) for x in v]}
        ref = _leaf(v, leaves)
        if ref is not None:
            return ref
        data = pickle.dumps(v, protocol=4)
        leaves.append(Leaf(data, "pickle", "u1", [len(data)], len(data)))
        return {"__t": len(leaves) - 1}

    return walk(state), leaves


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
            elif isinstance(v.get("__kv"), list):
                for i, pair in enumerate(v["__kv"]):
                    if isinstance(pair, list) and len(pair) == 2:
                        key = pair[0] if isinstance(pair[0], (str, int, float, bool)) else f"[{i}]"
                        walk(pair[1], join(key))

    walk(skeleton, "")
    return out


class CorruptShard(HpcmlError):
    """A shard whose structure does not match its bytes."""


def unflatten(skeleton: Any, entries: list[dict[str, Any]], buf: memoryview, *, source: str,
              map_location: Any = "cpu", policy: Any = None) -> Any:
    """Rebuild the state; tensors are copies (the buffer may be reused)."""
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
            out = _safe_unpickle(bytes(raw), policy)
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
        raise CorruptShard(f"{source}: unknown node {sorted(v)[:3]}")

    return walk(skeleton)


def _safe_unpickle(data: bytes, policy: Any = None) -> Any:
    """A pickled leaf, through the scan's policy (the default one unless given): a refused
    global raises ``UnpicklingError`` before anything is imported."""
    from hpcml.scan.loader import RestrictedUnpickler
    from hpcml.scan.policy import default_policy
    return RestrictedUnpickler(io.BytesIO(data), policy=policy or default_policy()).load()
