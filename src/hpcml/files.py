"""Small file helpers shared by the components: atomic writes, bounded reads of the small
JSON records hpcml writes on shared filesystems, and config files (YAML) read with errors
that name the file, the key and the line."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcml.errors import UsageError

if TYPE_CHECKING:
    import yaml


def write_atomic(path: str | os.PathLike, text: str, exclusive: bool = False) -> None:
    """Write through a temporary file and rename it, so a reader never sees half a file
    (several processes may write their own files in one shared directory). ``exclusive``:
    only if ``path`` does not exist yet (FileExistsError otherwise: of two processes that
    race for it, one wins). A failed write (a full disk) leaves no temporary file behind."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        if exclusive:
            os.link(tmp, path)
        else:
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def read_bounded(path: str | os.PathLike, max_bytes: int, *, follow_symlinks: bool = True) -> bytes:
    """The bytes of a file hpcml wrote itself, read as if anyone could have replaced it: a
    FIFO is not waited on (O_NONBLOCK), a device or directory is not read, a symlink is not
    followed unless asked (to /dev/zero it would fill the memory), and at most ``max_bytes``
    are read (a sparse file of 64 GiB claims its size for free). OSError when it cannot be
    opened; ValueError naming what it is instead when it is not such a file."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        chunks, size = [], 0
        while size <= max_bytes:
            chunk = os.read(fd, max_bytes + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > max_bytes:
            raise ValueError(f"larger than {max_bytes} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def load_json_bounded(path: str | os.PathLike, max_bytes: int, *, follow_symlinks: bool = True) -> Any:
    """``read_bounded`` + ``json.loads``: ValueError for anything that is not such a JSON
    file, nesting too deep for the parser ('[' * 100000) included; OSError as above."""
    data = read_bounded(path, max_bytes, follow_symlinks=follow_symlinks)
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def yaml_error(exc: Exception, source: str):
    """A PyYAML error as the one-line UsageError every config file gives (file, line)."""
    from hpcml.errors import UsageError
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return UsageError(f"not valid YAML: {problem}", file=source, line=mark.line + 1 if mark else None)


def load_yaml(text: str, source: str):
    """``yaml.safe_load`` whose syntax errors are one-line UsageErrors naming ``source``."""
    import yaml
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise yaml_error(exc, source) from None


def read_config(path: str | os.PathLike) -> str:
    """A configuration file's text; missing or unreadable is a one-line UsageError."""
    from hpcml.errors import UsageError
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError("file not found", file=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read: {exc}", file=str(path)) from None


def load_yaml_with_nodes(text: str, source: str):
    """``(data, node)``: the document and its node tree (for line numbers in errors)."""
    import yaml
    try:
        return yaml.safe_load(text), yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise yaml_error(exc, source) from None


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
