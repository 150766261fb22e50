"""FAKE of DCGM's ``dcgm_structs`` module, for tests: DCGM cannot exist here.

Status codes are DCGM's documented values; ``DCGMError(code)`` returns the code's own
subclass, as the real bindings do, so ``except dcgmExceptionClass(code)`` works."""

DCGM_ST_OK = 0
DCGM_ST_BADPARAM = -1
DCGM_ST_GENERIC_ERROR = -3
DCGM_ST_NOT_SUPPORTED = -6
DCGM_ST_NO_DATA = -14
DCGM_ST_NOT_WATCHED = -16
DCGM_ST_NO_PERMISSION = -17
DCGM_ST_CONNECTION_NOT_VALID = -21
DCGM_ST_LIBRARY_NOT_FOUND = -25
DCGM_ST_REQUIRES_ROOT = -29
DCGM_ST_MODULE_NOT_LOADED = -33
DCGM_ST_IN_USE = -34
DCGM_ST_PROFILING_NOT_SUPPORTED = -36
DCGM_ST_PROFILING_LIBRARY_ERROR = -37
DCGM_ST_PROFILING_MULTI_PASS = -38

DCGM_OPERATION_MODE_AUTO = 1
DCGM_OPERATION_MODE_MANUAL = 2
DCGM_GROUP_DEFAULT = 0
DCGM_GROUP_EMPTY = 1
DCGM_GROUP_ALL_GPUS = 0x7FFFFFFF

_TEXT = {
    DCGM_ST_BADPARAM: "Bad parameter passed to function",
    DCGM_ST_NOT_SUPPORTED: "Feature not supported",
    DCGM_ST_NO_DATA: "No data is available",
    DCGM_ST_NOT_WATCHED: "Field is not being updated",
    DCGM_ST_CONNECTION_NOT_VALID: "The connection to the host engine is not valid any longer",
    DCGM_ST_LIBRARY_NOT_FOUND: "DCGM library could not be found",
    DCGM_ST_IN_USE: "The requested operation could not be completed because the affected resource is in use",
    DCGM_ST_PROFILING_NOT_SUPPORTED: "Profiling is not supported for this group of GPUs or GPU",
    DCGM_ST_PROFILING_MULTI_PASS: "The requested profiling metrics cannot be collected in a single pass",
}
_CLASSES = {}


class DCGMError(Exception):
    def __new__(cls, value):
        if cls is DCGMError:
            cls = _CLASSES.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value):
        super().__init__(value)
        self.value = value

    def __str__(self):
        return _TEXT.get(self.value, f"DCGM Error with code {self.value}")


for _name, _code in list(globals().items()):
    if _name.startswith("DCGM_ST_") and _code != DCGM_ST_OK:
        _cls = "DCGMError_" + "".join(p.capitalize() for p in _name[len("DCGM_ST_"):].split("_"))
        _CLASSES[_code] = type(_cls, (DCGMError,), {})
        globals()[_cls] = _CLASSES[_code]


def dcgmExceptionClass(error_code):
    return _CLASSES.get(error_code)


def _dcgmCheckReturn(ret):
    if ret != DCGM_ST_OK:
        raise DCGMError(ret)
    return ret


def _dcgmInit(libDcgmPath=None):
    return None
