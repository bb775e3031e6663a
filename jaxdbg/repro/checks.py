"""Runtime checks that fire inside jit (``eqx.error_if``, ``checkify.check``): the values that made them fire.

Such a check raises a fixed message whatever made its condition true, so "same type and message" also holds
for a candidate whose condition now fires for another reason (``jnp.abs(targets - 1) > 1e-3`` on one-hot rows
instead of ``jnp.abs(targets.sum(-1) - 1) > 1e-3`` on mis-smoothed labels): the user's bug cut, the message kept.
A reproducer must keep both the check as written (its statement is kept like the raising one) and what it
tested: while :func:`recorded_checks` is active (in a contained child only; restored in ``finally``), each
check called from user code also hands the arrays its condition reads (by name, on its source line) to a host
callback that the condition depends on, so they are read before the check can raise. The first time a check
fires, :class:`CheckFired` carries their distinct values (rounded, see :func:`value_summary`) and the share of
the elements each holds, and their shapes; a candidate must show the same values in about the same shares, in
rows of the same width (a smaller batch of the same rows passes; other rows, or a one-hot of another width, do
not).

Example:
    >>> value_summary(np.array([[0.0111111, 0.911111], [0.0111111, 0.911111]]))
    (0.01111, 0.9111)
    >>> value_summary(np.arange(40.0))[:2]
    ('range', 0.0)
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import linecache
import sys
import threading
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdbg._source import SourceLocation, is_user_path
from jaxdbg.repro.messages import CheckFired

# The checks: (module, attribute, index of the condition among the positional arguments, whether it raises where
# the condition is true: eqx.error_if(x, pred, msg) does, checkify.check(pred, msg) where it is false).
CHECKS = (("equinox", "error_if", 1, True), ("equinox", "branched_error_if", 1, True),
          ("jax.experimental.checkify", "check", 0, False))
DISTINCT = 16  # up to this many distinct values are compared one by one; beyond, their range and count


def value_summary(value: Any) -> tuple:
    """The distinct values of an array, rounded to 4 significant digits (up to DISTINCT of them; beyond that
    their range and how many there are): what a candidate's array must show again."""
    return value_profile(value)[0]


def value_profile(value: Any) -> tuple[tuple, tuple[float, ...]]:
    """:func:`value_summary` and, where it lists the values one by one, the share of the elements each holds
    (3 decimals): a one-hot row of width 10 is 90% zeros, one of width 2 half; a smaller batch of the same rows
    keeps both.

    Example:
        >>> value_profile(np.eye(10)[[3, 7]])
        ((0.0, 1.0), (0.9, 0.1))
        >>> value_profile(np.arange(40.0))[1]
        ()
    """
    array = np.asarray(value)
    distinct: np.ndarray
    counts: np.ndarray
    if array.dtype == bool or np.issubdtype(array.dtype, np.integer):
        distinct, counts = np.unique(array, return_counts=True)
    else:  # (rounded at once, then each distinct value as it prints: a big array stays fast)
        floats = array.astype(np.float64).ravel()
        with np.errstate(all="ignore"):
            scale = 10.0 ** (np.floor(np.log10(np.abs(floats))) - 3)
            rounded = np.where(np.isfinite(scale) & (scale > 0), np.round(floats / scale) * scale, floats)
        merged: dict[float, int] = {}
        for x, count in zip(*np.unique(rounded, return_counts=True)):
            key = float(f"{x:.4g}")
            merged[key] = merged.get(key, 0) + int(count)
        order = sorted(merged, key=lambda x: (np.isnan(x), x))
        distinct, counts = np.asarray(order), np.asarray([merged[x] for x in order])
    if distinct.size <= DISTINCT:
        total = max(int(counts.sum()), 1)
        return tuple(x.item() for x in distinct), tuple(round(int(c) / total, 3) for c in counts)
    return ("range", distinct[0].item(), distinct[-1].item(), int(distinct.size)), ()


def condition_names(file: str, line: int, function: str, at: int) -> tuple[str, ...]:
    """The names the condition argument (position ``at``) of the call of ``function`` on ``line`` reads."""
    lines = linecache.getlines(file)
    try:
        tree = ast.parse("".join(lines))
    except SyntaxError:
        return ()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.lineno <= line <= (node.end_lineno or node.lineno)):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if name == function and at < len(node.args):
            found = [n.id for n in ast.walk(node.args[at]) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
            return tuple(dict.fromkeys(found))
    return ()


class _Recorder:
    def __init__(self, channel: Any):
        self.channel = channel
        self.sent: set[tuple[str, int]] = set()
        self.lock = threading.Lock()

    def wrap(self, check: Any, function: str, at: int, raises_if: bool) -> Any:
        def checked(*args: Any, **kwargs: Any) -> Any:
            frame = sys._getframe(1)
            if at < len(args) and is_user_path(frame.f_code.co_filename):
                with contextlib.suppress(Exception):  # a check we cannot read is left as it is
                    args = (*args[:at], self._watched(args[at], frame, function, at, raises_if), *args[at + 1:])
            return check(*args, **kwargs)
        checked.__wrapped__ = check  # type: ignore[attr-defined]
        return checked

    def _watched(self, pred: Any, frame: Any, function: str, at: int, raises_if: bool) -> Any:
        """``pred`` made to depend on a host callback that receives it and the arrays its expression reads."""
        if not isinstance(pred, (jax.Array, np.ndarray)):
            return pred
        where = SourceLocation(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
        names, arrays = [], []
        for name in condition_names(where.file, where.line, function, at):
            value = frame.f_locals.get(name, frame.f_globals.get(name))
            if isinstance(value, (jax.Array, np.ndarray)) and getattr(value, "dtype", None) is not None:
                names.append(name)
                arrays.append(jax.lax.stop_gradient(value))
        if not arrays:
            return pred

        def record(fired: np.ndarray, *values: np.ndarray) -> np.ndarray:
            key = (where.file, where.line)
            if np.any(fired):
                with self.lock:
                    first = key not in self.sent
                    self.sent.add(key)
                if first:
                    profiles = [value_profile(v) for v in values]
                    self.channel.send(CheckFired(where, tuple(names), tuple(p[0] for p in profiles),
                                                 tuple(p[1] for p in profiles), tuple(np.shape(v) for v in values)))
            return np.ones((), bool)

        def read(operands: tuple) -> jax.Array:
            return jax.pure_callback(record, jax.ShapeDtypeStruct((), jnp.bool_), *operands, vmap_method="sequential")

        # Only a check that fires sends its arrays to the host (a training loop's other steps pay nothing), and
        # the check now waits for the callback: the values are read before it can raise.
        fired = pred if raises_if else jnp.logical_not(pred)
        held = jax.lax.cond(jnp.any(fired), read, lambda operands: jnp.ones((), bool), (fired, *arrays))
        return jnp.logical_and(pred, held)


def _module(name: str, script: str | None) -> Any:
    """The module if loaded, or imported when the script names it ("equinox", "checkify"; neither starts anything
    at import)."""
    if name in sys.modules:
        return sys.modules[name]
    if script is not None and name.rsplit(".", 1)[-1] in script and importlib.util.find_spec(name.split(".")[0]):
        with contextlib.suppress(Exception):
            return importlib.import_module(name)
    return None


@contextlib.contextmanager
def recorded_checks(channel: Any, script: str | None) -> Iterator[None]:
    """While active, the runtime checks of CHECKS report what fired them (see the module docstring).

    ``script``: the target's source text, to import the checks' libraries it uses (else only loaded ones).
    """
    recorder = _Recorder(channel)
    patched: list[tuple[Any, str, Any]] = []
    try:
        for module_name, attribute, at, raises_if in CHECKS:
            module = _module(module_name, script)
            original = getattr(module, attribute, None) if module is not None else None
            if original is not None:
                setattr(module, attribute, recorder.wrap(original, attribute, at, raises_if))
                patched.append((module, attribute, original))
        yield
    finally:
        for module, attribute, original in reversed(patched):
            setattr(module, attribute, original)
