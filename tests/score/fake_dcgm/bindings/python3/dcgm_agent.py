"""FAKE of DCGM's ``dcgm_agent`` module with a replaying host engine, for tests.

DCGM cannot exist on the machines the tests run on (no GPU, no nv-hostengine). The
functions have the names and call signatures of DCGM's documented Python bindings; the
"host engine" behind them replays the JSON file named by ``HPCML_FAKE_DCGM`` (see
../../README.md). Each call is appended to ``CALLS`` (and, with ``HPCML_FAKE_DCGM_LOG``, to
that file as a JSON line) so tests can check what the sampler asked for.
"""

import itertools
import json
import os
from types import SimpleNamespace

import dcgm_fields
import dcgm_structs
import dcgmvalue

CALLS = []
_ENGINES = {}
_IDS = itertools.count(1)
PROFILING = range(1001, 1013)


class _Id:
    """Stands for the ctypes c_void_p handles and ids the real bindings return."""

    def __init__(self, value):
        self.value = value

    def __repr__(self):
        return f"_Id({self.value})"


def _v(x):
    return x.value if isinstance(x, _Id) else x


def _log(name, *args):
    entry = {"pid": os.getpid(), "call": name, "args": [_v(a) if not isinstance(a, (list, tuple)) else list(a)
                                                          for a in args]}
    CALLS.append(entry)
    path = os.environ.get("HPCML_FAKE_DCGM_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry, default=str) + "\n")


def _fail(code):
    raise dcgm_structs.DCGMError(code)


class _Engine:
    def __init__(self, data):
        self.gpus = {int(g["gpuId"]): g for g in data.get("gpus", [])}
        self.watch_error = data.get("watch_error")
        self.cache = [s for s in data.get("history", [])]
        self.ticks = [list(t) for t in data.get("ticks", [])]
        self.groups = {}             # group id -> [gpu ids]
        self.field_groups = {}       # field group id -> [field ids]
        self.watches = set()         # (group id, field group id)


def _engine(handle):
    eng = _ENGINES.get(_v(handle))
    if eng is None:
        _fail(dcgm_structs.DCGM_ST_CONNECTION_NOT_VALID)
    return eng


def _raw(field_id, ts, value):
    """A field value as the real callback receives it (c_dcgmFieldValue_v1's members)."""
    ftype = dcgm_fields._field_type(field_id)
    status = dcgm_structs.DCGM_ST_OK
    union = SimpleNamespace(i64=0, dbl=0.0, str="")
    if isinstance(value, str) and value.startswith("STATUS:"):
        status = getattr(dcgm_structs, value[len("STATUS:"):])
    elif isinstance(value, str) and ftype != dcgm_fields.DCGM_FT_STRING:
        value = getattr(dcgmvalue, value)            # a named blank sentinel
    if status == dcgm_structs.DCGM_ST_OK:
        if ftype == dcgm_fields.DCGM_FT_DOUBLE:
            union.dbl = float(value)
        elif ftype == dcgm_fields.DCGM_FT_STRING:
            union.str = str(value)
        else:
            union.i64 = int(value)
    return SimpleNamespace(version=1, fieldId=field_id, fieldType=ord(ftype), status=status,
                           ts=int(ts), value=union)


def dcgmInit():
    _log("dcgmInit")
    return dcgm_structs.DCGM_ST_OK


def dcgmShutdown():
    _log("dcgmShutdown")
    return dcgm_structs.DCGM_ST_OK


def dcgmStartEmbedded(opMode):
    _log("dcgmStartEmbedded", opMode)
    _fail(dcgm_structs.DCGM_ST_NOT_SUPPORTED)        # the sampler must never embed


def dcgmConnect_v2(ip_address, connectParams, version=None):
    _log("dcgmConnect_v2", ip_address)
    path = os.environ.get("HPCML_FAKE_DCGM")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (TypeError, OSError, ValueError):
        data = {"reachable": False}
    if not data.get("reachable", True):
        _fail(dcgm_structs.DCGM_ST_CONNECTION_NOT_VALID)
    handle = _Id(next(_IDS))
    _ENGINES[handle.value] = _Engine(data)
    return handle


def dcgmDisconnect(dcgm_handle):
    _log("dcgmDisconnect", dcgm_handle)
    _engine(dcgm_handle)
    del _ENGINES[_v(dcgm_handle)]
    return dcgm_structs.DCGM_ST_OK


def dcgmGetAllSupportedDevices(dcgm_handle):
    _log("dcgmGetAllSupportedDevices", dcgm_handle)
    return sorted(_engine(dcgm_handle).gpus)


def dcgmGetAllDevices(dcgm_handle):
    return dcgmGetAllSupportedDevices(dcgm_handle)


def dcgmGetDeviceAttributes(dcgm_handle, gpuId, version=None):
    _log("dcgmGetDeviceAttributes", dcgm_handle, gpuId)
    g = _engine(dcgm_handle).gpus.get(int(gpuId))
    if g is None:
        _fail(dcgm_structs.DCGM_ST_BADPARAM)
    ids = SimpleNamespace(brandName="NVIDIA", deviceName=g.get("name", ""), pciBusId=g.get("busId", ""),
                          serial="", uuid=g.get("uuid", ""), vbios="", inforomImageVersion="",
                          pciDeviceId=0, pciSubSystemId=0, driverVersion="", virtualizationMode=0)
    return SimpleNamespace(version=3, identifiers=ids)


def dcgmEntityGetLatestValues(dcgmHandle, entityGroup, entityId, fieldIds):
    _log("dcgmEntityGetLatestValues", dcgmHandle, entityGroup, entityId, list(fieldIds))
    g = _engine(dcgmHandle).gpus.get(int(entityId), {})
    out = []
    for fid in fieldIds:
        known = {dcgm_fields.DCGM_FI_DEV_NVML_INDEX: g.get("nvmlIndex"),
                 dcgm_fields.DCGM_FI_DEV_NAME: g.get("name"), dcgm_fields.DCGM_FI_DEV_UUID: g.get("uuid")}
        value = known.get(fid)
        out.append(_raw(fid, 0, value if value is not None else "STATUS:DCGM_ST_NOT_WATCHED"))
    return out


def _pop_or_fail(table: dict, handle_id) -> None:
    """Destroying an id the engine does not know is BADPARAM, as in DCGM."""
    if table.pop(_v(handle_id), None) is None:
        _fail(dcgm_structs.DCGM_ST_BADPARAM)


def dcgmGroupCreate(dcgm_handle, type, groupName):
    _log("dcgmGroupCreate", dcgm_handle, type, groupName)
    eng = _engine(dcgm_handle)
    gid = _Id(next(_IDS))
    eng.groups[gid.value] = [] if type == dcgm_structs.DCGM_GROUP_EMPTY else sorted(eng.gpus)
    return gid


def dcgmGroupDestroy(dcgm_handle, group_id):
    _log("dcgmGroupDestroy", dcgm_handle, group_id)
    eng = _engine(dcgm_handle)
    _pop_or_fail(eng.groups, group_id)
    eng.watches = {w for w in eng.watches if w[0] != _v(group_id)}
    return dcgm_structs.DCGM_ST_OK


def dcgmGroupAddDevice(dcgm_handle, group_id, gpu_id):
    _log("dcgmGroupAddDevice", dcgm_handle, group_id, gpu_id)
    eng = _engine(dcgm_handle)
    if int(gpu_id) not in eng.gpus or _v(group_id) not in eng.groups:
        _fail(dcgm_structs.DCGM_ST_BADPARAM)
    eng.groups[_v(group_id)].append(int(gpu_id))
    return dcgm_structs.DCGM_ST_OK


def dcgmGroupGetInfo(dcgm_handle, group_id, version=None):
    _log("dcgmGroupGetInfo", dcgm_handle, group_id)
    members = _engine(dcgm_handle).groups[_v(group_id)]
    entities = [SimpleNamespace(entityGroupId=dcgm_fields.DCGM_FE_GPU, entityId=g) for g in members]
    return SimpleNamespace(count=len(entities), entityList=entities)


def dcgmFieldGroupCreate(dcgm_handle, fieldIds, fieldGroupName):
    _log("dcgmFieldGroupCreate", dcgm_handle, list(fieldIds), fieldGroupName)
    fid = _Id(next(_IDS))
    _engine(dcgm_handle).field_groups[fid.value] = [int(f) for f in fieldIds]
    return fid


def dcgmFieldGroupDestroy(dcgm_handle, fieldGroupId):
    _log("dcgmFieldGroupDestroy", dcgm_handle, fieldGroupId)
    _pop_or_fail(_engine(dcgm_handle).field_groups, fieldGroupId)
    return dcgm_structs.DCGM_ST_OK


def dcgmWatchFields(dcgm_handle, groupId, fieldGroupId, updateFreq, maxKeepAge, maxKeepSamples):
    _log("dcgmWatchFields", dcgm_handle, groupId, fieldGroupId, updateFreq, maxKeepAge, maxKeepSamples)
    eng = _engine(dcgm_handle)
    fields = eng.field_groups[_v(fieldGroupId)]
    if eng.watch_error and any(f in PROFILING for f in fields):
        _fail(getattr(dcgm_structs, eng.watch_error))
    eng.watches.add((_v(groupId), _v(fieldGroupId)))
    return dcgm_structs.DCGM_ST_OK


def dcgmUnwatchFields(dcgm_handle, groupId, fieldGroupId):
    _log("dcgmUnwatchFields", dcgm_handle, groupId, fieldGroupId)
    _engine(dcgm_handle).watches.discard((_v(groupId), _v(fieldGroupId)))
    return dcgm_structs.DCGM_ST_OK


def dcgmUpdateAllFields(dcgm_handle, waitForUpdate):
    _log("dcgmUpdateAllFields", dcgm_handle, waitForUpdate)
    _engine(dcgm_handle)
    return dcgm_structs.DCGM_ST_OK


def dcgmGetValuesSince_v2(dcgm_handle, groupId, fieldGroupId, sinceTimestamp, enumCB, userData):
    """Release the next tick into the cache, then enumerate the watched values newer than
    ``sinceTimestamp``, per entity, through ``enumCB``; returns the next since-timestamp."""
    _log("dcgmGetValuesSince_v2", dcgm_handle, groupId, fieldGroupId, sinceTimestamp)
    eng = _engine(dcgm_handle)
    if eng.ticks:
        eng.cache += eng.ticks.pop(0)
    if (_v(groupId), _v(fieldGroupId)) not in eng.watches:
        _fail(dcgm_structs.DCGM_ST_NOT_WATCHED)
    members = set(eng.groups[_v(groupId)])
    fields = eng.field_groups[_v(fieldGroupId)]
    nxt = sinceTimestamp
    per_gpu = {}
    for s in eng.cache:
        if int(s["gpuId"]) not in members or int(s["ts"]) < sinceTimestamp:
            continue
        for key, value in s["values"].items():
            if int(key) in fields:
                per_gpu.setdefault(int(s["gpuId"]), []).append(_raw(int(key), s["ts"], value))
        nxt = max(nxt, int(s["ts"]) + 1)
    for gpu, values in sorted(per_gpu.items()):
        enumCB(dcgm_fields.DCGM_FE_GPU, gpu, values, len(values), userData)
    return nxt


def dcgmFieldValueEntityEnumeration_f(fn):
    """The real one is a ctypes CFUNCTYPE; here the callback is called directly."""
    return fn
