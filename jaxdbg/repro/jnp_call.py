"""A ``jax.numpy`` call that raised by itself, before binding any primitive, written out alone.

Many shape errors never reach a primitive's rules: ``jnp.reshape`` checks the sizes, ``jnp.einsum`` the
labels, ``jnp.split`` the division, ``jnp.take_along_axis`` the ranks, and raise a ``TypeError`` or
``ValueError`` from their own code. The traceback still holds the call: the outermost frame, below the last
frame of the user's (or a framework's) code, whose code object is a public function of ``jax.numpy``,
``jax.numpy.linalg``, ``jax.nn``, ``jax.lax`` or a method of JAX arrays. Its parameters, read from that frame,
give the call: arrays become inputs of the recorded shapes and dtypes (or values), everything else is written
as a Python literal. A function may have reassigned a parameter before raising (``jnp.einsum`` puts the
subscripts in front of the operands); the written call is kept only once it raises the same exception type
with the same normalised message (:func:`jaxdbg.repro.operation.cut_operation`).

Example:
    >>> import jax, jax.numpy as jnp
    >>> try:
    ...     jax.jit(lambda x: jnp.reshape(x, (3, 5)))(jnp.ones(16))
    ... except TypeError as err:
    ...     call = failing_call(err)
    >>> call.spelling, call.call_text(["a"])
    ('jnp.reshape', 'jnp.reshape(a, (3, 5))')
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import core

from jaxdbg._source import SourceLocation, is_user_file
from jaxdbg.jaxpr.emit import EmitError, EmittedFunction, Names, param_expr
from jaxdbg.repro.call_program import OperationProgram, avals_text, programs_of
from jaxdbg.repro.frames import concrete, exception_chain, tb_frames_with_lines, under_jax

# Public modules whose functions are written as calls, with their spelling in the reproducer (jnp first: a
# function both spell is written as jnp's).
_MODULES = (("jax.numpy", "jnp"), ("jax.numpy.linalg", "jnp.linalg"), ("jax.numpy.fft", "jnp.fft"),
            ("jax.nn", "jax.nn"), ("jax.lax", "lax"))


@dataclass
class FailedCall:
    """One public JAX function (or array method, ``spelling`` ``.name``) called with ``arguments`` that raised."""

    spelling: str
    arguments: list  # (kind, name, value): kind in positional, keyword, varargs, varkw
    source: SourceLocation | None
    stage: str = "tracing"

    @property
    def label(self) -> str:
        """``jnp.reshape``, ``Array.reshape`` for a method."""
        return ("Array" if self.spelling.startswith(".") else "") + self.spelling

    @property
    def arrays(self) -> list:
        """The array arguments, in the order the written call names them."""
        found: list = []
        for _, _, value in self.arguments:
            _collect_arrays(value, found)
        return found

    @property
    def avals(self) -> list:
        return [a.aval if not isinstance(a, np.ndarray) else core.ShapedArray(a.shape, a.dtype) for a in self.arrays]

    @property
    def values(self) -> list:
        return [concrete(a) for a in self.arrays]

    def call_text(self, names: list[str]) -> str:
        """The call, arrays named by ``names`` in order (raises EmitError for a value with no Python spelling)."""
        pending = iter(names)
        positional, keywords = [], []
        for kind, name, value in self.arguments:
            if kind == "positional":
                positional.append(_write(value, pending))
            elif kind == "varargs":
                positional.extend(_write(v, pending) for v in value)
            elif kind == "keyword":
                keywords.append(f"{name}={_write(value, pending)}")
            else:
                keywords.extend(f"{k}={_write(v, pending)}" for k, v in value.items())
        if self.spelling.startswith("."):
            receiver, *positional = positional
            return f"{receiver}{self.spelling}({', '.join(positional + keywords)})"
        return f"{self.spelling}({', '.join(positional + keywords)})"


def _is_array(value: Any) -> bool:
    return isinstance(value, (jax.Array, jax.core.Tracer, np.ndarray))


def _collect_arrays(value: Any, found: list) -> None:
    if _is_array(value):
        found.append(value)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _collect_arrays(item, found)


def _write(value: Any, names: Iterator[str]) -> str:
    if _is_array(value):
        return next(names)
    if value is Ellipsis:
        return "..."
    if isinstance(value, (list, tuple)) and any(_is_array(v) for v in value):
        items = [_write(v, names) for v in value]
        if isinstance(value, list):
            return "[" + ", ".join(items) + "]"
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    return param_expr(value)


@functools.lru_cache(maxsize=1)
def _public_functions() -> dict[Any, tuple[str, Any]]:
    """Code object -> (spelling, function) of every public function of ``_MODULES`` and every method of JAX
    arrays (the function a jitted or wrapped one runs: the frame's code is its)."""
    spelled: dict[Any, tuple[str, Any]] = {}
    for module_name, prefix in _MODULES:
        module = importlib.import_module(module_name)
        for name in dir(module):
            function = _python_function(getattr(module, name, None)) if not name.startswith("_") else None
            if function is not None:
                spelled.setdefault(function.__code__, (f"{prefix}.{name}", function))
    array_type = type(jnp.zeros(()))
    for name in dir(array_type):
        function = _python_function(getattr(array_type, name, None)) if not name.startswith("_") else None
        if function is not None and function.__code__.co_varnames[:1] == ("self",):
            spelled.setdefault(function.__code__, (f".{name}", function))
    return spelled


def _python_function(obj: Any) -> Any:
    try:
        function = inspect.unwrap(obj) if callable(obj) else None
    except ValueError:  # a __wrapped__ cycle
        return None
    return function if inspect.isfunction(function) else None


def failing_call(err: BaseException) -> FailedCall | None:
    """The public JAX function (or array method) the user's code called, in whose code ``err`` was raised
    with only JAX below it; None when the raise is not under one (or the user's own code is deeper)."""
    spelled = _public_functions()
    for exc in exception_chain(err):
        frames = list(tb_frames_with_lines(exc.__traceback__))
        users = [k for k, (f, _) in enumerate(frames) if not under_jax(f.f_code.co_filename)]
        first = users[-1] + 1 if users else 0
        for k in range(first, len(frames)):
            frame = frames[k][0]
            found = spelled.get(frame.f_code)
            if found is None:
                continue
            spelling, function = found
            arguments = _arguments(function, frame.f_locals)
            if arguments is None:
                return None
            source = next((SourceLocation(f.f_code.co_filename, line, f.f_code.co_name)
                           for f, line in reversed(frames[:k]) if is_user_file(f.f_code.co_filename)), None)
            return FailedCall(spelling, arguments, source)
    return None


def _arguments(function: Any, local: dict) -> list | None:
    """(kind, name, value) of ``function``'s parameters as its frame holds them, as a call would pass them:
    parameters left at their default are left out (after one, the rest go by keyword)."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None
    arguments: list = []
    by_keyword = False
    for name, param in signature.parameters.items():
        if name not in local and param.default is param.empty:
            return None
        value = local.get(name, param.default)  # a parameter the function deleted (`del copy`): unused
        if param.kind is param.VAR_POSITIONAL:
            if by_keyword:
                return None
            arguments.append(("varargs", name, _without_repeated_front(tuple(value), arguments)))
        elif param.kind is param.VAR_KEYWORD:
            arguments.append(("varkw", name, dict(value)))
        elif param.default is not param.empty and _same(value, param.default):
            by_keyword = by_keyword or param.kind is not param.KEYWORD_ONLY
        elif param.kind is param.KEYWORD_ONLY or (by_keyword and param.kind is param.POSITIONAL_OR_KEYWORD):
            arguments.append(("keyword", name, value))
        elif by_keyword:  # a positional-only parameter after one left at its default: not writable
            return None
        else:
            arguments.append(("positional", name, value))
    return arguments


def _without_repeated_front(values: tuple, arguments: list) -> tuple:
    """``*operands`` once a function has put its own positional parameters back in front of them
    (``operands = (subscripts, *operands)``, as ``jnp.einsum`` does)."""
    front = [v for kind, _, v in arguments if kind == "positional"]
    if front and len(values) >= len(front) and all(a is b for a, b in zip(values, front)):
        return values[len(front):]
    return values


def _same(value: Any, default: Any) -> bool:
    if value is default:
        return True
    if _is_array(value) or _is_array(default):
        return False
    try:
        return bool(type(value) is type(default) and value == default)
    except Exception:  # noqa: BLE001 - a comparison that does not give one bool: not the same
        return False


def writable(call: FailedCall, names: list[str]) -> str | None:
    """The call's text, or None when some argument has no Python spelling."""
    try:
        return call.call_text(names)
    except (EmitError, StopIteration):
        return None


def call_programs(call: FailedCall, exc_type: str, origin: str) -> Iterator[OperationProgram]:
    """Reproducers of the call to try: zeros of the recorded shapes and dtypes, then the recorded values."""
    avals = call.avals
    fresh = Names()
    names = [fresh.fresh() for _ in avals]
    text = writable(call, names)
    if text is None:
        return
    emitted = EmittedFunction("f", f"def f({', '.join(names)}):\n    return {text}\n", tuple(names), False)
    title = f"{call.label}({avals_text(avals)})"
    yield from programs_of(emitted, avals, call.values, docstring_parts=(
        title, "call", call.source, f"{exc_type} while {call.stage}", origin))
