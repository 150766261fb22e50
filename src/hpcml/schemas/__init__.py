"""One tag convention for every JSON document hpcml writes for people or other components.

The first key of each is ``"schema": "hpcml.<component>[.<part>]/<major>"``. A reader calls
``check`` so that a file written by a newer hpcml (a higher major) is refused in one line
instead of being misread. A minor (``/<major>.<minor>``) may only add keys, so every minor
of a known major is read. The JSON Schema (draft 2020-12) of each main document lies beside
this module as ``<component>[.<part>].schema.json``; ``load`` returns it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from hpcml.errors import UsageError

_TAG = re.compile(r"^(hpcml(?:\.[a-z][a-z0-9_]*)+)/(\d+)(?:\.\d+)?$")


def tag(name: str, major: int) -> str:
    """``tag("data.manifest", 1)`` is ``"hpcml.data.manifest/1"``."""
    return f"hpcml.{name.removeprefix('hpcml.')}/{major}"


#: the tag of ``hpcml vet``'s report.json (``vet.report.to_json``). Here, below both its writer
#: and its readers (the centre's collector and handler: ``centre.collector.schema``,
#: ``centre.sources``): ``vet`` sends through ``centre.client``, so the centre may not import
#: ``vet`` for it. Kept without a part: deployed collectors accept only ``hpcml.vet/`` tags.
VET_REPORT = tag("vet", 1)
#: the result a prolog's or health check's node report records its own drain as (``vet.prolog``
#: writes it, ``centre.handler`` resumes the node it names): a check name and a type no check has
DRAIN_CHECK, DRAIN_TYPE = "hpcml-drain", "drain"


def parse(value: Any) -> tuple[str, int] | None:
    """``"hpcml.data.manifest/1"`` -> ``("hpcml.data.manifest", 1)``; None if not a tag."""
    m = _TAG.match(value) if isinstance(value, str) else None
    return (m.group(1), int(m.group(2))) if m else None


def check(doc: Any, expected: str, source: str, *, also: tuple[str, ...] = (),
          untagged: bool = False) -> None:
    """Refuse a document this hpcml cannot read: ``UsageError`` (exit 2) naming ``source``
    and the key 'schema'. ``also``: older tags read as ``expected``; ``untagged``: accept a
    document without a tag (files written before tags existed)."""
    if not isinstance(doc, dict):
        raise UsageError(f"expected a JSON object ({expected})", file=source)
    found = doc.get("schema")
    if found is None and untagged or found in also:
        return
    want = parse(expected)
    assert want is not None, expected
    if found is None:
        raise UsageError(f"no schema tag: not an {expected} document", file=source, key="schema")
    got = parse(found)
    if got is None or got[0] != want[0]:
        raise UsageError(f"not an {want[0]} document (schema {found!r}); expected {expected}",
                         file=source, key="schema")
    if got[1] > want[1]:
        raise UsageError(f"written by a newer hpcml (schema {found}); this hpcml reads {expected}",
                         file=source, key="schema")
    if got[1] < want[1]:
        raise UsageError(f"written by an older hpcml (schema {found}); this hpcml reads {expected}",
                         file=source, key="schema")


def load(name: str) -> dict[str, Any]:
    """The JSON Schema of a document: ``load("data.manifest")`` (a full tag works too)."""
    base = name.removeprefix("hpcml.").split("/", 1)[0]
    from importlib import resources  # ~20 ms: not for writers, which only need tag()
    return json.loads(resources.files(__name__).joinpath(f"{base}.schema.json").read_text("utf-8"))


def names() -> list[str]:
    """Every document that has a schema file here, e.g. ``"data.manifest"``."""
    from importlib import resources
    return sorted(p.name.removesuffix(".schema.json") for p in resources.files(__name__).iterdir()
                  if p.name.endswith(".schema.json"))
