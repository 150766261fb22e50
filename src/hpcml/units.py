"""Quantities with units in protocol files: sizes, bandwidths, durations, fractions.

Written by hand because the field's libraries disagree with vetnode's files: pint is a
heavy import for a node worker and pydantic's ByteSize has no rates or durations. SI
prefixes are powers of 1000 (``GB`` = 1e9, as nccl-tests reports GB/s), IEC ones powers of
1024 (``GiB``); vetnode's files, where ``GB`` means 2**30, are rewritten to ``GiB`` when
they are loaded, so they keep their meaning.
"""

from __future__ import annotations

import re

_PREFIX = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?\d+)?)\s*([kKMGTP]i?)?(B|b|bit)?\s*$")
_RATE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?\d+)?)\s*([kKMGTP]i?)?(B|b|bit)\s*/\s*s\s*$")
_TIME_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|sec|m|min|h|d|w)?\s*$")
_TIME_SCALE = {None: 1.0, "s": 1.0, "sec": 1.0, "ms": 1e-3, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0,
               "w": 604800.0}
_RATE_SCALE = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def _number(value) -> float | None:
    if isinstance(value, bool):
        raise ValueError(f"expected a quantity, found {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"expected a number or a string with a unit, found {value!r}")
    return None


def _scaled(m: re.Match) -> float:
    bits = m.group(3) in ("b", "bit")
    return float(m.group(1)) * _PREFIX[m.group(2) or ""] / (8 if bits else 1)


def _quantity(value, pattern: re.Pattern, example: str) -> float:
    n = _number(value)
    if n is not None:
        return n
    m = pattern.match(value)
    if not m:
        raise ValueError(f"expected {example}, found {value!r}")
    return _scaled(m)


def parse_bytes(value) -> float:
    """``"8 GB"`` -> 8e9, ``"8 GiB"`` -> 8 * 2**30, a bare number is bytes."""
    return _quantity(value, _SIZE_RE, "a size such as '8 GB' or '512 MiB'")


def parse_rate(value) -> float:
    """``"15 GB/s"`` -> 15e9 bytes/s; ``"100 Gb/s"`` (bits) -> 12.5e9 bytes/s."""
    return _quantity(value, _RATE_RE, "a rate such as '15 GB/s'")


def parse_flops(value) -> float:
    """``"2 TFLOP/s"``, ``"500 GFLOPS"`` -> floating-point operations per second."""
    n = _number(value)
    if n is not None:
        return n
    m = re.match(r"^\s*([0-9]*\.?[0-9]+)\s*([kKMGT]?)\s*FLOP(?:S|/s)\s*$", value, re.I)
    if not m:
        raise ValueError(f"expected a rate such as '50 GFLOP/s', found {value!r}")
    return float(m.group(1)) * _RATE_SCALE[m.group(2).upper() if m.group(2) != "k" else "k"]


def parse_seconds(value) -> float:
    """``"500 ms"``, ``"2 min"``, ``30`` -> seconds."""
    n = _number(value)
    if n is not None:
        if n < 0:
            raise ValueError(f"expected a non-negative duration, found {value!r}")
        return n
    m = _TIME_RE.match(value)
    if not m:
        raise ValueError(f"expected a duration such as '30 s' or '500 ms', found {value!r}")
    return float(m.group(1)) * _TIME_SCALE[m.group(2)]


def parse_fraction(value) -> float:
    """``"80%"`` or ``0.8`` -> 0.8."""
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            return float(value.strip()[:-1]) / 100.0
        except ValueError:
            raise ValueError(f"expected a percentage such as '80%', found {value!r}") from None
    n = _number(value)
    if n is None:
        raise ValueError(f"expected a fraction such as 0.8 or '80%', found {value!r}")
    return n


def fmt_bytes(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def fmt_rate(n: float) -> str:
    return fmt_bytes(n) + "/s"
