"""The learning-rate schedule a training step already follows, read from its jaxpr and evaluated.

A schedule (``optax.warmup_cosine_decay_schedule``, any ``optax.scale_by_schedule``) is scalar arithmetic on an
integer step count the step takes as an argument (the optimiser state's ``count``), ending in a scalar that
multiplies the updates. Here that arithmetic is evaluated on its own, for a range of counts, with everything
else in the step left unevaluated: the multipliers' values per count are the schedule, and a multiplier that
starts well below its largest value warms up. Adam's bias corrections also depend on the count, but the
updates are divided by them, not multiplied: they are no multiplier.

"Add warmup" is no advice for a run that diverged under a warmup already: its peak is what to lower.

Example:
    >>> import jax, jax.numpy as jnp
    >>> def step(g, count):
    ...     lr = 0.5 * jnp.minimum(1.0, count / 10)   # warms up over 10 steps to 0.5
    ...     return g * lr
    >>> closed = jax.make_jaxpr(step)(jnp.ones(3), jnp.int32(4))
    >>> found = warmup(closed, [jnp.ones(3), jnp.int32(4)])
    >>> (found.start, found.peak, found.peak_step, found.step, round(found.now, 3))
    (0.0, 0.5, 10, 4, 0.2)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdbg import _compat

CALLS = ("pjit", "jit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr")
SHAPED = ("broadcast_in_dim", "reshape", "convert_element_type")  # a scalar made an array: the same multiplier
WARMS_UP = 0.5  # a schedule whose first value is below this share of its peak warms up
COUNTS = 10_000  # the schedule is evaluated at every count up to this (or twice the failing call's count)


@dataclass(frozen=True)
class Warmup:
    """A warmup schedule: its value at count 0, its largest value and the first count reaching it (among the
    counts evaluated), and the count and value at the failing call."""

    start: float
    peak: float
    peak_step: int
    step: int
    now: float

    def hint(self) -> str:
        where = ("at its peak" if self.now >= 0.99 * self.peak else
                 f"{self.now:.3g} (still warming up)" if self.step < self.peak_step else f"{self.now:.3g}")
        return (f"the learning rate already follows a schedule that warms up (from {self.start:.3g} to a peak of "
                f"{self.peak:.3g} by step {self.peak_step}; at this call's step {self.step} it is {where}): lower "
                "the schedule's peak, and/or clip gradients (e.g. `optax.clip_by_global_norm(1.0)`)")


class _Broadcast:
    """A scalar's value made into an array (broadcast, reshaped): a multiplier, not evaluated further."""

    def __init__(self, value: Any):
        self.value = value


def warmup(closed: Any, leaves: Sequence[Any]) -> Warmup | None:
    """The warmup schedule behind a multiplier of the step (the first one that warms up), or None. The schedule's
    arithmetic is traced once and evaluated at every count at once (vmapped)."""
    jaxpr, _ = _compat.open_jaxpr(closed)
    for at in (i for i, leaf in enumerate(leaves[:len(jaxpr.invars)]) if _step_count(leaf)):
        now = int(np.asarray(leaves[at]))
        count = jaxpr.invars[at]
        counts = np.arange(min(max(COUNTS, 2 * now), 2**22) + 1, dtype=np.int32)
        if not _multipliers(jaxpr, {count: jax.ShapeDtypeStruct((), jnp.int32)}, trace_only=True):
            continue
        curves = jax.jit(jax.vmap(lambda c: _multipliers(jaxpr, {count: c})))(counts)  # noqa: B023 - called at once
        for curve in curves:
            values = np.abs(np.asarray(curve, np.float64))
            top = int(np.argmax(values))
            if np.all(np.isfinite(values)) and values[top] > 0 and values[0] < WARMS_UP * values[top]:
                return Warmup(float(values[0]), float(values[top]), top, now, float(values[min(now, len(values) - 1)]))
    return None


def _step_count(leaf: Any) -> bool:
    """Whether an argument may be a step count: an integer scalar (a typed PRNG key is none)."""
    try:
        return np.ndim(leaf) == 0 and np.issubdtype(np.dtype(getattr(leaf, "dtype", type(leaf))), np.integer)
    except TypeError:
        return False


def _multipliers(jaxpr: Any, known: dict, trace_only: bool = False) -> list:
    """The values, in equation order, of the count-derived scalars that multiply arrays the count does not
    make (the updates), with ``known`` holding the count's value (a tracer; with ``trace_only``, a shape: only
    whether there are any, nothing evaluated)."""
    found: list = []
    _walk(jaxpr, dict(known), found, trace_only)
    return found


def _read(atom: Any, known: dict) -> Any:
    if hasattr(atom, "val"):  # a literal
        return atom.val
    return known.get(atom)


def _walk(jaxpr: Any, known: dict, found: list, trace_only: bool) -> None:
    for eqn in jaxpr.eqns:
        values = [_read(a, known) for a in eqn.invars]
        if not any(not hasattr(a, "val") and v is not None for a, v in zip(eqn.invars, values)):
            continue  # nothing the count makes
        name, out = eqn.primitive.name, eqn.outvars[0].aval if len(eqn.outvars) == 1 else None
        if name == "mul" and any(v is None for v in values):
            scale = [a for a, v in zip(eqn.invars, values) if v is not None]
            if len(scale) == 1 and not hasattr(scale[0], "val") and jnp.issubdtype(scale[0].aval.dtype, jnp.floating):
                value = values[eqn.invars.index(scale[0])]
                found.append(value.value if isinstance(value, _Broadcast) else value)
                continue
        if name in CALLS:
            inner = _inner(eqn)
            if inner is not None:
                inner_known = {v: x for v, x in zip(inner.invars, values) if x is not None}
                _walk(inner, inner_known, found, trace_only)
                for result, var in zip(inner.outvars, eqn.outvars):  # what the call returns of it
                    value = _read(result, inner_known)
                    if value is not None:
                        known[var] = value
                continue
        if any(v is None or isinstance(v, _Broadcast) for v in values) or out is None:
            continue
        scalars = all(getattr(a, "aval", None) is None or a.aval.shape == () for a in eqn.invars)
        if name in SHAPED and scalars and out.shape != ():
            known[eqn.outvars[0]] = _Broadcast(values[0])
        elif scalars and out.shape == ():  # scalar arithmetic only: a schedule's
            known[eqn.outvars[0]] = values[0] if trace_only else _compat.bind_eqn(eqn, list(values))[0]


def _inner(eqn: Any) -> Any:
    """The jaxpr a call equation runs, when its inputs are the equation's (one to one), else None."""
    from jaxdbg.repro.graph import inner_jaxprs

    inner = inner_jaxprs(eqn.params)
    if len(inner) != 1 or len(inner[0].invars) != len(eqn.invars) or inner[0].constvars:
        return None
    return inner[0]
