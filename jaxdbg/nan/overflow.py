"""The ``overflow`` analysis: a float16/bfloat16 value that left its dtype's range before the origin, and led to it.

Mixed precision fails this way: float16 tops out at 65504, so ``x * x`` of raw pixel values or unscaled
attention logits ``q @ k.T`` overflow to Inf, and a few operations later that Inf is a NaN (``inf - inf`` in a
softmax) or, through ``rsqrt(inf) = 0``, a 0 that becomes a NaN in the gradient. The NaN is the contract's
origin, but the fix belongs where the value left the range: compute that operation in float32, scale its
inputs, or (for a gradient) scale the loss. An epsilon does not help.

A candidate is an operation of the replay that made an Inf from finite inputs in bf16/f16: the chain's Infs,
and any other Inf made before the origin whose equation the origin's depends on (data flow through the
jaxpr, so also through values that turned finite again). The earliest is the root cause.

Example:
    >>> import jax.numpy as jnp
    >>> from jaxdbg.nan.analyses import Findings
    >>> from jaxdbg.nan.calls import Call
    >>> from jaxdbg.nan.localise import localise_call
    >>> found = localise_call(Call("f", lambda x: (x * x) - (x * x), (jnp.float16(300.0),), {}))
    >>> findings = Findings(found.first, localisation=found, chain=list(found.chain))
    >>> analyse(findings)
    >>> findings.overflow.origin.primitive, findings.overflow.dtype, findings.overflow.max, findings.overflow.reach
    ('mul', 'f16', 65504.0, 90000.0)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jaxdbg.nan.result import Origin, Overflow

if TYPE_CHECKING:
    from jaxdbg.nan.analyses import Findings

LIMITS = {"f16": 65504.0, "bf16": 3.3895313892515355e38}
PRODUCTS = ("mul", "dot_general", "conv_general_dilated", "integer_pow", "square")  # reach: a product of inputs


def analyse(findings: Findings) -> None:
    """Set ``findings.overflow`` to the earliest low-precision overflow behind the origin, if there is one."""
    first = findings.first
    if first is None or first.kind == "input":
        return
    if _overflowed(first):
        findings.overflow = _described(first)
        return
    found = findings.localisation
    target = getattr(getattr(found, "record", None), "site", None)
    candidates = [o for o in findings.chain if _overflowed(o)]
    candidates += [r.origin for r in getattr(found, "infs", ()) if _overflowed(r.origin) and r.site is not None
                   and target is not None and r.origin not in candidates and _feeds(r.site, target)]
    if candidates:
        findings.overflow = _described(candidates[0])


def _overflowed(origin: Origin) -> bool:
    """An Inf made in bf16/f16 from finite inputs (not a 1/0 or log(0), which no range would hold)."""
    if origin.kind != "inf" or not origin.outputs or origin.outputs[0].dtype not in LIMITS:
        return False
    if any(not s.finite for s in origin.inputs):
        return False
    return not any(s.zero for s in origin.inputs) or origin.primitive not in ("div", "log", "rsqrt", "pow")


def _described(origin: Origin) -> Overflow:
    dtype = origin.outputs[0].dtype
    sizes = sorted((max(abs(s.min or 0.0), abs(s.max or 0.0)) for s in origin.inputs), reverse=True)
    reach: float | None = None
    if origin.primitive in PRODUCTS and sizes:
        reach = sizes[0] * (sizes[1] if len(sizes) > 1 else sizes[0])
    return Overflow(origin, dtype, LIMITS[dtype], reach)


def _feeds(upstream: Any, downstream: Any) -> bool:
    """Whether the equation at site ``upstream`` computes (directly or not) an input of the one at ``downstream``:
    compared in the innermost jaxpr that holds both (an enclosing call stands for what runs inside it)."""
    up = [(s.scope, s.index) for s in (*upstream.enclosing(), upstream)]
    down = [(s.scope, s.index) for s in (*downstream.enclosing(), downstream)]
    k = 0
    while k < min(len(up), len(down)) and up[k][0] is down[k][0] and up[k][1] == down[k][1]:
        k += 1
    if k >= len(up) or k >= len(down) or up[k][0] is not down[k][0]:
        return False  # one holds the other, or they sit in different runs of a loop
    scope, source, target = up[k][0], up[k][1], down[k][1]
    return source < target and source in _upstream(scope.jaxpr, target)


def _upstream(jaxpr: Any, index: int) -> set[int]:
    """Indices of the equations of ``jaxpr`` whose outputs reach equation ``index``'s inputs."""
    from jaxdbg import _compat

    producer = {var: i for i, eqn in enumerate(jaxpr.eqns[:index]) for var in eqn.outvars}
    seen: set[int] = set()
    stack = [a for a in jaxpr.eqns[index].invars if not _compat.is_literal(a)]
    while stack:
        i = producer.get(stack.pop())
        if i is not None and i not in seen:
            seen.add(i)
            stack += [a for a in jaxpr.eqns[i].invars if not _compat.is_literal(a)]
    return seen
