"""Child-side instrumentation of ``jax.jit`` for ``jaxdbg repro``: notice failures and capture computations.

While :meth:`JitWatch.installed` is active (in a contained child only; restored in ``finally``), every
function the target jits is wrapped. Each call of a wrapped function:

- is announced on the channel (topic ``jit_call``, first few calls of each function), so the parent knows
  which jitted computation was running when the child crashed or hung;
- has its outputs checked for NaN/Inf (a cheap host-side check) -> topic ``failure``, kind ``nonfinite``;
- for its first ``mismatch_calls`` calls, is re-run op by op (``jax.disable_jit``) or in float64 and
  compared -> topic ``failure``, kind ``mismatch``;
- can be captured (jaxpr + concrete inputs) at the first failure of a chosen kind, ending the run with
  :class:`StopRun` so the caller can cut the computation in the same process;
- can send its StableHLO text before running (topic ``lowered``), for a crash inside compiled code.

jax's own functions are jitted at import time, before the watch is installed, so only user code is seen.

Example (inside a contained job):
    >>> with JitWatch(WatchConfig(), channel).installed() as watch:     # doctest: +SKIP
    ...     run_script(spec)
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import jax
import numpy as np

from jaxdbg import _compat
from jaxdbg._source import caller_user_frame

ANNOUNCED_CALLS = 3  # jit_call messages per function (a training loop must not flood the channel)


@dataclass(frozen=True)
class WatchConfig:
    """What the watch looks for. ``capture``: kind whose first failure is captured (then the run stops)."""

    nonfinite: bool = True
    mismatch_calls: int = 0
    reference: str = "eager"  # or "float64"
    rtol: float = 1e-3
    atol: float = 1e-5
    stop_on: str | None = None
    capture: str | None = None
    function: str | None = None  # only this jitted function counts for stop_on/capture
    send_lowered: bool = False


class StopRun(BaseException):
    """Ends the target run once the watch has what it needs (BaseException: user ``except Exception`` won't eat it)."""


@dataclass
class Captured:
    """A failing jitted call: its closed jaxpr, the flat concrete inputs, and the failure that was seen."""

    function: str
    closed_jaxpr: Any
    args: list
    failure: dict


class JitWatch:
    """Wraps ``jax.jit`` while installed; see the module docstring."""

    def __init__(self, config: WatchConfig, channel: Any):
        self.config = config
        self.channel = channel
        self.calls: Counter = Counter()
        self.reported: set[tuple[str, str]] = set()
        self.captured: Captured | None = None
        self.capture_error: str | None = None
        self.busy = False  # inside our own reference run: do not watch recursively
        self.last: str | None = None  # the jitted function entered most recently

    @contextlib.contextmanager
    def installed(self) -> Iterator["JitWatch"]:
        real_jit = jax.jit
        jax.jit = self._wrap_jit(real_jit)
        try:
            yield self
        finally:
            jax.jit = real_jit

    def _wrap_jit(self, real_jit: Callable) -> Callable:
        watch = self

        @functools.wraps(real_jit)
        def jit(fun: Callable | None = None, *args: Any, **kwargs: Any) -> Any:
            if fun is None:  # decorator-factory use: @jax.jit(static_argnames=...)
                return lambda f: jit(f, *args, **kwargs)
            return WatchedFunction(real_jit(fun, *args, **kwargs), fun, kwargs, watch)

        return jit

    # Called by WatchedFunction ------------------------------------------------------------------------------

    def on_call(self, wrapped: "WatchedFunction", args: tuple, kwargs: dict) -> int:
        name = wrapped.name
        self.calls[name] += 1
        self.last = name
        index = self.calls[name] - 1
        if index < ANNOUNCED_CALLS:
            self.channel.send("jit_call", {"function": name, "call": index})
        if self.config.send_lowered and index == 0:
            with contextlib.suppress(Exception):
                self.channel.send("lowered", {"function": name, "text": wrapped.jitted.lower(*args, **kwargs).as_text()})
        return index

    def on_exception(self, wrapped: "WatchedFunction", args: tuple, kwargs: dict, err: BaseException) -> None:
        if self.config.capture == "exception" and self._counts(wrapped.name):
            failure = {"kind": "exception", "function": wrapped.name, "type": type(err).__name__, "message": str(err)}
            self._capture(wrapped, args, kwargs, failure)

    def on_result(self, wrapped: "WatchedFunction", args: tuple, kwargs: dict, out: Any, index: int) -> None:
        failure = None
        if self.config.nonfinite:
            what = nonfinite_in(out)
            if what:
                failure = {"kind": "nonfinite", "what": what, "message": f"jitted function produced {what}"}
        if failure is None and index < self.config.mismatch_calls:
            failure = self._mismatch(wrapped, args, kwargs, out)
        if failure is None:
            return
        failure.update(function=wrapped.name, call=index, location=caller_user_frame())
        key = (failure["kind"], wrapped.name)
        if key not in self.reported:
            self.reported.add(key)
            self.channel.send("failure", failure)
        if self._counts(wrapped.name) and self.config.capture == failure["kind"]:
            self._capture(wrapped, args, kwargs, failure)
        if self._counts(wrapped.name) and self.config.stop_on == failure["kind"]:
            raise StopRun()

    def _counts(self, name: str) -> bool:
        return self.config.function is None or self.config.function == name

    def _mismatch(self, wrapped: "WatchedFunction", args: tuple, kwargs: dict, out: Any) -> dict | None:
        self.busy = True
        try:
            if self.config.reference == "float64":
                with jax.enable_x64(True):
                    wide = jax.tree_util.tree_map(_widen, (args, kwargs))
                    ref = wrapped.jitted(*wide[0], **wide[1])
                reference = "float64"
            else:
                with jax.disable_jit():
                    ref = wrapped.fun(*args, **kwargs)
                reference = "op-by-op"
        except Exception:  # noqa: BLE001 - no reference, no comparison
            return None
        finally:
            self.busy = False
        detail = compare_trees(out, ref, self.config.rtol, self.config.atol)
        if detail is None:
            return None
        return {"kind": "mismatch", "reference": reference, "message": f"jit and {reference} disagree", "detail": detail}

    def _capture(self, wrapped: "WatchedFunction", args: tuple, kwargs: dict, failure: dict) -> None:
        try:
            closed, flat = trace_flat(wrapped.fun, wrapped.jit_kwargs, args, kwargs)
            self.captured = Captured(wrapped.name, closed, flat, failure)
        except Exception as err:  # noqa: BLE001 - reported to the parent, which falls back to source reduction
            self.capture_error = f"{type(err).__name__}: {err}"
        raise StopRun()


class WatchedFunction:
    """A jitted function that reports its calls to the watch; everything else is the jitted function's."""

    def __init__(self, jitted: Any, fun: Callable, jit_kwargs: dict, watch: JitWatch):
        self.jitted, self.fun, self.jit_kwargs, self.watch = jitted, fun, jit_kwargs, watch
        self.name = getattr(fun, "__name__", None) or type(fun).__name__
        functools.update_wrapper(self, fun, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        watch = self.watch
        if watch.busy or any(_compat.is_tracer(leaf) for leaf in jax.tree_util.tree_leaves((args, kwargs))):
            return self.jitted(*args, **kwargs)
        index = watch.on_call(self, args, kwargs)
        try:
            out = self.jitted(*args, **kwargs)
        except Exception as err:
            watch.on_exception(self, args, kwargs, err)
            raise
        watch.on_result(self, args, kwargs, out, index)
        return out

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return self if obj is None else functools.partial(self, obj)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.jitted, name)


# ----------------------------------------------------------------------------------------------------------
# Checks and capture
# ----------------------------------------------------------------------------------------------------------


def _float_leaves(tree: Any) -> list[np.ndarray]:
    leaves = []
    for leaf in jax.tree_util.tree_leaves(tree):
        dtype = getattr(leaf, "dtype", None)
        if dtype is None or _compat.is_extended_dtype(dtype) or not jax.numpy.issubdtype(dtype, jax.numpy.inexact):
            continue
        leaves.append(np.asarray(leaf))
    return leaves


def nonfinite_in(tree: Any) -> str | None:
    """'NaN' if any floating leaf holds a NaN, 'Inf' if one holds only infinities, else None."""
    saw_inf = False
    for leaf in _float_leaves(tree):
        if np.isnan(leaf).any():
            return "NaN"
        saw_inf = saw_inf or bool(np.isinf(leaf).any())
    return "Inf" if saw_inf else None


def compare_trees(out: Any, ref: Any, rtol: float, atol: float) -> dict | None:
    """The worst disagreement between two output trees beyond tolerance, or None if they agree."""
    worst = None
    for a, b in zip(_float_leaves(out), _float_leaves(ref)):
        if a.shape != b.shape:
            continue
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        close = np.isclose(a64, b64, rtol=rtol, atol=atol, equal_nan=True)
        if close.all():
            continue
        diff = np.where(close, 0.0, np.nan_to_num(np.abs(a64 - b64), nan=np.inf))
        where = np.unravel_index(int(np.argmax(diff)), diff.shape)
        entry = {"max_abs_diff": float(diff[where]), "jit": float(a64[where]), "reference": float(b64[where]),
                 "mismatched": int((~close).sum()), "size": int(close.size)}
        if worst is None or entry["max_abs_diff"] > worst["max_abs_diff"]:
            worst = entry
    return worst


def _widen(leaf: Any) -> Any:
    dtype = getattr(leaf, "dtype", None)
    if dtype is not None and jax.numpy.issubdtype(dtype, jax.numpy.floating):
        return np.asarray(leaf, dtype=np.float64)
    return leaf


def trace_flat(fun: Callable, jit_kwargs: dict, args: tuple, kwargs: dict) -> tuple[Any, list]:
    """The closed jaxpr of ``fun`` over the flat non-static leaves of ``(args, kwargs)``, and those leaves."""
    static_nums = _as_tuple(jit_kwargs.get("static_argnums"))
    static_names = set(_as_tuple(jit_kwargs.get("static_argnames")))
    with contextlib.suppress(TypeError, ValueError):
        positional = list(inspect.signature(fun).parameters)
        static_nums += tuple(i for i, p in enumerate(positional) if p in static_names)
        static_names |= {positional[i] for i in static_nums if 0 <= i < len(positional)}
    static_nums = {i % len(args) if args else i for i in static_nums}
    dynamic_args = [a for i, a in enumerate(args) if i not in static_nums]
    dynamic_kwargs = {k: v for k, v in kwargs.items() if k not in static_names}
    leaves, tree = jax.tree_util.tree_flatten((dynamic_args, dynamic_kwargs))

    def flat_fun(*flat: Any) -> Any:
        dyn_args, dyn_kwargs = jax.tree_util.tree_unflatten(tree, flat)
        it = iter(dyn_args)
        full = [args[i] if i in static_nums else next(it) for i in range(len(args))]
        return fun(*full, **{**kwargs, **dyn_kwargs})

    closed = jax.make_jaxpr(flat_fun)(*leaves)
    avals = closed.in_avals
    flat = [leaf if _compat.is_extended_dtype(aval.dtype) else np.asarray(leaf, dtype=aval.dtype)
            for leaf, aval in zip(leaves, avals)]
    return closed, flat


def _as_tuple(value: Any) -> tuple:
    if value is None:
        return ()
    if isinstance(value, (int, str)):
        return (value,)
    return tuple(value)
