"""Allowlist-first policy: which globals a pickle may import.

Globals that rebuild data (numpy arrays, torch tensors, Python containers) are safe;
known code-execution gadgets are dangerous; everything else is unknown and blocks by
default. A site policy file has the same keys as ``default.yaml`` and extends it; it
cannot make a dangerous global safe.
"""

from __future__ import annotations

import importlib.resources
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcml.errors import UsageError
from hpcml.files import ConfigLoader, line_map, load_yaml_with_nodes, read_config, unknown_key
from hpcml.scan.model import Verdict

MAX_JUDGED = 1 << 16          # names whose verdict ``Policy.judge`` keeps
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.*")


def is_name(n: object) -> bool:
    """Whether ``n`` can be a line of a policy's ``safe:`` or ``dangerous:`` list: what the
    parser accepts, and all that advice may print."""
    return isinstance(n, str) and bool(n) and not set(n) - _NAME_CHARS and "." in n \
        and "*" not in n.rstrip("*").rstrip(".") and (not n.endswith("*") or n.endswith(".*"))


@dataclass
class PolicyFile:
    """One policy file's keys. Validated by hand, not with pydantic: importing pydantic
    costs ~120 ms, a third of a small scan's whole run, for three keys."""

    safe: list[str] = field(default_factory=list)
    dangerous: list[str] = field(default_factory=list)
    block_unknown: bool | None = None

    KEYS = ("safe", "dangerous", "block_unknown")

    @classmethod
    def parse(cls, data: dict, ld: ConfigLoader) -> PolicyFile:
        for key in data:
            if key not in cls.KEYS:
                raise ld.error((key,), unknown_key(key, cls.KEYS))
        out = cls()
        for key in ("safe", "dangerous"):
            names = data.get(key) or []
            if not isinstance(names, list):
                raise ld.error((key,), f"expected a list of 'module.name' or 'module.*', found {names!r}")
            for i, n in enumerate(names):
                if not is_name(n):
                    raise ld.error((key, i), f"{n!r} is not 'module.name' or 'module.*'")
            setattr(out, key, list(names))
        block = data.get("block_unknown")
        if block is not None and not isinstance(block, bool):
            raise ld.error(("block_unknown",), f"expected true or false, found {block!r}")
        out.block_unknown = block
        return out


def _is_dunder(part: str) -> bool:
    return len(part) > 4 and part.startswith("__") and part.endswith("__")


@dataclass
class Policy:
    safe_exact: set[str] = field(default_factory=set)
    safe_modules: set[str] = field(default_factory=set)
    dangerous_exact: set[str] = field(default_factory=set)
    dangerous_modules: set[str] = field(default_factory=set)
    block_unknown: bool = True
    sources: list[str] = field(default_factory=list)
    #: read an unknown global's source to tell a gadget (dangerous) from an unknown
    analyse_sources: bool = True
    #: what ``judge`` answered, per name (cleared by ``extend``); and, for the current file
    #: only, the names its analysis budget left unread
    _judged: dict[tuple[str, str], tuple[Verdict, str]] = field(
        default_factory=dict, init=False, repr=False, compare=False)
    _spent: dict[tuple[str, str], tuple[Verdict, str]] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    def extend(self, spec: PolicyFile, source: str) -> None:
        self._judged.clear()                # new lists: the answers (and analyses) start again
        gadgets = sys.modules.get("hpcml.scan.gadgets")
        if gadgets is not None:
            gadgets.forget(self.is_dangerous)
        for n in spec.safe:
            (self.safe_modules.add(n[:-2]) if n.endswith(".*") else self.safe_exact.add(n))
        for n in spec.dangerous:
            (self.dangerous_modules.add(n[:-2]) if n.endswith(".*") else self.dangerous_exact.add(n))
        if spec.block_unknown is not None:
            self.block_unknown = spec.block_unknown
        self.sources.append(source)

    @staticmethod
    def _under(module: str, roots: set[str]) -> str | None:
        parts = module.split(".")
        for i in range(len(parts), 0, -1):
            prefix = ".".join(parts[:i])
            if prefix in roots:
                return prefix
        return None

    def classify(self, module: str, name: str) -> tuple[Verdict, str]:
        """The verdict for importing ``module.name`` and the rule that decided it."""
        dotted = f"{module}.{name}"
        if dotted in self.dangerous_exact:
            return Verdict.DANGEROUS, f"{dotted} is on the dangerous list"
        root = self._under(dotted, self.dangerous_modules)
        if root:
            return Verdict.DANGEROUS, f"module {root} is on the dangerous list"
        owner = self._under(dotted, self.dangerous_exact)
        if owner:                       # an attribute of a dangerous global (builtins.eval.__call__)
            return Verdict.DANGEROUS, f"an attribute of {owner}, which is on the dangerous list"
        # A dotted name is an attribute chain: any tail of it may be a dangerous global
        # the module happens to import (mypkg + "os.system").
        nparts = name.split(".")
        for i in range(1 if len(nparts) == 1 else 0, len(nparts) - 1):
            tail = ".".join(nparts[i:])
            root = self._under(tail, self.dangerous_modules)
            if tail in self.dangerous_exact or (root and root != tail):
                return Verdict.DANGEROUS, f"its attribute chain reaches {tail}, which is dangerous"
        if dotted in self.safe_exact:
            return Verdict.SAFE, "allowlisted"
        if any(_is_dunder(p) for p in name.split(".")):
            return Verdict.DANGEROUS, "reaches a dunder attribute (an attribute-chain escape)"
        if any(p.startswith("_") for p in nparts[:-1]):
            return Verdict.DANGEROUS, ("its attribute chain passes through a private attribute "
                                       "(what a module imported for itself: another module)")
        root = self._under(module, self.safe_modules)
        if "." not in name and root and not any(
                p.startswith("_") for p in dotted[len(root) + 1:].split(".")):
            return Verdict.SAFE, f"module {root}.* is allowlisted"
        if "." in name and self._under(module, self.safe_modules | {d.rsplit('.', 1)[0] for d in self.safe_exact}):
            return Verdict.UNKNOWN, "an attribute chain inside an allowlisted module"
        return Verdict.UNKNOWN, "not on the allowlist"


    def is_dangerous(self, dotted: str) -> bool:
        """Whether a dotted name (``mod.name`` or ``mod.*``) is dangerous by the lists."""
        module, _, name = dotted.rpartition(".")
        if name == "*":
            return self._under(module, self.dangerous_modules) is not None
        return bool(module) and self.classify(module, name)[0] is Verdict.DANGEROUS

    def judge(self, module: str, name: str) -> tuple[Verdict, str]:
        """``classify``, then, for a name the lists leave unknown, what its source can
        reach (``hpcml.scan.gadgets``): the lists stay first, the analysis only turns
        unknown into dangerous. Answers are kept (a pickle may name one global millions of
        times); a name the file's analysis budget left unread is kept for the file only."""
        key = (module, name)
        hit = self._judged.get(key) or self._spent.get(key)
        if hit is not None:
            return hit
        verdict, why = self.classify(module, name)
        kept = self._judged
        if verdict is Verdict.UNKNOWN and self.analyse_sources:
            from hpcml.scan import gadgets
            found = None
            try:
                found = gadgets.reach(module, name, self.is_dangerous)
            except gadgets.Spent as exc:
                why, kept = f"{why}; {exc}", self._spent
            except Exception:  # noqa: BLE001 - the analysis may only add a finding, never lose the scan
                pass
            if found is not None:
                verdict, why = Verdict.DANGEROUS, str(found)
        if len(kept) >= MAX_JUDGED:
            kept.clear()
        kept[key] = verdict, why
        return verdict, why

    def start_file(self) -> None:
        """A file's scan begins: the source analysis's per-file budget starts again."""
        self._spent.clear()
        gadgets = sys.modules.get("hpcml.scan.gadgets")       # not imported for nothing
        analyser = gadgets.analyser(self.is_dangerous, create=False) if gadgets else None
        if analyser is not None:
            analyser.start_file()

    def analysis_note(self) -> str | None:
        """What the file's analysis budget left unread, for the file's notes."""
        if not self._spent:
            return None
        from hpcml.scan.gadgets import FILE_PARSES, FILE_SECONDS
        return (f"{len(self._spent)} unknown global names were not analysed: this file's source "
                f"analysis stopped at its budget ({FILE_PARSES} module parses, {FILE_SECONDS:g} s); "
                "they stay unknown")

    def __getstate__(self) -> dict[str, Any]:
        """Sent to the scan's worker processes without what this one judged."""
        return {k: v for k, v in self.__dict__.items() if k not in ("_judged", "_spent")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _judged={}, _spent={})


#: the standard library's process, network, debugging and interpreter modules: advice
#: never offers to allow a name from them, whatever the analysis found
NOT_ADVISED = frozenset("""
    os posix nt subprocess pty tty signal sys platform sysconfig site shutil tempfile
    socket ssl select selectors http urllib ftplib smtplib smtpd imaplib poplib nntplib
    telnetlib xmlrpc socketserver asyncio asyncore asynchat multiprocessing concurrent
    threading mailcap webbrowser cgi cgitb wsgiref pdb bdb trace tracemalloc faulthandler
    cProfile profile pstats timeit code codeop idlelib pydoc doctest unittest importlib
    pkgutil runpy zipimport ctypes marshal pickle shelve gc inspect builtins io
    logging ensurepip venv distutils tarfile zipfile gzip bz2 lzma dbm sqlite3 tokenize
    lib2to3 tkinter turtle dataclasses contextlib functools operator types copyreg
    pathlib glob fileinput mmap""".split())


def not_advised(dotted: str) -> str | None:
    """Why advice must not offer to allow ``dotted``; None when it may."""
    parts = dotted.split(".")
    if any(p.startswith("_") and not _is_dunder(p) for p in parts) or any(
            _is_dunder(p) and p != "__main__" for p in parts):
        return "a private name (a leading underscore): internals, which no checkpoint needs"
    if parts[0] in NOT_ADVISED:
        return (f"from {parts[0]}, a standard-library module that runs processes, talks to "
                "the network, writes files or debugs the interpreter")
    return None


def _load_file(path: Path | str, text: str) -> PolicyFile:
    data, node = load_yaml_with_nodes(text, str(path))
    data = data or {}
    if not isinstance(data, dict):
        raise UsageError("a policy file must be a mapping with keys safe, dangerous, block_unknown",
                         file=str(path))
    return PolicyFile.parse(data, ConfigLoader(str(path), line_map(node) if node is not None else {}))


def builtin_lists(text: str) -> dict[str, Any]:
    """The built-in ``default.yaml``, read without PyYAML (whose import is ~8 ms of every
    scan of one small file): top-level keys, ``  - item`` lists, a boolean, comments. Only
    for that file, whose shape a test holds to what ``yaml.safe_load`` reads."""
    data: dict[str, Any] = {}
    key = None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line:
            continue
        if line.startswith("  - ") and key is not None:
            data[key].append(line[4:].strip())
        elif not line[0].isspace() and line.endswith(":"):
            key = line[:-1]
            if key in data:
                raise ValueError(f"line {n}: {key} a second time")
            data[key] = []
        elif not line[0].isspace() and ": " in line:
            name, value = line.split(": ", 1)
            if value not in ("true", "false"):
                raise ValueError(f"line {n}: not a boolean: {value!r}")
            if name in data:
                raise ValueError(f"line {n}: {name} a second time")
            data[name], key = value == "true", None
        else:
            raise ValueError(f"line {n}: not a shape the built-in reader knows: {raw!r}")
    return data


#: the built-in policy: the standard library, numpy, torch and joblib, then one file per
#: library whose everyday objects need names of their own
BUILTIN_FILES = ("default.yaml", "pandas.yaml", "scikit-learn.yaml")


def default_policy() -> Policy:
    policy = Policy()
    for name in BUILTIN_FILES:
        text = importlib.resources.files("hpcml.scan.policy").joinpath(name).read_text()
        policy.extend(PolicyFile.parse(builtin_lists(text), ConfigLoader(name, {})), "built-in")
    policy.sources[:] = ["built-in"]
    return policy


def load_policy(*site_files: Path | str) -> Policy:
    """The built-in policy extended by each site file in order; bad files exit 2."""
    policy = default_policy()
    for f in site_files:
        text = read_config(f, what="the policy file")
        policy.extend(_load_file(f, text), str(f))
    return policy
