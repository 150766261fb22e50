"""GPU sampler through DCGM's Python bindings, for the GPUs bound to this task only.

DCGM's profiling fields (1001-1012: SM activity, occupancy, pipe activity, DRAM activity,
PCIe/NVLink bytes) are what the saturation score needs; NVML has none of them. The sampler
talks to a running host engine (``nv-hostengine``; standalone mode, address from
``DCGM_HOSTENGINE``, default ``localhost``; ``unix:/path`` or ``/path`` for a Unix socket)
through the bindings DCGM installs beside itself (``$DCGM_HOME/bindings/python3``,
``/usr/share/datacenter-gpu-manager-4/bindings/python3`` or
``/usr/local/dcgm/bindings/python3``).

What it does with them:

- a GPU group holding only this task's GPUs: Slurm's indices are matched to DCGM's GPU ids
  through each GPU's NVML index (field 52), UUIDs through the device attributes;
- one field group, profiling fields plus the device fields (utilisation, power, energy,
  clocks, clock-event reasons, framebuffer), watched at the recorder's interval, kept a few
  intervals in DCGM's cache;
- at each ``sample()``, every value DCGM cached since the previous call, with DCGM's own
  timestamp (``dcgmGetValuesSince_v2`` through the bindings' field-value collection), so a
  late sample keeps its true time and none is sampled twice. DCGM's blank values (the
  ``*_BLANK``, ``*_NOT_FOUND``, ``*_NOT_SUPPORTED``, ``*_NOT_PERMISSIONED`` sentinels, or
  a non-OK status) are no row: missing stays missing, never 0;
- when the profiling fields cannot be watched together (they need several passes on this
  GPU, profiling is unsupported, or another profiler such as Nsight holds the counters),
  only the device fields are watched, ``saturation`` is False and ``note`` says why.

The first fetch after the watch starts is discarded (as DCGM's own DcgmReader does): it
returns everything in DCGM's cache, which may hold another watcher's older samples.

No GPU or DCGM exists on the development machines; the tests run this module against a
replaying fake of the bindings (tests/score/fake_dcgm). The live path is untested here.
"""

from __future__ import annotations

import importlib
import math
import os
import sys
import uuid as _uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from hpcml.errors import HpcmlError
from hpcml.samplers import SamplerUnavailable
from hpcml.samplers.fields import BY_ID, PROFILING_IDS

DEVICE_IDS = (203, 155, 156, 100, 101, 112, 250, 251, 252, 253)
FI_DEV_NVML_INDEX = 52
DEFAULT_DIRS = ("/usr/share/datacenter-gpu-manager-4/bindings/python3",
                "/usr/local/dcgm/bindings/python3")
MODULES = ("dcgmvalue", "dcgm_structs", "dcgm_fields", "dcgm_agent", "dcgm_field_helpers", "pydcgm")
CONNECT_TIMEOUT_MS = 2000
KEEP_INTERVALS = 5            # DCGM keeps this many intervals of samples between two reads
MIN_KEEP_S = 10.0

# Why a watch of the profiling fields may fail, by DCGM status name (looked up in
# dcgm_structs, so a name an older DCGM lacks is simply skipped).
PROFILING_FAILURES = {
    "DCGM_ST_PROFILING_MULTI_PASS": "they cannot be collected in one pass on this GPU",
    "DCGM_ST_PROFILING_NOT_SUPPORTED": "this GPU does not support profiling fields",
    "DCGM_ST_NOT_SUPPORTED": "this GPU does not support profiling fields",
    "DCGM_ST_IN_USE": "the profiling counters are in use by another profiler (Nsight?)",
    "DCGM_ST_MODULE_NOT_LOADED": "DCGM's profiling module is not loaded",
    "DCGM_ST_PROFILING_LIBRARY_ERROR": "DCGM's profiling library failed",
    "DCGM_ST_REQUIRES_ROOT": "the host engine must run as root for profiling fields",
}


class DcgmUnavailable(HpcmlError, RuntimeError):
    """DCGM cannot be used here; the message says why in one line (exit 1)."""


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def binding_dirs(env: Mapping[str, str] | None = None) -> list[Path]:
    """Where to look for the bindings, most specific first."""
    env = _env(env)
    dirs: list[Path] = []
    home = env.get("DCGM_HOME")
    if home:
        dirs += [Path(home) / "bindings" / "python3", Path(home) / "bindings", Path(home)]
    dirs += [Path(d) for d in DEFAULT_DIRS]
    return dirs


def load_bindings(env: Mapping[str, str] | None = None) -> SimpleNamespace:
    """Import DCGM's binding modules (``pydcgm``, ``dcgm_structs`` ...); DcgmUnavailable if absent."""
    found = next((d for d in binding_dirs(env) if (d / "pydcgm.py").is_file()), None)
    if found is not None and str(found) not in sys.path:
        sys.path.insert(0, str(found))
    try:
        mods = {name: importlib.import_module(name) for name in MODULES}
    except ImportError as exc:
        looked = ", ".join(str(d) for d in binding_dirs(env))
        raise DcgmUnavailable(f"DCGM's Python bindings are not installed ({exc.name} not found; "
                              f"looked in DCGM_HOME and {looked})") from None
    return SimpleNamespace(path=str(found) if found else None, **mods)


def hostengine_address(env: Mapping[str, str] | None = None) -> str:
    return _env(env).get("DCGM_HOSTENGINE") or "localhost"


def _connect(b: SimpleNamespace, address: str, timeout_ms: int = CONNECT_TIMEOUT_MS):
    """A handle to a standalone host engine (never an embedded one: that would need root
    and would fight the node's own nv-hostengine for the profiling counters)."""
    kw = {"opMode": b.dcgm_structs.DCGM_OPERATION_MODE_AUTO, "timeoutMs": timeout_ms}
    if address.startswith("unix:"):
        kw["unixSocketPath"] = address[len("unix:"):]
    elif address.startswith("/"):
        kw["unixSocketPath"] = address
    else:
        kw["ipAddress"] = address
    return b.pydcgm.DcgmHandle(**kw)


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    code = getattr(exc, "value", None)
    return f"{text} (DCGM status {code})" if isinstance(code, int) else text


@dataclass
class Probe:
    """Whether a DCGM host engine answers, and if not, why not."""

    ok: bool
    reason: str
    address: str
    bindings: str | None = None
    gpus: int = 0

    def __bool__(self) -> bool:
        return self.ok


def probe(env: Mapping[str, str] | None = None, timeout_ms: int = CONNECT_TIMEOUT_MS) -> Probe:
    """Connect, count the GPUs DCGM supports, disconnect."""
    address = hostengine_address(env)
    try:
        b = load_bindings(env)
    except DcgmUnavailable as exc:
        return Probe(False, str(exc), address)
    try:
        handle = _connect(b, address, timeout_ms)
    except Exception as exc:  # noqa: BLE001 - any failure to connect is "not reachable"
        return Probe(False, f"no DCGM host engine reachable at {address}: {_describe(exc)} "
                            "(is nv-hostengine running? DCGM_HOSTENGINE sets the address)",
                     address, b.path)
    try:
        gpus = list(handle.GetSystem().discovery.GetAllSupportedGpuIds())
    except Exception as exc:  # noqa: BLE001
        return Probe(False, f"the DCGM host engine at {address} did not list its GPUs: "
                            f"{_describe(exc)}", address, b.path)
    finally:
        try:
            handle.Shutdown()
        except Exception:  # noqa: BLE001
            pass
    if not gpus:
        return Probe(False, f"the DCGM host engine at {address} supports no GPU on this node",
                     address, b.path)
    return Probe(True, f"DCGM host engine at {address}, {len(gpus)} GPUs", address, b.path, len(gpus))


def _is_uuid(entry: str) -> bool:
    return entry.upper().startswith(("GPU-", "MIG-"))


class DcgmSampler:
    """Samples this task's GPUs through a DCGM host engine; same interface as NvmlSampler."""

    def __init__(self, bound_gpus: Sequence[str], interval: float,
                 env: Mapping[str, str] | None = None) -> None:
        """``bound_gpus``: Slurm/NVML indices or UUIDs (empty: every GPU DCGM supports)."""
        self.bound = [str(g).strip() for g in bound_gpus if str(g).strip()]
        self.interval = float(interval)
        self.address = hostengine_address(env)
        self.env = _env(env)
        self.saturation = False
        self.note: str | None = None
        self.notes: list[str] = []
        self.models: dict[str, str] = {}
        self.uuids: dict[str, str] = {}
        self.field_ids: tuple[int, ...] = ()
        self.index_of: dict[int, int] = {}       # DCGM GPU id -> the index rows carry
        self.cleanup_errors: list[str] = []
        self._last_ts: dict[tuple[int, int], int] = {}
        # objects of the untyped DCGM bindings: handle, GPU group, field group, value collection
        self._handle: Any = None
        self._group: Any = None
        self._fields: Any = None
        self._values: Any = None
        self._watching = False
        self._closed = False
        self.b = load_bindings(env)
        try:
            self._open()
        except Exception:
            self.close()
            raise

    # -- set-up -----------------------------------------------------------------------

    def _nvml_index(self, gpu_id: int) -> int | None:
        """NVML's index of a DCGM GPU (DCGM numbers GPUs its own way)."""
        b = self.b
        try:
            v = b.dcgm_agent.dcgmEntityGetLatestValues(self._handle.handle, b.dcgm_fields.DCGM_FE_GPU,
                                                       gpu_id, [FI_DEV_NVML_INDEX])[0]
            if v.status != b.dcgm_structs.DCGM_ST_OK:
                return None
            i = int(v.value.i64)
            return None if b.dcgmvalue.DCGM_INT64_IS_BLANK(i) else i
        except Exception:  # noqa: BLE001 - unknown: fall back to DCGM's own id
            return None

    def _as_uuids(self, bound: list[str]) -> list[str]:
        """Slurm's device numbers and CUDA's ordinals as UUIDs, read from this process's own
        NVML (``samplers.binding``): the host engine numbers GPUs by NVML index over the whole
        node, which neither is. Where NVML cannot be read here they stay numbers, said; an
        entry NVML cannot place matches no GPU."""
        from hpcml.samplers.binding import source_of
        from hpcml.samplers.nvml import uuids_of
        source = source_of(bound, self.env)
        if source is None or all(_is_uuid(e) for e in bound):
            return bound
        try:
            uuids, notes = uuids_of(bound, source, self.env)
        except Exception as exc:  # noqa: BLE001 - no NVML in this process: the numbers stay
            self.notes.append(f"{source}'s GPU numbers taken as NVML indices (NVML not readable here: "
                              f"{type(exc).__name__})")
            return bound
        self.notes += [n for n in notes if n not in self.notes]
        return [u or f"{source}={e}" for u, e in zip(uuids, bound)]

    def _select(self, ids: dict[int, object]) -> list[tuple[int, int]]:
        """(DCGM GPU id, row index) for each bound GPU DCGM knows."""
        if not self.bound:
            nvml = {g: self._nvml_index(g) for g in ids}
            return [(g, i if (i := nvml[g]) is not None else g) for g in sorted(ids)]
        by_uuid = {str(getattr(i, "uuid", "")).upper(): g for g, i in ids.items()}
        nvml = ({g: self._nvml_index(g) for g in ids}
                if any(not _is_uuid(e) for e in self.bound) else {})
        by_index = {i: g for g, i in nvml.items() if i is not None}
        chosen, unknown, assumed = [], [], False
        for entry in self.bound:
            if _is_uuid(entry):
                g = by_uuid.get(entry.upper())
                if g is not None:
                    idx = self._nvml_index(g) if g not in nvml else nvml[g]
                    chosen.append((g, idx if idx is not None else g))
                else:
                    unknown.append(entry)
            elif entry.isdigit():
                i = int(entry)
                if i in by_index:
                    chosen.append((by_index[i], i))
                elif not by_index and i in ids:
                    chosen.append((i, i))             # no NVML index from DCGM: ids as indices
                    assumed = True
                else:
                    unknown.append(entry)
            else:
                unknown.append(entry)
        if assumed:
            self.notes.append("DCGM gave no NVML index; its GPU ids were taken as Slurm's indices")
        if unknown:
            self.notes.append(f"GPUs {unknown} of this task are not GPUs DCGM supports here; not recorded")
        seen, out = set(), []
        for g, idx in chosen:
            if g not in seen:
                seen.add(g)
                out.append((g, idx))
        return out

    def _open(self) -> None:
        b = self.b
        try:
            self._handle = _connect(b, self.address)
        except Exception as exc:  # noqa: BLE001
            raise DcgmUnavailable(f"cannot connect to the DCGM host engine at {self.address}: "
                                  f"{_describe(exc)}") from None
        system = self._handle.GetSystem()
        ids = {int(g): system.discovery.GetGpuAttributes(g).identifiers
               for g in system.discovery.GetAllSupportedGpuIds()}
        self.bound = self._as_uuids(self.bound)
        chosen = self._select(ids)
        if not chosen:
            raise DcgmUnavailable(f"none of this task's GPUs {self.bound or '(all)'} is a GPU "
                                  f"the DCGM host engine at {self.address} supports")
        token = f"{os.getpid()}-{_uuid.uuid4().hex[:8]}"
        self._group = b.pydcgm.DcgmGroup(self._handle, groupName=f"hpcml-{token}",
                                         groupType=b.dcgm_structs.DCGM_GROUP_EMPTY)
        for g, idx in chosen:
            self._group.AddGpu(g)
            self.index_of[g] = idx
            self.models[str(idx)] = str(getattr(ids[g], "deviceName", "") or "")
            self.uuids[str(idx)] = str(getattr(ids[g], "uuid", "") or "")
        self.models = {k: v for k, v in self.models.items() if v}
        update_us = max(int(round(self.interval * 1e6)), 1)
        keep_s = max(KEEP_INTERVALS * self.interval, MIN_KEEP_S)
        try:
            self._watch(tuple(PROFILING_IDS) + DEVICE_IDS, f"hpcml-prof-{token}", update_us, keep_s)
            self.saturation = True
        except b.dcgm_structs.DCGMError as exc:
            why = self._profiling_failure(exc)
            if why is None:
                raise
            self._drop_fields()
            self._watch(DEVICE_IDS, f"hpcml-dev-{token}", update_us, keep_s)
            self.note = (f"DCGM profiling fields not watched: {why} ({exc}); device fields only, "
                         "temporal utilisation, no saturation")
        try:
            system.UpdateAllFields(1)
        except Exception:  # noqa: BLE001 - the cache fills on its own in auto mode
            pass
        self._values = b.dcgm_field_helpers.DcgmFieldValueEntityCollection(self._handle.handle,
                                                                           self._group.GetId())
        self._fetch()                          # discard what was cached before our watch

    def _profiling_failure(self, exc: BaseException) -> str | None:
        st = self.b.dcgm_structs
        code = getattr(exc, "value", None)
        for name, why in PROFILING_FAILURES.items():
            if code is not None and getattr(st, name, object()) == code:
                return why
        return None

    def _watch(self, field_ids: tuple[int, ...], name: str, update_us: int, keep_s: float) -> None:
        self._fields = self.b.pydcgm.DcgmFieldGroup(self._handle, name=name, fieldIds=list(field_ids))
        self._group.samples.WatchFields(self._fields, update_us, keep_s, 0)
        self._watching = True
        self.field_ids = field_ids

    def _drop_fields(self) -> None:
        """Undo a field group whose watch failed (part of it may be watched)."""
        try:
            self._group.samples.UnwatchFields(self._fields)
        except Exception:  # noqa: BLE001
            pass
        try:
            self._fields.Delete()
        except Exception:  # noqa: BLE001
            pass
        self._fields, self._watching = None, False

    # -- sampling ---------------------------------------------------------------------

    def _number(self, v) -> float | None:
        """The value as a float, or None for any DCGM blank (never 0)."""
        if getattr(v, "isBlank", False):
            return None
        x = getattr(v, "value", None)
        if x is None or isinstance(x, (bool, str, bytes)):
            return None
        dv = self.b.dcgmvalue
        if isinstance(x, int):
            # 64-bit sentinels only: an int64 counter (energy in mJ) legitimately passes
            # the 32-bit sentinel range after a few hours.
            return None if dv.DCGM_INT64_IS_BLANK(x) else float(x)
        try:
            x = float(x)
        except (TypeError, ValueError):
            return None
        return None if not math.isfinite(x) or dv.DCGM_FP64_IS_BLANK(x) else x

    def _fetch(self) -> dict:
        self._values.GetAllSinceLastCall(self._fields)
        values = self._values.values
        self._values.EmptyValues()
        return values

    def sample(self, ts: int | None = None) -> list[tuple]:
        """Rows ``(dcgm_ts_ns, "gpu", field, value, None, gpu_index)`` since the last call;
        ``ts`` (the recorder's clock) is not used: DCGM's timestamps are kept."""
        values = self._fetch()
        fe_gpu = self.b.dcgm_fields.DCGM_FE_GPU
        rows = []
        for gpu_id, fields in values.get(fe_gpu, {}).items():
            idx = self.index_of.get(int(gpu_id))
            if idx is None:
                continue                       # not ours (cannot happen with our own group)
            for fid, series in fields.items():
                f = BY_ID.get(int(fid))
                if f is None:
                    continue
                key = (int(gpu_id), int(fid))
                last = self._last_ts.get(key, -1)
                newest = last
                for v in series:
                    t = int(v.ts)
                    if t <= last:
                        continue               # already emitted
                    newest = max(newest, t)
                    x = self._number(v)
                    if x is not None:
                        rows.append((t * 1000, "gpu", f.name, x, None, idx))
                self._last_ts[key] = newest
        rows.sort(key=lambda r: r[0])
        return rows

    def label(self) -> dict:
        note = self.note or "DCGM profiling fields: saturation"
        if self.notes:
            note = "; ".join([note, *self.notes])
        return {"kind": "dcgm", "saturation": self.saturation, "note": note,
                "hostengine": self.address, "fields": list(self.field_ids)}

    # -- clean-up ---------------------------------------------------------------------

    def close(self) -> None:
        """Unwatch, destroy the field group and the GPU group, disconnect (each step is
        tried even if an earlier one failed: the host engine may be gone)."""
        if self._closed:
            return
        self._closed = True
        steps: list[tuple[str, Callable[[], object]]] = []
        if self._watching and self._group is not None and self._fields is not None:
            steps.append(("unwatch", lambda: self._group.samples.UnwatchFields(self._fields)))
        if self._fields is not None:
            steps.append(("field group", self._fields.Delete))
        if self._group is not None:
            steps.append(("group", self._group.Delete))
        if self._handle is not None:
            steps.append(("disconnect", self._handle.Shutdown))
        for what, step in steps:
            try:
                step()
            except Exception as exc:  # noqa: BLE001
                self.cleanup_errors.append(f"{what}: {exc}")
        self._watching = False
        self._fields = self._group = self._handle = self._values = None


def open_sampler(gpus: Sequence[str], interval: float,
                 env: Mapping[str, str] | None = None) -> tuple[DcgmSampler, dict]:
    """``dcgm`` in hpcml.samplers.choose: the sampler and its label, or SamplerUnavailable
    saying why a host engine cannot be used."""
    found = probe(env)
    if not found.ok:
        raise SamplerUnavailable(found.reason)
    try:
        sampler = DcgmSampler(gpus, interval, env)
    except Exception as exc:  # noqa: BLE001 - any DCGM failure: say why
        raise SamplerUnavailable(f"{type(exc).__name__}: {exc}" if not str(exc).strip() else str(exc)) from exc
    return sampler, sampler.label()
