"""vetnode 0.1.5 protocol files, loaded unchanged.

Each vetnode ``type:`` class path maps to hpcml's equivalent check, and its fields are
rewritten to that check's parameters with the same meaning: vetnode's sizes are binary
(``"8 GB"`` is 8 GiB there), its GPU check fails at ``temp >= max_temp``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

_PREFIX = "vetnode.evaluations."


class FieldError(ValueError):
    """A vetnode field that cannot be translated: ``key`` names it, so the one-line error
    points at the line to fix, not at the check's type."""

    def __init__(self, key: str, problem: str) -> None:
        self.key = key
        super().__init__(problem)


def _number(f: dict, key: str, what: str) -> float:
    value = f.pop(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FieldError(key, f"expected {what} as a number, found {value!r}")
    return value


def _binary(value: Any) -> Any:
    """vetnode's ``"8 GB"`` / ``"15 GB/s"`` mean powers of 1024: say so explicitly."""
    if isinstance(value, str):
        return re.sub(r"(?<=\d)\s*([kKMGTP])B", lambda m: f" {m.group(1).upper()}iB", value)
    return value


def _gpu(f: dict) -> dict:
    out: dict[str, Any] = {}
    if "max_temp" in f:
        out["max_temperature"] = _number(f, "max_temp", "a temperature in degrees C") - 1
    if "max_used_memory" in f:
        out["max_memory_used_fraction"] = f.pop("max_used_memory")
    return out | f


def _cuda(f: dict) -> dict:
    f.pop("cuda_home", None)
    return {"device": "gpu"} | f


_METHODS = {"allreduce": "allreduce", "broadcast": "broadcast", "gather": "allgather",
            "allreduce-gather": "allreduce"}


def _nccl(f: dict) -> dict:
    out: dict[str, Any] = {"backend": "nccl"}
    f.pop("scheduler", None)
    topology = f.pop("topology", "full")
    if not isinstance(topology, str):
        raise FieldError("topology", f"expected 'full' or 'intranode', found {topology!r}")
    if topology == "intranode":
        out["topology"] = "intranode"
    method = f.pop("method", "allreduce")
    if not isinstance(method, str) or method not in _METHODS:
        raise FieldError("method", f"vetnode method '{method}' has no hpcml equivalent "
                         f"(use one of {', '.join(_METHODS)})")
    out["method"] = _METHODS[method]
    for key in ("payload", "min_bandwidth"):
        if key in f:
            out[key] = _binary(f.pop(key))
    if isinstance(f.get("warmup"), dict):
        out["warmup"] = {k: _binary(v) for k, v in f.pop("warmup").items()}
    return out | f


def _env(f: dict) -> dict:
    return f


def _tcp(f: dict) -> dict:
    if "timeout" in f:  # vetnode's connect timeout, not the check's deadline
        f["connect_timeout"] = f.pop("timeout")
    return f


#: vetnode class path -> (hpcml type, field converter, pip names hpcml's check needs)
MAPPING: dict[str, tuple[str, Callable[[dict], dict], tuple[str, ...]]] = {
    "gpu_eval.GPUEval": ("gpu", _gpu, ()),      # nvidia-ml-py is a dependency of hpcml
    "cuda_eval.CUDAEval": ("compute", _cuda, ("torch",)),
    "nccl_lib_eval.NcclLibEval": ("collective", _nccl, ("torch",)),
    "nccl_pytorch_eval.NcclPytorchEval": ("collective", _nccl, ("torch",)),
    "env_var_eval.EnvVarEval": ("env", _env, ()),
    "internet_access.InternetAccessEval": ("tcp", _tcp, ()),
}


def is_vetnode(type_name: str) -> bool:
    return type_name.startswith(_PREFIX)


def translate(type_name: str, fields: dict) -> tuple[str, dict, tuple[str, ...]]:
    """vetnode type and fields -> hpcml type, parameters, pip names it needs."""
    key = type_name[len(_PREFIX):]
    if key not in MAPPING:
        known = ", ".join(_PREFIX + k for k in MAPPING)
        raise LookupError(f"vetnode check '{type_name}' has no hpcml equivalent (supported: {known})")
    hpcml_type, convert, needs = MAPPING[key]
    return hpcml_type, convert(dict(fields)), needs
