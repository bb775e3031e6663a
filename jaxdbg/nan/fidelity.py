"""When op-by-op replay stays finite but the compiled call did not: bisect over compiled prefixes.

XLA rewrites algebra and fuses operations, so a compiled function can produce a NaN that the same
equations run one at a time never do (``(y + 1e8) - 1e8`` folds to ``y`` under jit, but is ``0`` op by
op in float32). Then jaxdbg compiles *prefixes* of the computation instead: the first ``k`` equations,
returning every value still needed afterwards (the frontier), and bisects on "does the frontier hold a
non-finite value" to the first equation whose compiled output does. Calls to inner jitted functions,
custom_jvp/custom_vjp and remat are inlined first, so the cut can fall inside them; loops and branches
stay whole (the origin may then be a whole loop, and the report says so).

Example:
    >>> import jax, jax.numpy as jnp
    >>> f = lambda y: jnp.log(((y + 1e8) - 1e8) + 0.1)
    >>> closed = jax.make_jaxpr(f)(jnp.float32(-0.5))
    >>> found = bisect_compiled(closed, [jnp.float32(-0.5)], "f")
    >>> found.origin.primitive, found.probes > 0
    ('log', True)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax

from jaxdbg import _compat
from jaxdbg.jaxpr import RULES, Hooks, Interpreter, Site
from jaxdbg.nan.passes import backward_equations
from jaxdbg.nan.result import Origin
from jaxdbg.nan.stats import nonfinite_flags, value_stats

INLINED = ("jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call",
           "custom_vjp_call_jaxpr", "remat2", "checkpoint", "eval_jaxpr")


@dataclass(frozen=True)
class BisectResult:
    origin: Origin
    probes: int  # compiled prefixes run
    equations: int  # equations of the flattened computation


class _PathRecorder(Hooks):
    """Remembers the path and equation of every leaf equation evaluated while retracing."""

    def __init__(self) -> None:
        self.sites: list[Site] = []

    def after(self, site: Site, invals: list, outvals: list, in_tags: list, out_tags: list,
              descended: bool) -> None:
        if not descended:
            self.sites.append(site)


def flatten(closed: Any, leaves: Sequence[Any], root: str) -> tuple[Any, list[tuple[str, ...] | None]]:
    """Retrace ``closed`` with call-like primitives inlined; returns the flat jaxpr and each equation's path."""
    recorder = _PathRecorder()
    interp = Interpreter(recorder, {k: RULES[k] for k in INLINED if k in RULES}, keep_source=True)
    flat = jax.make_jaxpr(lambda *xs: interp.run(closed, xs, root=root)[0])(*leaves)
    jaxpr, _ = _compat.open_jaxpr(flat)
    names = [e.primitive.name for e in jaxpr.eqns]
    if names == [s.primitive for s in recorder.sites]:
        return flat, [s.path for s in recorder.sites]
    return flat, [None] * len(names)  # the retrace folded or added equations: paths unknown


class _Prefixes:
    """Compiled runs of the first k+1 equations of a flat jaxpr, returning chosen values."""

    def __init__(self, flat: Any, leaves: Sequence[Any]):
        self.jaxpr, self.consts = _compat.open_jaxpr(flat)
        self.leaves = list(leaves)
        self.eqns = list(self.jaxpr.eqns)
        self.probes = 0
        last = {}
        for i, eqn in enumerate(self.eqns):
            for atom in eqn.invars:
                if not _compat.is_literal(atom):
                    last[atom] = i
        for atom in self.jaxpr.outvars:
            if not _compat.is_literal(atom):
                last[atom] = len(self.eqns)
        self.last_use = last

    def frontier(self, k: int) -> list:
        """Values made by equations 0..k that are still needed after k (or are outputs)."""
        return [v for eqn in self.eqns[: k + 1] for v in eqn.outvars
                if not _compat.is_drop_var(v) and self.last_use.get(v, -1) > k]

    def run(self, k: int, wanted: Sequence[Any]) -> list:
        wanted = [v for v in wanted if not _compat.is_literal(v)]
        eqns, jaxpr, consts = self.eqns[: k + 1], self.jaxpr, self.consts

        def prefix(*xs: Any) -> list:
            env = dict(zip(jaxpr.constvars, consts))
            env.update(zip(jaxpr.invars, xs))
            for eqn in eqns:
                ins = [a.val if _compat.is_literal(a) else env[a] for a in eqn.invars]
                env.update(zip(eqn.outvars, _compat.bind_eqn(eqn, ins)))
            return [env[v] for v in wanted]

        self.probes += 1
        return jax.jit(prefix)(*self.leaves)


def bisect_compiled(closed: Any, leaves: Sequence[Any], function: str, call_index: int = 0,
                    nan_only: bool = False, root: str | None = None) -> BisectResult | None:
    """The first equation whose *compiled* output is non-finite, or None if compiled prefixes stay finite (``root``:
    the path's first element, ``jit(function)`` unless given)."""
    root = root or f"jit({function})"
    flat, paths = flatten(closed, leaves, root)
    prefixes = _Prefixes(flat, leaves)
    n = len(prefixes.eqns)
    if n == 0:
        return None

    def dirty(k: int) -> bool:
        flags = [nonfinite_flags(v) for v in prefixes.run(k, prefixes.frontier(k))]
        return any(nan or (inf and not nan_only) for nan, inf in flags)

    if not dirty(n - 1):
        return None
    lo, hi = -1, n - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if dirty(mid):
            hi = mid
        else:
            lo = mid
    eqn = prefixes.eqns[hi]
    ins = _inputs_of(prefixes, hi)
    outs = prefixes.run(hi, eqn.outvars)
    has_nan = any(nonfinite_flags(v)[0] for v in outs)
    backward, _ = backward_equations(prefixes.jaxpr, False, frozenset())
    path = paths[hi] or (root,)
    origin = Origin(
        "nan" if has_nan else "inf", eqn.primitive.name, "backward" if hi in backward else "forward",
        _compat.eqn_source(eqn), function, call_index, tuple(path), tuple(value_stats(v) for v in ins), None,
        tuple(value_stats(v) for v in outs), _compat.eqn_name_stack(eqn),
    )
    return BisectResult(origin, prefixes.probes, n)


def _inputs_of(prefixes: _Prefixes, k: int) -> list:
    """Concrete inputs of equation k as the compiled prefix before it computes them."""
    eqn = prefixes.eqns[k]
    computed = [a for a in eqn.invars if not _compat.is_literal(a)]
    values = dict(zip(computed, prefixes.run(k - 1, computed))) if k > 0 and computed else {}
    env = dict(zip(prefixes.jaxpr.constvars, prefixes.consts))
    env.update(zip(prefixes.jaxpr.invars, prefixes.leaves))
    out = []
    for atom in eqn.invars:
        if _compat.is_literal(atom):
            out.append(atom.val)
        else:
            out.append(values.get(atom, env.get(atom)))
    return out
