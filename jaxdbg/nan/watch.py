"""Watch a running program for the first call whose outputs hold a NaN/Inf, cheaply.

While a :class:`Watch` is active (a context manager; everything is restored in ``finally``):

- it is a hook of :mod:`jaxdbg.jit_layer` that asks for the output check: every call of a function jitted
  meanwhile runs a companion compiled function that returns the user's outputs *plus* one small vector, the
  largest magnitude of every floating output leaf (``max(|x|)``, fused by XLA into the same program; a NaN or
  Inf anywhere shows up in it). Only that vector crosses to the host. It also feeds the growth tracker.
- every primitive jax runs eagerly (outside jit) has its outputs checked; one that *creates* a non-finite
  value from clean inputs is itself the origin.

The inputs of each call are kept (references; donated arguments are copied on the device first), so the
failing call can be replayed exactly. At the first non-finite call the watch raises
:class:`NonFiniteFound` (a ``BaseException``, so the program's own ``except Exception`` does not swallow it).

Example:
    >>> import jax, jax.numpy as jnp
    >>> with Watch() as watch:
    ...     step = jax.jit(lambda x: jnp.log(x))
    ...     step(jnp.array(-1.0))
    Traceback (most recent call last):
    ...
    jaxdbg.nan.watch.NonFiniteFound: call 0 of <lambda> returned non-finite ...
"""

from __future__ import annotations

import ast
import contextlib
import functools
import linecache
import sys
import types
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.tree_util import tree_flatten, tree_leaves

from jaxdbg import _compat, jit_layer
from jaxdbg._source import SourceLocation, caller_user_frame, is_user_file
from jaxdbg.jit_layer import CHECKED_SUFFIX, InstrumentedJit, JitCall, JitHook
from jaxdbg.nan.calls import Call, output_leaf_names
from jaxdbg.nan.growth import GrowthTracker
from jaxdbg.nan.result import Origin
from jaxdbg.nan.stats import is_inexact, nonfinite_flags, value_stats


@dataclass
class JitFinding:
    """The first jitted call with non-finite outputs (``kind``: 'nan' if any output holds a NaN, else 'inf')."""

    call: Call
    nonfinite_outputs: list[str]
    kind: str = "nan"
    closed_jaxpr: Any = None  # traced while the call was under way (None: trace it again later)


@dataclass
class EagerFinding:
    """An operation run eagerly that created a non-finite value (already fully localised)."""

    origin: Origin


class NonFiniteFound(BaseException):
    """Ends the watched program at the first non-finite call (caught by jaxdbg, not by the program)."""

    def __init__(self, finding: JitFinding | EagerFinding):
        super().__init__(_describe(finding))
        self.finding = finding


def _describe(finding: JitFinding | EagerFinding) -> str:
    if isinstance(finding, EagerFinding):
        return f"eager {finding.origin.primitive} made a {finding.origin.kind}"
    return (f"call {finding.call.call_index} of {finding.call.name} returned non-finite "
            f"{', '.join(finding.nonfinite_outputs[:3])}")


def _keeps_fast_path(executable_name: str) -> bool:
    """The user's watched functions and jaxdbg's own keep jax's C++ dispatch (eager jax functions do not)."""
    return executable_name.endswith((CHECKED_SUFFIX, CHECKED_SUFFIX + ")", "_jaxdbg", "_jaxdbg)"))


def _trace_now(call: Call) -> Any:
    """The call's jaxpr, traced while the call is still under way. Framework wrappers (``nnx.jit``) jit an
    inner function that only runs inside the context their own ``__call__`` sets up; traced later, outside
    it, that function raises. None if tracing fails here too (the analysis then says why)."""
    from jaxdbg.nan.localise import trace_for_replay  # the watch itself needs no interpreter

    try:
        with jit_layer.internal():
            return trace_for_replay(call)
    except Exception:  # noqa: BLE001 - the later analysis traces again and reports the failure
        return None


@functools.lru_cache(maxsize=256)
def _assigned_names(file: str, line: int) -> tuple[str, ...] | None:
    """``('params', 'loss')`` for a call written ``params, loss = step(...)`` on that line, else None."""
    text = linecache.getline(file, line).strip()
    try:
        statement = ast.parse(text).body[0]
    except (SyntaxError, IndexError, ValueError):
        return None
    if not isinstance(statement, (ast.Assign, ast.AnnAssign)):
        return None
    target = statement.targets[0] if isinstance(statement, ast.Assign) else statement.target
    if isinstance(target, ast.Name):
        return (target.id,)
    if isinstance(target, (ast.Tuple, ast.List)) and all(isinstance(e, ast.Name) for e in target.elts):
        return tuple(e.id for e in target.elts if isinstance(e, ast.Name))
    return None


class _Watched:
    """What the watch keeps of one jitted function: its output leaf names and the line that calls it."""

    def __init__(self) -> None:
        self.leaf_names: list[str] | None = None
        self.call_site: SourceLocation | None = None


class Watch(JitHook):
    """Context manager that watches ``jax.jit`` calls and eager operations for the first NaN/Inf.

    Args:
        nan_only: only a NaN counts (Inf is ignored).
        growth_factor: a leaf whose magnitude grows by this factor is reported as growth.
        eager: also check operations run eagerly (outside jit).
    """

    check_outputs = True  # the jit layer's fused max(|x|) of every floating output

    def __init__(self, nan_only: bool = False, growth_factor: float = 100.0, eager: bool = True):
        self.nan_only = nan_only
        self.growth = GrowthTracker(growth_factor)
        self.eager = eager
        self.active = False
        self.calls = 0
        self.eager_ops = 0
        self.functions: list[InstrumentedJit] = []
        self._watched: dict[int, _Watched] = {}
        self.finding: JitFinding | EagerFinding | None = None
        self._stack: contextlib.ExitStack | None = None
        # Calls of the user functions that run eager operations: code -> (frame of its latest call, 0-based
        # index of that call). Holding the frame keeps the next call from reusing its identity.
        self._eager_calls: dict[Any, tuple[Any, int]] = {}
        self._user_files: dict[str, bool] = {}

    # -- installation ---------------------------------------------------------------------------------------

    def __enter__(self) -> Watch:
        stack = contextlib.ExitStack()
        # Calls cached before now would keep jax's C++ dispatch and stay invisible to the eager hook; the
        # entries made while watching are dropped again on exit so later code gets the fast path back.
        jax.clear_caches()
        stack.callback(jax.clear_caches)
        stack.enter_context(jit_layer.installed(self))
        if self.eager:
            stack.enter_context(_compat.eager_hooks(self._on_eager, self._on_eager_jit, _keeps_fast_path))
        stack.callback(setattr, self, "active", False)
        self._stack = stack
        self.active = True
        return self

    def __exit__(self, *exc: Any) -> None:
        stack, self._stack = self._stack, None
        self._eager_calls.clear()
        if stack is not None:
            stack.close()

    # -- hooks of the jit layer ------------------------------------------------------------------------------

    def on_jit(self, function: InstrumentedJit) -> None:
        self.functions.append(function)

    def before(self, call: JitCall) -> None:
        if not self.active:
            return
        # The inputs are kept to replay the call; a call that may donate them gets device copies.
        call.notes["nan_inputs"] = self.copy_tree((call.args, call.kwargs)) if call.function.donates else (
            call.args, call.kwargs)

    def after(self, call: JitCall, out: Any) -> None:
        if not self.active or "nan_inputs" not in call.notes:
            return
        function = call.function
        host = call.host_magnitudes()
        self.calls += 1
        seen = self._watched.setdefault(function.record.id, _Watched())
        if seen.leaf_names is None:
            seen.call_site = caller_user_frame(2)
            seen.leaf_names = self._float_leaf_names(out, function.name)
        bad = np.isnan(host) if self.nan_only else ~np.isfinite(host)
        if bad.any():
            args, kwargs = call.notes["nan_inputs"]
            replay = Call(function.name, function.fun, tuple(args), dict(kwargs), function.static_argnums,
                          function.static_argnames, call.index, caller_user_frame(2), list(seen.leaf_names))
            kind = "nan" if np.isnan(host).any() else "inf"
            self.found(JitFinding(replay, [n for n, b in zip(seen.leaf_names, bad) if b], kind, _trace_now(replay)))
        self.growth.update(function.name, seen.leaf_names, host, call.index, seen.call_site)

    @staticmethod
    def _float_leaf_names(out: Any, name: str) -> list[str]:
        site = caller_user_frame(3)
        targets = _assigned_names(site.file, site.line) if site else None
        names = output_leaf_names(out, targets, name)
        return [n for n, leaf in zip(names, tree_leaves(out)) if is_inexact(leaf)]

    # -- helpers ---------------------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return jit_layer.is_internal()

    @staticmethod
    def internal() -> Any:
        """jaxdbg's own work: the eager hook ignores it."""
        return jit_layer.internal()

    def copy_tree(self, tree: Any) -> Any:
        """Device copies of the arrays in ``tree`` (kept when the call may donate its arguments)."""
        with self.internal():
            return jax.tree_util.tree_map(lambda x: x.copy() if isinstance(x, jax.Array) else x, tree)

    def found(self, finding: JitFinding | EagerFinding) -> None:
        if self.finding is None:
            self.finding = finding
        self.active = False  # nothing after the first finding matters
        raise NonFiniteFound(finding)

    # -- eager operations ----------------------------------------------------------------------------------

    def _on_eager(self, primitive: Any, args: Sequence[Any], params: dict, out: Any, nested: bool) -> None:
        if nested or not self.active or self.busy:
            return
        outs = out if primitive.multiple_results else [out]
        self._check_eager(primitive.name, args, outs, lambda *xs: primitive.bind(*xs, **params))

    def _on_eager_jit(self, name: str, closed: Any, args: Sequence[Any], outs: list, nested: bool) -> None:
        """A jitted function run eagerly through Python dispatch: jax's own (``jnp.sqrt``), not a watched one."""
        if nested or not self.active or self.busy or not name or name.endswith(CHECKED_SUFFIX):
            return
        self._check_eager(name, args, outs, closed)

    def _eager_call_index(self) -> int | None:
        """Which call (0-based) of the user function running this eager operation is under way."""
        frame: types.FrameType | None = sys._getframe(2)
        while frame is not None:
            path = frame.f_code.co_filename
            user = self._user_files.get(path)
            if user is None:
                user = self._user_files[path] = is_user_file(path)
            if user:
                break
            frame = frame.f_back
        if frame is None:
            return None
        latest = self._eager_calls.get(frame.f_code)
        index = 0 if latest is None else latest[1] + (latest[0] is not frame)
        self._eager_calls[frame.f_code] = (frame, index)
        return index

    def _check_eager(self, name: str, args: Sequence[Any], outs: list, program: Any) -> None:
        call_index = self._eager_call_index()
        if not any(is_inexact(o) for o in outs):
            return
        with self.internal():
            self.eager_ops += 1
            flags = [nonfinite_flags(o) for o in outs]
            out_nan = any(n for n, _ in flags)
            out_inf = any(i for _, i in flags)
            if not out_nan and (self.nan_only or not out_inf):
                return
            in_flags = [nonfinite_flags(a) for a in tree_flatten(list(args))[0]]
            in_nan = any(n for n, _ in in_flags)
            in_inf = any(i for _, i in in_flags)
            created = (out_nan and not in_nan) or (not self.nan_only and out_inf and not in_nan and not in_inf)
            if not created:
                return
            kind = "nan" if out_nan and not in_nan else "inf"
            origin = self._eager_origin(name, list(args), program, outs, kind, call_index)
        self.found(EagerFinding(origin))

    def _eager_origin(self, name: str, args: list, program: Any, outs: list, kind: str,
                      call_index: int | None) -> Origin:
        """The eager operation as an origin. ``program`` (a closed jaxpr, or a function to trace) is replayed
        to name the primitive inside (``jnp.sqrt`` is a jitted function around ``sqrt``). The source is the
        user's line running it now."""
        from jaxdbg.nan.localise import localise_call  # the watch itself needs no interpreter

        source, name_stack = _compat.current_source_context()
        source = source or caller_user_frame(3)
        inputs = tuple(value_stats(a) for a in args)
        path: tuple[str, ...] = ("eager",)
        try:
            closed = program if not callable(program) else jax.make_jaxpr(program)(*args)
            inner = localise_call(Call("eager", None, tuple(args), {}), self.nan_only, closed).first
        except Exception:  # noqa: BLE001 - naming the inner primitive is a refinement; the op itself is known
            inner = None
        if inner is not None and inner.kind != "input":
            path = ("eager", *inner.path[1:]) if name in ("scan", "while", "cond") else ("eager",)
            if name in ("scan", "while", "cond") and inner.source is not None:
                source = inner.source  # a loop body traced just now: its own line is the better answer
            name, inputs = inner.primitive or name, inner.inputs
        return Origin(
            kind, name, "backward" if "transpose(" in name_stack else "forward", source,
            source.function if source else "<eager>", call_index if call_index is not None else self.eager_ops - 1,
            path, inputs, None,
            tuple(value_stats(o) for o in outs), name_stack,
        )
