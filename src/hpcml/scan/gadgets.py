"""What a global that is not on the allowlist can do, read from its source, never imported.

A pickle can call any global it names, and public bypasses of pickle scanners use globals
no list names: ``uuid._get_command_stdout`` runs a command, ``imaplib.IMAP4`` opens a
socket, ``logging.FileHandler`` writes a file. Lists cannot keep up, so for a name the
allowlist does not cover the scan reads the module's source on this machine, finds the
named function (for a class, what unpickling or calling an instance runs: ``__new__``,
``__init__``, ``__setstate__``, ``__call__``, ``__setitem__``, ``append``, ``extend``,
``__del__``) and follows what it calls, within the module and into other modules' sources,
to a bounded depth. A call that reaches a primitive (a process, the network, a file write,
``eval``/``exec``/``compile``, ``ctypes``, importing by name, loading another pickle) makes
the global dangerous, with the path that reached it.

Sources are found by walking ``sys.path`` by hand, as the loading interpreter would:
``importlib.util.find_spec`` of a submodule imports its parent package, which is the code a
scanner must not run. A name whose source cannot be found (a C extension, a module this
machine lacks) stays unknown: the analysis only ever turns unknown into dangerous, so a
source planted beside a model can make nothing pass. Hand-written rather than a library: the Python static analysers
(pyright, jedi, astroid) either import what they analyse or cost seconds to start, and this
only needs the names a function calls.

Cost (issue 47: a 1.1 MB pickle naming 24k distinct globals took 612 s and 2.15 GB when every
module's syntax tree was kept and every name searched afresh): a module is parsed once per
process into a small index (a tree is dropped at once; indexes past ``KEPT_SOURCE`` go least
recently used first); a function's body is re-read and summarised only when a path reaches
it, once; what a callee reaches, or that it reaches nothing within every bound, is kept for
the next names. A file's names share ``FILE_SECONDS`` and ``FILE_PARSES``: past them the
names left are not analysed (``Spent``: they stay unknown, and the file's notes say how many).
"""

from __future__ import annotations

import ast
import builtins
import io
import os
import sys
import time
import tokenize
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

#: exact callables and what reaching them means
PRIMITIVES: dict[str, str] = {
    **dict.fromkeys([
        "os.system", "os.popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.posix_spawnp",
        "os.kill", "os.killpg", "os.startfile", "posix.system", "pty.spawn", "pty.fork",
        "asyncio.create_subprocess_exec", "asyncio.create_subprocess_shell",
        "multiprocessing.Process", "webbrowser.open", "webbrowser.open_new",
        "webbrowser.open_new_tab", "platform.popen"], "process"),
    **dict.fromkeys([
        "socket.socket", "socket.create_connection", "socket.create_server", "socket.fromfd",
        "socket.socketpair", "socket.getaddrinfo", "socket.gethostbyname",
        "socket.gethostbyname_ex", "ssl.wrap_socket", "http.client.HTTPConnection",
        "http.client.HTTPSConnection", "ftplib.FTP", "ftplib.FTP_TLS", "smtplib.SMTP",
        "smtplib.SMTP_SSL", "telnetlib.Telnet", "imaplib.IMAP4", "imaplib.IMAP4_SSL",
        "poplib.POP3", "poplib.POP3_SSL", "nntplib.NNTP", "xmlrpc.client.ServerProxy",
        "socketserver.TCPServer", "socketserver.UDPServer"], "network"),
    **dict.fromkeys([
        "os.remove", "os.unlink", "os.rmdir", "os.removedirs", "os.rename", "os.renames",
        "os.replace", "os.mkdir", "os.makedirs", "os.chmod", "os.chown", "os.truncate",
        "os.symlink", "os.link", "os.write", "os.mkfifo", "os.mknod", "shutil.rmtree",
        "shutil.move", "shutil.copy", "shutil.copy2", "shutil.copyfile", "shutil.copytree",
        "shutil.copyfileobj", "shutil.chown", "shutil.make_archive", "shutil.unpack_archive",
        "tarfile.TarFile.extractall", "tarfile.TarFile.extract", "zipfile.ZipFile.extractall",
        "zipfile.ZipFile.extract", "tempfile.mkstemp", "tempfile.mkdtemp"], "file-write"),
    **dict.fromkeys(["builtins.eval", "builtins.exec", "builtins.compile",
                     "builtins.breakpoint"], "eval"),
    **dict.fromkeys(["builtins.__import__", "importlib.import_module", "importlib.reload",
                     "importlib.__import__", "pkgutil.resolve_name", "runpy.run_path",
                     "runpy.run_module", "importlib.util.spec_from_file_location",
                     "importlib.util.module_from_spec", "importlib.util.spec_from_loader"], "import"),
    **dict.fromkeys([
        "pickle.load", "pickle.loads", "pickle.Unpickler", "_pickle.load", "_pickle.loads",
        "_pickle.Unpickler", "marshal.load", "marshal.loads", "shelve.open",
        "dill.load", "dill.loads", "cloudpickle.load", "cloudpickle.loads", "joblib.load",
        "torch.load", "numpy.load", "pandas.read_pickle",
        # parse, then construct arbitrary objects: as good as a pickle load
        "yaml.load", "yaml.load_all", "yaml.unsafe_load", "yaml.unsafe_load_all", "yaml.full_load",
        "yaml.full_load_all", "yaml.UnsafeLoader", "yaml.Loader", "yaml.FullLoader", "yaml.CLoader",
        "yaml.CUnsafeLoader", "yaml.CFullLoader", "yaml.constructor.UnsafeConstructor",
        "yaml.constructor.FullConstructor", "jsonpickle.decode", "jsonpickle.unpickler.decode",
        "hydra.utils.instantiate", "keras.models.load_model"], "pickle"),
}
#: whole modules every callable of which is a primitive
PRIMITIVE_MODULES: dict[str, str] = {
    "subprocess": "process", "_posixsubprocess": "process", "os.exec": "process",
    "os.spawn": "process", "urllib.request": "network", "requests": "network",
    "httpx": "network", "aiohttp": "network", "ctypes": "ctypes", "_ctypes": "ctypes",
    "cffi": "ctypes", "code": "eval", "codeop": "eval", "pdb": "eval", "bdb": "eval",
}
#: what each kind of primitive means, for the report
MEANS = {"process": "runs a process", "network": "opens a network connection",
         "file-write": "writes or removes files", "eval": "evaluates code",
         "ctypes": "calls native code (ctypes)", "import": "imports modules by name",
         "pickle": "loads another pickle (or constructs arbitrary objects)", "listed": "is another name for a dangerous global"}
#: the worst first, when a function reaches several
SEVERITY = ("listed", "process", "eval", "ctypes", "import", "pickle", "network", "file-write")
#: what unpickling a class, or calling or dropping its instance, runs
CLASS_ENTRY = ("__new__", "__init__", "__setstate__", "__call__", "__setitem__", "append",
               "extend", "__getattr__", "__setattr__", "__hash__", "__eq__", "__del__")
_WRITE_MODES = frozenset("wax+")
#: bytes of one module's source read at most: parsing holds its whole syntax tree for a
#: moment, 4 to 80x the source and up to 200x at the peak (torch.sparse._triton_ops_meta,
#: 490 KiB of literal tables: 96 MiB); 7 of the 24,450 modules of this venv and Python are
#: larger (pandas.core.frame, torch's generated test tables, pydoc's topics)
MAX_SOURCE = 2**19
MAX_DEPTH = 6               # function calls followed from the named global
MAX_FUNCTIONS = 400         # function bodies read for one global, in all
#: the standard library's introspection and data-structure modules: a call into them is
#: not followed (their own eval/exec, as in ``inspect`` or ``namedtuple``, is not reachable
#: with a pickle's arguments, and following them would make every nn.Module dangerous)
NOT_FOLLOWED = frozenset("""inspect typing typing_extensions abc enum dataclasses functools
    collections warnings weakref copy re sre_compile sre_parse textwrap traceback linecache
    ast string numbers operator contextlib types reprlib pprint""".split())
MAX_PACKAGES = 2            # top-level packages a path may cross into (torch -> its callee's)
MAX_SECONDS = 2.0           # analysis time for one global; beyond, it stays unknown
MAX_NAME = 200              # characters of a module name looked up at all
#: what one file's names may cost together (from ``Analyser.start_file``): past either,
#: the names left are not analysed (they stay unknown, and say so)
FILE_SECONDS = 3.0          # analysis time (24k distinct globals: the whole scan within 5 s on a slow 2-core VM)
FILE_PARSES = 256           # module sources parsed (a parse is most of the cost: ~15 ms)
#: module indexes kept per process, weighed by the bytes of source they were read from;
#: the least recently used go first (and cost a parse again if a later name needs them)
KEPT_SOURCE = 24 * 2**20    # (their indexes: ~0.8x that)
MAX_ANSWERS = 1 << 16       # answers kept per process (names, and what a callee reaches)
_MAX_EXPR = 9               # attribute/call levels of an expression kept (the resolver follows 8)
_OPENERS = frozenset({"builtins.open", "io.open", "os.open", "codecs.open"})
_PATH_WRITES = frozenset(f"pathlib.Path.{m}" for m in (
    "write_text", "write_bytes", "unlink", "rename", "replace", "rmdir", "touch", "mkdir", "symlink_to"))
#: the last part of every exact primitive: a reference that is not a call can only be one
#: of them if it ends so (or goes through a name the index keeps anyway)
_LAST_PARTS = frozenset(d.rpartition(".")[2] for d in PRIMITIVES)


class Spent(Exception):
    """The file's analysis budget was spent before this name was analysed: it stays unknown."""


@dataclass(frozen=True)
class Reach:
    """A path from a global to a primitive."""

    kind: str
    path: tuple[str, ...]

    def __str__(self) -> str:
        return f"{MEANS[self.kind]}: {' → '.join(self.path)}"


#: what a call may do with a file: (writes if it is ``open``, writes if it is ``os.open``)
Flags = tuple[bool, bool]


def _primitive(dotted: str, flags: Flags | None) -> str | None:
    if dotted in _OPENERS:
        return "file-write" if flags is not None and flags[dotted == "os.open"] else None
    if dotted in _PATH_WRITES:
        return "file-write"
    kind = PRIMITIVES.get(dotted)
    if kind:
        return kind
    if dotted.startswith(("os.exec", "os.spawn")):
        return "process"
    i = dotted.find(".")
    while i > 0:
        kind = PRIMITIVE_MODULES.get(dotted[:i])
        if kind and dotted[:i] not in ("os.exec", "os.spawn"):
            return kind
        i = dotted.find(".", i + 1)
    return PRIMITIVE_MODULES.get(dotted)


def _flags(call: ast.Call) -> Flags:
    return _writes("builtins.open", call), _writes("os.open", call)


def _writes(dotted: str, call: ast.Call) -> bool:
    """Whether an ``open`` call may write: its mode (or flags) is not a constant that reads."""
    if dotted == "os.open":
        flags = call.args[1] if len(call.args) > 1 else next(
            (k.value for k in call.keywords if k.arg == "flags"), None)
        if flags is None:
            return True
        names = {n.attr if isinstance(n, ast.Attribute) else n.id
                 for n in ast.walk(flags) if isinstance(n, (ast.Attribute, ast.Name))} - {"os"}
        if any(not n.startswith("O_") for n in names):
            return True                                 # flags computed at run time
        return bool(names & {"O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC", "O_APPEND"})
    mode = call.args[1] if len(call.args) > 1 else next(
        (k.value for k in call.keywords if k.arg == "mode"), None)
    if mode is None:
        return False                                    # the default mode reads
    if isinstance(mode, ast.Constant) and isinstance(mode.value, str):
        return bool(_WRITE_MODES & set(mode.value))
    return True                                         # a mode computed at run time


# ------------------------------------------------------------------------ finding sources
#: a directory's entries: (names, stems of the extension modules ``NAME.*.so``); None: not one
Listing = tuple[frozenset[str], frozenset[str]]


def find_source(module: str, paths: list[str] | None = None,
                listings: dict[str, Listing | None] | None = None) -> Path | None:
    """The ``.py`` file Python would import ``module`` from, found without importing
    anything: each ``sys.path`` directory (``''``: the current one), packages as directories.
    ``listings`` caches each directory's entries (an ``Analyser`` keeps one per process)."""
    parts = module.split(".")
    if len(module) > MAX_NAME or not all(p.isidentifier() for p in parts) \
            or module in sys.builtin_module_names:
        return None
    try:
        return _search(parts, paths if paths is not None else sys.path,
                       listings if listings is not None else {})
    except (OSError, ValueError):                       # a name too long for the filesystem
        return None


def _listing(directory: Path, cache: dict[str, Listing | None]) -> Listing | None:
    key = str(directory)
    if key not in cache:
        if len(cache) >= 4096:
            cache.clear()
        try:
            names = frozenset(os.listdir(directory))
        except OSError:                                 # missing, not a directory, unreadable
            cache[key] = None
        else:
            cache[key] = (names, frozenset(n.partition(".")[0] for n in names
                                           if n.endswith(".so") and n.count(".") >= 2))
    return cache[key]


def _search(parts: list[str], paths: list[str], cache: dict[str, Listing | None]) -> Path | None:
    last = parts[-1]
    for entry in paths:
        base = Path(entry or ".").joinpath(*parts[:-1])
        listing = _listing(base, cache)
        if listing is None:
            continue
        names, extensions = listing
        if f"{last}.py" in names and (base / f"{last}.py").is_file():
            return base / f"{last}.py"
        if last in names:
            if (base / last / "__init__.py").is_file():
                return base / last / "__init__.py"
            if (base / last).is_dir():
                return None     # a namespace package: nothing to read here
        if last in extensions:
            return None         # an extension module
    return None


# ------------------------------------------------------------------------ the index
# A module is parsed once and kept as an index, not as its syntax tree (a tree is ~50x its
# source): its imports, what its top level binds, and where each function and class is in
# the file. A function's body is read again from the file, parsed and summarised only when
# a path reaches it (most never are), and then only its summary is kept. Expressions are
# small tuples: ("n", name), ("a", owner, attribute), ("c", callee) for ``callee(...)``.
Expr = tuple
#: (first byte, end byte, indentation) of a definition in its module's file
Span = tuple[int, int, int]


def _expr(node: ast.expr, level: int = 0) -> Expr | None:
    if level > _MAX_EXPR:
        return None
    if isinstance(node, ast.Name):
        return ("n", node.id)
    if isinstance(node, ast.Attribute):
        owner = _expr(node.value, level + 1)
        return None if owner is None else ("a", owner, node.attr)
    if isinstance(node, ast.Call):
        callee = _expr(node.func, level + 1)
        return None if callee is None else ("c", callee)
    return None


@dataclass
class _Body:
    imports: dict[str, str]                 # what the body imports (the module's come after)
    aliases: dict[str, Expr | None]         # ``x = <name, attribute or call>`` in the body
    calls: list[tuple[Expr, Flags]]         # what it calls, each once
    refs: list[Expr]                        # names it passes on without calling them


@dataclass(eq=False, slots=True)
class _Func:
    name: str
    owner: _Class | None                    # the class it is a method of
    span: Span
    #: resolved once per process: (a primitive it names itself: (kind, dotted)), what it calls
    summary: tuple[tuple[str, str] | None, list[tuple[str, Flags]]] | None = None


@dataclass(eq=False, slots=True)
class _Class:
    name: str
    bases: list[Expr | None]
    methods: dict[str, _Func]
    span: Span
    binds: dict[str, Expr | None] | None = None     # what the body or its methods bind to a name
    lookups: dict[str, tuple[_Module, _Class, _Func] | None] = field(default_factory=dict)


@dataclass(eq=False, slots=True)
class _Module:
    name: str
    package: str
    path: Path
    encoding: str
    imports: dict[str, str]
    assigns: dict[str, Expr | None]
    defs: dict[str, _Func | _Class] = field(default_factory=dict)
    weight: int = 0                         # bytes of source
    on_import: Reach | None = None          # a primitive its top level calls directly


def _imports_of(nodes: list[ast.stmt] | list[ast.AST], package: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for node in nodes:
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    out[a.asname] = a.name
                else:
                    root = a.name.split(".")[0]
                    out[root] = root
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                up = up[:len(up) - node.level + 1] if node.level > 1 else up
                base = ".".join([*up, *([base] if base else [])])
            for a in node.names:
                if a.name != "*":
                    out[a.asname or a.name] = f"{base}.{a.name}" if base else a.name
    return out


def _top_level(node: ast.AST) -> list[ast.Call]:
    """The calls importing the module runs: its statements, not the bodies of the functions,
    classes and lambdas it defines (under an ``if`` or a ``try`` too)."""
    out: list[ast.Call] = []
    todo = [node]
    while todo:
        n = todo.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(n, ast.Call):
            out.append(n)
        todo.extend(ast.iter_child_nodes(n))
    return out


def _is_main_guard(node: ast.stmt) -> bool:
    """``if __name__ == "__main__":``, which importing does not run."""
    return isinstance(node, ast.If) and isinstance(node.test, ast.Compare) \
        and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__"


def _index_body(fn: ast.FunctionDef | ast.AsyncFunctionDef, mod: _Module) -> _Body:
    nodes = list(ast.walk(fn))
    imports = _imports_of(nodes, mod.package)
    aliases: dict[str, Expr | None] = {}
    calls: dict[tuple[Expr, Flags], None] = {}
    loads: list[ast.Name | ast.Attribute] = []
    callees: set[int] = set()
    for n in nodes:
        if isinstance(n, ast.Call):
            callees.add(id(n.func))
            e = _expr(n.func)
            if e is not None:
                calls[(e, _flags(n))] = None
        elif isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, ast.Load):
            loads.append(n)
        elif isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name) \
                and isinstance(n.value, (ast.Name, ast.Attribute, ast.Call)):
            aliases[n.targets[0].id] = _expr(n.value)   # a call: an instance, whose methods count
    # A reference resolves to an exact primitive only if it ends in one's last part, or goes
    # through a name bound here or at the top level, or is self's: the others are dropped.
    refs: dict[Expr, None] = {}
    for n in loads:
        if id(n) in callees:
            continue
        if isinstance(n, ast.Name):
            keep = n.id in _LAST_PARTS or n.id in aliases or n.id in imports or n.id in mod.imports \
                or n.id in mod.assigns or n.id in mod.defs
        else:
            keep = n.attr in _LAST_PARTS or (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"))
        if keep and (e := _expr(n)) is not None:
            refs[e] = None
    return _Body(imports, aliases, list(calls), list(refs))


def _binds_of(node: ast.ClassDef) -> dict[str, Expr | None]:
    """What a class body or its methods bind to a name (``x = ...``, ``self.x = ...``): the
    first binding that is not ``self``'s own attribute."""
    out: dict[str, Expr | None] = {}
    for n in ast.walk(node):
        if not isinstance(n, ast.Assign) or not isinstance(n.value, (ast.Name, ast.Attribute, ast.Call)):
            continue
        v = n.value
        if isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name) and v.value.id == "self":
            continue
        for t in n.targets:
            if isinstance(t, ast.Name) and t.id not in out:
                out[t.id] = _expr(v)
            elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self" \
                    and t.attr not in out:
                out[t.attr] = _expr(v)
    return out


def _span(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef, lines: list[int]) -> Span:
    """Where a definition is, its decorators included (what they call is part of it)."""
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    end = node.end_lineno or node.lineno
    return lines[first - 1], lines[end] if end < len(lines) else lines[-1], node.col_offset


class Analyser:
    """Reads each module's source once per process into a small index (least recently used
    ones dropped past ``KEPT_SOURCE``); ``reach(module, name)`` answers from caches: per
    name, per function (what it calls, resolved once), and per callee what it was found to
    reach, or that it reaches nothing within every bound. ``start_file`` starts a file's
    budget (``FILE_SECONDS``, ``FILE_PARSES``); past it ``reach`` raises ``Spent``."""

    def __init__(self, paths: list[str] | None = None,
                 listed: Callable[[str], bool] | None = None) -> None:
        self._paths = paths
        #: whether a dotted name is on the policy's dangerous list: a global that is
        #: another name for one (``tarfile.bltn_open`` is ``builtins.open``) is that global
        self._listed = listed or (lambda dotted: False)
        self._modules: OrderedDict[str, _Module] = OrderedDict()
        self._missing: set[str] = set()         # modules without a source to read
        self._kept = 0                          # bytes of source behind the kept indexes
        self._listings: dict[str, Listing | None] = {}
        self._answers: dict[str, Reach | None] = {}
        #: callee -> (primitive kind, the path from it on), as found from any name
        self._found: dict[str, tuple[str, tuple[str, ...]]] = {}
        #: callees searched to the end, within no bound, without finding anything
        self._empty: set[str] = set()
        self.parses = 0                         # sources parsed by this process
        self.bodies = 0                         # definitions read again and parsed alone
        self._refused = 0                       # parses the file's budget refused
        self._cuts = 0                          # searches a bound cut short
        self._budget = MAX_FUNCTIONS
        self._deadline = 0.0
        self._seen: set[str] = set()
        self.start_file()

    def start_file(self) -> None:
        """A new file: its names share a fresh ``FILE_SECONDS`` and ``FILE_PARSES``."""
        self.file_parses = 0
        self.file_seconds = 0.0
        self.skipped = 0                        # names of this file left unanalysed

    # ---------------------------------------------------------------- modules
    def module(self, name: str) -> _Module | None:
        mod = self._modules.get(name)
        if mod is not None:
            self._modules.move_to_end(name)
            return mod
        if name in self._missing:
            return None
        src = find_source(name, self._paths, self._listings)
        if src is not None and self.file_parses >= FILE_PARSES:
            self._refused += 1                  # not remembered: a later file may read it
            self._cuts += 1
            return None
        mod = self._read(name, src) if src is not None else None
        if mod is None:
            if len(self._missing) >= MAX_ANSWERS:
                self._missing.clear()
            self._missing.add(name)
            return None
        self._modules[name] = mod
        self._kept += mod.weight
        while self._kept > KEPT_SOURCE and len(self._modules) > 1:
            self._kept -= self._modules.popitem(last=False)[1].weight
        return mod

    def _read(self, name: str, src: Path) -> _Module | None:
        try:
            if src.stat().st_size > MAX_SOURCE:
                return None
            data = src.read_bytes()
            if len(data) > MAX_SOURCE:
                return None
            self.parses += 1
            self.file_parses += 1
            encoding = tokenize.detect_encoding(io.BytesIO(data).readline)[0]
            tree = ast.parse(data, str(src))
        except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
            return None
        lines = [0]                  # the byte each line starts at, and the end
        at = data.find(b"\n")
        while at >= 0:
            lines.append(at + 1)
            at = data.find(b"\n", at + 1)
        lines.append(len(data))
        package = name if src.name == "__init__.py" else name.rpartition(".")[0]
        top: list[ast.stmt] = list(tree.body)
        for n in tree.body:          # names bound under try/if at module level count too
            if isinstance(n, (ast.If, ast.Try)):
                top += [m for m in ast.walk(n) if isinstance(m, ast.stmt)]
        mod = _Module(name, package, src, encoding, _imports_of(top, package),
                      {t.id: _expr(n.value) for n in top if isinstance(n, ast.Assign)
                       for t in n.targets if isinstance(t, ast.Name)}, weight=len(data))
        for n in top:
            if isinstance(n, ast.ClassDef):
                cls = _Class(n.name, [_expr(b) for b in n.bases], {}, _span(n, lines))
                for m in n.body:
                    if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m.name not in cls.methods:
                        cls.methods[m.name] = _Func(m.name, cls, _span(m, lines))
                mod.defs[n.name] = cls
            elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                mod.defs[n.name] = _Func(n.name, None, _span(n, lines))
        for c in (c for n in tree.body if not _is_main_guard(n) for c in _top_level(n)):
            e = _expr(c.func)
            dotted = self._resolve(e, mod, None, {}) if e is not None else None
            kind = _primitive(dotted, _flags(c)) if dotted else None
            if kind and dotted:
                mod.on_import = Reach(kind, (f"importing {mod.name}", dotted))
                break
        return mod

    def _definition(self, mod: _Module, span: Span) -> ast.stmt | None:
        """A function or class read again from its module's file and parsed alone."""
        start, end, indent = span
        try:
            with open(mod.path, "rb") as fh:
                fh.seek(start)
                text = fh.read(end - start).decode(mod.encoding)
            self.bodies += 1
            tree = ast.parse(f"if 1:\n{text}" if indent else text)
        except (OSError, SyntaxError, ValueError, LookupError, RecursionError, MemoryError):
            return None              # the file changed since: nothing read from it
        node = tree.body[0] if tree.body else None
        if indent and isinstance(node, ast.If):
            node = node.body[0]
        return node

    def _locate(self, dotted: str) -> tuple[_Module, list[str]] | None:
        """The module holding ``dotted`` and the attribute path inside it."""
        parts = dotted.split(".")
        for i in range(len(parts) - 1, 0, -1):
            mod = self.module(".".join(parts[:i]))
            if mod is not None:
                return mod, parts[i:]
        return None

    # ---------------------------------------------------------------- entry
    def reach(self, module: str, name: str) -> Reach | None:
        """What calling ``module.name`` can reach; None if nothing found. Raises ``Spent``
        when the file's budget leaves the name unanalysed (nothing is remembered then)."""
        dotted = f"{module}.{name}"
        if dotted in self._answers:
            return self._answers[dotted]
        left = FILE_SECONDS - self.file_seconds
        if left <= 0 or self.file_parses >= FILE_PARSES:
            self.skipped += 1
            raise Spent(f"not analysed: this file's names had spent its source analysis "
                        f"budget ({FILE_PARSES} module parses, {FILE_SECONDS:g} s)")
        start = time.monotonic()
        self._budget = MAX_FUNCTIONS
        self._deadline = start + min(MAX_SECONDS, left)
        self._seen = set()
        refused, self._timed_out = self._refused, False
        try:
            found = self._target(dotted, (dotted,), 0, alias=True)
        except (RecursionError, MemoryError, ValueError, OSError):
            found = None                         # a source too hostile to follow: unknown
        finally:
            self.file_seconds += time.monotonic() - start
        if found is None and (self._refused != refused or (self._timed_out and left < MAX_SECONDS)):
            self.skipped += 1
            raise Spent(f"not analysed to the end: this file's names spent its source analysis "
                        f"budget ({FILE_PARSES} module parses, {FILE_SECONDS:g} s)")
        if len(self._answers) >= MAX_ANSWERS:
            self._answers.clear()
        self._answers[dotted] = found
        return found

    def _target(self, dotted: str, path: tuple[str, ...], depth: int,
                flags: Flags | None = None, alias: bool = False) -> Reach | None:
        """What calling (or, for a class, instantiating) ``dotted`` can reach."""
        kind = _primitive(dotted, flags)
        if kind and depth:
            return Reach(kind, path if path[-1] == dotted else (*path, dotted))
        remember = depth > 0 and not alias      # the same answer whoever calls it
        if remember:
            if dotted in self._empty:
                return None
            hit = self._found.get(dotted)
            if hit is not None and depth + len(hit[1]) - 1 <= MAX_DEPTH \
                    and len({p.split(".")[0] for p in (*path, *hit[1][:-1])}) <= MAX_PACKAGES:
                return Reach(hit[0], (*path, *hit[1]))
        if depth > MAX_DEPTH or dotted in self._seen or self._budget <= 0:
            self._cuts += 1
            return None
        if time.monotonic() > self._deadline:
            self._cuts += 1
            self._timed_out = True
            return None
        self._seen.add(dotted)
        cuts = self._cuts
        where = self._locate(dotted)
        if where and not depth and where[0].on_import:   # importing it runs its top level first
            return where[0].on_import
        found = self._in_module(*where, path, depth, alias) if where else None
        if kind:   # the named global is a primitive itself: its own source may say how
            return found if found and found.kind == kind else Reach(kind, path)
        if remember and len(self._found) + len(self._empty) < MAX_ANSWERS:
            if found is not None and found.path[:len(path)] == path:
                self._found[dotted] = (found.kind, found.path[len(path):])
            elif found is None and self._cuts == cuts:
                self._empty.add(dotted)
        return found

    def _in_module(self, mod: _Module, attrs: list[str], path: tuple[str, ...],
                   depth: int, alias: bool = False) -> Reach | None:
        """``alias``: ``path`` so far is the named global and the names it re-exports (the
        same object): one on the dangerous list makes the global that list's."""
        head = attrs[0]
        bound = None
        if head in mod.imports:        # a re-export: the global is what the module imported
            bound = mod.imports[head]
        elif head in mod.assigns:
            value = mod.assigns[head]
            if value is not None and value[0] != "c":
                bound = self._resolve(value, mod, None, {})
        if bound:
            bound = ".".join([bound, *attrs[1:]])
            if alias and (self._listed(bound) or self._listed(bound.rpartition(".")[0] + ".*")):
                return Reach("listed", (*path, bound))
            return self._target(bound, (*path, bound), depth + 1, alias=alias)
        node = mod.defs.get(head)
        if node is None:
            return None
        if isinstance(node, _Class):
            methods = attrs[1:2] or list(CLASS_ENTRY)
            for meth in methods:
                found = self._method(mod, node, meth)
                if found is None:
                    continue
                owner, cls, fn = found
                step = f"{owner.name}.{cls.name}.{fn.name}"
                r = self._function(owner, fn, path if path[-1] == step else (*path, step), depth + 1)
                if r:
                    return r
            return None
        if len(attrs) > 1:
            return None
        return self._function(mod, node, path, depth + 1)

    def _method(self, mod: _Module, cls: _Class, name: str,
                seen: set[str] | None = None) -> tuple[_Module, _Class, _Func] | None:
        """``name`` on ``cls`` or its bases, as far as their sources can be read."""
        if name in cls.lookups:
            return cls.lookups[name]
        top = seen is None
        seen = set() if seen is None else seen
        key = f"{mod.name}.{cls.name}"
        if key in seen or len(seen) > 16:
            return None
        seen.add(key)
        refused = self._refused
        found: tuple[_Module, _Class, _Func] | None = None
        if name in cls.methods:
            found = mod, cls, cls.methods[name]
        for base in cls.bases if found is None else ():
            dotted = self._resolve(base, mod, None, {}) if base is not None else None
            where = self._locate(dotted) if dotted else None
            if where is None:
                continue
            bmod, battrs = where
            bcls = bmod.defs.get(battrs[0]) if len(battrs) == 1 else None
            if isinstance(bcls, _Class):
                found = self._method(bmod, bcls, name, seen)
                if found:
                    break
        if top and self._refused == refused and len(seen) <= 16:     # complete: kept
            cls.lookups[name] = found
        return found

    # ---------------------------------------------------------------- bodies
    def _function(self, mod: _Module, fn: _Func, path: tuple[str, ...], depth: int) -> Reach | None:
        self._budget -= 1
        if self._budget < 0:
            self._cuts += 1
            return None
        early, targets = self._summary(mod, fn)
        if early is not None:
            return Reach(early[0], (*path, early[1]))
        roots = {p.split(".")[0] for p in path}
        for dotted, flags in targets:
            root = dotted.split(".")[0]
            if root in NOT_FOLLOWED:
                continue
            if root not in roots and len(roots) >= MAX_PACKAGES:
                self._cuts += 1
                continue
            r = self._target(dotted, (*path, dotted), depth, flags)
            if r:
                return r
        return None

    def _summary(self, mod: _Module, fn: _Func) -> tuple[tuple[str, str] | None, list[tuple[str, Flags]]]:
        """What ``fn`` names: a primitive it hands on or calls itself (the worst), and the
        dotted names of what it calls; resolved once per process."""
        if fn.summary is not None:
            return fn.summary
        refused = self._refused
        node = self._definition(mod, fn.span)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name != fn.name:
            fn.summary = None, []
            return fn.summary
        try:
            body = _index_body(node, mod)
        except RecursionError:
            fn.summary = None, []
            return fn.summary
        del node
        scope = _Scope(mod, fn.owner, body.imports)
        early = None
        # a reference that is not a call still hands a primitive to whoever calls it
        for ref in body.refs:
            dotted = self._resolve(ref, mod, scope, body.aliases)
            if dotted and dotted in PRIMITIVES:
                early = PRIMITIVES[dotted], dotted
                break
        targets = [(d, flags) for e, flags in body.calls if (d := self._resolve(e, mod, scope, body.aliases))]
        if early is None:    # what this body calls directly, the worst of it
            direct = [(SEVERITY.index(k), k, d) for d, flags in targets if (k := _primitive(d, flags))]
            if direct:
                _, kind, dotted = min(direct)
                early = kind, dotted
        summary = early, list(dict.fromkeys(targets))
        if self._refused == refused:
            fn.summary = summary
        return summary

    def _resolve(self, expr: Expr, mod: _Module, scope: _Scope | None,
                 aliases: dict[str, Expr | None], hops: int = 0) -> str | None:
        """The dotted name an expression refers to, as far as the source says."""
        if hops > 8:
            return None
        tag = expr[0]
        if tag == "n":
            n = expr[1]
            alias = aliases.get(n)
            if n in aliases and alias != expr:
                if alias is None:
                    return None
                return self._resolve(alias, mod, scope, {k: v for k, v in aliases.items() if k != n}, hops + 1)
            if scope and n in scope.imports:
                return scope.imports[n]
            if n in mod.imports:
                return mod.imports[n]
            if n in mod.defs:
                return f"{mod.name}.{n}"
            if n in mod.assigns:
                value = mod.assigns[n]
                return None if value is None else self._resolve(value, mod, None, {}, hops + 1)
            if hasattr(builtins, n):
                return f"builtins.{n}"
            return None
        if tag == "a":
            value, attr = expr[1], expr[2]
            if scope and scope.cls is not None and value[0] == "n" and value[1] in ("self", "cls"):
                return self._self_attr(scope, attr, hops)
            if scope and scope.cls is not None and value == ("c", ("n", "super")):
                for parent in scope.cls.bases:
                    dotted = self._resolve(parent, mod, scope, aliases, hops + 1) if parent else None
                    if dotted:
                        return f"{dotted}.{attr}"
                return None
            owner = self._resolve(value, mod, scope, aliases, hops + 1)
            return f"{owner}.{attr}" if owner else None
        # ("c", callee): X(...).m: the instance's method is the class's
        return self._resolve(expr[1], mod, scope, aliases, hops + 1)

    def _self_attr(self, scope: _Scope, attr: str, hops: int) -> str | None:
        """``self.attr`` inside a class: its method, or what the class or its methods bind
        to it (``self._builtin_open = open``)."""
        cls, mod = scope.cls, scope.mod
        assert cls is not None
        found = self._method(mod, cls, attr)
        if found is not None:
            owner, ocls, fn = found
            return f"{owner.name}.{ocls.name}.{fn.name}"
        if cls.binds is None:
            node = self._definition(mod, cls.span)
            try:
                cls.binds = _binds_of(node) if isinstance(node, ast.ClassDef) else {}
            except RecursionError:
                cls.binds = {}
        value = cls.binds.get(attr)
        if value is None:
            return None
        return self._resolve(value, mod, _Scope(mod, None, scope.imports), {}, hops + 1)


@dataclass
class _Scope:
    mod: _Module
    cls: _Class | None
    imports: dict[str, str]          # the function's own; the module's are looked up after


_shared: dict[int, Analyser] = {}


def analyser(listed: Callable[[str], bool] | None = None, create: bool = True) -> Analyser | None:
    """The process's analyser for a policy (``listed`` is its ``is_dangerous``)."""
    key = id(getattr(listed, "__self__", listed))
    if key not in _shared and create:
        _shared[key] = Analyser(listed=listed)
    return _shared.get(key)


def forget(listed: Callable[[str], bool]) -> None:
    """Drop a policy's analyser (its lists changed)."""
    _shared.pop(id(getattr(listed, "__self__", listed)), None)


def reach(module: str, name: str, listed: Callable[[str], bool] | None = None) -> Reach | None:
    """What ``module.name`` can reach when a pickle calls it; None when nothing found (or no
    source to read); ``Spent`` when the file's budget is. One analyser per process and
    policy, so each module is parsed once."""
    a = analyser(listed)
    assert a is not None
    return a.reach(module, name)
