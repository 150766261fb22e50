"""What a scan produces: per file a verdict, the globals behind it and where they are.

Verdicts are ordered: a file is as bad as its worst finding, and ``error`` (could not
be read or parsed to the end) is never ``safe``; nor is ``not-scanned`` (a format hpcml
recognises but does not read: HDF5, ONNX, GGUF, a TF SavedModel), which is the least bad
verdict that is not ``safe``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Verdict(str, enum.Enum):
    SAFE = "safe"
    NOT_SCANNED = "not-scanned"
    ERROR = "error"
    UNKNOWN = "unknown"
    DANGEROUS = "dangerous"

    @property
    def rank(self) -> int:
        return _RANK[self]

    @staticmethod
    def worst(verdicts) -> Verdict:
        return max(verdicts, key=lambda v: v.rank, default=Verdict.SAFE)


_RANK = {Verdict.SAFE: 0, Verdict.NOT_SCANNED: 1, Verdict.ERROR: 2, Verdict.UNKNOWN: 3, Verdict.DANGEROUS: 4}


@dataclass(frozen=True)
class Location:
    """Where in a file: an archive member path (``a.zip!dir/data.pkl``) and a byte offset."""

    member: str = ""
    offset: int | None = None

    def __str__(self) -> str:
        where = self.member
        if self.offset is not None:
            where = f"{where}@{self.offset}" if where else f"@{self.offset}"
        return where


@dataclass
class Finding:
    """One global (or an import-like effect) that loading the file would trigger; in a
    format that is not a pickle, a construct that runs code on load (a Keras Lambda layer,
    a TF PyFunc op) or content hpcml does not read (``not-scanned``)."""

    verdict: Verdict
    name: str                      # "os.system", or a description for non-global effects
    why: str                       # which policy rule or construct decided the verdict
    location: Location
    opcode: str = ""               # GLOBAL, STACK_GLOBAL, INST, EXT1, ...; the construct elsewhere
    count: int = 1                 # how many times the same name appears in this stream


@dataclass
class FileResult:
    path: str
    format: str                    # "pickle", "pytorch-zip", "numpy-npy", ... or "unrecognised"
    verdict: Verdict
    findings: list[Finding] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)       # why the verdict is ``error``
    notes: list[str] = field(default_factory=list)        # facts that do not change the verdict
    size: int = 0
    scanned: bool = True           # False when the content is not a model artefact at all
