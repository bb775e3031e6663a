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

import numpy as np

from jaxdbg import _compat

CALLS = ("pjit", "jit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr")
SHAPED = ("broadcast_in_dim", "reshape", "convert_element_type")  # a scalar made an array: the same multiplier
WARMS_UP = 0.5  # a schedule whose first value is below this share of its peak warms up
STEPS = (0, 1, 2, 3, 5, 8, 12, 20, 30, 50, 80, 120, 200, 300, 500, 800, 1200, 2000, 3000, 5000, 10000)


@dataclass(frozen=True)
class Warmup:
    """A warmup schedule: its value at count 0, its largest value and the first count reaching it (among the
    counts tried), and the count and value at the failing call."""

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

    def __init__(self, value: float):
        self.value = value


def warmup(closed: Any, leaves: Sequence[Any]) -> Warmup | None:
    """The warmup schedule behind a multiplier of the step (the first one that warms up), or None."""
    jaxpr, _ = _compat.open_jaxpr(closed)
    counts = [i for i, leaf in enumerate(leaves[:len(jaxpr.invars)]) if _step_count(leaf)]
    for at_count in counts:
        now = int(np.asarray(leaves[at_count]))
        steps = sorted({*STEPS, now})
        curves = [_multipliers(jaxpr, {jaxpr.invars[at_count]: np.int32(c)}) for c in steps]
        if not curves[0] or any(len(c) != len(curves[0]) for c in curves):
            continue
        for k in range(len(curves[0])):
            values = [abs(c[k]) for c in curves]
            peak = max(values)
            if peak > 0 and values[0] < WARMS_UP * peak and all(np.isfinite(values)):
                at = values.index(peak)
                top, peak = _peak(jaxpr.invars[at_count], jaxpr, k, steps[max(at - 1, 0)],
                                  steps[min(at + 1, len(steps) - 1)])
                return Warmup(values[0], peak, top, now, values[steps.index(now)])
    return None


def _peak(count: Any, jaxpr: Any, k: int, low: int, high: int) -> tuple[int, float]:
    """The count in [low, high] where multiplier ``k`` is largest (the schedule rising, then falling there) and
    that value: a ternary search, the first such count on a plateau."""
    def value(c: int) -> float:
        return abs(_multipliers(jaxpr, {count: np.int32(c)})[k])

    while high - low > 2:
        a, b = low + (high - low) // 3, high - (high - low) // 3
        if value(a) < value(b):
            low = a + 1
        else:
            high = b
    best = max(range(low, high + 1), key=lambda c: (value(c), -c))
    return best, value(best)


def _step_count(leaf: Any) -> bool:
    """Whether an argument may be a step count: an integer scalar (a typed PRNG key is none)."""
    try:
        return np.ndim(leaf) == 0 and np.issubdtype(np.dtype(getattr(leaf, "dtype", type(leaf))), np.integer)
    except TypeError:
        return False


def _multipliers(jaxpr: Any, known: dict) -> list[float]:
    """The values, in equation order, of the count-derived scalars that multiply arrays the count does not
    make (the updates), with ``known`` holding the count's value."""
    found: list[float] = []
    _walk(jaxpr, dict(known), found)
    return found


def _read(atom: Any, known: dict) -> Any:
    if hasattr(atom, "val"):  # a literal
        return atom.val
    return known.get(atom)


def _walk(jaxpr: Any, known: dict, found: list[float]) -> None:
    for eqn in jaxpr.eqns:
        values = [_read(a, known) for a in eqn.invars]
        derived = [v for a, v in zip(eqn.invars, values) if not hasattr(a, "val") and v is not None]
        if not derived:
            continue
        name = eqn.primitive.name
        if name == "mul":
            scale = [v.value if isinstance(v, _Broadcast) else v for v in values if v is not None]
            if any(v is None for v in values) and len(scale) == 1 and np.ndim(scale[0]) == 0 \
                    and np.issubdtype(np.asarray(scale[0]).dtype, np.floating):
                found.append(float(scale[0]))
                continue
        if name in CALLS:
            inner = _inner(eqn)
            if inner is not None:
                inner_known = {v: x for v, x in zip(inner.invars, values) if x is not None}
                _walk(inner, inner_known, found)
                for out, var in zip(inner.outvars, eqn.outvars):  # what the call returns of it
                    value = _read(out, inner_known)
                    if value is not None:
                        known[var] = value
                continue
        if any(v is None or isinstance(v, _Broadcast) for v in values) or len(eqn.outvars) != 1:
            continue
        if name in SHAPED and np.ndim(values[0]) == 0 and eqn.outvars[0].aval.shape != ():
            known[eqn.outvars[0]] = _Broadcast(float(np.asarray(values[0])))
            continue
        if eqn.outvars[0].aval.shape != () or any(np.ndim(v) != 0 for v in values):
            continue  # scalar arithmetic only: a schedule's
        known[eqn.outvars[0]] = np.asarray(_compat.bind_eqn(eqn, list(values))[0])


def _inner(eqn: Any) -> Any:
    """The jaxpr a call equation runs, when its inputs are the equation's (one to one), else None."""
    from jaxdbg.repro.graph import inner_jaxprs

    inner = inner_jaxprs(eqn.params)
    if len(inner) != 1 or len(inner[0].invars) != len(eqn.invars) or inner[0].constvars:
        return None
    return inner[0]
