"""The learning-rate schedule a training step already follows, read from its jaxpr and evaluated.

A schedule (``optax.warmup_cosine_decay_schedule``, any ``optax.scale_by_schedule``) is scalar arithmetic on an
integer step count the step takes as an argument (the optimiser state's ``count``), ending in a scalar that
multiplies the updates. Here that arithmetic is evaluated on its own, for a range of counts, with everything
else in the step left unevaluated: the multipliers' values per count are the schedule, and a multiplier that
starts well below its largest value warms up. Adam's bias corrections also depend on the count, but the
updates are divided by them, not multiplied: they are no multiplier.

"Add warmup" is no advice for a run that diverged under a warmup already: its peak is what to lower. And a
multiplier that changes sign by the failing call's count is a learning rate gone negative (a decay to -1e-2
instead of 0, a sign slip in a hand-written schedule): every update since climbs the loss.

Example:
    >>> import jax, jax.numpy as jnp
    >>> def step(g, count):
    ...     lr = 0.5 * jnp.minimum(1.0, count / 10)   # warms up over 10 steps to 0.5
    ...     return g * lr
    >>> closed = jax.make_jaxpr(step)(jnp.ones(3), jnp.int32(4))
    >>> found = warmup(curves(closed, [jnp.ones(3), jnp.int32(4)]))
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

CALLS = ("pjit", "jit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr",
         "eval_jaxpr")
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


def _ascent(how: str, grew: bool) -> str:
    return (f"The learning rate is negative at this call: {how} climbs the loss instead of descending it"
            + (", and what grew is that ascent." if grew else "."))


@dataclass(frozen=True)
class SignFlip:
    """A schedule that changes sign: the learning rate it multiplies the updates by goes negative (its value
    at the first count where it is not 0, the first count where its sign is the other, and the count and learning
    rate at the failing call), so from ``flip`` on the updates climb the loss."""

    start: float
    flip: int
    step: int
    now: float

    def sentence(self, grew: bool) -> str:
        """What the explanation says; ``grew``: values grew before the failing call (that is the ascent)."""
        return _ascent(f"the schedule that scales the updates starts at {self.start:.3g} and is negative from step "
                       f"{self.flip} on (at this call's step {self.step} it is {self.now:.3g}), so from then on every "
                       "update", grew)

    def hint(self) -> str:
        return ("keep the learning-rate schedule at or above 0: decay it to 0, not below (`optax.linear_schedule(init, "
                "0.0, steps)`, `optax.warmup_cosine_decay_schedule(0.0, peak, warmup, steps, end_value=0.0)`), and "
                f"check its sign where it is written (it is negative from step {self.flip} on)")


@dataclass(frozen=True)
class NegativeStep:
    """A step size passed in as an argument (``name``), negative (``value``) at the failing call, in an update
    written ``p - lr * g`` of the argument ``parameter``."""

    name: str
    value: float
    parameter: str

    def sentence(self, grew: bool) -> str:
        return _ascent(f"the argument `{self.name}` is {self.value:.3g}, and the step subtracts `{self.name}` times "
                       f"a value from `{self.parameter}` (an update `p - lr * g`), so it", grew)

    def hint(self) -> str:
        return (f"keep the learning rate at or above 0: check the schedule that computes `{self.name}` (a decay that "
                "ends below 0, a sign slip in a cosine term: `0.5 * peak * (1 + cos(pi * t))` is never negative)")


def negative_step(closed: Any, leaves: Sequence[Any], names: Sequence[str]) -> NegativeStep | None:
    """A negative float scalar argument of the step that scales what the step subtracts from another argument
    (``p - lr * g``, the descent form): a learning rate gone negative, so the update ascends; else None."""
    jaxpr, _ = _compat.open_jaxpr(closed)
    named = dict(zip(jaxpr.invars, names))
    rates = {var: (name, float(np.asarray(leaf))) for var, leaf, name in zip(jaxpr.invars, leaves, names)
             if np.ndim(leaf) == 0 and _floating(leaf) and float(np.asarray(leaf)) < 0}
    same: dict = {var: var for var in jaxpr.invars}  # a var -> the argument it is (itself, a cast, a broadcast)
    products: dict = {}  # a var -> the rate it was multiplied by
    for eqn in jaxpr.eqns:
        ins = [same.get(a) if not hasattr(a, "val") else None for a in eqn.invars]  # (a literal may not hash)
        name = eqn.primitive.name
        if name in SHAPED and ins[0] is not None:
            same[eqn.outvars[0]] = ins[0]
        elif name == "mul" and any(a in rates for a in ins):
            products[eqn.outvars[0]] = next(a for a in ins if a in rates)
        elif name == "sub" and ins[0] is not None and not hasattr(eqn.invars[1], "val") \
                and eqn.invars[1] in products:
            return NegativeStep(*rates[products[eqn.invars[1]]], named[ins[0]])
    return None


def _floating(leaf: Any) -> bool:
    try:
        return bool(np.issubdtype(np.dtype(getattr(leaf, "dtype", type(leaf))), np.floating))
    except TypeError:
        return False


def warmup(curves: Sequence[Curve]) -> Warmup | None:
    """The warmup schedule among a step's multipliers (:func:`curves`; the first one that warms up), or None."""
    for now, values in curves:
        values = np.abs(values)
        top = int(np.argmax(values))
        if np.all(np.isfinite(values)) and values[top] > 0 and values[0] < WARMS_UP * values[top]:
            return Warmup(float(values[0]), float(values[top]), top, now, float(values[min(now, len(values) - 1)]))
    return None


def sign_flip(curves: Sequence[Curve]) -> SignFlip | None:
    """The schedule among a step's multipliers (:func:`curves`) that has changed sign by the call's count, or None.
    Optax multiplies the updates by minus the learning rate: the learning rate is the multiplier times the sign it
    starts with. Values within ``SIGN_NOISE`` of 0, against the largest, have no sign (a decay that ends at 0)."""
    for now, values in curves:
        if now >= len(values) or not np.all(np.isfinite(values[:now + 1])):
            continue
        signed = np.where(np.abs(values) > SIGN_NOISE * np.max(np.abs(values[:now + 1])), np.sign(values), 0.0)
        first = int(np.argmax(signed != 0))
        flips = np.nonzero(signed[first:now + 1] == -signed[first])[0]
        if signed[first] != 0 and signed[now] == -signed[first] and flips.size:
            sign = signed[first]
            return SignFlip(float(values[first] * sign), first + int(flips[0]), now, float(values[now] * sign))
    return None


SIGN_NOISE = 1e-3
Curve = tuple[int, np.ndarray]  # a step count's value at the call, and a multiplier's values at counts 0, 1, ...


def curves(closed: Any, leaves: Sequence[Any]) -> list[Curve]:
    """For each integer scalar argument that feeds a multiplier of the updates (an optimiser's step count): its
    value at the call, and each multiplier's values at every count up to ``COUNTS`` (or twice the call's count).
    The schedule's arithmetic is traced once and evaluated at every count at once (vmapped)."""
    jaxpr, _ = _compat.open_jaxpr(closed)
    found = []
    for at in (i for i, leaf in enumerate(leaves[:len(jaxpr.invars)]) if _step_count(leaf)):
        now = int(np.asarray(leaves[at]))
        count = jaxpr.invars[at]
        counts = np.arange(min(max(COUNTS, 2 * now), 2**22) + 1, dtype=np.int32)
        if not _multipliers(jaxpr, {count: jax.ShapeDtypeStruct((), jnp.int32)}, trace_only=True):
            continue
        curves = jax.jit(jax.vmap(lambda c: _multipliers(jaxpr, {count: c})))(counts)  # noqa: B023 - called at once
        found += [(now, np.asarray(curve, np.float64)) for curve in curves]
    return found


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
