"""One helper per job: a few jobs that every component needs are done in one module each,
and nowhere else. Two copies drift apart: one reads a FIFO someone left in a shared
directory and hangs, one misses the zombie a kill left behind, one accepts ``"5 min"`` and
the other does not. This test walks every module of src/hpcml with ``ast`` and fails on
such code outside its owner.

The rules, and what each deliberately leaves out:

* ``json-file`` (owner ``hpcml/files.py``: ``read_json``, ``load_json_bounded``): parsing a
  whole file as JSON: ``json.load(f)`` of a file ``open()``-ed here; ``json.loads`` /
  ``orjson.loads`` of ``.read_text()``, ``.read_bytes()``, ``f.read()`` of an opened file or
  ``read_bounded(...)``, directly or through a local name, with ``.decode()``/``.strip()``
  or a slice between. JSON that arrives over a socket, HTTP, a pipe or a subprocess's
  stdout, a line of a JSON Lines log, and data files inside the package
  (``importlib.resources``: shipped with hpcml, nobody else's to replace, perhaps in a zip
  with no path to open) are other jobs.
* ``kill-loop`` (owner ``hpcml/proctree.py``): a loop that both sends a kill
  (``os.kill``/``os.killpg`` with a signal other than 0, ``.kill()``, ``.terminate()``,
  ``.send_signal()``) and waits or reaps (``os.wait*``, ``time.sleep``, ``.wait()``,
  ``.join()`` with no positional argument, ``.communicate()``, ``psutil.wait_procs``): the
  kill-until-gone and kill-and-reap loops. A kill on the loop's way out (in a block that
  ends in ``return``/``break``/``raise``: kill the child on a timeout and leave) is one
  kill, not a loop.
* ``proc-parse`` (owners ``hpcml/proctree.py``, ``hpcml/owner.py``): a path, however built
  (a literal, an f-string, ``Path("/proc") / pid / "stat"``, ``os.path.join``, a ``glob``
  under ``/proc``), naming what identifies a process or its host: ``/proc/<pid>/stat``,
  ``status``, ``cmdline``, ``environ`` (also per task), its ``children``, ``ns/pid``, and
  ``/proc/sys/kernel/random/boot_id``. Who a process is, whether it is still the same one,
  what it left behind: proctree and owner answer that. System-wide files
  (``/proc/meminfo``, ``/proc/stat``, ``/proc/loadavg``, mounts) and a process's resource
  counters (``schedstat``, ``statm``) are not identity: the host samplers and checks that
  read them own that job. The rule is about the path, not the directory the module is in.
* ``duration-regex`` (owner ``hpcml/units.py``): a regular expression with a number and a
  group of two or more time units (``(s|m|h)``, ``(ms|s|min)``, ``[smh]``): parsing
  ``30s``/``5 min``/``1h`` is ``units.parse_seconds``.
* ``slurm-states`` (owner ``hpcml/cluster/slurm.py``): a list, tuple or set literal with two
  or more of Slurm's node or job state names (``"DOWN"``, ``"DRAIN"``, ``"RUNNING"``...):
  what counts as lost, drained or alive is decided once.

``PENDING`` lists offenders in files that others are rewriting now, each with what to do;
an entry that no longer offends fails too, so the list only shrinks.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

import hpcml

SRC = Path(hpcml.__file__).resolve().parent

OWNERS = {
    "json-file": {"hpcml/files.py"},
    "kill-loop": {"hpcml/proctree.py"},
    "proc-parse": {"hpcml/proctree.py", "hpcml/owner.py"},
    "duration-regex": {"hpcml/units.py"},
    "slurm-states": {"hpcml/cluster/slurm.py"},
}

#: not offenders, with why
EXEMPT = {
    ("hpcml/run/inject/sitecustomize.py", "json-file"):
        "runs inside every Python process of a rank and imports nothing of hpcml (its docstring); "
        "it reads a 4 KiB request with a bounded read of its own",
}

#: offenders known and not yet moved onto their helper: (file, rule) -> what to do. None
#: today; an entry whose file no longer offends fails the test, so the list only shrinks.
PENDING: dict[tuple[str, str], str] = {}


class Hit(NamedTuple):
    file: str
    rule: str
    line: int
    what: str


# -- the rules ---------------------------------------------------------------------------------

JSON_PARSERS = {f"{m}.{f}" for m in ("json", "orjson", "ujson", "simplejson", "rapidjson") for f in ("load", "loads")}
OPENERS = {"open", "io.open", "os.fdopen", "codecs.open", "gzip.open"}
CONTENT_WRAPPERS = {"decode", "strip", "rstrip", "lstrip", "removeprefix", "encode"}
RESOURCES = {"importlib.resources.files", "importlib_resources.files"}

KILLS = {"os.kill"}
#: proctree's one-pass kills: a loop around them (kill again until gone, reaping) is proctree's too
TREE_KILLS = {f"hpcml.proctree.{f}" for f in ("kill_descendants", "kill_orphans")}
WAITS = {"os.waitpid", "os.wait", "os.wait3", "os.wait4", "os.waitid", "time.sleep", "psutil.wait_procs"}

PROC_RE = re.compile(r"^/proc/[^/]+(?:/task/[^/]+)?/(?:stat|status|cmdline|environ|children|ns/pid(?:_for_children)?)$"
                     r"|^/proc/sys/kernel/random/boot_id$")

_UNIT = r"(?:[mun]s|s|secs?|seconds?|m|mins?|minutes?|h|hrs?|hours?|d|days?|w|weeks?)"
DURATION_RE = re.compile(rf"\((?:\?:)?{_UNIT}(?:\|{_UNIT})+\)|\[[smhdw]{{2,5}}\]")
NUMBER_RE = re.compile(r"\\d|0-9")
REGEX_CALLS = {f"{m}.{f}" for m in ("re", "regex")
               for f in ("compile", "match", "fullmatch", "search", "findall", "finditer", "split", "sub", "subn")}

SLURM_STATES = frozenset(
    # node states and flags (sinfo(1), scontrol(1))
    "ALLOC ALLOCATED BLOCKED CLOUD COMPLETING DOWN DRAIN DRAINED DRAINING FAIL FAILING FUTURE IDLE INVAL MAINT "
    "MIXED NOT_RESPONDING PERFCTRS PLANNED POWER_DOWN POWERED_DOWN POWERING_DOWN POWERING_UP REBOOT_ISSUED "
    "REBOOT_REQUESTED RESERVED RESUME UNKNOWN "
    # job states (squeue(1))
    "BOOT_FAIL CANCELLED COMPLETED CONFIGURING DEADLINE FAILED NODE_FAIL OUT_OF_MEMORY PENDING PREEMPTED "
    "REQUEUED REQUEUE_FED REQUEUE_HOLD RESIZING RESV_DEL_HOLD REVOKED RUNNING SIGNALING SPECIAL_EXIT "
    "STAGE_OUT STOPPED SUSPENDED TIMEOUT".split())

SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.Module)
LOOPS = (ast.For, ast.AsyncFor, ast.While)
DOCUMENTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)


def aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> what it imports (``j`` -> ``json``, ``loads`` -> ``json.loads``), from
    every import of the module, function-level ones included."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def dotted(node: ast.AST, names: dict[str, str]) -> str | None:
    """``os.path.join`` for that expression, through the module's imports; None if not a name."""
    if isinstance(node, ast.Name):
        return names.get(node.id, node.id)
    if isinstance(node, ast.Attribute):
        base = dotted(node.value, names)
        return f"{base}.{node.attr}" if base else None
    return None


def own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a scope, not those of the functions and classes defined in it."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, SCOPES):
            stack.extend(ast.iter_child_nodes(node))


def _attr_call(node: ast.AST, *attrs: str) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in attrs


def _is_open(node: ast.AST, names: dict[str, str]) -> bool:
    """``open(...)``, or ``path.open()`` / ``path.open("rb")`` (not ``zipfile.open(member)``)."""
    if not isinstance(node, ast.Call):
        return False
    if dotted(node.func, names) in OPENERS:
        return True
    return _attr_call(node, "open") and all(isinstance(a, ast.Constant) and isinstance(a.value, str)
                                            for a in node.args)


def _from_resources(node: ast.AST, names: dict[str, str]) -> bool:
    while isinstance(node, (ast.Call, ast.Attribute)):
        if isinstance(node, ast.Call):
            if dotted(node.func, names) in RESOURCES:
                return True
            node = node.func
        else:
            node = node.value
    return False


def _is_content(e: ast.AST, names: dict[str, str], opened: set[str], content: set[str]) -> bool:
    """Whether an expression is a file's bytes or text: ``p.read_text()``, ``f.read()`` of an
    opened ``f``, ``read_bounded(...)``, a name bound to one, with ``.decode()`` or a slice."""
    while True:
        if isinstance(e, ast.Subscript):
            e = e.value
        elif _attr_call(e, *CONTENT_WRAPPERS):
            e = e.func.value                                     # type: ignore[attr-defined]
        else:
            break
    if isinstance(e, ast.Name):
        return e.id in content
    if _attr_call(e, "read_text", "read_bytes"):
        return not _from_resources(e, names)
    if _attr_call(e, "read", "readall"):
        receiver = e.func.value                                  # type: ignore[attr-defined]
        return (isinstance(receiver, ast.Name) and receiver.id in opened) or _is_open(receiver, names)
    return isinstance(e, ast.Call) and (dotted(e.func, names) or "").split(".")[-1] == "read_bounded"


def json_file_hits(tree: ast.AST, names: dict[str, str]) -> Iterator[tuple[int, str]]:
    for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, SCOPES[:-1]))]:
        nodes = list(own_nodes(scope))
        opened: set[str] = set()
        for node in nodes:
            if isinstance(node, ast.withitem) and isinstance(node.optional_vars, ast.Name) \
                    and _is_open(node.context_expr, names):
                opened.add(node.optional_vars.id)
            elif isinstance(node, ast.Assign) and _is_open(node.value, names):
                opened |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        content: set[str] = set()
        for _ in range(2):                            # a name read from another read name
            for node in nodes:
                if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None \
                        and _is_content(node.value, names, opened, content):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    content |= {t.id for t in targets if isinstance(t, ast.Name)}
        for node in nodes:
            if not (isinstance(node, ast.Call) and node.args):
                continue
            name = dotted(node.func, names)
            if name not in JSON_PARSERS:
                continue
            arg = node.args[0]
            if name.endswith(".load"):
                if (isinstance(arg, ast.Name) and arg.id in opened) or _is_open(arg, names):
                    yield node.lineno, f"{name} of an opened file"
            elif _is_content(arg, names, opened, content):
                yield node.lineno, f"{name} of a file's content"


def _is_kill(node: ast.AST, names: dict[str, str]) -> bool:
    if not isinstance(node, ast.Call):
        return False
    if dotted(node.func, names) in KILLS:
        sig = node.args[1] if len(node.args) > 1 else None
        return not (isinstance(sig, ast.Constant) and sig.value == 0)      # 0: is it alive? not a kill
    if dotted(node.func, names) in TREE_KILLS:
        return True
    return (_attr_call(node, "kill", "terminate") and not node.args) or _attr_call(node, "send_signal")


def _is_wait(node: ast.AST, names: dict[str, str]) -> bool:
    if not isinstance(node, ast.Call):
        return False
    if dotted(node.func, names) in WAITS:
        return True
    return _attr_call(node, "wait", "communicate") or (_attr_call(node, "join") and not node.args)


def _statements(loop: ast.AST, leaving: bool = False) -> Iterator[tuple[ast.AST, bool]]:
    """The statements inside a loop (nested blocks too, not nested functions), each with
    whether its block ends the loop or the function (return, break, raise)."""
    for field in ("body", "orelse", "finalbody", "handlers"):
        block = getattr(loop, field, None) or []
        ends = leaving or bool(block) and isinstance(block[-1], (ast.Return, ast.Break, ast.Raise))
        for stmt in block:
            if isinstance(stmt, SCOPES):
                continue
            yield stmt, ends
            yield from _statements(stmt, ends)


def kill_loop_hits(tree: ast.AST, names: dict[str, str]) -> Iterator[tuple[int, str]]:
    for loop in ast.walk(tree):
        if not isinstance(loop, LOOPS):
            continue
        kills, waits = [], []
        for stmt, leaving in _statements(loop):
            for node in _expressions(stmt):
                if _is_kill(node, names) and not leaving:
                    kills.append(node)
                elif _is_wait(node, names):
                    waits.append(node)
        if kills and waits:
            yield loop.lineno, f"a loop that kills (line {kills[0].lineno}) and waits (line {waits[0].lineno})"


def _expressions(stmt: ast.AST) -> Iterator[ast.AST]:
    """The expressions of one statement, not those of the statements nested in it."""
    stack = [c for c in ast.iter_child_nodes(stmt) if not isinstance(c, (ast.stmt, ast.excepthandler))]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(c for c in ast.iter_child_nodes(node) if not isinstance(c, (ast.stmt, SCOPES)))


def path_text(node: ast.AST, names: dict[str, str]) -> str | None:
    """The path an expression builds, ``*`` for each part not known here; None if it is
    not a path expression."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "*" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        left = path_text(node.left, names)
        return None if left is None else f"{left.rstrip('/')}/{path_text(node.right, names) or '*'}"
    if isinstance(node, ast.Call):
        func = dotted(node.func, names) or ""
        if func.split(".")[-1] in ("Path", "PurePath", "PosixPath") and len(node.args) == 1:
            return path_text(node.args[0], names)
        if func in ("os.path.join", "posixpath.join") and node.args:
            parts = [path_text(a, names) or "*" for a in node.args]
            return "/".join(p.strip("/") if i else p.rstrip("/") for i, p in enumerate(parts))
        if _attr_call(node, "glob", "rglob", "joinpath") and node.args:
            base = path_text(node.func.value, names)         # type: ignore[attr-defined]
            if base is not None:
                return "/".join([base.rstrip("/"), *(path_text(a, names) or "*" for a in node.args)])
    return None


def proc_parse_hits(tree: ast.AST, names: dict[str, str]) -> Iterator[tuple[int, str]]:
    docstrings = {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, DOCUMENTED)
                  and n.body and isinstance(n.body[0], ast.Expr)}
    seen: set[int] = set()
    for node in ast.walk(tree):
        if id(node) in seen or id(node) in docstrings:
            continue
        text = path_text(node, names)
        if text is None:
            continue
        seen |= {id(n) for n in ast.walk(node)}         # the parts of a path are not paths of their own
        if PROC_RE.match(text):
            yield node.lineno, f"reads {text}"


def duration_regex_hits(tree: ast.AST, names: dict[str, str]) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and dotted(node.func, names) in REGEX_CALLS:
            pattern = node.args[0]
            if isinstance(pattern, ast.Constant) and isinstance(pattern.value, (str, bytes)):
                text = pattern.value if isinstance(pattern.value, str) else pattern.value.decode("latin-1")
                if NUMBER_RE.search(text) and DURATION_RE.search(text):
                    yield node.lineno, f"duration pattern {text!r}"


def slurm_states_hits(tree: ast.AST, names: dict[str, str]) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            states = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in SLURM_STATES]
            if len(states) >= 2:
                yield node.lineno, f"Slurm states {', '.join(states[:4])}{'...' if len(states) > 4 else ''}"


RULES = {"json-file": json_file_hits, "kill-loop": kill_loop_hits, "proc-parse": proc_parse_hits,
         "duration-regex": duration_regex_hits, "slurm-states": slurm_states_hits}


def check_source(source: str, file: str = "hpcml/x.py") -> list[Hit]:
    """Every rule's hits in one module's source (owners not yet taken out)."""
    tree = ast.parse(source)
    names = aliases(tree)
    return sorted({Hit(file, rule, line, what) for rule, find in RULES.items() for line, what in find(tree, names)})


@functools.cache
def offences() -> tuple[Hit, ...]:
    """The hits in src/hpcml outside each rule's owners and the exemptions (read once per
    run: both tests below ask)."""
    out = []
    for path in sorted(SRC.rglob("*.py")):
        file = path.relative_to(SRC.parent).as_posix()
        out += [h for h in check_source(path.read_text(encoding="utf-8"), file)
                if file not in OWNERS[h.rule] and (file, h.rule) not in EXEMPT]
    return tuple(out)


# -- the tree ----------------------------------------------------------------------------------

def test_every_job_is_done_by_its_helper():
    found = [h for h in offences() if (h.file, h.rule) not in PENDING]
    assert not found, "done outside the helper that owns the job (see this test's docstring):\n" + "\n".join(
        f"{h.file}:{h.line}: {h.rule}: {h.what} (owner: {', '.join(sorted(OWNERS[h.rule]))})" for h in found)


def test_every_pending_entry_still_offends():
    """The allowlist only shrinks: a fixed file must leave it."""
    hit = {(h.file, h.rule) for h in offences()}
    stale = sorted(set(PENDING) - hit)
    assert not stale, f"fixed: remove from PENDING: {stale}"


def test_the_owners_and_exemptions_exist_or_are_being_written():
    """An owner that moved would turn its rule off silently (owner.py is being written)."""
    missing = {f for files in OWNERS.values() for f in files if not (SRC.parent / f).is_file()} - {"hpcml/owner.py"}
    missing |= {f for f, _ in EXEMPT if not (SRC.parent / f).is_file()}
    assert not missing, missing


# -- the checker itself: each rule fails on what it is meant to, and only on that ---------------

def rules_of(source: str) -> list[str]:
    return [h.rule for h in check_source(source)]


@pytest.mark.parametrize("source", [
    "import json\ndef f(p):\n    return json.loads(p.read_text())",
    "import json\ndef f(p):\n    with open(p) as fh:\n        return json.load(fh)",
    "import json\ndef f(p):\n    return json.load(open(p))",
    "import orjson\ndef f(p):\n    return orjson.loads(p.read_bytes())",
    "import orjson\ndef f(p):\n    with open(p, 'rb') as fh:\n        return orjson.loads(fh.read(4097).rstrip())",
    "import json\ndef f(p):\n    text = p.read_text(encoding='utf-8')\n    return json.loads(text)",
    "from json import loads as parse\ndef f(p):\n    return parse(p.read_bytes().decode())",
    "import json\nfrom hpcml.files import read_bounded\ndef f(p):\n    return json.loads(read_bounded(p, 10))",
    "import json\ndef f(p):\n    with p.open() as fh:\n        return json.load(fh)",
], ids=["read_text", "load-open", "load-open-inline", "orjson-read_bytes", "bounded-read", "through-a-name",
        "imported-name", "read_bounded", "path-open"])
def test_a_json_file_read_is_caught(source):
    assert rules_of(source) == ["json-file"]


@pytest.mark.parametrize("source", [
    "import json, sys\ndef f(sock):\n    return json.loads(sock.recv(4096))",
    "import json\ndef f(resp):\n    return json.loads(resp.read())",                      # an HTTP response
    "import json, subprocess\ndef f():\n    return json.loads(subprocess.run(['x'], capture_output=True).stdout)",
    "import json, sys\ndef f():\n    return json.loads(sys.stdin.readline())",
    "import json\ndef f(lines):\n    return [json.loads(line) for line in lines]",
    "import json\nfrom importlib import resources\n"
    "def f():\n    return json.loads(resources.files('hpcml').joinpath('s.json').read_text())",
    "import json, zipfile\ndef f(zf, info):\n    with zf.open(info) as fh:\n        return json.loads(fh.read())",
    "import json\ndef f(fh):\n    text = fh.read()\ndef g(text):\n    return json.loads(text)",   # another scope
])
def test_json_that_is_not_a_file_read_passes(source):
    assert rules_of(source) == []


@pytest.mark.parametrize("source", [
    "import os, signal\ndef f(kids):\n    for _ in range(9):\n        for pid in kids:\n"
    "            os.kill(pid, signal.SIGKILL)\n        for pid in kids:\n            os.waitpid(pid, 0)",
    "import os, time\ndef f(left):\n    while left():\n        for pid in left():\n            os.kill(pid, 9)\n"
    "        time.sleep(0.02)",
    "def f(procs):\n    for p in procs:\n        p.join(timeout=5)\n        if p.is_alive():\n            p.kill()\n"
    "            p.join()",
    "import signal, time\ndef f(p):\n    while p.poll() is None:\n        p.send_signal(signal.SIGKILL)\n"
    "        time.sleep(0.1)",
], ids=["kill-and-reap", "kill-until-gone", "join-kill-join", "send_signal"])
def test_a_kill_loop_is_caught(source):
    assert "kill-loop" in rules_of(source)


@pytest.mark.parametrize("source", [
    "import os, time\ndef f(pid, rfd):\n    while True:\n        if not ready(rfd):\n            os.kill(pid, 9)\n"
    "            os.waitpid(pid, 0)\n            return None\n        time.sleep(1)",      # one kill on the way out
    "import os, time\ndef f(pid):\n    while True:\n        try:\n            os.kill(pid, 0)\n"
    "        except OSError:\n            return\n        time.sleep(1)",                      # a liveness probe
    "def f(procs, sig):\n    for p in procs:\n        p.send_signal(sig)",                  # forwarding, no wait
    "def f(parts, p):\n    for x in parts:\n        p.kill()\n        ', '.join(x)",        # str.join is no wait
])
def test_what_is_not_a_kill_loop_passes(source):
    assert rules_of(source) == []


@pytest.mark.parametrize("source", [
    "def f(pid):\n    with open(f'/proc/{pid}/stat', 'rb') as fh:\n        return fh.read()",
    "def f(pid):\n    return open(f'/proc/{pid}/environ', 'rb').read()",
    "from pathlib import Path\ndef f(pid):\n    return (Path('/proc') / str(pid) / 'cmdline').read_bytes()",
    "from pathlib import Path\ndef f():\n    return [p.read_bytes() for p in Path('/proc').glob('[0-9]*/cmdline')]",
    "import os\ndef f(pid):\n    return open(os.path.join('/proc', str(pid), 'status')).read()",
    "from pathlib import Path\ndef f():\n    return Path('/proc/sys/kernel/random/boot_id').read_text()",
    "import os\ndef f():\n    return os.stat('/proc/self/ns/pid').st_ino",
    "import os\ndef f():\n    return open(f'/proc/self/task/{os.getpid()}/children').read()",
])
def test_a_proc_identity_read_is_caught(source):
    assert rules_of(source) == ["proc-parse"]


@pytest.mark.parametrize("source", [
    "def f():\n    return open('/proc/meminfo').read()",                                     # host samplers'
    "def f():\n    return open('/proc/stat').read()",
    "def f():\n    return open('/proc/loadavg').read()",
    "def f(pid):\n    return open(f'/proc/{pid}/schedstat').read()",                         # CPU accounting
    "def f():\n    return open('/proc/self/statm').read()",
    "def f():\n    '''Reads /proc/PID/stat.'''\n    raise ValueError('/proc/PID/environ is blank')",
])
def test_other_proc_files_pass(source):
    assert rules_of(source) == []


def _regex(pattern: str, call: str = "compile") -> str:
    return f"import re\nP = re.{call}({pattern!r}, 'x')"


@pytest.mark.parametrize("source", [
    _regex(r"(\d+)\s*(s|m|h)"),
    _regex(r"^\s*([0-9]*\.?[0-9]+)\s*(s|m|min|h|d|w)?\s*$"),
    _regex(r"(\d+)([smh])", "match"),
    _regex(r"(?P<n>\d+)\s*(?:ms|sec|min)"),
])
def test_a_duration_regex_is_caught(source):
    assert rules_of(source) == ["duration-regex"]


@pytest.mark.parametrize("source", [
    _regex(r"^(send|recv)\s+(\d+)\s*(->|<-)\s*(\d+)$"),
    _regex(r"^\s*(\d+(?:\.\d+)?)\s*(m?)\s*$"),                                        # CPU millicores
    _regex(r"^\s*([0-9.]+)\s*([kMG]i?)?(B|b|bit)?\s*$"),
    _regex(r"(s|m|h)"),                                                                  # no number
])
def test_other_regexes_pass(source):
    assert rules_of(source) == []


@pytest.mark.parametrize("source", [
    "BAD = {'DOWN', 'DRAIN', 'FAIL'}",
    "def f(s):\n    return s in ('RUNNING', 'PENDING')",
    "ALIVE = frozenset(['COMPLETING', 'RUNNING'])",
])
def test_a_list_of_slurm_states_is_caught(source):
    assert rules_of(source) == ["slurm-states"]


@pytest.mark.parametrize("source", [
    "def f(s):\n    return s == 'DOWN'",                                   # one state: a comparison, not a list
    "MLFLOW = ('FINISHED', 'KILLED')",
    "WORDS = ['down', 'idle']",
])
def test_other_string_lists_pass(source):
    assert rules_of(source) == []


def test_an_owner_may_do_its_job_and_a_pending_entry_is_listed_by_file_and_rule():
    source = "import json\ndef f(p):\n    return json.loads(p.read_text())"
    assert [h.rule for h in check_source(source, "hpcml/files.py") if "hpcml/files.py" not in OWNERS[h.rule]] == []
    assert all(rule in OWNERS and file.startswith("hpcml/") and why for (file, rule), why in PENDING.items())


# --- messages: library code logs --------------------------------------------------------

#: where writing to stderr is the job: the command lines, the Typer-free fast paths, the
#: code injected into a user's process (it imports nothing of hpcml), the rank wrapper's
#: own entry (an exec failure before anything else runs) and the test cluster's script
STDERR_WRITERS = ("/cli/", "hpcml/cli", "hpcml/__main__.py", "/fast", "hpcml/fastparser.py", "/inject/",
                  "hpcml/run/rankexec.py", "hpcml/testing/")


def _stderr_prints(tree: ast.AST) -> list[int]:
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            and n.func.id == "print" and any(k.arg == "file" and ast.unparse(k.value) == "sys.stderr"
                                             for k in n.keywords)]


def test_library_code_logs_instead_of_printing_to_stderr():
    """A message for the person running hpcml goes through ``hpcml.logs`` (CONTRIBUTING):
    the same text on stderr, and an application can send it elsewhere."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = str(path.relative_to(SRC.parent))
        if any(w in rel for w in STDERR_WRITERS):
            continue
        found += [f"{rel}:{line}" for line in _stderr_prints(ast.parse(path.read_text()))]
    assert not found, "print(..., file=sys.stderr) in library code: use hpcml.logs.get(__name__)\n" + "\n".join(found)


def test_a_stderr_print_is_caught():
    assert _stderr_prints(ast.parse("import sys\ndef f():\n    print('x', file=sys.stderr)\n")) == [3]
    assert _stderr_prints(ast.parse("print('x')\n")) == []
