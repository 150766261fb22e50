"""hpcml.arrowprobe: pyarrow's pandas probe answered once, in a fresh interpreter (the test
process has pandas loaded already)."""

from __future__ import annotations

import subprocess
import sys

from tests import needs

needs.module("pandas")          # the probe only costs anything where pandas is installed

SCRIPT = """
import sys
from hpcml.arrowprobe import skip_pandas
import pyarrow as pa, pyarrow.compute as pc
skip_pandas()
t = pa.table({"a": [1, 2, 2]})
pc.unique(t["a"]).to_numpy(); pa.Table.from_batches(t.to_batches()).column("a").to_numpy()
print("loaded after arrays:", "pandas" in sys.modules)
import pandas
print("importable after:", pa.Table.from_pandas(pandas.DataFrame({"x": [7]})).column("x").to_pylist())
"""


def test_arrays_and_tables_load_no_pandas_and_pandas_still_imports_afterwards():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["loaded after arrays: False", "importable after: [7]"]


def test_without_the_probe_pyarrow_loads_pandas():
    """The reason for the module: the same arrays without it load pandas (else the test above
    proves nothing)."""
    script = SCRIPT.replace("skip_pandas()", "pass")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.stdout.splitlines()[0] == "loaded after arrays: True", out.stderr


def test_a_ranks_first_logged_batch_loads_no_pandas():
    """What a rank that logs through hpcml.observe builds: its rows as one Arrow batch."""
    script = ("import sys\nfrom hpcml.observe.schema import to_batch\n"
              "b = to_batch([(1_000_000, 'metric', 'loss', 0.5, 3, None)], rank=0)\n"
              "print(b.num_rows, 'pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["1", "False"], out.stderr
