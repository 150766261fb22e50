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


def test_a_ranks_logged_batches_leave_its_pyarrow_converting_pandas_objects_as_before():
    """A training script that logs through hpcml.observe and builds Arrow arrays from pandas
    objects later: NaN is null and a categorical a dictionary, as without hpcml (the probe
    is answered only in hpcml's own processes)."""
    script = ("import math\nfrom hpcml.observe.schema import to_batch\nimport pyarrow as pa\n"
              "to_batch([(1_000_000, 'metric', 'loss', 0.5, 3, None)], rank=0)\nimport pandas as pd\n"
              "print(pa.array(pd.Series([1.0, math.nan])).null_count, "
              "pa.types.is_dictionary(pa.array(pd.Series(['a', 'b'], dtype='category')).type))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["1", "True"], out.stderr


def test_another_threads_import_of_pandas_in_that_moment_goes_on():
    """A user's thread still looking for pandas (a slow file system) when hpcml's thread
    answers the probe: the finder refuses pandas to hpcml's thread only, so the user's
    import completes (a finder refusing every thread broke it: "pandas.compat not built")."""
    out = subprocess.run([sys.executable, "-c", RACE], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "pandas", out.stdout + out.stderr


RACE = """import sys, threading, time
import pyarrow as pa
from hpcml import arrowprobe
in_import, go = threading.Event(), threading.Event()
class Slow:
    def find_spec(self, name, path=None, target=None):
        if name == "pandas" and threading.current_thread() is not threading.main_thread() and not go.is_set():
            in_import.set()
            go.wait(10)
        return None
sys.meta_path.insert(0, Slow())
result = {}
def user():
    try:
        import pandas
        result["ok"] = pandas.__name__
    except ImportError as exc:
        result["ok"] = f"failed: {exc}"
t = threading.Thread(target=user)
t.start()
in_import.wait(10)
real = pa.array
def array(*a, **k):
    go.set()
    time.sleep(0.5)
    return real(*a, **k)
pa.array = array
arrowprobe.skip_pandas()
t.join(30)
print(result.get("ok"))
"""


LEAN = """
import sys, time
from hpcml.arrowprobe import skip_pandas
skip_pandas(numpy=True)
print("numpy loaded:", "numpy" in sys.modules)
import numpy as np
from hpcml.observe.schema import to_batch
b = to_batch([(time.time_ns(), "metric", "loss", np.float32(0.5), np.int64(3), np.int16(1)),
              (time.time_ns(), "host", "cpu", float("nan"), None, None), (time.time_ns(), "gpu", "sm", 7, 2, 0)], rank=0)
d = b.to_pydict()
print("values:", d["value"][0], d["value"][1], d["value"][2], d["step"], d["gpu"])
"""


def test_a_recorders_pyarrow_loads_no_numpy_and_still_takes_numpy_values():
    """``skip_pandas(numpy=True)`` (a rank's recorder): pyarrow imported without numpy (the
    CPU a rank's node saves), and rows holding numpy numbers made later still become the
    same Arrow values (``to_batch`` makes them Python numbers; such a pyarrow alone refuses
    a float32); NaN stays null as before."""
    out = subprocess.run([sys.executable, "-c", LEAN], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["numpy loaded: False", "values: 0.5 None 7.0 [3, None, 2] [1, None, 0]"]
    bare = LEAN.split("b = to_batch(")[0] + "import pyarrow as pa\npa.array([np.float32(0.5)], pa.float64())\n"
    out = subprocess.run([sys.executable, "-c", bare], capture_output=True, text=True, timeout=120)
    assert "ArrowInvalid" in out.stderr          # why to_batch converts: without it, the row is lost
