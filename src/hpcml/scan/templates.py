"""A Jinja2 template a model file carries (a GGUF ``tokenizer.chat_template``), judged by
what it does, read with Jinja2's own parser.

Why not a keyword list: an escape can spell every name it needs at render time
(``lipsum[('_' * 2) ~ 'globals' ~ ('_' * 2)]``, ``x|attr(name)``), so no list of words finds
it. What a template can reach is decided by its syntax tree: a name it looks up, an
attribute or item it takes, a filter it applies, another template it loads. A chat
template needs only its conversation (``messages``, ``message['role']``), loops, tests,
string filters and ``namespace()`` for a flag; an escape needs a computed or private
attribute, or one of Jinja2's own objects (``lipsum``, ``cycler``, ``joiner``, ``self``)
as a way into Python. The first is ``safe``, the second ``dangerous``, whatever its
spelling. Written by hand on top of ``jinja2.nodes``: no scanner of the field parses the
template (they match words).
"""

from __future__ import annotations

from typing import Any

from hpcml.scan.model import Verdict

Problem = tuple[Verdict, str]

#: Jinja2's global objects: functions whose Python internals an escape reaches through
#: (``lipsum.__globals__``, ``cycler.__init__.__globals__``); ``self``, the template itself
_INTERNAL_NAMES = frozenset({"lipsum", "cycler", "joiner", "self", "range", "dict"})
#: of those, the ones a chat template may call (and only call)
_CALLABLE_ONLY = frozenset({"cycler", "joiner", "range", "dict"})
#: filters that look attributes up by a name they are given (``attribute=`` or their argument)
_BY_NAME = frozenset({"map", "selectattr", "rejectattr", "groupby", "sort", "sum", "unique", "min", "max"})
#: str methods that look attributes up from their format string ("{0.__class__}")
_FORMATTERS = frozenset({"format", "format_map"})
#: attributes without an underscore that still lead to a frame's globals and builtins
#: (``(x|map('string')).gi_frame.f_builtins['eval']``: Jinja2's filters return generators)
_INTERPRETER_ATTRS = frozenset({"gi_frame", "gi_code", "gi_yieldfrom", "cr_frame", "cr_code", "ag_frame", "ag_code",
                                "f_globals", "f_builtins", "f_locals", "f_back", "f_code", "tb_frame", "tb_next",
                                "func_globals", "func_code", "im_func", "im_self", "mro"})
#: the attributes of ``loop`` and the arithmetic a computed index may use
_ARITHMETIC = ("Add", "Sub", "Mul", "FloorDiv", "Mod", "Neg", "Pos")


def judge(text: str) -> Problem | None:
    """The problem with rendering ``text``, or None when it uses only what a chat template
    uses. A template Jinja2 cannot parse is an error a loader meets too (no code runs)."""
    import jinja2
    from jinja2 import nodes
    try:
        tree = jinja2.Environment().parse(text)
    except jinja2.TemplateSyntaxError as exc:
        return (Verdict.ERROR, f"not a template Jinja2 parses (line {exc.lineno}: {exc.message})")
    except RecursionError:
        return (Verdict.ERROR, "a template nested too deeply for Jinja2's parser")
    called = {id(n.node) for n in tree.find_all(nodes.Call)}
    loads = next(iter(tree.find_all((nodes.Include, nodes.Import, nodes.FromImport, nodes.Extends))), None)
    if loads is not None:
        return (Verdict.DANGEROUS, f"{type(loads).__name__.lower()} of another template: a loader's files, not the chat")
    for name in tree.find_all(nodes.Name):
        if name.name in _INTERNAL_NAMES and (name.name not in _CALLABLE_ONLY or id(name) not in called):
            return (Verdict.DANGEROUS, f"reaches for Jinja2's own {name.name!r} (a way into the interpreter)")
    for attr in tree.find_all(nodes.Getattr):
        if attr.attr.startswith("_") or attr.attr in _INTERPRETER_ATTRS:
            return (Verdict.DANGEROUS, f"reads the interpreter's attribute {attr.attr!r}")
        if attr.attr in _FORMATTERS and id(attr) in called:
            return (Verdict.DANGEROUS, f"calls str.{attr.attr}, whose format string can read attributes")
    for item in tree.find_all(nodes.Getitem):
        problem = _key_problem(item.arg)
        if problem:
            return (Verdict.DANGEROUS, problem)
    for filt in tree.find_all(nodes.Filter):
        problem = _filter_problem(filt)
        if problem:
            return (Verdict.DANGEROUS, problem)
    return None


def _key_problem(key: Any) -> str | None:
    """A subscript's key: Jinja2's ``x[key]`` falls back to ``getattr(x, key)`` for text, so
    a key is a literal, a slice, or integer arithmetic on literals and ``loop``."""
    from jinja2 import nodes
    if isinstance(key, nodes.Const):
        if isinstance(key.value, str) and (key.value.startswith("_") or key.value in _INTERPRETER_ATTRS):
            return f"reads the interpreter's item or attribute {key.value!r}"
        return None
    if isinstance(key, nodes.Slice):
        parts = [p for p in (key.start, key.stop, key.step) if p is not None]
        return next((p for p in (_key_problem(x) for x in parts) if p), None) if all(_integer(x) for x in parts) \
            else "a slice computed from something other than numbers"
    return None if _integer(key) else "an item or attribute whose name is computed while it renders"


def _integer(node: Any) -> bool:
    """An expression that can only be a number: literals, ``loop`` counters, arithmetic."""
    from jinja2 import nodes
    if isinstance(node, nodes.Const):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, nodes.Getattr) and isinstance(node.node, nodes.Name) and node.node.name == "loop":
        return node.attr in ("index", "index0", "revindex", "revindex0", "length", "depth", "depth0")
    if type(node).__name__ in _ARITHMETIC:
        return all(_integer(c) for c in node.iter_child_nodes())
    if isinstance(node, nodes.Filter) and node.name in ("length", "count", "int") and node.node is not None:
        return not node.args and not node.kwargs
    return False


def _filter_problem(node: Any) -> str | None:
    from jinja2 import nodes
    if node.name == "attr":
        return "the attr filter: an attribute looked up by a name given while it renders"
    if node.name in _BY_NAME:
        names = [kw.value for kw in node.kwargs if kw.key == "attribute"]
        if node.name in ("selectattr", "rejectattr") and node.args:
            names.append(node.args[0])
        for n in names:
            if not isinstance(n, nodes.Const) or not isinstance(n.value, (str, int)):
                return f"the {node.name} filter with an attribute name computed while it renders"
            if any(str(part).startswith("_") or part in _INTERPRETER_ATTRS for part in str(n.value).split(".")):
                return f"the {node.name} filter reads the private attribute {n.value!r}"
    return None
