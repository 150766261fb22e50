"""pyarrow's probe for pandas, answered "not here" once, so hpcml's processes never load it.

pyarrow imports pandas, when it is installed, at the first array it builds, only to ask
whether its input is a pandas object: 0.3-0.4 s of CPU and ~50 MB. hpcml hands pyarrow
no pandas objects, and its own processes (a rank's recorder, the launcher's report at the
end of every job, ``hpcml report``) would pay that on the job's critical path. pyarrow
tries the import once per process and remembers the answer; a finder that refuses pandas
for the length of one tiny array gives it "no" (a ``None`` in ``sys.modules`` does not:
pyarrow's Cython import looks past it). The finder is gone afterwards: anything else in
the process may still import pandas.

Only for hpcml's own processes (the recorder, the launcher's report, ``hpcml report``, ``hpcml
observe report``), never in a library function a training script calls: once pyarrow has
been told "no pandas", ``pa.array`` of a pandas object made later converts it as a plain
sequence (NaN stays NaN, a categorical becomes strings, ``pa.record_batch(df)`` fails).
"""

from __future__ import annotations

import sys
import threading
from typing import Any

_LOCK = threading.Lock()
_done = False


class _NoPandas:
    """Refuses pandas to the thread that made it only: another thread's import of pandas in
    that moment goes on (pyarrow then waits for it on the module's lock, and finds it)."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if (name == "pandas" or name.startswith("pandas.")) and threading.get_ident() == self.thread:
            raise ModuleNotFoundError("hpcml gives pyarrow no pandas objects", name=name)


def skip_pandas() -> None:
    """Make pyarrow's first array without importing pandas (a no-op once done, or when
    pandas is loaded already: then pyarrow finds it at no cost)."""
    global _done
    with _LOCK:
        if _done or "pandas" in sys.modules:
            return
        finder = _NoPandas()
        sys.meta_path.insert(0, finder)
        try:
            import pyarrow as pa
            pa.array([0])
        finally:
            sys.meta_path.remove(finder)
            _done = True
