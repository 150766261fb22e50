"""Model and artefact security scanning, and the safe loader the other components use.

``hpcml.scan.safe_load(path)`` and ``hpcml.scan.RestrictedUnpickler`` are the entry points
for code; ``hpcml scan`` is the command. Attributes are imported lazily so that importing
the package stays cheap for the CLI.
"""

from __future__ import annotations

from typing import Any

_LAZY = {"safe_load": "hpcml.scan.loader", "RestrictedUnpickler": "hpcml.scan.loader",
         "UnsafeFileError": "hpcml.scan.loader", "scan_file": "hpcml.scan.scanner",
         "scan_paths": "hpcml.scan.scanner", "load_policy": "hpcml.scan.policy"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)
