"""Child-side instrumentation of ``jax.jit`` for ``jaxdbg repro``: notice failures and capture computations.

While :meth:`JitWatch.installed` is active (in a contained child only; restored in ``finally``), the watch
is a hook of :mod:`jaxdbg.jit_layer`, so every call of a function the target jits:

- is announced on the channel (:class:`JitCallSeen`, first few calls of each function), so the parent knows
  which jitted computation was running when the child crashed or hung;
- has its outputs checked for NaN/Inf (the jit layer's check, compiled into the function) -> :class:`FailureSeen`, kind
  ``nonfinite``;
- for its first ``mismatch_calls`` calls, is re-run op by op (``jax.disable_jit``) or in float64 and
  compared -> :class:`FailureSeen`, kind ``mismatch``;
- can be captured (jaxpr + concrete inputs) at the first failure of a chosen kind, ending the run with
  :class:`StopRun` so the caller can cut the computation in the same process;
- can send its StableHLO text before running (:class:`LoweredText`), for a crash inside compiled code.

jax's own functions are jitted at import time, before the watch is installed, so only user code is seen.

Example (inside a contained job):
    >>> with JitWatch(WatchConfig(), channel).installed() as watch:     # doctest: +SKIP
    ...     run_script(spec)
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from jaxdbg import _compat, jit_layer, multihost
from jaxdbg._source import caller_user_frame
from jaxdbg.jit_layer import JitCall, JitHook
from jaxdbg.nonfinite import kind_of
from jaxdbg.repro.frozen import record_call
from jaxdbg.repro.graph import nested_equations
from jaxdbg.repro.messages import FailureSeen, JitCallSeen, LoweredText
from jaxdbg.repro.purity import frozen_site

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
    # a mismatch must exceed what rounding in the computation's narrowest float type explains (bfloat16 mixed
    # precision rounds differently under jit, which keeps fused intermediates in float32): on when repro looks
    # for any failure, off when the user asked for a mismatch (--kind mismatch)
    rounding_slack: bool = False
    send_lowered: bool = False


class StopRun(BaseException):
    """Ends the target run once the watch has what it needs (BaseException: user ``except Exception`` won't eat it)."""


@dataclass
class Captured:
    """A failing jitted call: its closed jaxpr, the flat concrete inputs, and the failure that was seen."""

    function: str
    closed_jaxpr: Any
    args: list
    failure: FailureSeen
    frozen: str | None = None  # a mismatch: what differs between two traces of the call (see repro.purity)
    frozen_call: Any = None  # then the call of the user's function that computes it (repro.frozen.FrozenCall)


class JitWatch(JitHook):
    """A hook of the jit layer while installed; see the module docstring."""

    def __init__(self, config: WatchConfig, channel: Any):
        self.config = config
        self.check_outputs = config.nonfinite
        self.channel = channel
        self.reported: set[tuple[str, str]] = set()
        self.captured: Captured | None = None
        self.capture_error: str | None = None
        self.last: str | None = None  # the jitted function entered most recently

    @contextlib.contextmanager
    def installed(self) -> Iterator[JitWatch]:
        with jit_layer.installed(self):
            yield self

    # Hooks of the jit layer ---------------------------------------------------------------------------------

    def before(self, call: JitCall) -> None:
        function = call.function
        self.last = function.name
        if call.index < ANNOUNCED_CALLS:
            self.channel.send(JitCallSeen(function.name, call.index))
        if function.donates and (self.config.capture or call.index < self.config.mismatch_calls) and self._counts(
                function.name):
            # the call deletes what it donates: the capture and the reference run need the inputs after it
            call.notes["inputs"] = jit_layer.device_copies((call.args, call.kwargs))
        if self.config.send_lowered and call.index == 0:
            with contextlib.suppress(Exception):
                text = function.jitted.lower(*call.args, **call.kwargs).as_text()
                self.channel.send(LoweredText(function.name, text))

    def on_exception(self, call: JitCall, err: BaseException) -> None:
        name = call.function.name
        if self.config.capture == "exception" and self._counts(name) and isinstance(err, Exception):
            self._capture(call, FailureSeen("exception", name, call.index, str(err), type=type(err).__name__))

    def after(self, call: JitCall, out: Any) -> None:
        failure = None
        name = call.function.name
        if self.config.nonfinite:
            kind = kind_of(call.host_magnitudes())
            if kind is not None:
                what = {"nan": "NaN", "inf": "Inf"}[kind]
                failure = FailureSeen("nonfinite", name, call.index, f"jitted function produced {what}",
                                      caller_user_frame(), what=what)
        if failure is None and call.index < self.config.mismatch_calls:
            failure = self._mismatch(call, out)
        if failure is None:
            return
        key = (failure.kind, name)
        if key not in self.reported:
            self.reported.add(key)
            self.channel.send(failure)
        if self._counts(name) and self.config.capture == failure.kind:
            self._capture(call, failure)
        if self._counts(name) and self.config.stop_on == failure.kind:
            raise StopRun()

    def _counts(self, name: str) -> bool:
        return self.config.function is None or self.config.function == name

    def _mismatch(self, call: JitCall, out: Any) -> FailureSeen | None:
        function, (args, kwargs) = call.function, _inputs(call)
        try:
            with jit_layer.internal():  # the reference run is ours: its jitted calls are not watched
                if self.config.reference == "float64":
                    with jax.enable_x64(True):
                        wide = jax.tree_util.tree_map(_widen, (args, kwargs))
                        ref = function.jitted(*wide[0], **wide[1])
                    reference = "float64"
                else:
                    with jax.disable_jit():
                        ref = function.fun(*args, **kwargs)
                    reference = "op-by-op"
        except Exception:  # noqa: BLE001 - no reference, no comparison
            return None
        detail = compare_trees(out, ref, self.config.rtol, self.config.atol)
        if detail is None:
            return None
        if self.config.rounding_slack and _within_rounding(function, args, kwargs, out, ref, self.config.rtol,
                                                           self.config.atol):
            return None
        return FailureSeen("mismatch", function.name, call.index, f"jit and {reference} disagree", caller_user_frame(),
                           reference=reference, detail=detail)

    def _capture(self, call: JitCall, failure: FailureSeen) -> None:
        args, kwargs = _inputs(call)
        try:
            closed, flat = trace_flat(call.function.fun, call.function.options, args, kwargs)
            frozen, frozen_call = None, None
            if failure.kind == "mismatch":  # a trace-time side effect? (a second trace: no cut can show it)
                again, _ = trace_flat(call.function.fun, call.function.options, args, kwargs)
                frozen, where = frozen_site(closed, again)
                if frozen is not None and where is not None:  # the user's function that computes it, called how
                    with contextlib.suppress(Exception):  # without it, the parent still names the line
                        frozen_call = record_call(where, lambda: trace_flat(
                            call.function.fun, call.function.options, args, kwargs))
            self.captured = Captured(call.function.name, closed, flat, failure, frozen, frozen_call)
        except Exception as err:  # noqa: BLE001 - reported to the parent, which falls back to source reduction
            self.capture_error = f"{type(err).__name__}: {err}"
        raise StopRun()


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


ROUNDINGS = 2  # roundings of the narrowest float type, at the output's own scale, that a disagreement may hold


def narrowest_float_eps(closed: Any) -> float:
    """The machine epsilon of the least precise float type any equation of ``closed`` (nested bodies too)
    computes in: 2**-7 where it works in bfloat16, float32's where it works in float32 at least.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> narrowest_float_eps(jax.make_jaxpr(lambda x: jnp.sin(x.astype(jnp.bfloat16)).astype(jnp.float32))(1.0))
        0.0078125
    """
    eps = float(np.finfo(np.float32).eps)
    for eqn in nested_equations(closed.jaxpr.eqns):
        for var in eqn.outvars:
            dtype = getattr(getattr(var, "aval", None), "dtype", None)
            if dtype is not None and not _compat.is_extended_dtype(dtype) and jax.numpy.issubdtype(dtype,
                                                                                                    jax.numpy.floating):
                eps = max(eps, float(jax.numpy.finfo(dtype).eps))
    return eps


def _within_rounding(function: Any, args: tuple, kwargs: dict, out: Any, ref: Any, rtol: float, atol: float) -> bool:
    """Whether jit and the reference disagree by no more than :data:`ROUNDINGS` roundings of the narrowest float
    type the call computes in, at each output's own scale (max |reference|): mixed precision's expected
    difference, not a failure. False where the call computes in float32 or wider, or cannot be traced again."""
    try:
        closed, _ = trace_flat(function.fun, function.options, args, kwargs)
    except Exception:  # noqa: BLE001 - not traceable again: the plain tolerance stands
        return False
    eps = narrowest_float_eps(closed)
    if eps <= float(np.finfo(np.float32).eps):
        return False
    for a, b in zip(_float_leaves(out), _float_leaves(ref)):
        if a.shape != b.shape:
            continue
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        scale = float(np.max(np.abs(b64), initial=0.0, where=np.isfinite(b64)))
        if not np.isclose(a64, b64, rtol=rtol, atol=atol + ROUNDINGS * eps * scale, equal_nan=True).all():
            return False
    return True


def _widen(leaf: Any) -> Any:
    dtype = getattr(leaf, "dtype", None)
    if dtype is not None and jax.numpy.issubdtype(dtype, jax.numpy.floating):
        return np.asarray(leaf, dtype=np.float64)
    return leaf


def _inputs(call: JitCall) -> tuple[tuple, dict]:
    """A call's ``(args, kwargs)``, as they were before it ran (copies, where it donates them)."""
    return call.notes.get("inputs") or (call.args, call.kwargs)


def trace_flat(fun: Callable, jit_kwargs: dict, args: tuple, kwargs: dict) -> tuple[Any, list]:
    """The closed jaxpr of ``fun`` over the flat non-static leaves of ``(args, kwargs)``, and those leaves."""
    static_nums = _as_tuple(jit_kwargs.get("static_argnums"))
    static_names = set(_as_tuple(jit_kwargs.get("static_argnames")))
    with contextlib.suppress(TypeError, ValueError):
        positional = list(inspect.signature(fun).parameters)
        static_nums += tuple(i for i, p in enumerate(positional) if p in static_names)
        static_names |= {positional[i] for i in static_nums if 0 <= i < len(positional)}
    # Negative positions count from the end; a static parameter passed by keyword sits at or past len(args).
    static_positions = {i + len(args) if i < 0 else i for i in static_nums}
    dynamic_args = [a for i, a in enumerate(args) if i not in static_positions]
    dynamic_kwargs = {k: v for k, v in kwargs.items() if k not in static_names}
    leaves, tree = jax.tree_util.tree_flatten((dynamic_args, dynamic_kwargs))

    def flat_fun(*flat: Any) -> Any:
        dyn_args, dyn_kwargs = jax.tree_util.tree_unflatten(tree, flat)
        it = iter(dyn_args)
        full = [args[i] if i in static_positions else next(it) for i in range(len(args))]
        return fun(*full, **{**kwargs, **dyn_kwargs})

    closed = jax.make_jaxpr(flat_fun)(*leaves)
    avals = closed.in_avals
    leaves = [multihost.global_value(leaf) for leaf in leaves]  # a job's sharded inputs, whole (a collective)
    flat = [leaf if _compat.is_extended_dtype(aval.dtype) else np.asarray(leaf, dtype=aval.dtype)
            for leaf, aval in zip(leaves, avals)]
    return closed, flat


def _as_tuple(value: Any) -> tuple:
    if value is None:
        return ()
    if isinstance(value, (int, str)):
        return (value,)
    return tuple(value)
