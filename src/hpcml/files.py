"""Small file helpers shared by the components: atomic writes, bounded reads of the small
JSON records hpcml writes on shared filesystems, and the one loader of user files (YAML,
TOML, JSON): bounded in size and YAML alias expansion, since blueprints and sweeps come
from colleagues and catalogues, with errors that name the file, the key and the line."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcml import scratch
from hpcml.errors import UsageError

if TYPE_CHECKING:
    import yaml


def write_atomic(path: str | os.PathLike, data: str | bytes, exclusive: bool = False, *,
                 mode: int | None = None, durable: bool = False) -> None:
    """Write a file whole and then give it its name, so a reader never sees half a file
    (several processes, or threads, may write the same file or their own in one shared
    directory). ``exclusive``: only if ``path`` does not exist yet (FileExistsError
    otherwise: of two processes that race for it, one wins). ``mode``: exactly these
    permissions (fchmod; the umask only narrows a plain create). ``durable``: fsync the file
    and its directory before returning (a commit record that must survive a node crash).

    The file is written nameless (``scratch.anonymous``, O_TMPFILE) and linked into place,
    so a writer killed with SIGKILL leaves nothing; a replace goes through a temporary name
    for the microseconds between that link and the rename. Where the filesystem has no
    O_TMPFILE (NFS) the whole write goes through the temporary name, which
    ``remove_dead_temps`` sweeps once its writer is dead. A failed write (a full disk)
    leaves no temporary file."""
    path = Path(path)
    tmp = _temp_name(path)
    _sweep_once(path.parent)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    create = 0o666 if mode is None else mode
    fd = scratch.anonymous(path.parent, create, to_publish=True)
    if fd is not None:
        try:
            fill(fd, payload, mode, durable)
            if exclusive:
                scratch.place_new(fd, path, tmp, mode=create, durable=durable, exact=mode is not None)
            else:
                scratch.replace_with(fd, path, tmp, mode=create, durable=durable, exact=mode is not None)
        finally:
            os.close(fd)
        if durable:
            fsync_dir(path.parent)
        return
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, create)
        try:
            fill(fd, payload, mode, durable)
        finally:
            os.close(fd)
        if exclusive:
            os.link(tmp, path)
        else:
            os.replace(tmp, path)
        if durable:
            fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def fill(fd: int, payload: bytes, mode: int | None = None, durable: bool = False) -> None:
    """All of ``payload`` into ``fd`` (``os.write`` may write less); ``mode`` exactly (fchmod:
    the umask only narrows a create); fsynced when ``durable``."""
    if mode is not None:
        os.fchmod(fd, mode)
    view = memoryview(payload)
    while view:
        view = view[os.write(fd, view):]
    if durable:
        os.fsync(fd)


def _temp_name(path: Path) -> Path:
    """``write_atomic``'s temporary name for ``path``: ``.NAME.@HOST.PID.TID.RANDOM.tmp``,
    which says who wrote it (``remove_dead_temps``)."""
    return path.with_name(f".{path.name}.@{scratch.host_tag()}.{os.getpid()}.{threading.get_ident()}."
                          f"{os.urandom(4).hex()}.tmp")


#: directories this process has swept of dead writers' temporary files (once each)
_SWEPT: set[str] = set()
_SWEPT_LOCK = threading.Lock()


def _sweep_once(directory: Path) -> None:
    """The first time this process writes into ``directory`` (once: a directory of 10,000
    shards is listed once, not once a file): remove the temporary files that a writer
    killed between its link and its rename left there, so what a kill left is gone once
    the same tool writes there again. Only names exactly of ``_temp_name``'s form: a
    user's ``.notes.1.2.ab.tmp`` beside them is not ours."""
    key = os.fspath(directory)
    with _SWEPT_LOCK:
        if key in _SWEPT:
            return
        _SWEPT.add(key)
    remove_dead_temps(directory, strict=True)


#: another host's temporary file is removed only when older than this: its pid means nothing
#: here, and no write_atomic lasts a day
OTHER_HOST_S = 86400.0


def remove_dead_temps(directory: str | os.PathLike, older_than: float = 60.0, *, strict: bool = False) -> int:
    """Remove ``write_atomic``'s temporary files in ``directory`` that a writer killed
    between its write and its rename left. One made on this host goes when its writer (the
    pid in the name) is not alive, or when it is older than ``older_than`` seconds (a write
    takes milliseconds); one made on another host sharing the directory only when older
    than that (its pid means nothing here), as does one named without a host (an older
    hpcml's, written from any host). ``strict``: only names exactly of ``_temp_name``'s
    form, this host's by their writer's pid alone and another host's after ``OTHER_HOST_S``
    (what ``write_atomic`` sweeps: the directory may be the user's, and the age of a live
    writer's file proves nothing). Another user's file, a link or a directory is never removed. Returns
    how many went."""
    gone, now, here = 0, time.time(), scratch.host_tag()
    try:
        entries = [e for e in os.scandir(os.fspath(directory)) if e.name.startswith(".") and e.name.endswith(".tmp")]
    except OSError:
        return 0
    for entry in entries:
        parts = entry.name.rsplit(".", 5)            # .NAME . @HOST . PID . TID . HEX . tmp
        if len(parts) == 6 and parts[1].startswith("@") and parts[2].isdigit() and parts[3].isdigit():
            host, pid = parts[1][1:], int(parts[2])
            if strict and (len(parts[4]) != 8 or not all(c in "0123456789abcdef" for c in parts[4])):
                continue
        elif strict:
            continue
        else:
            parts = entry.name.rsplit(".", 4)        # .NAME . PID . TID . HEX . tmp: an older hpcml's,
            if len(parts) != 5 or not parts[1].isdigit() or not parts[2].isdigit():    # of any host
                continue
            host, pid = "", int(parts[1])
        if not scratch.removable(entry):
            continue
        try:
            age = now - entry.stat(follow_symlinks=False).st_mtime
        except OSError:
            continue
        if host == here:
            dead = scratch.dead_here(pid, now - age) or (not strict and age > older_than)
        else:
            dead = age > (OTHER_HOST_S if strict else older_than)
        if not dead:
            continue
        with contextlib.suppress(OSError):           # gone meanwhile, or not ours to remove
            os.unlink(entry.path)
            gone += 1
    return gone


def fsync_dir(path: str | os.PathLike) -> None:
    """fsync a directory: a rename or create in it survives a crash from then on."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def private_dir(folder: str | os.PathLike, *, create: bool = True) -> str | None:
    """Why ``folder`` is not this user's own private directory, or None when it is (made
    0700 if missing). Its parent may be written by no one else, unless sticky as /tmp is
    (then no one else can rename or replace what is ours in it): a directory only we can
    enter holds what only we may reach (a spool, a socket the user's own processes send to)."""
    folder = Path(folder)
    try:
        parent = os.stat(folder.parent)              # a TMPDIR that is a link: the directory it names
        if parent.st_mode & 0o022 and not parent.st_mode & stat.S_ISVTX or parent.st_uid not in (0, os.geteuid()):
            return f"its parent {folder.parent} may be written by others"
        if create:
            folder.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(folder)
    except OSError as exc:
        return exc.strerror or str(exc)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        return "not this user's own private directory"
    return None


def inside(root: str | os.PathLike, path: str | os.PathLike) -> Path:
    """``path`` resolved (symlinks followed, ``..`` folded), if it stays inside ``root``
    (resolved too); ValueError naming where it leads otherwise. For every path a file from
    someone else (a blueprint's file names) or a flag names under a directory hpcml writes."""
    base = Path(root).resolve()
    target = (base / path).resolve()
    if target != base and not target.is_relative_to(base):
        raise ValueError(f"leads outside {base} (to {target})")
    return target


def read_bounded(path: str | os.PathLike, max_bytes: int, *, follow_symlinks: bool = True) -> bytes:
    """The bytes of a file hpcml wrote itself, read as if anyone could have replaced it: a
    FIFO is not waited on (O_NONBLOCK), a device or directory is not read, a symlink is not
    followed unless asked (to /dev/zero it would fill the memory), and at most ``max_bytes``
    are read (a sparse file of 64 GiB claims its size for free). OSError when it cannot be
    opened; ValueError naming what it is instead when it is not such a file."""
    return read_bounded_stat(path, max_bytes, follow_symlinks=follow_symlinks)[0]


def read_bounded_stat(path: str | os.PathLike, max_bytes: int, *,
                      follow_symlinks: bool = True) -> tuple[bytes, os.stat_result]:
    """``read_bounded``, and the status of the open file it read: who owns the bytes read
    (a path checked, then opened, may be another file by then)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = ("a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode)
                    else "a socket" if stat.S_ISSOCK(st.st_mode) else "a device")
            raise ValueError(f"{kind}, not a regular file")
        chunks, size = [], 0
        while size <= max_bytes:    # asked for what the file holds (a read allocates what it asks), past the bound never
            chunk = os.read(fd, min(max_bytes + 1 - size, max(st.st_size + 1 - size, 1 << 16)))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > max_bytes:
            raise ValueError(f"larger than {max_bytes} bytes")
        return b"".join(chunks), st
    finally:
        os.close(fd)


def read_ends(path: str | os.PathLike, head_bytes: int, tail_bytes: int, *,
              follow_symlinks: bool = False) -> tuple[bytes, bytes, bool]:
    """The first ``head_bytes`` and the last ``tail_bytes`` of a file someone else's program
    appends to (a training log: a header line, then its latest rows), opened as
    ``read_bounded`` opens one, and whether that is the whole file (then all of it is the
    tail, the head empty). Memory is bounded whatever the file's size."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_size <= head_bytes + tail_bytes:
            return b"", _pread_all(fd, head_bytes + tail_bytes, 0), True
        return _pread_all(fd, head_bytes, 0), _pread_all(fd, tail_bytes, st.st_size - tail_bytes), False
    finally:
        os.close(fd)


def tail_lines(path: str | os.PathLike, max_bytes: int, *, follow_symlinks: bool = False) -> list[str]:
    """The lines of a log's last ``max_bytes`` (``read_ends``: memory bounded, no FIFO
    waited on), the first left out where the read began inside it (it is cut, unless it is all there is); [] when it
    cannot be read. Decoded as UTF-8, a bad byte replaced: the caller makes them printable."""
    try:
        _head, end, whole = read_ends(path, 0, max_bytes, follow_symlinks=follow_symlinks)
    except (OSError, ValueError):
        return []
    found = end.decode("utf-8", "replace").splitlines()
    return found if whole or len(found) < 2 else found[1:]


def _pread_all(fd: int, n: int, offset: int) -> bytes:
    """Up to ``n`` bytes from ``offset``: pread may return fewer than asked before the end."""
    chunks, got = [], 0
    while got < n:
        chunk = os.pread(fd, n - got, offset + got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def load_json_bounded(path: str | os.PathLike, max_bytes: int, *, follow_symlinks: bool = True,
                      loads: Any = None, check: Callable[[bytes], None] | None = None) -> Any:
    """``read_bounded`` + ``json.loads``: ValueError for anything that is not such a JSON
    file, nesting too deep for the parser ('[' * 100000) included; OSError as above.
    ``loads``: a faster parser (orjson) for files read often. ``check``: called with the
    bytes before they are parsed (a checksum): what is parsed is what it judged."""
    return load_json_bounded_stat(path, max_bytes, follow_symlinks=follow_symlinks, loads=loads, check=check)[0]


def load_json_bounded_stat(path: str | os.PathLike, max_bytes: int, *, follow_symlinks: bool = True,
                           loads: Any = None, check: Callable[[bytes], None] | None = None) -> tuple[Any, os.stat_result]:
    """``load_json_bounded``, and the status of the open file it read (``read_bounded_stat``)."""
    data, st = read_bounded_stat(path, max_bytes, follow_symlinks=follow_symlinks)
    if check is not None:
        check(data)
    try:
        return (loads or json.loads)(data), st
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


#: the largest JSON record hpcml reads back (a checkpoint's index of a large model, a
#: manifest of many shards); anything bigger is not one of its files
JSON_MAX = 256 << 20


def read_json(path: str | os.PathLike, tag: str | None, *, missing: str = "missing", also: tuple[str, ...] = (),
              untagged: bool = False, max_bytes: int = JSON_MAX, loads: Any = None) -> Any:
    """A JSON file hpcml wrote (run.json, farm.json, a manifest, a checkpoint's records),
    read as if anyone could have replaced it, with one wording for every fault: a
    UsageError (exit 2) naming the file and saying ``missing`` (the caller's words for a
    file that is not there), ``unreadable (why)``, ``not JSON (why)``, or what the schema
    tag says (another document, a newer hpcml; ``hpcml.schemas.check``). ``tag`` None:
    no tag to check. ``loads``: a faster parser (orjson) for the large ones."""
    try:
        data = read_bounded(path, max_bytes)
    except FileNotFoundError:
        raise UsageError(missing, file=str(path)) from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"unreadable ({getattr(exc, 'strerror', None) or exc})", file=str(path)) from None
    try:
        doc = (loads or json.loads)(data)
    except RecursionError:
        raise UsageError("not JSON (nested too deeply)", file=str(path)) from None
    except ValueError as exc:                   # json's and orjson's decode errors are ValueErrors
        raise UsageError(f"not JSON ({exc})", file=str(path)) from None
    if tag is not None:
        from hpcml.schemas import check
        check(doc, tag, str(path), also=also, untagged=untagged)
    return doc


# A config file (blueprint, sweep, protocol, rules, EDF, policy, site hooks) is written by
# hand: the largest we ship is 7 KiB. 256 KiB is 40 times that, and PyYAML parses even the
# densest 256 KiB (a list of one-digit numbers) in about 1.5 s and 70 MB; 1 MiB of it took
# 5.7 s and 256 MB. Anything bigger is refused before parsing (a 45 MB "blueprint" is a
# mistake or an attack, never a config).
CONFIG_MAX = 256 << 10
# Nodes that aliases may add to a YAML document. A config reuses a few small blocks (a
# shared env: mapping) a few times: hundreds of nodes. The classic bomb (8 levels x 10
# aliases) adds 10^8 and every walk of the result (validation, rendering) pays for them.
YAML_ALIAS_NODES_MAX = 10_000
# Characters of scalar text that aliases may add to a YAML document. The node count alone
# lets 9,000 aliases of one 150 KB string through (186 KB on disk, 1.35 GB once expanded:
# every walk of the result, validation and rendering included, pays for each copy; render
# ran for more than 300 s). 2 MiB is 8 times the largest file accepted (CONFIG_MAX) and
# hundreds of times what a config reuses (a shared env: block, a config file's text).
YAML_ALIAS_TEXT_MAX = 2 << 20


def _too_big(max_bytes: int) -> str:
    size = f"{max_bytes / (1 << 20):g} MiB" if max_bytes >= 1 << 20 else f"{max_bytes >> 10} KiB"
    return f"larger than {size}, the limit for a file like this (refused unread)"


def _refuse_big(text: str, source: str, max_bytes: int) -> None:
    """The size limit for text that did not come through ``read_config`` (a ``loads(text)``)."""
    if len(text) > max_bytes:
        raise UsageError(_too_big(max_bytes), file=source)


def yaml_error(exc: Exception, source: str):
    """A PyYAML error as the one-line UsageError every config file gives (file, line)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return UsageError(f"not valid YAML: {problem}", file=source, line=mark.line + 1 if mark else None)


def _bounded_yaml(text: str, source: str, max_bytes: int, max_alias_nodes: int,
                  max_alias_text: int = YAML_ALIAS_TEXT_MAX):
    """``(data, node)`` of one YAML document, composed once with PyYAML's safe loader while
    measuring what each alias adds: the nodes and the characters of scalar text of the node
    it names, its own aliases expanded (computed once per node as it is composed, so the
    walk is linear in the document). A bomb, deep (aliases of aliases) or wide (thousands of
    aliases of one long string), is refused at the alias that crosses a bound, before any
    Python object is constructed. A recursive alias (``&a [*a]``) is refused too: no config
    needs one and walking it never ends."""
    import yaml
    _refuse_big(text, source, max_bytes)

    def size(n: int) -> str:
        return f"{n / (1 << 20):g} MiB" if n >= 1 << 20 else f"{n >> 10} KiB" if n >= 1 << 10 else f"{n} characters"

    class Loader(yaml.SafeLoader):
        sizes: dict[int, tuple[int, int]]       # id(node) -> (nodes, characters), aliases expanded
        added = added_text = 0

        def compose_node(self, parent, index):
            if not self.check_event(yaml.AliasEvent):
                node = super().compose_node(parent, index)
                if isinstance(node, yaml.ScalarNode):
                    self.sizes[id(node)] = (1, len(node.value))
                    return node
                kids = [n for kv in node.value for n in kv] if isinstance(node, yaml.MappingNode) else node.value
                self.sizes[id(node)] = (1 + sum(self.sizes[id(k)][0] for k in kids),
                                        sum(self.sizes[id(k)][1] for k in kids))
                return node
            event = self.peek_event()
            node = super().compose_node(parent, index)
            named = self.sizes.get(id(node))
            line = event.start_mark.line + 1
            if named is None:
                raise UsageError(f"alias *{event.anchor} is inside the node it names (a recursive alias)",
                                 file=source, line=line)
            self.added += named[0]
            self.added_text += named[1]
            if self.added > max_alias_nodes:
                raise UsageError(f"aliases expand to more than {max_alias_nodes} nodes (a YAML bomb?); "
                                 "write the repeated blocks out or use fewer aliases", file=source, line=line)
            if self.added_text > max_alias_text:
                raise UsageError(f"aliases expand to more than {size(max_alias_text)} of text (a YAML bomb?: "
                                 f"*{event.anchor} alone is {size(named[1])}); write the repeated text out "
                                 "or use fewer aliases", file=source, line=line)
            return node

    loader = Loader(text)
    loader.sizes = {}
    try:
        node = loader.get_single_node()
        return (loader.construct_document(node) if node is not None else None), node
    except yaml.YAMLError as exc:
        raise yaml_error(exc, source) from None
    except RecursionError:
        raise UsageError("not valid YAML: nested too deeply", file=source) from None
    finally:
        loader.dispose()


def load_yaml(text: str, source: str, *, max_bytes: int = CONFIG_MAX,
              max_alias_nodes: int = YAML_ALIAS_NODES_MAX, max_alias_text: int = YAML_ALIAS_TEXT_MAX):
    """The one YAML loader for user files: ``yaml.safe_load`` bounded in size and alias
    expansion (nodes and text); any problem is a one-line UsageError naming ``source`` (and
    the line)."""
    return _bounded_yaml(text, source, max_bytes, max_alias_nodes, max_alias_text)[0]


def load_yaml_with_nodes(text: str, source: str, *, max_bytes: int = CONFIG_MAX,
                         max_alias_nodes: int = YAML_ALIAS_NODES_MAX, max_alias_text: int = YAML_ALIAS_TEXT_MAX):
    """``(data, node)``: ``load_yaml``'s document and its node tree (for line numbers in errors)."""
    return _bounded_yaml(text, source, max_bytes, max_alias_nodes, max_alias_text)


def load_toml(text: str, source: str, *, max_bytes: int = CONFIG_MAX) -> dict[str, Any]:
    """The one TOML loader for user files: size-bounded ``tomllib.loads`` whose errors are one
    line naming ``source`` and the line (TOML has no aliases; deep nesting is refused)."""
    import re
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10
        import tomli as tomllib
    _refuse_big(text, source, max_bytes)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        m = re.search(r"\s*\(at line (\d+), column \d+\)", msg)
        line = int(m.group(1)) if m else getattr(exc, "lineno", None)
        raise UsageError(f"not valid TOML: {msg[:m.start()] if m else msg}", file=source, line=line) from None
    except RecursionError:
        raise UsageError("not valid TOML: nested too deeply", file=source) from None


def load_json(text: str, source: str, *, max_bytes: int = CONFIG_MAX) -> Any:
    """The one JSON loader for user files: size-bounded ``json.loads``, one-line errors."""
    _refuse_big(text, source, max_bytes)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"not valid JSON: {exc.msg}", file=source, line=exc.lineno) from None
    except RecursionError:
        raise UsageError("not valid JSON: nested too deeply", file=source) from None


def read_config(path: str | os.PathLike, *, max_bytes: int = CONFIG_MAX, what: str = "") -> str:
    """A user file's text, read with ``read_bounded``: a FIFO, a device or a file over
    ``max_bytes`` is refused unread. Any problem is a one-line UsageError (``what``: e.g.
    "the EDF", to say which file in the message)."""
    what = f" {what}" if what else ""
    try:
        data = read_bounded(path, max_bytes)
    except FileNotFoundError:
        raise UsageError(f"cannot read{what}: file not found" if what else "file not found", file=str(path)) from None
    except ValueError as exc:
        problem = _too_big(max_bytes) if "larger" in str(exc) else str(exc)
        raise UsageError(f"cannot read{what}: {problem}", file=str(path)) from None
    except OSError as exc:
        raise UsageError(f"cannot read{what}: {exc.strerror or exc}", file=str(path)) from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UsageError(f"cannot read{what}: not UTF-8 text (bad byte at offset {exc.start})",
                         file=str(path)) from None


def line_map(node: yaml.Node, path: tuple = (), out: dict | None = None) -> dict[tuple, int]:
    """Key path -> 1-based line, from PyYAML's composed node tree."""
    import yaml
    out = {} if out is None else out
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = (*path, key_node.value)
            out[key] = key_node.start_mark.line + 1
            line_map(value_node, key, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            line_map(item, (*path, i), out)
    return out


def key_text(path: tuple) -> str:
    """``('evals', 2, 'timeout')`` as ``evals[2].timeout``."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def validation_problem(err: Any) -> str:
    """One pydantic ``ErrorDetails`` as the problem part of a one-line error: "unknown key",
    "missing", or the validator's message with what was found."""
    if err["type"] == "extra_forbidden":
        return "unknown key"
    if err["type"] == "missing":
        return "missing"
    msg = err["msg"].removeprefix("Value error, ")
    found = err.get("input")
    if "found" in msg or isinstance(found, (dict, list)):
        return msg
    return f"{msg} (found {found!r})"


def unknown_key(key: str, known: Sequence[str]) -> str:
    """The problem text for a key a config file does not have: the nearest known key, or
    the list of them (a typo must not pass silently, nor leave the user guessing)."""
    import difflib
    near = difflib.get_close_matches(str(key), list(known), n=1, cutoff=0.6)
    return "unknown key" + (f"; did you mean '{near[0]}'?" if near else f" (known: {', '.join(known)})")


class ConfigLoader:
    """Errors for a parsed config file that name its file, dotted key and line."""

    def __init__(self, source: str, lines: dict[tuple, int]):
        self.source, self.lines = source, lines

    def error(self, path: tuple, problem: str) -> UsageError:
        line = None
        for n in range(len(path), -1, -1):
            if path[:n] in self.lines:
                line = self.lines[path[:n]]
                break
        return UsageError(problem, file=self.source, key=key_text(path) or None, line=line)

    def convert(self, path: tuple, value: Any, parse) -> Any:
        try:
            return parse(value)
        except ValueError as exc:
            raise self.error(path, str(exc)) from None
