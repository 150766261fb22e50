"""pyarrow's probe for pandas, answered "not here" once, so hpcml's processes never load it
(and, in a rank's recorder, its import of numpy).

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

A rank's recorder (the task wrapper) also refuses pyarrow numpy, which pyarrow imports
at its own import when it can: about 0.1-0.25 s of CPU per rank (numpy's own import) on
the node the rank runs on, for a process that builds its arrays from Python lists only.
pyarrow then converts no numpy object in that process (``hpcml.observe.schema.to_batch``
makes every value a Python number first); nowhere else is numpy refused.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

_LOCK = threading.Lock()
_done = False


class _NoPandas:
    """Refuses pandas (and ``also``) to the thread that made it only: another thread's
    import of pandas in that moment goes on (pyarrow then waits for it on the module's
    lock, and finds it)."""

    def __init__(self, also: tuple[str, ...] = ()) -> None:
        self.thread = threading.get_ident()
        self.refused = ("pandas", *also)

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        top = name.partition(".")[0]
        if top in self.refused and threading.get_ident() == self.thread:
            raise ModuleNotFoundError(f"hpcml gives pyarrow no {top} objects", name=name)


def skip_pandas(numpy: bool = False) -> None:
    """Make pyarrow's first array without importing pandas (a no-op once done, or when
    pandas is loaded already: then pyarrow finds it at no cost); ``numpy``: without numpy
    either where pyarrow is not loaded yet (a rank's recorder only: module docstring)."""
    global _done
    with _LOCK:
        if _done or "pandas" in sys.modules:
            return
        lean = numpy and "numpy" not in sys.modules and "pyarrow" not in sys.modules
        finder = _NoPandas(("numpy",) if lean else ())
        sys.meta_path.insert(0, finder)
        try:
            import pyarrow as pa
            pa.array([0])
        finally:
            sys.meta_path.remove(finder)
            _done = True
