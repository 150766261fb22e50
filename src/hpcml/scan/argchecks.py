"""Arguments of allowlisted callables: an entry on the ``safe:`` list is a capability, safe
for every argument a pickle can hand it, or checked here at each call the walk sees.

Why: an allowlist of names is not enough. ``fractions.Fraction("1e30000000")`` is an
allowlisted constructor that never returns; ``builtins.list(range(10**12))`` fills memory;
``torch.storage._load_from_bytes(b)`` runs ``torch.load`` on bytes inside the pickle. The
walker (``picklewalk``) calls :func:`judge` for every call of a checked name (REDUCE,
NEWOBJ, NEWOBJ_EX, INST, OBJ) with the arguments as it modelled them, and for a call of any
allowlisted name that is handed a checked one as a value: ``copyreg._reconstructor``,
``__newobj__``, numpy's generator constructors and torch's ``_rebuild_from_type`` call what
they are given, so the callee's check applies to what they call it with; any other callee
handed a checked callable may call it with arguments hpcml cannot see.

Values come from ``picklewalk``: ``str``, ``int``, ``bool``, ``None``, tuples of them,
``Blob`` (bytes written in the file), ``OPAQUE`` (a number or container written in the
file), and what the load builds (``Call``, ``Ref``, ``Persistent``) or lost track of
(``Unknown``). Written by hand: no scanner of the field checks arguments.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

from hpcml.scan.model import Verdict
from hpcml.scan.walkvalues import BigInt, Blob, Call, LongText, Nested, Persistent, Ref, Unknown

#: a problem with a call: its verdict and why
Problem = tuple[Verdict, str]
MAX_DEPTH = 4

_FRACTION = re.compile(r"\s*[+-]?\d+(/\d+)?\s*|\s*[+-]?(\d+\.?\d*|\.\d+)\s*")
_EXPONENT = re.compile(r"[eE]\s*[+-]?(\d+)")
_MAX_TEXT = 10_000
_ENCODERS = frozenset({"_codecs.encode", "codecs.encode"})
_LATIN1 = frozenset({"latin1", "latin-1", "iso-8859-1", "iso8859-1"})






def built_at_load(v: object) -> bool:
    """Whether ``v`` is (or holds, inside a tuple) an object the load builds or names, or a
    value the walk lost track of: anything but data written literally in the file."""
    t = type(v)
    if t is tuple:
        return any(built_at_load(x) for x in v)  # type: ignore[attr-defined]
    return t in (Call, Ref, Persistent, Unknown, Nested)


def _literal_args(what: str) -> Callable[[tuple], Problem | None]:
    def check(args: tuple) -> Problem | None:
        if any(built_at_load(a) for a in args):
            return (Verdict.UNKNOWN, f"{what} is given an object built at load time (a lazy range, "
                                     "or anything whose iteration or conversion runs code): unbounded")
        return None
    return check


def _sized(args: tuple) -> Problem | None:
    """bytes/bytearray: from bytes or (str, encoding); an int would be a size to allocate."""
    first = args[0] if args else None
    if not args or type(first) in (Blob, str) or _latin1_text(first):   # protocol 2: bytearray(_codecs.encode(s, 'latin1'))
        return None
    return (Verdict.UNKNOWN, "bytes/bytearray given something other than bytes or text "
                             "(an int is a size to allocate: bytes(10**12))")


def _fraction(args: tuple) -> Problem | None:
    for a in args:
        if type(a) is str:
            m = _EXPONENT.search(a)
            if m and len(m.group(1)) > 4:
                return (Verdict.DANGEROUS, f"Fraction of {a[:40]!r}: an exponent it expands to "
                                           f"10**{m.group(1)[:12]} (the load never returns)")
            if len(a) > _MAX_TEXT or not _FRACTION.fullmatch(a):
                return (Verdict.UNKNOWN, "Fraction given text that is not 'n', 'n/d' or a short decimal")
        elif built_at_load(a):
            return (Verdict.UNKNOWN, "Fraction given an object built at load time (a Decimal with a huge exponent?)")
    return None


def _latin1_text(v: object) -> bool:
    """``_codecs.encode(text, 'latin1')`` of text written in the file: how protocols 0-2
    write bytes. Every character must be below 256 (the load fails otherwise)."""
    if not (isinstance(v, Call) and isinstance(v.func, Ref) and v.func.dotted in _ENCODERS):
        return False
    a = v.args
    if type(a) is not tuple or len(a) != 2 or a[1] not in _LATIN1:
        return False
    return type(a[0]) is LongText or (type(a[0]) is str and all(ord(c) < 256 for c in a[0]))


def _latin1_encode(args: tuple) -> Problem | None:
    """Pickle writes bytes as ``_codecs.encode(text, 'latin1')``; other codecs (punycode is
    quadratic) are not what a pickler writes."""
    if len(args) == 2 and args[1] in _LATIN1 and (type(args[0]) in (str, LongText)):
        return None
    return (Verdict.UNKNOWN, "encode with anything but text and 'latin1' (what pickle writes)")


def _never_called(args: tuple) -> Problem | None:
    return (Verdict.UNKNOWN, "a storage class is named by torch's persistent ids, never called "
                             "(called with a size, it allocates that much)")


def _load_from_bytes(args: tuple) -> Problem | None:
    if len(args) == 1 and (type(args[0]) is Blob or _latin1_text(args[0])):
        return None                     # the bytes are scanned as a torch file (pickles.py)
    return (Verdict.DANGEROUS, "torch.load of something other than bytes written in the file "
                               "(text, or an object built at load time): hpcml cannot scan what it loads")


def _no_tz_path(args: tuple) -> Problem | None:
    """pandas resolves a time zone 'dateutil/PATH' by opening PATH as a tz file."""
    for a in args:
        if type(a) is str and a.startswith("dateutil/"):
            return (Verdict.DANGEROUS, f"a time zone {a[:60]!r}: pandas opens that path as a tz file")
        if built_at_load(a) and not _literal_tz(a):
            return (Verdict.UNKNOWN, "a time zone or value built at load time")
    return None


def _literal_tz(v: object) -> bool:
    return isinstance(v, Call) and isinstance(v.func, Ref) and v.func.dotted in _TZ_CLASSES \
        and type(v.args) is tuple and not any(type(a) is str and a.startswith("dateutil/") for a in v.args)


_TZ_CLASSES = frozenset({"zoneinfo.ZoneInfo", "datetime.timezone", "datetime.timedelta"})
_PANDAS_INDEXES = frozenset(f"pandas.{n}" for n in (
    "Index", "RangeIndex", "MultiIndex", "DatetimeIndex", "TimedeltaIndex", "PeriodIndex", "CategoricalIndex",
    "IntervalIndex"))
_ARROW_PARTS = frozenset({"pyarrow.lib.type_for_alias", "pyarrow.lib.py_buffer"})


def _pandas_index_class(args: tuple) -> Problem | None:
    cls = args[0] if args else None
    if isinstance(cls, Ref) and cls.dotted in _PANDAS_INDEXES:
        return None
    return (Verdict.UNKNOWN, "pandas builds an index of a class that is not one of pandas' own")


def _arrow_literal(v: object) -> bool:
    if type(v) is tuple:
        return all(_arrow_literal(x) for x in v)
    if isinstance(v, Call):
        return isinstance(v.func, Ref) and v.func.dotted in _ARROW_PARTS and _arrow_literal(v.args)
    return not built_at_load(v)


def _restore_array(args: tuple) -> Problem | None:
    """pyarrow.lib._restore_array((type, length, null_count, offset, buffers, children,
    dictionary)) trusts its offsets: only literal parts here, and safe_load validates the
    array in full (the scan does not read the buffers' offsets)."""
    if _arrow_literal(args):
        return None
    return (Verdict.UNKNOWN, "a pyarrow array rebuilt from parts built at load time")


_SKLEARN_NEWOBJ = frozenset({"sklearn.metrics._dist_metrics.EuclideanDistance64", "sklearn.neighbors._kd_tree.KDTree",
                             "sklearn.neighbors._ball_tree.BallTree"})


def _sklearn_class(args: tuple) -> Problem | None:
    """scikit-learn's Cython ``newObj(cls)``: ``cls.__new__(cls)`` of its own tree or metric."""
    cls = args[0] if len(args) == 1 else None
    if isinstance(cls, Ref) and (cls.dotted in _SKLEARN_NEWOBJ or cls.dotted.startswith("sklearn.metrics._dist_metrics.")):
        return None
    return (Verdict.UNKNOWN, "scikit-learn's newObj of a class that is not its own tree or metric")


#: checked callables: (arguments) -> a problem or None
CHECKS: dict[str, Callable[[tuple], Problem | None]] = {
    "builtins.set": _literal_args("set()"),
    "builtins.frozenset": _literal_args("frozenset()"),
    "builtins.list": _literal_args("list()"),
    "builtins.tuple": _literal_args("tuple()"),
    "builtins.dict": _literal_args("dict()"),
    "builtins.int": _literal_args("int()"),
    "builtins.str": _literal_args("str()"),
    "collections.OrderedDict": _literal_args("OrderedDict()"),
    "collections.deque": _literal_args("deque()"),
    "collections.Counter": _literal_args("Counter()"),
    "builtins.bytes": _sized,
    "builtins.bytearray": _sized,
    "fractions.Fraction": _fraction,
    "torch.storage._load_from_bytes": _load_from_bytes,
    "_codecs.encode": _latin1_encode,
    "codecs.encode": _latin1_encode,
    "torch.Size": _literal_args("torch.Size()"),
    **dict.fromkeys([f"torch.{n}Storage" for n in (
        "Untyped", "Typed", "Float", "Double", "Half", "BFloat16", "Long", "Int", "Short", "Char", "Byte", "Bool",
        "ComplexFloat", "ComplexDouble", "QInt8", "QUInt8", "QInt32", "QUInt4x2", "QUInt2x4")]
        + ["torch.storage.UntypedStorage", "torch.storage.TypedStorage"], _never_called),
    **{name: _literal_args(name) for name in (*_PANDAS_INDEXES, "pandas.DataFrame", "pandas.Series",
                                              "pandas.Categorical")},
    **dict.fromkeys([f"pandas.core.indexes.{m}" for m in (
        "base._new_Index", "datetimes._new_DatetimeIndex", "interval._new_IntervalIndex",
        "timedeltas._new_TimedeltaIndex", "period._new_PeriodIndex")], _pandas_index_class),
    "pandas.DatetimeTZDtype": _no_tz_path,
    "pandas._libs.tslibs.timestamps._unpickle_timestamp": _no_tz_path,
    "pyarrow.lib._restore_array": _restore_array,
    # functions and scalar types a fitted estimator holds as parameters: if a pickle calls one,
    # only with data written in the file (numpy.mean(range(10**12)) would fill memory)
    **{name: _literal_args(name) for name in (
        "sklearn.feature_selection._univariate_selection.f_classif",
        "sklearn.feature_selection._univariate_selection.f_regression",
        "sklearn.feature_selection._univariate_selection.chi2",
        "sklearn.cluster._kmeans._kmeans_single_lloyd", "sklearn.cluster._kmeans._kmeans_single_elkan",
        "numpy.mean", "numpy.float64", "numpy.float32", "numpy.int64", "numpy.int32", "numpy.bool_",
        "scipy._lib.array_api_compat.numpy._aliases.asarray")},
    **dict.fromkeys(["sklearn.metrics._dist_metrics.newObj", "sklearn.neighbors._kd_tree.newObj",
                     "sklearn.neighbors._ball_tree.newObj"], _sklearn_class),
}


def _at(args: tuple, i: int) -> object:
    return args[i] if len(args) > i else None


def _rest(args: tuple, i: int) -> tuple:
    v = _at(args, i)
    return v if type(v) is tuple else (v,)


#: checked callables whose arguments the scan follows into other files or bytes: handed to a
#: caller, they would be called where the walk does not record what they load
DIRECT_ONLY = frozenset({"torch.storage._load_from_bytes"})

#: allowlisted callables that call what they are given: (arguments) -> the (callee, its
#: arguments) pairs they call (None: a class it instantiates empty, without arguments)
CALLERS: dict[str, Callable[[tuple], list[tuple[object, tuple | None]]]] = {
    "copyreg._reconstructor": lambda a: [(_at(a, 1), (_at(a, 2),)), (_at(a, 0), None)],
    "copyreg.__newobj__": lambda a: [(_at(a, 0), tuple(a[1:]))],
    "copyreg.__newobj_ex__": lambda a: [(_at(a, 0), _rest(a, 1))],
    "collections.defaultdict": lambda a: [(_at(a, 0), ())],
    "numpy.random._pickle.__randomstate_ctor": lambda a: [(_at(a, 1), (_at(a, 0),))],
    "numpy.random._pickle.__generator_ctor": lambda a: [(_at(a, 1), (_at(a, 0),))],
    "numpy.random._pickle.__bit_generator_ctor": lambda a: [(_at(a, 0), ())],
    "torch._tensor._rebuild_from_type": lambda a: [(_at(a, 0), _rest(a, 2)), (_at(a, 1), None)],
    "torch._tensor._rebuild_from_type_v2": lambda a: [(_at(a, 0), _rest(a, 2)), (_at(a, 1), None)],
    # Cython's __pyx_unpickle_X(type, checksum, state) and scikit-learn's newObj(cls): an empty
    # instance of the class (X.__new__(type)), its state set afterwards
    **dict.fromkeys(["sklearn.metrics._dist_metrics.newObj", "sklearn.neighbors._kd_tree.newObj",
                     "sklearn.neighbors._ball_tree.newObj", "pandas._libs.arrays.__pyx_unpickle_NDArrayBacked",
                     "pandas._libs.interval.__pyx_unpickle_IntervalMixin",
                     "numpy.random.bit_generator.__pyx_unpickle_SeedSequence"], lambda a: [(_at(a, 0), None)]),
    **dict.fromkeys([f"pandas.core.indexes.{m}" for m in (      # cls.__new__(cls, **state): cls checked above
        "base._new_Index", "datetimes._new_DatetimeIndex", "interval._new_IntervalIndex",
        "timedeltas._new_TimedeltaIndex", "period._new_PeriodIndex")], lambda a: [(_at(a, 0), None)]),
}


def _refs(args: object) -> Iterator[object]:
    if type(args) is Ref:
        yield args
    elif type(args) is tuple:
        for a in args:
            yield from _refs(a)


def _big_ints(v: object) -> Iterator[int]:
    if isinstance(v, BigInt):
        yield v.nbytes
    elif type(v) is tuple:
        for x in v:
            yield from _big_ints(x)


def judge(dotted: str, args: object, depth: int = 0, kwargs: object = None) -> list[Problem]:
    """The problems of calling ``dotted`` with ``args`` (and NEWOBJ_EX's ``kwargs``), as the
    walk modelled them."""
    big = max(_big_ints(args), default=0)
    if big:
        return [(Verdict.UNKNOWN, f"{dotted} is handed an integer of {big} bytes: converting, hashing or "
                                  "dividing it takes time that grows faster than the file")]
    if kwargs is not None and (dotted in CHECKS or dotted in CALLERS):
        return [(Verdict.UNKNOWN, f"{dotted} is called with keyword arguments (NEWOBJ_EX), which hpcml does not check")]
    if type(args) is not tuple:
        if dotted in CHECKS or dotted in CALLERS:
            return [(Verdict.UNKNOWN, f"{dotted} is called with arguments hpcml could not follow")]
        return []
    out: list[Problem] = []
    handled: set[int] = set()
    caller = CALLERS.get(dotted)
    if caller is not None:
        for callee, cargs in caller(args):
            if isinstance(callee, Ref):
                handled.add(id(callee))
                name = callee.dotted
                if cargs is None:
                    continue
                if name in DIRECT_ONLY:
                    out.append((Verdict.DANGEROUS, f"{dotted} calls {name}, which hpcml follows only "
                                                   "when the pickle calls it itself"))
                    continue
                if dotted == "copyreg.__newobj_ex__" and name in CHECKS:
                    out.append((Verdict.UNKNOWN, f"{dotted} calls {name} with keyword arguments, "
                                                 "which hpcml does not check"))
                if depth < MAX_DEPTH:
                    out += [(v, f"{dotted} calls {name}: {why}") for v, why in judge(name, cargs, depth + 1)]
                else:
                    out.append((Verdict.UNKNOWN, f"{dotted}: calls nested deeper than {MAX_DEPTH}"))
    check = CHECKS.get(dotted)
    if check is not None:
        problem = check(args)
        if problem is not None:
            out.append(problem)
    for ref in _refs(args):
        name = ref.dotted  # type: ignore[attr-defined]
        if name in CHECKS and id(ref) not in handled:
            out.append((Verdict.UNKNOWN, f"{name}, whose arguments hpcml checks, is handed to {dotted}, "
                                         "which may call it with arguments hpcml cannot see"))
    return out
