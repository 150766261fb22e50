"""The bundled blueprint catalogue (one YAML file per service) and where blueprints are found.

A blueprint is named by a path to its file, or by its name, looked up in this order:
the directories of ``$HPCML_SERVICE_PATH`` (``os.pathsep``-separated, a user's or a
site's own), then each catalogue of the registry: the bundled one, then those that site
packages declare under the entry-point group ``hpcml.service_catalogues`` (an object
whose ``str()`` is a directory, e.g. a ``Path``)::

    [project.entry-points."hpcml.service_catalogues"]
    mysite = "mysite.services:CATALOGUE"
"""

from __future__ import annotations

import os
from pathlib import Path

from hpcml.errors import UsageError
from hpcml.registry import Registry

DIRECTORY = Path(__file__).parent

CATALOGUES: Registry[object] = Registry("blueprint catalogue", "hpcml.service_catalogues",
                                        {"builtin": "hpcml.service.catalogue:DIRECTORY"})


def directories() -> list[Path]:
    """Where blueprints are looked up by name, first match wins."""
    dirs = [Path(d) for d in os.environ.get("HPCML_SERVICE_PATH", "").split(os.pathsep) if d]
    return dirs + [Path(str(CATALOGUES.get(name))) for name in CATALOGUES.names()]


def available() -> dict[str, Path]:
    """Every blueprint name -> its file (the first directory that has it)."""
    found: dict[str, Path] = {}
    for d in directories():
        for f in sorted(d.glob("*.yaml")) if d.is_dir() else ():
            found.setdefault(f.stem, f)
    return found


def find(ref: str) -> Path:
    """A blueprint's file from a path or a name."""
    path = Path(ref)
    if path.suffix in (".yaml", ".yml") or os.sep in ref:
        if not path.is_file():
            raise UsageError("file not found", file=ref)
        return path
    known = available()
    if ref not in known:
        raise UsageError(f"no blueprint called '{ref}' (known: {', '.join(sorted(known))}; "
                         "or give a path to a .yaml file, or add a directory to HPCML_SERVICE_PATH)", key="blueprint")
    return known[ref]
