"""The ``hpcml`` command's entry point (errors become their message in ``hpcml.cli_report``).

Light on purpose: ``hpcml env run`` sits in front of every container start (once per
task under srun), so it takes a path that imports no CLI framework; every other command
goes to the Typer app in ``hpcml.cli_app``, whose groups (``hpcml.cli_support.Group``)
end a command that raised an ``HpcmlError`` through :func:`report`.
"""

from __future__ import annotations

import sys
from types import ModuleType

from hpcml import version
from hpcml.cli_report import report


def __getattr__(name: str):
    if name == "app":                      # ``from hpcml.cli import app`` (tests, plugins)
        from hpcml.cli_app import app
        return app
    raise AttributeError(name)


#: command words -> the module of their Typer-free fast path
FAST_PATHS = ((("env", "run"), "hpcml.env.fastrun"), (("scan",), "hpcml.scan.fastscan"),
              (("vet",), "hpcml.vet.fastvet"), (("run",), "hpcml.run.fastrun"))
#: top-level commands that a component's app holds (``hpcml run``, ``hpcml report``)
TOP_LEVEL = {"run": "run", "report": "run"}


def components() -> tuple[str, ...]:
    """The components: hpcml's packages with a ``cli`` package (``hpcml <component> ...``),
    found on disk so a new one needs no list here (and nothing is imported to find them)."""
    from pathlib import Path
    root = Path(__file__).parent
    return tuple(sorted(p.parent.parent.name for p in root.glob("*/cli/__init__.py")))


def main() -> None:
    """The ``hpcml`` program; Ctrl-C anywhere (even while it starts) is one line and exit 130,
    never a traceback."""
    code: str | int | None = 0
    try:
        _main()
    except KeyboardInterrupt:
        print("hpcml: interrupted", file=sys.stderr)
        code = 130
    except SystemExit as exc:
        code = exc.code
    _exit(code)


#: native libraries whose C++ thread pools can abort the process while the interpreter tears
#: them down ("terminate called without an active exception", apache/arrow#34314)
NATIVE_POOLS = ("pyarrow", "duckdb")


def _exit(code: str | int | None) -> None:
    """End the program with ``code`` once its work is done.

    With Arrow loaded, a finished command can still die of SIGABRT in the C++ static
    destructors that run after Python's (a pool thread still joinable): the output was
    whole, the exit status says it crashed. So, with such a library loaded, do what
    interpreter shutdown does that matters here (join non-daemon threads, run ``atexit``
    handlers, flush stdout and stderr) and leave with ``os._exit``, skipping the native
    teardown. Without one, the ordinary ``sys.exit``.
    """
    if not any(name in sys.modules for name in NATIVE_POOLS):
        sys.exit(code)
    import atexit
    import os
    import threading
    if code is None:
        code = 0
    elif not isinstance(code, int):         # sys.exit("message"): print it, status 1
        print(code, file=sys.stderr)
        code = 1
    main_thread = threading.main_thread()
    for thread in threading.enumerate():
        if thread is not main_thread and not thread.daemon and thread.is_alive():
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):       # a closed pipe: CPython's own shutdown says 120
            code = code or 120
    os._exit(code & 0xFF)


def _fast_path(argv: list[str]) -> tuple[ModuleType | None, list[str]]:
    """The module that runs this command line without Typer, if any, and its arguments: ``hpcml env run``
    (every container start), ``hpcml scan FILE`` (CI loops, a scan before each load), ``hpcml vet
    PROTOCOL`` and ``hpcml run`` (every job's start).
    Each has ``wants(args)``, ``main(args)``, ``PROG`` and ``FLAGS``; --help goes to Typer."""
    for words, module in FAST_PATHS:
        if argv[:len(words)] == list(words):
            fast, args = __import__(module, fromlist=["main"]), argv[len(words):]
            return (fast if fast.wants(args) else None), args
    return None, argv


def _main() -> None:
    argv = sys.argv[1:]
    if argv in (["--version"], ["-V"]):
        print(f"hpcml {version()}")
        return
    fast, args = _fast_path(argv)
    if fast is not None:
        from hpcml.errors import HpcmlError
        try:
            code = fast.main(args)
        except HpcmlError as exc:
            code = report(fast.PROG, exc, fast.FLAGS)
        sys.exit(code)
    word = argv[0] if argv else ""
    # only the component's own CLI: the others' imports (numpy, pyarrow, ...) cost every
    # command a quarter of a second otherwise
    if word in TOP_LEVEL:
        import importlib
        importlib.import_module(f"hpcml.{TOP_LEVEL[word]}.cli").app(args=argv, prog_name="hpcml")
        return
    if word and word not in TOP_LEVEL.values() and word in components():
        import importlib
        importlib.import_module(f"hpcml.{word}.cli").app(args=argv[1:], prog_name=f"hpcml {word}")
        return
    from hpcml.cli_app import app
    app()
