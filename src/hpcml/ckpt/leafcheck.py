"""Whether a checkpoint's pickled leaf loads: the one rule that ``verify`` (and so prune),
``hpcml scan``'s checkpoint format and the load itself apply to it.

Judged apart, they disagreed: a leaf of 0 bytes, one with a second pickle or junk after its
STOP, one over the restricted unpickler's size limit or one holding a dangerous pickle in a
bytes value verified clean and never loaded (or loaded what verify refused), and prune then
removed the older checkpoint that did load. So each of them calls ``judge`` on the leaf's
bytes: the scanner's walk (``scan_stream``: nested pickles, torch bytes, joblib readings),
the restricted unpickler's own reading (one pickle, read to its STOP, which must be the
leaf's last byte) and its size limit. A leaf that passes here loads; what fails is refused
alike by all three.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:
    from hpcml.scan.context import FileScan
    from hpcml.scan.model import FileResult


def limit() -> int:
    """The largest pickled leaf the load reads (``RestrictedUnpickler``'s limit, read at
    each call so save, verify and load never hold different numbers)."""
    from hpcml.scan import loader
    return loader.MAX_PICKLE_BYTES


def new_scan(source: str, policy: Any = None) -> FileScan:
    """A scan in which ``judge`` records its findings, with the scanner's own way of
    reading content the load reaches (torch files in bytes)."""
    from hpcml.scan.context import FileScan
    from hpcml.scan.policy import default_policy
    from hpcml.scan.scanner import scan_content
    return FileScan(source, policy or default_policy(), 0, scan_content)


def judge(fs: FileScan, fh: BinaryIO, offset: int, nbytes: int, member: str) -> None:
    """Record in ``fs`` why the pickled leaf at ``fh[offset:offset + nbytes]`` would not
    load, if it would not (nothing recorded: it loads)."""
    from hpcml.scan import pickles
    from hpcml.units import fmt_bytes
    top = limit()
    if nbytes <= 0:
        fs.error("0 bytes: no pickle, which the load refuses", member)
        return
    if nbytes > top:
        fs.error(f"{nbytes} bytes: larger than the {top} ({fmt_bytes(top)}) a pickled leaf may be (the load "
                 "refuses it)", member)
        return
    end = offset + nbytes
    try:
        pickles.scan_stream(fs, fh, offset, end, member)        # as hpcml scan judges it, nested pickles too
        res = pickles.walk_one(fh, offset, end, joblib=False)   # as the load's unpickler reads it
    except OSError:
        raise
    except Exception as exc:  # noqa: BLE001 - fail closed: a walker bug refuses the leaf
        fs.error(f"internal error while judging the leaf ({type(exc).__name__}: {exc})", member)
        return
    fs.events(res.events, member)
    if res.error or not res.stopped:
        fs.error(f"not a pickle the load reads: {res.error or 'it has no STOP'}", member)
    elif res.end != end:
        fs.error(f"{end - res.end} bytes after the pickle's end (a second pickle or junk): the load reads "
                 "one pickle that is the whole leaf", member)


def refusals(res: FileResult) -> list[str]:
    """One line per reason a judged leaf does not load (none: every one loads)."""
    from hpcml.scan.model import Verdict
    out = [f"{f.location.member}: refused at load: {f.name} ({f.why})"
           for f in res.findings if f.verdict is not Verdict.SAFE]
    return out + list(res.errors)
