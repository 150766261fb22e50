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
"""

from __future__ import annotations

import ast
import builtins
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
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
        "torch.load", "numpy.load", "pandas.read_pickle"], "pickle"),
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
         "pickle": "loads another pickle", "listed": "is another name for a dangerous global"}
#: the worst first, when a function reaches several
SEVERITY = ("listed", "process", "eval", "ctypes", "import", "pickle", "network", "file-write")
#: what unpickling a class, or calling or dropping its instance, runs
CLASS_ENTRY = ("__new__", "__init__", "__setstate__", "__call__", "__setitem__", "append",
               "extend", "__getattr__", "__setattr__", "__hash__", "__eq__", "__del__")
_WRITE_MODES = frozenset("wax+")
MAX_SOURCE = 4 * 2**20      # bytes of one module's source read at most
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


@dataclass(frozen=True)
class Reach:
    """A path from a global to a primitive."""

    kind: str
    path: tuple[str, ...]

    def __str__(self) -> str:
        return f"{MEANS[self.kind]}: {' → '.join(self.path)}"


def _primitive(dotted: str, call: ast.Call | None) -> str | None:
    if dotted in ("builtins.open", "io.open", "os.open", "codecs.open"):
        return "file-write" if call is not None and _writes(dotted, call) else None
    if dotted in ("pathlib.Path.write_text", "pathlib.Path.write_bytes", "pathlib.Path.unlink",
                  "pathlib.Path.rename", "pathlib.Path.replace", "pathlib.Path.rmdir",
                  "pathlib.Path.touch", "pathlib.Path.mkdir", "pathlib.Path.symlink_to"):
        return "file-write"
    if dotted in PRIMITIVES:
        return PRIMITIVES[dotted]
    for prefix, kind in PRIMITIVE_MODULES.items():
        if dotted == prefix or dotted.startswith(
                prefix if prefix in ("os.exec", "os.spawn") else prefix + "."):
            return kind
    return None


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


def find_source(module: str, paths: list[str] | None = None) -> Path | None:
    """The ``.py`` file Python would import ``module`` from, found without importing
    anything: each ``sys.path`` directory (``''``: the current one), packages as directories."""
    parts = module.split(".")
    if len(module) > MAX_NAME or not all(p.isidentifier() for p in parts) \
            or module in sys.builtin_module_names:
        return None
    try:
        return _search(parts, paths if paths is not None else sys.path)
    except (OSError, ValueError):                       # a name too long for the filesystem
        return None


def _search(parts: list[str], paths: list[str]) -> Path | None:
    for entry in paths:
        root = Path(entry or ".")
        if not root.is_dir():
            continue
        base = root.joinpath(*parts[:-1])
        if len(parts) > 1 and not base.is_dir():
            continue
        for candidate in (base / f"{parts[-1]}.py", base / parts[-1] / "__init__.py"):
            if candidate.is_file():
                return candidate
        if (base / parts[-1]).is_dir() or any(base.glob(f"{parts[-1]}.*.so")):
            return None        # a namespace package or an extension: nothing to read here
    return None


@dataclass
class _Module:
    name: str
    package: str
    imports: dict[str, str]
    defs: dict[str, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef]
    assigns: dict[str, ast.expr]
    top_calls: list[ast.Call]


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


class Analyser:
    """Reads sources once per process; ``reach(module, name)`` answers from a cache."""

    def __init__(self, paths: list[str] | None = None,
                 listed: Callable[[str], bool] | None = None) -> None:
        self._paths = paths
        #: whether a dotted name is on the policy's dangerous list: a global that is
        #: another name for one (``tarfile.bltn_open`` is ``builtins.open``) is that global
        self._listed = listed or (lambda dotted: False)
        self._modules: dict[str, _Module | None] = {}
        self._answers: dict[str, Reach | None] = {}
        self._class_binds: dict[int, dict[str, ast.expr]] = {}

    # ---------------------------------------------------------------- modules
    def module(self, name: str) -> _Module | None:
        if name in self._modules:
            return self._modules[name]
        self._modules[name] = None
        src = find_source(name, self._paths)
        if src is None:
            return None
        try:
            if src.stat().st_size > MAX_SOURCE:
                return None
            tree = ast.parse(src.read_bytes(), str(src))
        except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
            return None
        package = name if src.name == "__init__.py" else name.rpartition(".")[0]
        top = [n for n in tree.body]
        for n in tree.body:          # names bound under try/if at module level count too
            if isinstance(n, (ast.If, ast.Try)):
                top += [m for m in ast.walk(n) if isinstance(m, ast.stmt)]
        defs = {n.name: n for n in top
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        assigns = {t.id: n.value for n in top if isinstance(n, ast.Assign)
                   for t in n.targets if isinstance(t, ast.Name)}
        calls = [c for n in tree.body if not _is_main_guard(n) for c in _top_level(n)]
        mod = _Module(name, package, _imports_of(top, package), defs, assigns, calls)
        self._modules[name] = mod
        return mod

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
        dotted = f"{module}.{name}"
        if dotted not in self._answers:
            self._budget = MAX_FUNCTIONS
            self._deadline = time.monotonic() + MAX_SECONDS
            self._seen: set[str] = set()
            try:
                self._answers[dotted] = self._target(dotted, (dotted,), 0, alias=True)
            except (RecursionError, MemoryError, ValueError, OSError):
                self._answers[dotted] = None     # a source too hostile to follow: unknown
        return self._answers[dotted]

    def _target(self, dotted: str, path: tuple[str, ...], depth: int,
                call: ast.Call | None = None, alias: bool = False) -> Reach | None:
        """What calling (or, for a class, instantiating) ``dotted`` can reach."""
        kind = _primitive(dotted, call)
        if kind and depth:
            return Reach(kind, path if path[-1] == dotted else (*path, dotted))
        if depth > MAX_DEPTH or dotted in self._seen or self._budget <= 0 \
                or time.monotonic() > self._deadline:
            return None
        self._seen.add(dotted)
        where = self._locate(dotted)
        if where and not depth:      # importing the module runs its top level first
            found = self._on_import(where[0])
            if found:
                return found
        found = self._in_module(*where, path, depth, alias) if where else None
        if kind:   # the named global is a primitive itself: its own source may say how
            return found if found and found.kind == kind else Reach(kind, path)
        return found

    def _on_import(self, mod: _Module) -> Reach | None:
        """A primitive the module's top level calls directly (``antigravity`` opens a web
        browser when imported). Only direct calls: following every top-level call would
        find ``namedtuple``'s ``eval`` in half the standard library."""
        for c in mod.top_calls:
            dotted = self._resolve(c.func, mod, None, {})
            kind = _primitive(dotted, c) if dotted else None
            if kind:
                return Reach(kind, (f"importing {mod.name}", dotted or ""))
        return None

    def _in_module(self, mod: _Module, attrs: list[str], path: tuple[str, ...],
                   depth: int, alias: bool = False) -> Reach | None:
        """``alias``: ``path`` so far is the named global and the names it re-exports (the
        same object): one on the dangerous list makes the global that list's."""
        head = attrs[0]
        bound = None
        if head in mod.imports:        # a re-export: the global is what the module imported
            bound = mod.imports[head]
        elif head in mod.assigns and isinstance(mod.assigns[head], (ast.Name, ast.Attribute)):
            bound = self._resolve(mod.assigns[head], mod, None, {})
        if bound:
            bound = ".".join([bound, *attrs[1:]])
            if alias and (self._listed(bound) or self._listed(bound.rpartition(".")[0] + ".*")):
                return Reach("listed", (*path, bound))
            return self._target(bound, (*path, bound), depth + 1, alias=alias)
        node = mod.defs.get(head)
        if node is None:
            return None
        if isinstance(node, ast.ClassDef):
            methods = attrs[1:2] or list(CLASS_ENTRY)
            for meth in methods:
                found = self._method(mod, node, meth, set())
                if found is None:
                    continue
                owner, cls, fn = found
                step = f"{owner.name}.{cls.name}.{fn.name}"
                r = self._function(owner, cls, fn, path if path[-1] == step else (*path, step),
                                   depth + 1)
                if r:
                    return r
            return None
        if len(attrs) > 1:
            return None
        return self._function(mod, None, node, path, depth + 1)

    def _method(self, mod: _Module, cls: ast.ClassDef, name: str,
                seen: set[str]) -> tuple[_Module, ast.ClassDef, ast.FunctionDef | ast.AsyncFunctionDef] | None:
        """``name`` on ``cls`` or its bases, as far as their sources can be read."""
        key = f"{mod.name}.{cls.name}"
        if key in seen or len(seen) > 16:
            return None
        seen.add(key)
        for n in cls.body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name:
                return mod, cls, n
        for base in cls.bases:
            dotted = self._resolve(base, mod, None, {})
            if not dotted:
                continue
            where = self._locate(dotted)
            if where is None:
                continue
            bmod, battrs = where
            bcls = bmod.defs.get(battrs[0]) if len(battrs) == 1 else None
            if isinstance(bcls, ast.ClassDef):
                found = self._method(bmod, bcls, name, seen)
                if found:
                    return found
        return None

    # ---------------------------------------------------------------- bodies
    def _function(self, mod: _Module, cls: ast.ClassDef | None,
                  fn: ast.FunctionDef | ast.AsyncFunctionDef, path: tuple[str, ...],
                  depth: int) -> Reach | None:
        self._budget -= 1
        if self._budget < 0:
            return None
        nodes = list(ast.walk(fn))
        local_imports = {**mod.imports, **_imports_of(nodes, mod.package)}
        aliases: dict[str, ast.expr] = {}
        calls: list[ast.Call] = []
        refs: list[ast.Name | ast.Attribute] = []
        for n in nodes:
            if isinstance(n, ast.Call):
                calls.append(n)
            elif isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, ast.Load):
                refs.append(n)
            elif isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name) \
                    and isinstance(n.value, (ast.Name, ast.Attribute, ast.Call)):
                aliases[n.targets[0].id] = n.value   # a call: an instance, whose methods count
        scope = _Scope(mod, cls, local_imports)
        # a reference that is not a call still hands a primitive to whoever calls it
        callees = {id(c.func) for c in calls}
        for ref in refs:
            if id(ref) in callees:
                continue
            dotted = self._resolve(ref, mod, scope, aliases)
            kind = _primitive(dotted, None) if dotted and dotted in PRIMITIVES else None
            if dotted and kind:
                return Reach(kind, (*path, dotted))
        # what this body calls directly first, the worst of it; then what its callees reach
        targets = [(c, d) for c in calls if (d := self._resolve(c.func, mod, scope, aliases))]
        direct = [(SEVERITY.index(k), k, d) for c, d in targets if (k := _primitive(d, c))]
        if direct:
            _, kind, dotted = min(direct)
            return Reach(kind, (*path, dotted))
        roots = {p.split(".")[0] for p in path}
        for c, dotted in targets:
            root = dotted.split(".")[0]
            if root in NOT_FOLLOWED or (root not in roots and len(roots) >= MAX_PACKAGES):
                continue
            r = self._target(dotted, (*path, dotted), depth, c)
            if r:
                return r
        return None

    def _resolve(self, expr: ast.expr, mod: _Module, scope: _Scope | None,
                 aliases: dict[str, ast.expr], hops: int = 0) -> str | None:
        """The dotted name an expression refers to, as far as the source says."""
        if hops > 8:
            return None
        if isinstance(expr, ast.Name):
            n = expr.id
            if n in aliases and aliases[n] is not expr:
                return self._resolve(aliases[n], mod, scope, {k: v for k, v in aliases.items() if k != n},
                                     hops + 1)
            imports = scope.imports if scope else mod.imports
            if n in imports:
                return imports[n]
            if n in mod.defs:
                return f"{mod.name}.{n}"
            if n in mod.assigns and isinstance(mod.assigns[n], (ast.Name, ast.Attribute, ast.Call)):
                return self._resolve(mod.assigns[n], mod, None, {}, hops + 1)
            if hasattr(builtins, n):
                return f"builtins.{n}"
            return None
        if isinstance(expr, ast.Attribute):
            value = expr.value
            if scope and scope.cls is not None and isinstance(value, ast.Name) and value.id in ("self", "cls"):
                return self._self_attr(scope, expr.attr, hops)
            if scope and scope.cls is not None and isinstance(value, ast.Call) \
                    and isinstance(value.func, ast.Name) and value.func.id == "super":
                for parent in scope.cls.bases:
                    dotted = self._resolve(parent, mod, scope, aliases, hops + 1)
                    if dotted:
                        return f"{dotted}.{expr.attr}"
                return None
            owner = self._resolve(value, mod, scope, aliases, hops + 1)
            return f"{owner}.{expr.attr}" if owner else None
        if isinstance(expr, ast.Call):   # X(...).m: the instance's method is the class's
            return self._resolve(expr.func, mod, scope, aliases, hops + 1)
        return None

    def _self_attr(self, scope: _Scope, attr: str, hops: int) -> str | None:
        """``self.attr`` inside a class: its method, or what the class or its methods bind
        to it (``self._builtin_open = open``)."""
        cls, mod = scope.cls, scope.mod
        assert cls is not None
        found = self._method(mod, cls, attr, set())
        if found is not None:
            owner, ocls, fn = found
            return f"{owner.name}.{ocls.name}.{fn.name}"
        value = self._binds(cls).get(attr)
        if value is None:
            return None
        return self._resolve(value, mod, _Scope(mod, None, scope.imports), {}, hops + 1)

    def _binds(self, cls: ast.ClassDef) -> dict[str, ast.expr]:
        """What a class body or its methods bind to a name (``x = ...``, ``self.x = ...``),
        indexed once per class: the first binding that is not ``self``'s own attribute."""
        key = id(cls)
        if key not in self._class_binds:
            out: dict[str, ast.expr] = {}
            for n in ast.walk(cls):
                if not isinstance(n, ast.Assign) or not isinstance(n.value, (ast.Name, ast.Attribute, ast.Call)):
                    continue
                v = n.value
                if isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name) and v.value.id == "self":
                    continue
                for t in n.targets:
                    if isinstance(t, ast.Name):
                        out.setdefault(t.id, v)
                    elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        out.setdefault(t.attr, v)
            self._class_binds[key] = out
        return self._class_binds[key]


@dataclass
class _Scope:
    mod: _Module
    cls: ast.ClassDef | None
    imports: dict[str, str]


_shared: dict[int, Analyser] = {}


def reach(module: str, name: str, listed: Callable[[str], bool] | None = None) -> Reach | None:
    """What ``module.name`` can reach when a pickle calls it; None when nothing found (or no
    source to read). One analyser per process and policy, so each module is parsed once."""
    key = id(getattr(listed, "__self__", listed))
    if key not in _shared:
        _shared[key] = Analyser(listed=listed)
    return _shared[key].reach(module, name)
