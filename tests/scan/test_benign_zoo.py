"""What users pickle every day is safe.

Each object below is written in ``tmp_path`` by the real producers (``pickle`` protocols
0 to 5, ``joblib.dump``, ``torch.save`` in its zip and its legacy format), scanned, and
loaded twice: by ``hpcml.scan.safe_load`` and by the producer's own loader
(``pickle.load``, ``joblib.load``, ``torch.load(weights_only=False)``). The scan must say
``safe`` and the two loads must give the same object, to the byte.

A tensor pickled with ``pickle`` or ``joblib`` (not ``torch.save``) goes through
``torch.storage._load_from_bytes``, whose argument is an ordinary legacy torch file.
"""

from __future__ import annotations
import __future__

import copyreg
import io
import math
import pickle
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hpcml.scan.loader import safe_load
from hpcml.scan.model import Verdict
from hpcml.scan.scanner import scan_file
from tests import needs

# ---------------------------------------------------------------------------------------
# The objects
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Obj:
    name: str
    make: Callable[[], Any]
    needs: tuple[str, ...] = ()          # modules it needs (tests/needs.py)
    producers: tuple[str, ...] | None = None   # None: every producer


def _numpy_objects() -> list[Obj]:
    def scalars():
        return [np.float64(1.5), np.float32(-2.25), np.float16(0.5), np.longdouble(3.0), np.int8(-3),
                np.int64(2**40), np.uint16(7), np.uint64(2**63), np.complex128(1 + 2j), np.complex64(3 - 1j),
                np.bool_(True), np.str_("text"), np.bytes_(b"raw"), np.datetime64("2024-01-02T03:04:05"),
                np.timedelta64(5, "s")]

    def structured():
        dt = np.dtype([("id", "<i4"), ("score", "<f8"), ("tag", "S3"), ("xy", "<f4", (2,)),
                       ("inner", [("a", "u1"), ("b", "<i2")])])
        return np.array([(1, 0.5, b"abc", (1.0, 2.0), (3, -4)), (2, -1.5, b"de", (0.0, 9.5), (255, 7))], dtype=dt)

    objs = [
        Obj("ndarray", lambda: np.arange(12, dtype=np.float32).reshape(3, 4)),
        Obj("ndarray_fortran", lambda: np.asfortranarray(np.arange(12, dtype=np.int64).reshape(3, 4))),
        Obj("default_rng", lambda: np.random.default_rng(0)),
        Obj("seed_sequence", lambda: np.random.SeedSequence(1)),
        Obj("random_state", lambda: np.random.RandomState(0)),
        Obj("masked_array_mask", lambda: np.ma.array([1.0, 2.0, 3.0], mask=[False, True, False])),
        Obj("masked_array_fill_value", lambda: np.ma.array([1, 2, 3], mask=[True, False, False], fill_value=-9)),
        Obj("numpy_scalars", scalars),
        Obj("structured_array", structured),
        Obj("datetime64_array", lambda: np.array(["2024-01-01", "2024-06-30", "NaT"], dtype="datetime64[D]")),
        Obj("timedelta64_array", lambda: np.array([1, 2, 3], dtype="timedelta64[ms]")),
    ]
    for bg in ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64"):
        objs.append(Obj(f"bit_generator_{bg}", lambda bg=bg: getattr(np.random, bg)(0)))
        objs.append(Obj(f"generator_{bg}", lambda bg=bg: np.random.Generator(getattr(np.random, bg)(0))))
    return objs


# Every torch dtype that torch.save can write; the classic ones also go through pickle
# (the legacy format), the others only through the zip format (torch refuses the rest).
TORCH_DTYPES_ALL_PRODUCERS = ("float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64",
                              "uint8", "bool", "complex64", "complex128")
TORCH_DTYPES_ZIP_ONLY = ("uint16", "uint32", "uint64", "complex32", "float8_e4m3fn", "float8_e4m3fnuz",
                         "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2",
                         "bits8", "bits16", "bits1x8", "bits2x4", "bits4x2")


def _tensor_of(dtype_name: str):
    import torch
    dtype = getattr(torch, dtype_name)
    base = torch.linspace(-3, 3, 12).reshape(3, 4)
    if dtype is torch.bool:
        return base > 0
    if dtype.is_complex:
        real = base.to(torch.float16 if dtype is torch.complex32 else torch.float64)
        return torch.complex(real, -real).to(dtype)
    if dtype_name.startswith(("bits", "float4", "float8_e8m0")):   # no arithmetic: their bytes
        size = torch.empty((), dtype=dtype).element_size()
        return torch.arange(12 * size, dtype=torch.uint8).view(dtype).reshape(3, -1)
    if not dtype.is_floating_point and dtype_name.startswith("u"):
        return (base.abs() * 10).to(dtype)
    return (base * 10).to(dtype) if not dtype.is_floating_point else base.to(dtype)


def _torch_objects() -> list[Obj]:
    import_torch = ("torch",)

    def view():
        import torch
        return torch.arange(48, dtype=torch.float32).reshape(6, 8)[1:, ::2]

    def dense():
        import torch
        return torch.tensor([[0.0, 1.5, 0.0, 0.0], [2.0, 0.0, 0.0, -1.0], [0.0, 0.0, 3.0, 0.0], [0.0, 4.0, 0.0, 0.0]])

    def quantized(kind: str):
        import torch
        x = dense()
        if kind == "per_channel":
            return torch.quantize_per_channel(x, torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64),
                                              torch.tensor([0, 1, 2, 3]), 0, torch.qint8)
        if kind == "per_channel_float_qparams":      # float zero points (quantized embeddings)
            return torch.quantize_per_channel(x, torch.tensor([0.1, 0.2, 0.3, 0.4]),
                                              torch.tensor([0.0, 1.0, 2.0, 3.0]), 0, torch.quint8)
        dtype = {"per_tensor_quint8": torch.quint8, "per_tensor_qint8": torch.qint8,
                 "per_tensor_qint32": torch.qint32, "per_tensor_quint4x2": torch.quint4x2,
                 "per_tensor_quint2x4": torch.quint2x4}[kind]
        return torch.quantize_per_tensor(x, 0.1, 0 if dtype in (torch.qint8, torch.qint32) else 3, dtype)

    def parameter(dtype_name: str, requires_grad: bool = True):
        import torch
        return torch.nn.Parameter(_tensor_of(dtype_name), requires_grad=requires_grad)

    def state_dict():
        import torch
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2)).state_dict()

    def optimizer_state():
        import torch
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        model(torch.ones(4, 3)).sum().backward()
        opt.step()
        return opt.state_dict()

    objs = [Obj(f"tensor_{d}", lambda d=d: _tensor_of(d), import_torch) for d in TORCH_DTYPES_ALL_PRODUCERS]
    objs += [Obj(f"tensor_{d}", lambda d=d: _tensor_of(d), import_torch, ("torch_zip",)) for d in TORCH_DTYPES_ZIP_ONLY]
    objs += [
        Obj("tensor_strided_view", view, import_torch),
        Obj("tensor_sparse_coo", lambda: dense().to_sparse(), import_torch),
        Obj("tensor_sparse_csr", lambda: dense().to_sparse_csr(), import_torch),
        Obj("tensor_sparse_csc", lambda: dense().to_sparse_csc(), import_torch),
        Obj("tensor_sparse_bsr", lambda: dense().to_sparse_bsr((2, 2)), import_torch),
        Obj("tensor_sparse_bsc", lambda: dense().to_sparse_bsc((2, 2)), import_torch),
        *(Obj(f"tensor_quantized_{k}", lambda k=k: quantized(k), import_torch)
          for k in ("per_tensor_quint8", "per_tensor_qint8", "per_tensor_qint32", "per_tensor_quint4x2",
                    "per_tensor_quint2x4", "per_channel", "per_channel_float_qparams")),
        Obj("parameter", lambda: parameter("float32"), import_torch),
        Obj("parameter_bfloat16", lambda: parameter("bfloat16"), import_torch),
        Obj("parameter_frozen", lambda: parameter("float32", requires_grad=False), import_torch),
        Obj("module_state_dict", state_dict, import_torch),
        Obj("optimizer_state_dict", optimizer_state, import_torch),
    ]
    return objs


class _ByName:
    """Pickles ``__future__.annotations`` as a reference to that global (GLOBAL), as the
    pickle that fickling calls safe does, instead of rebuilding a ``_Feature``."""

    @staticmethod
    def dumps(obj: Any, protocol: int) -> bytes:
        buf = io.BytesIO()
        pickler = pickle.Pickler(buf, protocol)
        pickler.dispatch_table = {**copyreg.dispatch_table, type(obj): lambda o: "annotations"}
        pickler.dump(obj)
        return buf.getvalue()


def _builtin_objects() -> list[Obj]:
    return [
        Obj("builtins_len", lambda: len),
        Obj("future_annotations", lambda: __future__.annotations),
        Obj("future_annotations_by_name", lambda: __future__.annotations,
            producers=tuple(f"pickle{p}" for p in range(6))),
    ]


def _sklearn_objects() -> list[Obj]:
    def data():
        rng = np.random.default_rng(0)
        x = rng.normal(size=(40, 3))
        return x, (x[:, 0] + 0.3 * x[:, 1] > 0).astype(int)

    def fitted(make):
        def build():
            x, y = data()
            return make().fit(x, y)
        return build

    def logistic():
        from sklearn.linear_model import LogisticRegression
        return LogisticRegression()

    def forest():
        from sklearn.ensemble import RandomForestClassifier
        return RandomForestClassifier(n_estimators=3, max_depth=3, random_state=0)

    def scaler():
        from sklearn.preprocessing import StandardScaler
        return StandardScaler()

    def pipeline():
        from sklearn.pipeline import Pipeline
        return Pipeline([("scale", scaler()), ("clf", logistic())])

    need = ("sklearn",)
    return [Obj("sklearn_logistic_regression", fitted(logistic), need),
            Obj("sklearn_random_forest", fitted(forest), need),
            Obj("sklearn_standard_scaler", fitted(scaler), need),
            Obj("sklearn_pipeline", fitted(pipeline), need)]


def _pandas_objects() -> list[Obj]:
    def frame():
        import pandas as pd
        return pd.DataFrame({"i": [1, 2, 3], "f": [0.5, np.nan, 2.5], "s": ["a", "b", "c"], "b": [True, False, True],
                             "t": pd.to_datetime(["2024-01-01", "2024-01-02", "2024-01-03"]),
                             "c": pd.Categorical(["x", "y", "x"])}, index=pd.Index([10, 20, 30], name="id"))

    def series():
        import pandas as pd
        return pd.Series([1.5, 2.5, np.nan], index=["a", "b", "c"], name="score")

    def categorical():
        import pandas as pd
        return pd.Categorical(["low", "high", "low", "mid"], categories=["low", "mid", "high"], ordered=True)

    def datetime_index():
        import pandas as pd
        return pd.date_range("2024-01-01", periods=4, freq="D", tz="UTC", name="day")

    def multi_index():
        import pandas as pd
        return pd.MultiIndex.from_product([["a", "b"], [1, 2]], names=["letter", "number"])

    need = ("pandas",)
    return [Obj("pandas_dataframe", frame, need), Obj("pandas_series", series, need),
            Obj("pandas_categorical", categorical, need), Obj("pandas_datetime_index", datetime_index, need),
            Obj("pandas_multi_index", multi_index, need)]


OBJECTS = _numpy_objects() + _torch_objects() + _builtin_objects() + _sklearn_objects() + _pandas_objects()
_OPT_OUT = {"sklearn": "scikit-learn"}


# ---------------------------------------------------------------------------------------
# The producers and their loaders
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Producer:
    name: str
    suffix: str
    dump: Callable[[Any, Path, Obj], None]
    load: Callable[[Path], Any]
    needs: tuple[str, ...] = ()


def _pickle_dump(protocol: int):
    def dump(obj: Any, path: Path, what: Obj) -> None:
        if what.name == "future_annotations_by_name":
            path.write_bytes(_ByName.dumps(obj, protocol))
            return
        with open(path, "wb") as fh:
            pickle.dump(obj, fh, protocol=protocol)
    return dump


def _pickle_load(path: Path) -> Any:
    with open(path, "rb") as fh:
        return pickle.load(fh)


def _joblib_dump(obj: Any, path: Path, what: Obj) -> None:
    import joblib
    joblib.dump(obj, path)


def _joblib_load(path: Path) -> Any:
    import joblib
    return joblib.load(path)


def _torch_dump(zip_format: bool):
    def dump(obj: Any, path: Path, what: Obj) -> None:
        import torch
        torch.save(obj, path, _use_new_zipfile_serialization=zip_format)
    return dump


def _torch_load(path: Path) -> Any:
    import torch
    return torch.load(path, map_location="cpu", weights_only=False)


PRODUCERS = {p.name: p for p in [
    *(Producer(f"pickle{n}", ".pkl", _pickle_dump(n), _pickle_load) for n in range(6)),
    Producer("joblib", ".joblib", _joblib_dump, _joblib_load, ("joblib",)),
    Producer("torch_zip", ".pt", _torch_dump(True), _torch_load, ("torch",)),
    Producer("torch_legacy", ".pt", _torch_dump(False), _torch_load, ("torch",)),
]}


def _cases() -> list:
    cases = []
    for obj in OBJECTS:
        for producer in obj.producers or tuple(PRODUCERS):
            uses_torch = "torch" in obj.needs or "torch" in PRODUCERS[producer].needs
            cases.append(pytest.param(obj, PRODUCERS[producer], id=f"{obj.name}-{producer}",
                                      marks=[pytest.mark.torch] if uses_torch else []))
    return cases


def _need(obj: Obj, producer: Producer) -> None:
    for module in obj.needs + producer.needs:
        needs.module(module, _OPT_OUT.get(module))


# ---------------------------------------------------------------------------------------
# Equality to the byte
# ---------------------------------------------------------------------------------------

_IDENTICAL = (types.BuiltinFunctionType, types.FunctionType, type, types.ModuleType)


def same(a: Any, b: Any, where: str = "value", depth: int = 0) -> None:  # noqa: C901 - one dispatch by type
    """Raise AssertionError, naming the place, unless ``a`` and ``b`` are the same value."""
    assert depth < 60, f"{where}: nested too deep to compare"
    assert type(a) is type(b), f"{where}: {type(a)} != {type(b)}"
    top = type(a).__module__.split(".")[0]
    if isinstance(a, _IDENTICAL) or a is None:
        assert a is b, f"{where}: {a!r} is not {b!r}"
    elif top == "torch":
        _same_torch(a, b, where, depth)
    elif top == "pandas":
        _same_pandas(a, b, where)
    elif isinstance(a, np.ndarray):
        _same_array(a, b, where, depth)
    elif isinstance(a, np.generic):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), f"{where}: {a!r} != {b!r}"
    elif isinstance(a, float):
        assert a == b or (math.isnan(a) and math.isnan(b)), f"{where}: {a!r} != {b!r}"
    elif isinstance(a, (bool, int, complex, str, bytes, bytearray, frozenset, set)):
        assert a == b, f"{where}: {a!r} != {b!r}"
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{where}: keys {list(a)} != {list(b)}"
        for k in a:
            same(a[k], b[k], f"{where}[{k!r}]", depth + 1)
        if hasattr(a, "__dict__"):                      # an OrderedDict's _metadata
            same(vars(a), vars(b), f"{where}.__dict__", depth + 1)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]", depth + 1)
    else:                                               # what pickle itself would write
        same(a.__reduce_ex__(4), b.__reduce_ex__(4), f"{where}<{type(a).__name__}>", depth + 1)


def _same_array(a: np.ndarray, b: np.ndarray, where: str, depth: int) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype}{a.shape} != {b.dtype}{b.shape}"
    if isinstance(a, np.ma.MaskedArray):
        same(np.ma.getdata(a), np.ma.getdata(b), f"{where}.data", depth + 1)
        same(np.ma.getmaskarray(a), np.ma.getmaskarray(b), f"{where}.mask", depth + 1)
        same(np.asarray(a.fill_value), np.asarray(b.fill_value), f"{where}.fill_value", depth + 1)
    elif a.dtype.hasobject:
        for i, (x, y) in enumerate(zip(a.ravel(), b.ravel())):
            same(x, y, f"{where}.flat[{i}]", depth + 1)
    else:
        assert a.tobytes() == b.tobytes(), f"{where}: {a!r} != {b!r}"


def _tensor_bytes(t) -> bytes:
    import torch
    flat = t.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.element_size() else b""


def _same_torch(a: Any, b: Any, where: str, depth: int) -> None:
    import torch
    if not isinstance(a, torch.Tensor):
        assert a == b, f"{where}: {a!r} != {b!r}"          # torch.Size, dtype, device
        return
    assert (a.dtype, a.layout, a.shape, a.requires_grad) == (b.dtype, b.layout, b.shape, b.requires_grad), \
        f"{where}: {a.dtype} {a.layout} {a.shape} {a.requires_grad} != {b.dtype} {b.layout} {b.shape} {b.requires_grad}"
    parts: dict[str, Any] = {}
    if a.is_quantized:
        scheme = a.qscheme()
        assert scheme == b.qscheme(), f"{where}: {scheme} != {b.qscheme()}"
        if scheme in (torch.per_channel_affine, torch.per_channel_affine_float_qparams):
            parts = {"scales": lambda t: t.q_per_channel_scales(), "zero_points": lambda t: t.q_per_channel_zero_points(),
                     "axis": lambda t: t.q_per_channel_axis()}
        else:
            parts = {"scale": lambda t: t.q_scale(), "zero_point": lambda t: t.q_zero_point()}
        parts["int_repr"] = lambda t: t.int_repr()
    elif a.layout is torch.sparse_coo:
        parts = {"coalesced": lambda t: t.is_coalesced(), "indices": lambda t: t._indices(),
                 "values": lambda t: t._values()}
    elif a.layout in (torch.sparse_csr, torch.sparse_bsr):
        parts = {"crow": lambda t: t.crow_indices(), "col": lambda t: t.col_indices(), "values": lambda t: t.values()}
    elif a.layout in (torch.sparse_csc, torch.sparse_bsc):
        parts = {"ccol": lambda t: t.ccol_indices(), "row": lambda t: t.row_indices(), "values": lambda t: t.values()}
    else:
        assert (a.stride(), a.storage_offset()) == (b.stride(), b.storage_offset()), f"{where}: layout in storage"
        assert bytes(a.untyped_storage()) == bytes(b.untyped_storage()), f"{where}: storage bytes differ"
        assert _tensor_bytes(a) == _tensor_bytes(b), f"{where}: {a} != {b}"
    for part, get in parts.items():
        x, y = get(a), get(b)
        if isinstance(x, torch.Tensor):
            assert _tensor_bytes(x) == _tensor_bytes(y) and x.dtype == y.dtype, f"{where}.{part}: {x} != {y}"
        else:
            same(x, y, f"{where}.{part}", depth + 1)
    if type(a) is not torch.Tensor:                     # a Parameter's or subclass's own attributes
        same(vars(a), vars(b), f"{where}.__dict__", depth + 1)


def _same_pandas(a: Any, b: Any, where: str) -> None:
    import pandas as pd
    try:
        if isinstance(a, pd.DataFrame):
            pd.testing.assert_frame_equal(a, b, check_exact=True, check_flags=True)
        elif isinstance(a, pd.Series):
            pd.testing.assert_series_equal(a, b, check_exact=True, check_flags=True)
        elif isinstance(a, pd.Index):
            pd.testing.assert_index_equal(a, b, exact=True, check_exact=True)
            assert getattr(a, "freq", None) == getattr(b, "freq", None), "freq"
        else:
            pd.testing.assert_extension_array_equal(a, b, check_exact=True)
    except AssertionError as exc:
        raise AssertionError(f"{where}: {exc}") from None


# ---------------------------------------------------------------------------------------
# The tests
# ---------------------------------------------------------------------------------------


def test_the_comparison_tells_values_apart():
    """``same`` can fail: a different seed, one flipped element, another mask, fill value."""
    pairs = [
        (np.random.default_rng(0), np.random.default_rng(1)),
        (np.random.SeedSequence(1), np.random.SeedSequence(2)),
        (np.random.RandomState(0), np.random.RandomState(1)),
        (np.random.MT19937(0), np.random.MT19937(1)),
        (np.ma.array([1, 2], mask=[0, 1]), np.ma.array([1, 2], mask=[1, 0])),
        (np.ma.array([1, 2], fill_value=3), np.ma.array([1, 2], fill_value=4)),
        (np.float32(1), np.float64(1)),
        (np.array([0.0]), np.array([-0.0])),
        (__future__.annotations, __future__.division),
        ({"a": [1, np.int8(2)]}, {"a": [1, np.int8(3)]}),
    ]
    for a, b in pairs:
        with pytest.raises(AssertionError):
            same(a, b)
    same(np.random.default_rng(0), np.random.default_rng(0))
    same(np.ma.array([1.0, np.nan], mask=[0, 1]), np.ma.array([1.0, np.nan], mask=[0, 1]))


@pytest.mark.torch
def test_the_comparison_tells_tensors_apart():
    torch = needs.module("torch")
    base = torch.arange(6, dtype=torch.float32)
    other = base.clone()
    other[3] = -1
    for a, b in [(base, other), (base, base.to(torch.float64)), (base.to_sparse(), other.to_sparse()),
                 (torch.nn.Parameter(base), torch.nn.Parameter(base, requires_grad=False)),
                 (torch.quantize_per_tensor(base, 0.1, 0, torch.qint8), torch.quantize_per_tensor(base, 0.2, 0, torch.qint8))]:
        with pytest.raises(AssertionError):
            same(a, b)
    same(base.to(torch.bfloat16), base.clone().to(torch.bfloat16))


@pytest.mark.parametrize(("obj", "producer"), _cases())
def test_everyday_object_is_safe_and_loads_like_its_loader(obj, producer, tmp_path):
    _need(obj, producer)
    path = tmp_path / f"{obj.name}{producer.suffix}"
    producer.dump(obj.make(), path, obj)
    result = scan_file(path)
    bad = [f"{f.name} ({f.verdict.value}: {f.why})" for f in result.findings if f.verdict is not Verdict.SAFE]
    assert result.verdict is Verdict.SAFE, (bad, result.errors)
    assert result.scanned and result.format != "unrecognised", result
    same(safe_load(path), producer.load(path))
