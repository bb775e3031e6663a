"""A user's function written alone: its source, what it reads written out, reduced while it fails the same way.

A reproducer cut to one function of the user's (a host callback's logger, the function that draws a value jit
freezes) needs that function without the program around it: its source (dedented; a method inside a bare
class of its own, the instance rebuilt from the attributes it reads), the modules it reads imported (only
jax, numpy and the standard library: anything else is no standalone reproducer), and the other globals and
closure values it reads written as Python literals. :meth:`Standalone.reduce` then shrinks that text with
the source reducer (:class:`jaxdbg.repro.source.SourceReducer`) while a test, run here in this process,
still passes: the raising statement is protected.

Example:
    >>> import numpy as np
    >>> LIMIT = 2.0
    >>> def check(x):
    ...     y = np.abs(x) * 2
    ...     if y.max() > LIMIT:
    ...         raise ValueError(f"too large: {y.max()}")
    >>> alone = standalone(check)
    >>> print(alone.text(), end="")
    import numpy as np
    LIMIT = 2.0
    <BLANKLINE>
    <BLANKLINE>
    def check(x):
        y = np.abs(x) * 2
        if y.max() > LIMIT:
            raise ValueError(f'too large: {y.max()}')
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import functools
import inspect
import io
import math
import signal
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from jaxdbg.jaxpr.emit import EmitError, array_expr
from jaxdbg.repro.source import SourceReducer, parse

ALLOWED_PACKAGES = ("jax", "numpy")  # besides the standard library
LITERAL_CHARS = 2000  # a literal longer than this is no small reproducer
CHECK_SECONDS = 2.0  # one in-process check of a candidate (a call of the user's function): longer is a hang


class NotStandalone(Exception):
    """Why a function cannot be written alone (the message says what it reads)."""


@dataclass(frozen=True)
class Standalone:
    """``text()`` defines what ``name`` calls (``check``, ``logger``, ``saver.save``): imports, literal globals,
    the definition, and (a method) its instance."""

    name: str
    prelude: tuple[str, ...]
    definition: str
    postlude: tuple[str, ...] = ()
    raise_line: int | None = None  # the raising line inside ``definition`` (1-based), when it is there

    def text(self) -> str:
        return "\n".join([*self._head(), self.definition.rstrip("\n"), *self.postlude]) + "\n"

    def _head(self) -> list[str]:
        """The prelude, two blank lines after it (the definition keeps its own leading blank lines)."""
        return [*self.prelude, "", ""] if self.prelude else []

    @property
    def protected_line(self) -> int | None:
        return None if self.raise_line is None else len(self._head()) + self.raise_line

    def reduce(self, fails: Any, seconds: float = 10.0) -> Standalone:
        """The text shrunk while ``fails(namespace)`` (after executing it) holds; one text, no parts."""
        def test(states: Any) -> list[bool]:
            return [_runs_and_fails(state.text, fails) for state in states]

        if not _runs_and_fails(self.text(), fails):
            raise NotStandalone("written alone, it does not fail the same way")
        if threading.current_thread() is not threading.main_thread():
            return self  # no alarm to stop a candidate that loops forever (an edit can drop a loop's step)
        reducer = SourceReducer(self.text(), self.protected_line, test, deadline=time.perf_counter() + seconds)
        text = reducer.run()
        protected = reducer.state.protected
        return Standalone(self.name, (), text, (), protected.lineno if protected is not None else None)


class _TooSlow(BaseException):
    """Raised by the alarm into a candidate that runs too long (a BaseException: user code may catch Exception)."""


def _runs_and_fails(text: str, fails: Any) -> bool:
    """Execute ``text`` and ask ``fails``; a candidate that runs past CHECK_SECONDS does not count."""
    namespace: dict = {"__name__": "__jaxdbg_standalone__"}
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), _alarm(CHECK_SECONDS):
        try:
            exec(compile(text, "<standalone>", "exec"), namespace)  # noqa: S102 - the user's own function
            return bool(fails(namespace))
        except _TooSlow:
            return False
        except Exception:  # noqa: BLE001 - a candidate that does not even define the function
            return False


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    """Raise _TooSlow after ``seconds`` (main thread only: elsewhere no alarm can be set, and none is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise _TooSlow()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except _TooSlow:
        pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def standalone(function: Any, raised_at: int | None = None, name: str | None = None) -> Standalone:
    """``function`` (a function, bound method, callable instance or ``functools.partial`` of one) written alone;
    ``raised_at``: the line (in its file) that raised, to be protected. Raises NotStandalone."""
    partial_args: tuple = ()
    if isinstance(function, functools.partial):
        if function.keywords:
            raise NotStandalone("a functools.partial with keywords")
        function, partial_args = function.func, function.args
    owner = None
    if inspect.ismethod(function):
        owner, function = function.__self__, function.__func__
    elif not inspect.isfunction(function) and inspect.isfunction(vars(type(function)).get("__call__")):
        owner, function = function, type(function).__call__
    if not inspect.isfunction(function):
        raise NotStandalone(f"{type(function).__name__} objects have no Python source")
    try:
        lines, start = inspect.getsourcelines(function)
    except (OSError, TypeError) as err:
        raise NotStandalone(f"no source ({err})") from None
    definition = textwrap.dedent("".join(lines))
    tree = parse(definition)
    node = tree.body[0] if tree.body else None
    if not isinstance(node, ast.FunctionDef) or node.name != function.__name__:
        raise NotStandalone("a lambda or a generated function")
    node.decorator_list = []
    raise_line = raised_at - start + 1 if raised_at is not None and 0 <= raised_at - start < len(lines) else None
    definition = ast.unparse(tree) if raise_line is None else _without_decorators(definition, node)
    reads = _free_names(node)
    closure = dict(zip(function.__code__.co_freevars, (c.cell_contents for c in function.__closure__ or ())))
    values = {n: closure[n] if n in closure else function.__globals__[n] for n in reads
              if n in closure or n in function.__globals__}
    prelude = ["import numpy as np"] + [_binding(n, v) for n, v in values.items()]
    missing = [n for n in reads if n not in values and not hasattr(builtins, n)]
    if missing:
        raise NotStandalone(f"it reads {', '.join(missing)}, bound nowhere it can see")
    if owner is None and not partial_args:
        return Standalone(name or function.__name__, tuple(dict.fromkeys(prelude)), definition, (), raise_line)
    return _with_owner(owner, function, partial_args, definition, prelude, raise_line, name)


def _with_owner(owner: Any, function: Any, partial_args: tuple, definition: str, prelude: list,
                raise_line: int | None, name: str | None) -> Standalone:
    """A method inside a bare class of its own (the instance rebuilt from the attributes it reads), or a partial."""
    if owner is None:
        callable_name = name or f"{function.__name__}_"
        bound = ", ".join(literal(a) for a in partial_args)
        post: tuple[str, ...] = (f"{callable_name} = functools.partial({function.__name__}, {bound})",)
        return Standalone(callable_name, tuple(dict.fromkeys(["import functools", *prelude])), definition, post,
                          raise_line)
    cls = type(owner)
    state = getattr(owner, "__dict__", None)
    if state is None or partial_args:
        raise NotStandalone(f"a {cls.__name__} without __dict__ (slots) or a partial of a method")
    attributes = sorted({n.attr for n in ast.walk(parse(definition)) if isinstance(n, ast.Attribute)
                         and isinstance(n.value, ast.Name) and n.value.id == "self"})
    class_body = []
    for attribute in attributes:
        if attribute in state:
            continue
        value = inspect.getattr_static(cls, attribute, None)
        if value is None or callable(value) or isinstance(value, (property, staticmethod, classmethod)):
            raise NotStandalone(f"it uses self.{attribute}, which is not a plain attribute")
        class_body.append(f"    {attribute} = {literal(value)}")
    indented = textwrap.indent(definition, "    ")
    header = f"class {cls.__name__}:\n" + "".join(line + "\n" for line in class_body)
    instance = name or cls.__name__.lower()
    values = {a: state[a] for a in attributes if a in state}
    post = (f"{instance} = {cls.__name__}.__new__({cls.__name__})",
            f"{instance}.__dict__.update({literal(values)})")
    shift = header.count("\n")
    called = instance if function.__name__ == "__call__" else f"{instance}.{function.__name__}"
    return Standalone(called, tuple(dict.fromkeys(prelude)), header + indented, post,
                      raise_line + shift if raise_line is not None else None)


def _without_decorators(definition: str, node: ast.FunctionDef) -> str:
    """The definition's text from its ``def`` line on (decorators apply to the program, not to the function),
    keeping the original lines so the raising line keeps its place."""
    rows = definition.splitlines()
    first = node.lineno - 1
    return "\n".join([""] * first + rows[first:]) + "\n"


def _free_names(node: ast.FunctionDef) -> list[str]:
    """Names the function reads but does not bind itself (parameters, assignments, inner definitions)."""
    bound = {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
    read: list[str] = []
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            (read.append(child.id) if isinstance(child.ctx, ast.Load) else bound.add(child.id))
        elif isinstance(child, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)) and child is not node:
            bound.add(child.name)
        elif isinstance(child, ast.alias):
            bound.add((child.asname or child.name).split(".")[0])
        elif isinstance(child, ast.ExceptHandler) and child.name:
            bound.add(child.name)
        elif isinstance(child, ast.arg):
            bound.add(child.arg)
    return [n for n in dict.fromkeys(read) if n not in bound]


def _binding(name: str, value: Any) -> str:
    """``import numpy as np``, ``from math import sqrt`` or ``NAME = <literal>`` for a global the function reads."""
    if inspect.ismodule(value):
        _allowed(value.__name__, name)
        return f"import {value.__name__}" if name == value.__name__ else f"import {value.__name__} as {name}"
    module = getattr(value, "__module__", None)
    if (inspect.isfunction(value) or inspect.isbuiltin(value) or inspect.isclass(value)) and module:
        _allowed(module, name)
        exported = getattr(value, "__name__", "")
        if getattr(sys.modules.get(module), exported, None) is not value:
            raise NotStandalone(f"it reads {name}, which {module} does not export by that name")
        alias = "" if name == exported else f" as {name}"
        return f"from {module} import {exported}{alias}"
    return f"{name} = {literal(value)}"


def _allowed(module: str, name: str) -> None:
    top = module.split(".")[0]
    if top not in ALLOWED_PACKAGES and top not in sys.stdlib_module_names:
        raise NotStandalone(f"it reads {name} from {top} (a reproducer imports only jax, numpy and the stdlib)")


def literal(value: Any) -> str:
    """A Python expression rebuilding ``value``; raises NotStandalone where there is none (or it is long)."""
    text = _literal_of(value)
    if len(text) > LITERAL_CHARS:
        raise NotStandalone(f"a value of {len(text)} characters")
    return text


def _literal_of(value: Any) -> str:
    """A Python expression rebuilding ``value`` (numbers, strings, containers of them, small arrays)."""
    if value is None or (isinstance(value, (bool, str, bytes, int)) and not isinstance(value, np.generic)):
        return repr(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else f"float('{value}')"
    if isinstance(value, (list, tuple, set)):
        items = [_literal_of(v) for v in value]
        if isinstance(value, list):
            return "[" + ", ".join(items) + "]"
        if isinstance(value, set):
            return "{" + ", ".join(items) + "}" if items else "set()"
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_literal_of(k)}: {_literal_of(v)}" for k, v in value.items()) + "}"
    if hasattr(value, "__array__") and hasattr(value, "dtype"):
        try:
            return array_expr(np.asarray(value))
        except EmitError as err:
            raise NotStandalone(str(err)) from None
    raise NotStandalone(f"a {type(value).__name__} value, which has no literal")

