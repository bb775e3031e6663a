"""Which values of a jaxpr surely carry a NaN they hold on to the call's outputs, read from the jaxpr alone.

A NaN is the origin only if it reaches an output of the call (a select can discard it: the branch a batch
element does not take under vmap, the masked side of a ``jnp.where``). The replay learns that for certain at
the outputs, which for a training step may be far away; this analysis lets it stop as soon as the rest of the
way is sure. A value *surely reaches* an output when a path of equations that keep any NaN of their operands
(arithmetic, matmuls, sums, reshapes, calls) leads from it to an output: no select, comparison, slice or loop
on the way, where the NaN could be left behind. That is a lower bound: a value it does not vouch for may still
reach the outputs, which the replay then finds out by running on.

Example:
    >>> import jax, jax.numpy as jnp
    >>> def f(x):
    ...     y = jnp.log(x)
    ...     return jnp.where(x > 0, y, 0.0) + 1.0, (y * 2.0).sum()
    >>> jaxpr = jax.make_jaxpr(f)(jnp.ones(2)).jaxpr
    >>> y = jaxpr.eqns[0].outvars[0]   # the log's result
    >>> sorted(surely_reached(jaxpr)[y])  # the select may drop it on the way to output 0; the sum keeps it
    [1]
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from jaxdbg import _compat

if TYPE_CHECKING:
    from jaxdbg.jaxpr.interpreter import Site

# Primitives whose output holds a NaN whenever an operand does (elementwise maths, NaN * 0 included; sums,
# matmuls and cumulative sums over the NaN; moves that keep every element). Not here: selects, comparisons,
# max/min (backend-dependent), slices and gathers (they may leave the NaN element behind), pow (1 ** NaN = 1).
KEEPS_NAN = frozenset({
    "abs", "acos", "acosh", "add", "add_any", "asin", "asinh", "atan", "atan2", "atanh", "broadcast_in_dim",
    "cbrt", "ceil", "concatenate", "conj", "convert_element_type", "copy", "copy_p", "cos", "cosh", "cumsum",
    "digamma", "div", "dot_general", "erf", "erf_inv", "erfc", "exp", "exp2", "expand_dims", "expm1", "floor",
    "imag", "integer_pow", "lgamma", "log", "log1p", "logistic", "mul", "neg", "pad", "real", "reduce_precision",
    "reduce_sum", "reshape", "rev", "round", "rsqrt", "sharding_constraint", "sign", "sin", "sinh", "sqrt",
    "square", "squeeze", "sub", "tan", "tanh", "transpose",
})

# Calls: their operands and results map one to one onto their jaxpr's inputs and outputs (param: its jaxpr).
CALLS = {"jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
         "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr", "custom_vjp_call_jaxpr": "fun_jaxpr",
         "remat2": "jaxpr", "checkpoint": "jaxpr", "eval_jaxpr": "call_jaxpr"}

_REACHED: weakref.WeakKeyDictionary[Any, dict[Any, frozenset[int]]] = weakref.WeakKeyDictionary()


def surely_reached(jaxpr: Any) -> dict[Any, frozenset[int]]:
    """Variable -> the positions of ``jaxpr``'s outputs that a NaN it holds surely reaches (absent: none).
    Computed once per jaxpr, backwards from its outputs, and forgotten with it."""
    found = _REACHED.get(jaxpr)
    if found is not None:
        return found
    reached: dict[Any, set[int]] = {}
    for position, atom in enumerate(jaxpr.outvars):
        if not _compat.is_literal(atom):
            reached.setdefault(atom, set()).add(position)
    for eqn in reversed(jaxpr.eqns):
        outs = [reached.get(v, set()) for v in eqn.outvars]
        if not any(outs):
            continue
        for i, atom in enumerate(eqn.invars):
            if _compat.is_literal(atom):
                continue
            gained = _through(eqn, i, outs)
            if gained:
                reached.setdefault(atom, set()).update(gained)
    found = {var: frozenset(positions) for var, positions in reached.items()}
    _REACHED[jaxpr] = found
    return found


def _through(eqn: Any, operand: int, outs: list[set[int]]) -> set[int]:
    """The output positions (of the enclosing jaxpr) that a NaN in operand ``operand`` of ``eqn`` surely reaches,
    given ``outs``, those its results surely reach."""
    name = eqn.primitive.name
    if name in CALLS:
        inner = called_jaxpr(eqn)
        if inner is None:
            return set()
        invar = list(inner.invars)[operand] if operand < len(inner.invars) else None
        positions = surely_reached(inner).get(invar, frozenset()) if invar is not None else frozenset()
        return set().union(*(outs[p] for p in positions if p < len(outs)))
    if name not in KEEPS_NAN or not _keeps(eqn):
        return set()
    return set().union(*outs)


def called_jaxpr(eqn: Any) -> Any:
    """The jaxpr a call equation runs on its operands (one to one), or None for any other equation."""
    param = CALLS.get(eqn.primitive.name)
    closed = (eqn.params.get(param) or eqn.params.get("fun_jaxpr")) if param else None
    return _compat.open_jaxpr(closed)[0] if closed is not None else None


def _keeps(eqn: Any) -> bool:
    """The parameters that would let a NaN go: a cast to integers, ``x ** 0``, a negative (cropping) pad."""
    name = eqn.primitive.name
    if name == "convert_element_type":
        return bool(np.issubdtype(np.dtype(eqn.params["new_dtype"]), np.inexact))
    if name == "integer_pow":
        return eqn.params.get("y") != 0
    if name == "pad":
        return all(low >= 0 and high >= 0 for low, high, _ in eqn.params["padding_config"])
    return True


def reaches_outputs(site: Site, positions: list[int]) -> bool:
    """Whether a NaN in the results at ``positions`` of the equation at ``site`` surely reaches an output of
    the call being replayed (followed out of the calls the site sits in; a loop or branch it sits in stops it:
    the replay vouches for those once they finish)."""
    scope, outvars = site.scope, [site.eqn.outvars[p] for p in positions]
    while True:
        reached = surely_reached(scope.jaxpr)
        outputs: set[int] = set().union(*(reached.get(v, frozenset()) for v in outvars))
        if not outputs:
            return False
        parent = scope.parent
        if parent is None:
            return True
        if scope.kind != "call" or parent.primitive not in CALLS:  # loop carries, branches, kernels: not one to one
            return False
        outvars = [parent.eqn.outvars[p] for p in outputs if p < len(parent.eqn.outvars)]
        scope = parent.scope
