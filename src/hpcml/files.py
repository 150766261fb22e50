"""Small file helpers shared by the components."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Write through a temporary file and rename it, so a reader never sees half a file
    (several processes may write their own files in one shared directory)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


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
