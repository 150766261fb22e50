import pytest

from hpcml import units


@pytest.mark.parametrize("text,expected", [
    ("8 GB", 8e9), ("8GiB", 8 * 2**30), ("512 MiB", 512 * 2**20), (1024, 1024.0),
    ("1.5 kB", 1500.0), ("100 Gb", 12.5e9),
])
def test_sizes(text, expected):
    assert units.parse_bytes(text) == pytest.approx(expected)


@pytest.mark.parametrize("text,expected", [
    ("15 GB/s", 15e9), ("15 GiB/s", 15 * 2**30), ("100 Gb/s", 12.5e9), ("200MB/s", 2e8),
])
def test_rates(text, expected):
    assert units.parse_rate(text) == pytest.approx(expected)


@pytest.mark.parametrize("text,expected", [("500 ms", 0.5), ("2 min", 120.0), (30, 30.0), ("1.5s", 1.5)])
def test_seconds(text, expected):
    assert units.parse_seconds(text) == pytest.approx(expected)


def test_fraction_and_flops():
    assert units.parse_fraction("80%") == pytest.approx(0.8)
    assert units.parse_fraction(0.25) == 0.25
    assert units.parse_flops("2 TFLOP/s") == 2e12
    assert units.parse_flops("50 GFLOPS") == 5e10


@pytest.mark.parametrize("parse,bad", [
    (units.parse_bytes, "8 parsecs"), (units.parse_rate, "15 GB"), (units.parse_seconds, "soon"),
    (units.parse_fraction, "most"), (units.parse_bytes, True), (units.parse_seconds, -1),
    (units.parse_bytes, [1]),
])
def test_rejects(parse, bad):
    with pytest.raises(ValueError):
        parse(bad)
