"""Offline dependency-confusion check of a requirements file or lock file.

Why: an installer that searches a private index together with PyPI takes the highest version
it finds anywhere, so anyone can win a private package's name by uploading it to PyPI: that is
how ``torchtriton`` reached PyTorch nightly users through ``--extra-index-url`` in Dec 2022.
Look-alike names install malware, and unpinned or unhashed lines let a later upload change
what installs. Everything is decided from the file alone, no index is asked: the result is
reproducible and the check runs on an air-gapped login node.

Requirement syntax (PEP 508) and name normalisation are ``packaging``'s. pip's line grammar
(``\\`` continuations, `` #`` comments, ``-r``/``-c`` includes, index options, per-line
``--hash``) is parsed here because pip has no public API (``pip._internal`` changes without
notice) and pip-requirements-parser is a vendored copy of pip's internals; the grammar is small
and follows pip's ``req_file.py``.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import os
import re
import shlex
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, urlsplit

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import (
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)

from hpcml.errors import UsageError
from hpcml.files import load_json, load_toml, load_yaml, read_bounded

# Lock files are generated, not written by hand: a big project's uv.lock is a few MiB.
LOCK_MAX = 16 << 20
PYPI = "https://pypi.org/simple"
# Anyone can upload to these, so a name served from them is public.
PUBLIC_HOSTS = frozenset({"pypi.org", "pypi.python.org", "files.pythonhosted.org", "test.pypi.org"})

RULES: dict[str, str] = {
    "mixed-index": "a private index or find-links location is searched together with PyPI",
    "insecure-index": "an index or find-links location over plain http, or with TLS checks off",
    "unpinned": "a requirement without an exact == pin, or a locked package without a version",
    "missing-hash": "a requirement or locked package without hashes where hashes are needed",
    "known-squat": "a name on the bundled list of malicious, typosquat or confusion packages",
    "confusable-name": "a name one edit or one look-alike swap from a popular package",
    "unknown-internal": "a site-internal package name that resolves from PyPI",
    "direct-url": "a direct URL or VCS requirement not pinned by a hash or a commit",
}


@dataclass
class ReqFinding:
    severity: str              # "high" | "medium" | "low"
    rule: str                  # a key of RULES
    package: str | None        # canonical name, or None for file-wide findings
    line: int | None           # 1-based line in `file`
    message: str
    file: str | None = None    # the file `line` is in: an -r/-c include may differ from the report's


@dataclass
class RequirementsReport:
    path: str
    kind: str                  # "requirements", "uv.lock", "poetry.lock", "pylock", "Pipfile.lock"
    findings: list[ReqFinding] = field(default_factory=list)
    packages: int = 0


# --------------------------------------------------------------------------- squat list

SQUAT_KINDS = ("malicious", "confusion", "typosquat")
_LOOKALIKE = (("rn", "m"), ("vv", "w"), ("0", "o"), ("1", "l"), ("i", "l"))
_MIN_EDIT_LEN = 5   # shorter names have too many honest neighbours (jax/jaxb, ray/rag, pip/pipx)


@dataclass(frozen=True)
class Squat:
    name: str                  # canonical
    kind: str                  # one of SQUAT_KINDS
    why: str


@dataclass
class SquatList:
    squats: dict[str, Squat]
    protected: frozenset[str]
    allowed: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        self._skeletons = {_skeleton(p): p for p in self.protected}
        self._long = sorted(p for p in self.protected if len(p) >= _MIN_EDIT_LEN)

    def confusable(self, name: str) -> str | None:
        """The protected name that `name` (canonical) can be mistaken for, if any."""
        if name in self.protected or name in self.allowed:
            return None
        return self._skeletons.get(_skeleton(name)) or next(
            (p for p in self._long if _one_edit(name, p)), None)


def _skeleton(name: str) -> str:
    """A canonical name with separators dropped and look-alike letters folded together."""
    s = name.replace("-", "")
    for a, b in _LOOKALIKE:
        s = s.replace(a, b)
    return s


def _one_edit(a: str, b: str) -> bool:
    """True if a != b and one insert, delete, substitution or neighbour swap turns a into b."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) > len(b):
        a, b = b, a
    i = 0
    while i < len(a) and a[i] == b[i]:
        i += 1
    if len(a) < len(b):
        return a[i:] == b[i + 1:]
    swap = i + 1 < len(a) and a[i] == b[i + 1] and a[i + 1] == b[i] and a[i + 2:] == b[i + 2:]
    return a[i + 1:] == b[i + 1:] or swap


def load_squat_list(text: str | None = None, *, source: str = "squats.yaml") -> SquatList:
    """Parse and validate a squat list; without `text`, the one bundled with hpcml."""
    if text is None:
        try:
            text = resources.files("hpcml.scan").joinpath("data").joinpath("squats.yaml").read_text("utf-8")
        except OSError as exc:
            raise UsageError(f"cannot read the bundled list: {exc.strerror or exc}", file=source) from None
    data = load_yaml(text, source)
    if not isinstance(data, dict) or set(data) - {"squats", "protected", "allowed"}:
        raise UsageError("expected a mapping with keys squats, protected and optionally allowed", file=source)

    def names(key: str, required: bool = True) -> frozenset[str]:
        value = data.get(key, None if required else [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise UsageError("expected a list of package names", file=source, key=key)
        return frozenset(canonicalize_name(v) for v in value)

    entries = data.get("squats")
    if not isinstance(entries, list):
        raise UsageError("expected a list of entries", file=source, key="squats")
    protected, squats = names("protected"), dict[str, Squat]()
    for i, entry in enumerate(entries):
        where = f"squats[{i}]"
        if not isinstance(entry, dict) or set(entry) != {"name", "kind", "why"}:
            raise UsageError("expected exactly the keys name, kind, why", file=source, key=where)
        for key in ("name", "why"):
            if not isinstance(entry[key], str) or not entry[key].strip():
                raise UsageError("must be a non-empty string", file=source, key=f"{where}.{key}")
        if entry["kind"] not in SQUAT_KINDS:
            raise UsageError(f"must be one of {', '.join(SQUAT_KINDS)}", file=source, key=f"{where}.kind")
        name = canonicalize_name(entry["name"])
        if name in squats or name in protected:
            raise UsageError(f"{name!r} is listed twice, or is also protected", file=source, key=f"{where}.name")
        squats[name] = Squat(name, entry["kind"], entry["why"].strip())
    return SquatList(squats, protected, names("allowed", required=False))


@functools.lru_cache(maxsize=1)
def _bundled() -> SquatList:
    return load_squat_list()


# --------------------------------------------------------------------------- common model

@dataclass
class _Entry:
    """One package to install: a requirement line or a lock-file entry."""

    name: str | None           # canonical; None for a URL or path with no recognisable name
    file: str
    line: int | None
    pinned: bool = False       # exact == / === pin, or a version in a lock file
    hashed: bool = False       # --hash on the line, or artefact hashes in a lock file
    index: str | None = None   # lock files: the index it was locked from; None = any searched
    url: str | None = None     # direct URL or VCS requirement
    url_pinned: bool = False   # the URL names one immutable artefact (hash or commit)
    local: bool = False        # path, directory, editable checkout: no index involved

    def __post_init__(self) -> None:
        for url in (self.url, self.index):
            if url is not None:
                _split(url, self.file, self.line)


@dataclass
class _Source:
    """An index or find-links location and where it was declared."""

    url: str
    file: str | None
    line: int | None
    option: str                # "--extra-index-url", "index", ...
    used: bool = True          # pip ignores indexes after --no-index; Pipfile sources may be unused
    verify: bool = True        # Pipfile.lock's verify_ssl

    def __post_init__(self) -> None:
        _split(self.url, self.file, self.line)


@dataclass
class _Parsed:
    entries: list[_Entry]
    sources: list[_Source]
    hash_mode: bool            # every entry needs hashes (pip's hash-checking mode; always in a lock)
    lock: bool


def _split(url: str, file: str | None, line: int | None) -> SplitResult:
    """urlsplit, with a malformed URL (``http://[x``) as bad input rather than a ValueError."""
    try:
        return urlsplit(url)
    except ValueError as exc:
        raise UsageError(f"malformed URL {url!r}: {exc}", file=file, line=line) from None


def _is_public(url: str) -> bool:
    return (urlsplit(url).hostname or "") in PUBLIC_HOSTS


def _is_insecure(url: str) -> bool:
    parts = urlsplit(url)
    if parts.scheme.lower() != "http":
        return False
    host = parts.hostname or ""
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host != "localhost"


def _redact(url: str) -> str:
    """The URL without user:token, which findings must not carry into CI logs."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]).geturl()


def _label(url: str) -> str:
    return "PyPI" if _is_public(url) else _redact(url)


def _is_commit(rev: object) -> bool:
    return isinstance(rev, str) and bool(re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", rev))


def _name_from_filename(url_path: str) -> str | None:
    filename = url_path.rstrip("/").rpartition("/")[2]
    try:
        if filename.endswith(".whl"):
            return canonicalize_name(parse_wheel_filename(filename)[0])
        return canonicalize_name(parse_sdist_filename(filename)[0])
    except ValueError:
        return None


def _location(loc: str, name: str | None, file: str, line: int | None, hashed: bool) -> _Entry:
    """An entry for a URL, VCS URL or local path (pip's ``-e``, ``pkg @ url``, bare locations)."""
    parts = _split(loc, file, line)
    scheme = parts.scheme.lower()
    remote = "://" in loc and scheme.rpartition("+")[2] != "file"
    if name is None:
        egg = re.search(r"(?:^|&)egg=([A-Za-z0-9][A-Za-z0-9._-]*)", parts.fragment)
        name = canonicalize_name(egg.group(1)) if egg else _name_from_filename(parts.path)
    if not remote:
        return _Entry(name, file, line, local=True)
    if "+" in scheme:          # git+https://host/repo@rev: only a full commit id is immutable
        pinned = _is_commit(parts.path.rpartition("@")[2] if "@" in parts.path else "")
    else:
        pinned = hashed or bool(re.search(r"(?:^|&)(sha256|sha384|sha512)=[0-9a-fA-F]+", parts.fragment))
    return _Entry(name, file, line, hashed=hashed, url=loc, url_pinned=pinned)


def _read_text(path: Path, *, file: str, line: int | None = None, key: str | None = None,
               what: str = "file") -> str:
    try:
        return read_bounded(path, LOCK_MAX).decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{what} is not UTF-8 text (bad byte at offset {exc.start})",
                         file=file, line=line, key=key) from None
    except (OSError, ValueError) as exc:      # ValueError: a NUL byte in the path, a FIFO, too big
        raise UsageError(f"cannot read {what}: {getattr(exc, 'strerror', None) or exc}",
                         file=file, line=line, key=key) from None


# --------------------------------------------------------------------------- requirements files

_COMMENT = re.compile(r"(^|\s+)#.*$")
_NAMED_URL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\s*(\[[^\]]*\])?\s*@")
_LOCATION = re.compile(r"^(\w[\w+.-]*://|[./~\\]|[A-Za-z]:[\\/])")
_ARCHIVES = (".whl", ".tar.gz", ".tgz", ".tar.bz2", ".tar", ".zip")
_HASH = re.compile(r"(sha256|sha384|sha512):[0-9a-fA-F]+")
# pip's SUPPORTED_OPTIONS and SUPPORTED_OPTIONS_REQ; the value says whether the option takes one.
_OPTIONS: dict[str, bool] = {
    "--requirement": True, "--constraint": True, "--editable": True, "--index-url": True,
    "--extra-index-url": True, "--no-index": False, "--find-links": True, "--trusted-host": True,
    "--no-binary": True, "--only-binary": True, "--prefer-binary": False, "--require-hashes": False,
    "--pre": False, "--use-feature": True, "--hash": True, "--config-settings": True,
    "--global-option": True,
}
_SHORT = {"-r": "--requirement", "-c": "--constraint", "-e": "--editable", "-i": "--index-url",
          "-f": "--find-links"}
_PER_REQUIREMENT = frozenset({"--hash", "--config-settings", "--global-option"})


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """pip's join_lines + ignore_comments: (first line number, line) for each non-empty line."""
    pending: list[str] = []
    start = 1
    for no, raw in enumerate([*text.splitlines(), ""], 1):   # "" ends a trailing continuation
        if not pending:
            start = no
        comment = bool(_COMMENT.match(raw))
        if raw.endswith("\\") and not comment:
            pending.append(raw.rstrip("\\"))
            continue
        pending.append(" " + raw if comment else raw)
        line = _COMMENT.sub("", "".join(pending)).strip()
        pending = []
        if line:
            yield start, line


def _options(text: str, file: str, line: int) -> list[tuple[str, str | None]]:
    """(long option, value) pairs, with ``--opt=v``, ``--opt v``, ``-iURL`` and unique prefixes."""
    try:
        tokens = iter(shlex.split(text))
    except ValueError as exc:
        raise UsageError(f"cannot split the options: {exc}", file=file, line=line) from None
    out: list[tuple[str, str | None]] = []
    for token in tokens:
        name: str | None
        if token.startswith("--"):
            given, eq, value = token.partition("=")
            matches = [o for o in _OPTIONS if o.startswith(given)]
            name = given if given in _OPTIONS else (matches[0] if len(matches) == 1 else None)
            has_value = bool(eq)
        else:
            name, value = _SHORT.get(token[:2]), token[2:]
            has_value = bool(value)
        if name is None:
            what = "unknown pip option" if token.startswith("-") else "unexpected text"
            raise UsageError(f"{what} {token!r}", file=file, line=line)
        if _OPTIONS[name] and not has_value:
            value = next(tokens, "")
            if not value:
                raise UsageError("needs a value", file=file, line=line, key=name)
        elif not _OPTIONS[name] and has_value:
            raise UsageError("takes no value", file=file, line=line, key=name)
        if name == "--hash" and not _HASH.fullmatch(value):
            raise UsageError(f"{value!r} is not sha256:, sha384: or sha512: and a hex digest",
                             file=file, line=line, key=name)
        out.append((name, value if _OPTIONS[name] else None))
    return out


def _requirement(text: str, file: str, line: int, hashed: bool) -> _Entry:
    """An entry for the requirement part of a line: PEP 508, ``name @ url``, or a bare location."""
    head = text.split(";")[0].strip()
    if not _NAMED_URL.match(text) and (_LOCATION.match(text) or "/" in head or head.endswith(_ARCHIVES)):
        loc = text.split("; ")[0] if "://" in text else head     # pip's marker separators
        return _location(re.sub(r"\[[^\]]*\]$", "", loc.strip()), None, file, line, hashed)
    try:
        req = Requirement(text)
    except InvalidRequirement as exc:
        raise UsageError(f"invalid requirement {text!r}: {str(exc).splitlines()[0]}",
                         file=file, line=line) from None
    name = canonicalize_name(req.name)
    if req.url:
        return _location(req.url, name, file, line, hashed)
    pinned = any(s.operator == "===" or (s.operator == "==" and not s.version.endswith(".*"))
                 for s in req.specifier)
    return _Entry(name, file, line, pinned=pinned, hashed=hashed)


class _PipWalker:
    """Reads a requirements file and its -r/-c includes the way pip does, offline."""

    def __init__(self) -> None:
        self.entries: list[_Entry] = []
        self.constraints: list[_Entry] = []
        self.index: _Source | None = None
        self.extra_indexes: list[_Source] = []
        self.find_links: list[_Source] = []
        self.no_index = self.require_hashes = False
        self._done: set[tuple[Path, bool]] = set()

    def read(self, text: str, shown: str, constraint: bool, stack: tuple[tuple[Path, str], ...]) -> None:
        for no, line in _logical_lines(text):
            if line.startswith("-"):
                self._option_line(line, shown, no, constraint, stack)
                continue
            # pip's break_args_options: the requirement runs up to the first token starting with "-"
            words = line.split(" ")
            cut = next((i for i, w in enumerate(words) if w.startswith("-")), len(words))
            opts = _options(" ".join(words[cut:]), shown, no)
            for name, _ in opts:
                if name not in _PER_REQUIREMENT:
                    raise UsageError("cannot follow a requirement on the same line", file=shown, line=no, key=name)
            entry = _requirement(" ".join(words[:cut]).strip(), shown, no, any(n == "--hash" for n, _ in opts))
            (self.constraints if constraint else self.entries).append(entry)

    def _option_line(self, line: str, shown: str, no: int, constraint: bool,
                     stack: tuple[tuple[Path, str], ...]) -> None:
        opts = _options(line, shown, no)
        editable = any(n == "--editable" for n, _ in opts)
        for name, value in opts:
            value = value or ""
            if name in ("--requirement", "--constraint"):
                self._include(value, name == "--constraint", shown, no, name, stack)
            elif name == "--editable":
                (self.constraints if constraint else self.entries).append(_location(value, None, shown, no, False))
            elif name == "--index-url":
                self.index = _Source(value, shown, no, name)      # the last one wins, as in pip
            elif name in ("--extra-index-url", "--find-links"):
                (self.extra_indexes if name == "--extra-index-url" else self.find_links).append(
                    _Source(value, shown, no, name))
            elif name == "--no-index":
                self.no_index = True
            elif name == "--require-hashes":
                self.require_hashes = True
            elif name in _PER_REQUIREMENT and not editable:
                raise UsageError("must follow a requirement on the same line", file=shown, line=no, key=name)

    def _include(self, target: str, constraint: bool, shown: str, no: int, option: str,
                 stack: tuple[tuple[Path, str], ...]) -> None:
        if re.match(r"\w[\w+.-]*://", target):
            raise UsageError(f"remote include {_redact(target)} is not fetched: this check is offline; "
                             "download it and include the local copy", file=shown, line=no, key=option)
        child = target if os.path.isabs(target) else os.path.normpath(os.path.join(os.path.dirname(shown), target))
        text = _read_text(Path(child), file=shown, line=no, key=option, what=f"included file {child}")
        real = Path(child).resolve()
        if any(real == seen for seen, _ in stack):
            chain = " -> ".join([*(s for _, s in stack), child])
            raise UsageError(f"include cycle: {chain}", file=shown, line=no, key=option)
        if (real, constraint) not in self._done:    # a file included twice is read once
            self._done.add((real, constraint))
            self.read(text, child, constraint, (*stack, (real, child)))

    def walk(self, text: str, shown: str) -> _Parsed:
        root = Path(shown).resolve()
        self._done.add((root, False))
        self.read(text, shown, False, ((root, shown),))
        pinned_by_constraint = {e.name for e in self.constraints if e.pinned}
        for entry in self.entries:
            entry.pinned = entry.pinned or entry.name in pinned_by_constraint
        indexes = [self.index or _Source(PYPI, None, None, "default index"), *self.extra_indexes]
        for source in indexes:
            source.used = not self.no_index     # --no-index drops every index, keeps find-links
        return _Parsed(self.entries, [*indexes, *self.find_links],
                       hash_mode=self.require_hashes or any(e.hashed for e in self.entries), lock=False)


# --------------------------------------------------------------------------- lock files

class _Lines:
    """Finds each package's line in file order, since tomllib and json give no positions."""

    def __init__(self, text: str) -> None:
        self.lines, self.cursor = text.splitlines(), 0

    def find(self, pattern: str) -> int | None:
        regex = re.compile(pattern)
        for i in range(self.cursor, len(self.lines)):
            if regex.search(self.lines[i]):
                self.cursor = i + 1
                return i + 1
        return None

    def toml_name(self, name: str) -> int | None:
        return self.find(rf"""^\s*name\s*=\s*["']{re.escape(name)}["']\s*$""")


def _table(value: Any, file: str, key: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UsageError("expected a table", file=file, key=key)
    return value


def _tables(value: Any, file: str, key: str) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise UsageError("expected an array of tables", file=file, key=key)
    return value


def _str(value: Any, file: str, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise UsageError("expected a non-empty string", file=file, key=key)
    return value


def _all_hashed(artefacts: list[dict[str, Any]], key: str) -> bool:
    return bool(artefacts) and all(a.get(key) for a in artefacts)


_Lock = tuple[list[_Entry], list[_Source]]


def _packages(data: dict[str, Any], key: str, file: str, lines: _Lines) -> Iterator[tuple[str, dict, str, int | None]]:
    """Each ``[[key]]`` table of a TOML lock file: (its place for errors, the table, the
    canonical name, its line)."""
    for i, pkg in enumerate(_tables(data.get(key), file, key)):
        where = f"{key}[{i}]"
        raw = _str(pkg.get("name"), file, f"{where}.name")
        yield where, pkg, canonicalize_name(raw), lines.toml_name(raw)


def _uv(data: dict[str, Any], file: str, lines: _Lines) -> _Lock:
    """uv.lock: ``[[package]]`` with ``source = {registry|git|url|path|directory|editable|virtual}``."""
    entries = []
    for where, pkg, name, line in _packages(data, "package", file, lines):
        source = _table(pkg.get("source"), file, f"{where}.source")
        artefacts = [_table(pkg.get("sdist"), file, f"{where}.sdist"),
                     *_tables(pkg.get("wheels"), file, f"{where}.wheels")]
        hashed = _all_hashed([a for a in artefacts if a], "hash")
        if "registry" in source:
            entries.append(_Entry(name, file, line, pinned="version" in pkg, hashed=hashed,
                                  index=_str(source["registry"], file, f"{where}.source.registry")))
        elif "git" in source:      # https://host/repo?rev=main#<commit>
            url = _str(source["git"], file, f"{where}.source.git")
            entries.append(_Entry(name, file, line, url=url, url_pinned=_is_commit(urlsplit(url).fragment)))
        elif "url" in source:
            url = _str(source["url"], file, f"{where}.source.url")
            entries.append(_Entry(name, file, line, hashed=hashed, url=url, url_pinned=hashed))
        else:
            entries.append(_Entry(name, file, line, local=True))
    return entries, []


def _poetry(data: dict[str, Any], file: str, lines: _Lines) -> _Lock:
    """poetry.lock: ``[[package]]`` with ``files`` (lock 2.x) or ``[metadata.files]`` (1.x) and
    ``[package.source]`` of type legacy (an index), git, url, file or directory; none is PyPI."""
    old_files = _table(_table(data.get("metadata"), file, "metadata").get("files"), file, "metadata.files")
    old_files = {canonicalize_name(k): v for k, v in old_files.items()}
    entries = []
    for where, pkg, name, line in _packages(data, "package", file, lines):
        files = _tables(pkg.get("files", old_files.get(name)), file, f"{where}.files")
        hashed = _all_hashed(files, "hash")
        source = _table(pkg.get("source"), file, f"{where}.source")
        kind = source.get("type")
        if not source or kind == "legacy":
            index = _str(source.get("url"), file, f"{where}.source.url") if source else PYPI
            entries.append(_Entry(name, file, line, pinned="version" in pkg, hashed=hashed, index=index))
        elif kind == "git":
            url = _str(source.get("url"), file, f"{where}.source.url")
            entries.append(_Entry(name, file, line, url=url,
                                  url_pinned=_is_commit(source.get("resolved_reference"))))
        elif kind == "url":
            entries.append(_location(_str(source.get("url"), file, f"{where}.source.url"), name, file, line, hashed))
        else:
            entries.append(_Entry(name, file, line, local=True))
    return entries, []


def _pylock(data: dict[str, Any], file: str, lines: _Lines) -> _Lock:
    """pylock.toml (PEP 751): ``[[packages]]`` with ``vcs``, ``directory``, ``archive`` or
    ``index`` + ``sdist``/``wheels``; hashes are ``{algorithm = digest}`` tables."""
    entries = []
    for where, pkg, name, line in _packages(data, "packages", file, lines):
        vcs = _table(pkg.get("vcs"), file, f"{where}.vcs")
        archive = _table(pkg.get("archive"), file, f"{where}.archive")
        artefacts = [a for a in (_table(pkg.get("sdist"), file, f"{where}.sdist"),
                                 *_tables(pkg.get("wheels"), file, f"{where}.wheels")) if a]
        urls = [a["url"] for a in artefacts if isinstance(a.get("url"), str)]
        if "url" in vcs:
            entries.append(_Entry(name, file, line, url=_str(vcs["url"], file, f"{where}.vcs.url"),
                                  url_pinned=_is_commit(vcs.get("commit-id"))))
        elif "url" in archive:
            entries.append(_location(_str(archive["url"], file, f"{where}.archive.url"), name, file, line,
                                     bool(archive.get("hashes"))))
        elif pkg.get("index") or urls:
            index = pkg.get("index") or "{0.scheme}://{0.netloc}".format(_split(urls[0], file, line))
            entries.append(_Entry(name, file, line, pinned="version" in pkg,
                                  hashed=_all_hashed(artefacts, "hashes"), index=_str(index, file, f"{where}.index")))
        else:
            entries.append(_Entry(name, file, line, local=True))
    return entries, []


def _pipfile(data: dict[str, Any], file: str, lines: _Lines) -> _Lock:
    """Pipfile.lock: ``_meta.sources`` [{name, url, verify_ssl}] and sections of
    ``name: {version, hashes, index}`` or ``{git, ref}``, ``{file}``, ``{path}``."""
    declared = _tables(_table(data.get("_meta"), file, "_meta").get("sources"), file, "_meta.sources")
    declared = declared or [{"name": "pypi", "url": PYPI, "verify_ssl": True}]
    urls = {}
    sources = []
    for i, src in enumerate(declared):
        url = _str(src.get("url"), file, f"_meta.sources[{i}].url")
        urls[_str(src.get("name"), file, f"_meta.sources[{i}].name")] = url
        sources.append(_Source(url, file, lines.find(re.escape(json.dumps(url))), "source",
                               used=False, verify=src.get("verify_ssl") is not False))
    lines.cursor = 0
    entries = []
    for section, packages in data.items():
        if section == "_meta":
            continue
        for raw, spec in _table(packages, file, section).items():
            where = f"{section}.{raw}"
            spec = _table(spec, file, where)
            name, line = canonicalize_name(raw), lines.find(rf"^\s*{re.escape(json.dumps(raw))}\s*:\s*\{{")
            hashed = bool(spec.get("hashes"))
            if vcs := next((k for k in ("git", "hg", "svn", "bzr") if k in spec), None):
                entries.append(_Entry(name, file, line, url=_str(spec[vcs], file, f"{where}.{vcs}"),
                                      url_pinned=_is_commit(spec.get("ref"))))
            elif "file" in spec:
                entries.append(_location(_str(spec["file"], file, f"{where}.file"), name, file, line, hashed))
            elif "path" in spec:
                entries.append(_Entry(name, file, line, local=True))
            else:
                index = _str(spec.get("index", declared[0]["name"]), file, f"{where}.index")
                if index not in urls:
                    raise UsageError(f"index {index!r} is not in _meta.sources", file=file, key=f"{where}.index")
                pinned = str(spec.get("version", "")).startswith("==")
                entries.append(_Entry(name, file, line, pinned=pinned, hashed=hashed, index=urls[index]))
    return entries, sources


_LOCK_PARSERS: dict[str, Callable[[dict[str, Any], str, _Lines], _Lock]] = {
    "uv.lock": _uv, "poetry.lock": _poetry, "pylock": _pylock, "Pipfile.lock": _pipfile,
}


def _parse_lock(kind: str, text: str, shown: str) -> _Parsed:
    load = load_json if kind == "Pipfile.lock" else load_toml
    data = load(text, shown, max_bytes=LOCK_MAX)
    entries, declared = _LOCK_PARSERS[kind](_table(data, shown, "(top level)"), shown, _Lines(text))
    used: dict[str, _Source] = {}
    for e in entries:
        if e.index:
            e.index = e.index.rstrip("/")
            used.setdefault(e.index, _Source(e.index, e.file, e.line, "index"))
    for source in declared:
        source.used = source.url.rstrip("/") in used
    known = {s.url.rstrip("/") for s in declared}
    return _Parsed(entries, [*declared, *(s for u, s in used.items() if u not in known)], hash_mode=True, lock=True)


_PYLOCK_NAME = re.compile(r"^pylock\.([^.]+\.)?toml$")
_LOCK_NAMES = {"uv.lock": "uv.lock", "poetry.lock": "poetry.lock", "pipfile.lock": "Pipfile.lock"}


def _kind(path: Path, text: str) -> str:
    """The file's kind: by its name, else by content; anything else is a requirements file."""
    if path.name.lower() in _LOCK_NAMES:
        return _LOCK_NAMES[path.name.lower()]
    if _PYLOCK_NAME.match(path.name):
        return "pylock"
    if text.lstrip().startswith("{"):
        return "Pipfile.lock"
    for pattern, kind in ((r"^\[metadata\]", "poetry.lock"), (r"^(lock-version\s*=|\[\[packages\]\])", "pylock"),
                          (r"^\[\[package\]\]", "uv.lock")):
        if re.search(pattern, text, re.MULTILINE):
            return kind
    return "requirements"


# --------------------------------------------------------------------------- rules

def _source_findings(sources: list[_Source], used: list[_Source], mixed: bool, parsed: _Parsed) -> Iterator[ReqFinding]:
    """insecure-index for each location, then mixed-index when PyPI is searched with anything else."""
    seen = set()
    for s in sources:
        if s.url in seen:
            continue
        seen.add(s.url)
        where = f"{s.option} {_redact(s.url)}"
        if _is_insecure(s.url):
            yield ReqFinding("high", "insecure-index", None, s.line,
                             f"{where} is plain http: anyone on the network path can change what installs; "
                             "use https", s.file)
        if not s.verify:
            yield ReqFinding("high", "insecure-index", None, s.line,
                             f"{where} has verify_ssl = false: TLS certificates are not checked", s.file)
    if not mixed:
        return
    anchor = next(s for s in used if _is_public(s.url) != _is_public(used[0].url))
    if parsed.lock:
        def served(url: str) -> str:
            names = sorted({e.name or "?" for e in parsed.entries if e.index == url.rstrip("/")})
            return f"{_label(url)} ({len(names)}: {', '.join(names[:5])}{', ...' if len(names) > 5 else ''})"
        message = (f"packages were locked from several indexes, {'; '.join(served(s.url) for s in used)}: check "
                   "that each package taken from PyPI is meant to come from there (torchtriton from PyPI "
                   "beside torch from PyTorch's index was the Dec 2022 attack)")
    else:
        private = ", ".join(sorted({_redact(s.url) for s in used if not _is_public(s.url)}))
        message = (f"pip searches PyPI together with {private} and installs the highest version found "
                   "anywhere, so a PyPI upload named like a package served there wins (torchtriton via "
                   "PyTorch nightly's --extra-index-url, Dec 2022); use one index that proxies PyPI, or "
                   "pin and hash every line")
    yield ReqFinding("high", "mixed-index", None, anchor.line, message, anchor.file)


def _entry_findings(e: _Entry, *, mixed: bool, public_used: bool, parsed: _Parsed,
                    internal: frozenset[str], squats: SquatList) -> Iterator[ReqFinding]:
    def finding(severity: str, rule: str, message: str) -> ReqFinding:
        return ReqFinding(severity, rule, e.name, e.line, message, e.file)

    name = e.name or ""
    is_internal = name in internal
    if squat := squats.squats.get(name):
        yield finding("high", "known-squat", f"{name} is a known {squat.kind} package: {squat.why}")
    elif name and not is_internal and (target := squats.confusable(name)):
        yield finding("medium", "confusable-name",
                      f"{name} is one typo or look-alike letter away from {target}; check the spelling")
    if e.local:
        return
    if e.url is not None:
        if not e.url_pinned:
            plain = _is_insecure(e.url)
            yield finding("medium" if plain else "low", "direct-url",
                          f"{_redact(e.url)} is pinned by neither a hash nor a full commit id, so what it "
                          f"serves can change{' (and it is plain http)' if plain else ''}")
        return
    # A package that may come from the private index is what a PyPI upload would shadow.
    from_private = e.index is not None and not _is_public(e.index)
    severity = "high" if mixed and (is_internal or from_private) else "medium"
    if not e.pinned:
        yield finding(severity, "unpinned", f"{name} is locked without a version" if parsed.lock else
                      f"{name} has no exact == pin: a newer upload that matches is installed")
    if not e.hashed and (parsed.hash_mode or mixed):
        if parsed.lock:
            why = "is locked without artefact hashes: a swapped file is not detected"
        elif parsed.hash_mode:
            why = "has no --hash: pip's hash-checking mode, on for this file, needs one on every line"
        else:
            why = "has no --hash while several indexes are searched: a same-named upload installs unnoticed"
        yield finding(severity, "missing-hash", f"{name} {why}")
    if is_internal and (public_used if e.index is None else _is_public(e.index)):
        how = "was locked from PyPI" if parsed.lock else "is looked up on PyPI and nothing ties it to the private index"
        yield finding("high", "unknown-internal",
                      f"{name} is a site-internal package but {how}: anyone can publish that name there")


def _analyse(parsed: _Parsed, internal: frozenset[str], squats: SquatList) -> list[ReqFinding]:
    used = [s for s in parsed.sources if s.used]
    public_used = any(_is_public(s.url) for s in used)
    mixed = public_used and not all(_is_public(s.url) for s in used)
    findings = list(_source_findings(parsed.sources, used, mixed, parsed))
    for entry in parsed.entries:
        findings.extend(_entry_findings(entry, mixed=mixed, public_used=public_used, parsed=parsed,
                                        internal=internal, squats=squats))
    return findings


def check_requirements(path: str | os.PathLike[str], *, internal_names: Iterable[str] = ()) -> RequirementsReport:
    """Check a requirements file (with its includes) or a uv/poetry/pylock/Pipfile lock file.

    `internal_names` are the site's private package names: each one that would resolve from
    PyPI is reported. Bad input (unreadable file, bad line, broken lock) raises UsageError.
    """
    shown = os.fsdecode(path)
    text = _read_text(Path(shown), file=shown)
    kind = _kind(Path(shown), text)
    parsed = _PipWalker().walk(text, shown) if kind == "requirements" else _parse_lock(kind, text, shown)
    names = [internal_names] if isinstance(internal_names, str) else internal_names
    internal = frozenset(canonicalize_name(n) for n in names if n.strip())
    return RequirementsReport(shown, kind, _analyse(parsed, internal, _bundled()), len(parsed.entries))
