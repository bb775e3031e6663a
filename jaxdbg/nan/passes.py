"""Forward or backward pass: which equations of a differentiated program compute the gradient.

An equation is *backward* when jax transposed it (its name stack reads ``transpose(...)``), or when it
sits inside a backward equation, or by data flow: every use of its outputs is a backward equation (the
derivative residuals, such as ``div 0.5 sqrt(x)`` for the gradient of ``sqrt``, live among the ``jvp``
equations and are told apart only this way).

When a program uses ``grad`` without the primal value, data flow alone would call the whole forward
computation backward (it only feeds the gradient). Then an equation counts as a residual only if one of
its inputs comes from the same source line (the derivative of ``sqrt`` reads ``sqrt``'s own output).

Example:
    >>> import jax, jax.numpy as jnp
    >>> closed = jax.make_jaxpr(jax.value_and_grad(lambda x: jnp.sqrt(x)))(1.0)
    >>> [(e.primitive.name, backward) for e, backward in classify(closed.jaxpr)]
    [('sqrt', False), ('div', True), ('mul', True)]
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from jaxdbg import _compat
from jaxdbg.jaxpr import Site
from jaxdbg.nan.result import Pass


def _is_transposed(eqn: Any) -> bool:
    return "transpose(" in _compat.eqn_name_stack(eqn)


def _is_jvp(eqn: Any) -> bool:
    return "jvp(" in _compat.eqn_name_stack(eqn)


def differentiates(jaxpr: Any) -> bool:
    """Whether a (closed or open) jaxpr computes a derivative anywhere, inside loops and calls too: a training
    step does, an ODE solve or a forward-only model does not (then "clip gradients" is no advice).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> differentiates(jax.make_jaxpr(jax.grad(jnp.sin))(1.0)), differentiates(jax.make_jaxpr(jnp.sin)(1.0))
        (True, False)
    """
    from jaxdbg.repro.graph import nested_equations

    return any(_is_jvp(eqn) or _is_transposed(eqn) for eqn in nested_equations(getattr(jaxpr, "jaxpr", jaxpr).eqns))


def differentiates_only_in_loops(jaxpr: Any) -> bool:
    """Whether every derivative a jaxpr computes is taken inside a loop body (scan, while): the gradient drives
    an iteration of its own, as a leapfrog (HMC) or Langevin integrator or an inner optimisation does, rather
    than one update of a training step (a gradient accumulated over micro-batches in a scan is one too).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> leapfrog = lambda z: jax.lax.scan(lambda z, _: (z - 0.1 * jax.grad(jnp.sin)(z), None), z, None, 3)[0]
        >>> differentiates_only_in_loops(jax.make_jaxpr(leapfrog)(1.0))
        True
        >>> differentiates_only_in_loops(jax.make_jaxpr(jax.grad(jnp.sin))(1.0))
        False
    """
    from jaxdbg.repro.graph import inner_jaxprs

    def outside(eqns: Any) -> bool:  # a derivative outside every loop body
        return any(_is_jvp(e) or _is_transposed(e) or (e.primitive.name not in ("scan", "while") and any(
            outside(inner.eqns) for inner in inner_jaxprs(e.params))) for e in eqns)

    eqns = getattr(jaxpr, "jaxpr", jaxpr).eqns
    return differentiates(jaxpr) and not outside(eqns)


def backward_equations(jaxpr: Any, inherited: bool,
                       backward_outputs: frozenset[int]) -> tuple[set[int], dict[int, frozenset[int]]]:
    """Indices of the backward equations of ``jaxpr``, and per equation which of its outputs feed only them.

    ``inherited``: the enclosing equation is backward (so is everything inside). ``backward_outputs``: the
    positions of ``jaxpr.outvars`` whose outer uses are all backward.
    """
    eqns = list(jaxpr.eqns)
    if inherited:
        return set(range(len(eqns))), {i: frozenset(range(len(e.outvars))) for i, e in enumerate(eqns)}
    users: dict[Any, list[int]] = defaultdict(list)
    for i, eqn in enumerate(eqns):
        for atom in eqn.invars:
            if not _compat.is_literal(atom):
                users[atom].append(i)
    outputs_at: dict[Any, list[int]] = defaultdict(list)
    for position, atom in enumerate(jaxpr.outvars):
        if not _compat.is_literal(atom):
            outputs_at[atom].append(position)

    def sweep(residual_test: Any) -> tuple[set[int], dict[int, frozenset[int]]]:
        backward: set[int] = set()
        feeds_backward: dict[int, frozenset[int]] = {}
        for i in range(len(eqns) - 1, -1, -1):
            eqn = eqns[i]
            if _is_transposed(eqn):
                backward.add(i)
                feeds_backward[i] = frozenset(range(len(eqn.outvars)))
                continue
            only_backward = []
            for atom in eqn.outvars:
                if _compat.is_drop_var(atom):
                    continue
                uses, exits = users.get(atom, []), outputs_at.get(atom, [])
                only_backward.append(bool(uses or exits) and all(u in backward for u in uses)
                                     and all(p in backward_outputs for p in exits))
            feeds_backward[i] = frozenset(k for k, flag in enumerate(only_backward) if flag)
            if only_backward and all(only_backward) and residual_test(i):
                backward.add(i)
        return backward, feeds_backward

    backward, feeds = sweep(lambda i: True)
    primal = [i for i, e in enumerate(eqns) if _is_jvp(e) and not _is_transposed(e)]
    if primal and all(i in backward for i in primal):  # grad without the primal value: see module docstring
        producer_line = {}
        for eqn in eqns:
            for atom in eqn.outvars:
                producer_line[atom] = _compat.eqn_source(eqn)

        def same_line_input(i: int) -> bool:
            eqn = eqns[i]
            if not _is_jvp(eqn):
                return True
            line = _compat.eqn_source(eqn)
            return line is not None and any(
                not _compat.is_literal(a) and producer_line.get(a) == line for a in eqn.invars)

        backward, feeds = sweep(same_line_input)
    return backward, feeds


class PassClassifier:
    """Answers "is this site in the backward pass?" for sites of one interpretation (cached per jaxpr)."""

    def __init__(self, backward_outputs: frozenset[int] = frozenset()) -> None:
        """``backward_outputs``: the positions of the top-level jaxpr's outputs that only a backward pass run
        later uses (the residuals of a forward program that ``jax.grad`` runs eagerly, outside jit)."""
        self._cache: dict[tuple, tuple[set[int], dict[int, frozenset[int]]]] = {}
        self._top_outputs = backward_outputs

    def is_backward(self, site: Site) -> bool:
        backward, _ = self._analysis(site)
        return site.index in backward

    def pass_of(self, site: Site) -> Pass:
        return "backward" if self.is_backward(site) else "forward"

    def _analysis(self, site: Site) -> tuple[set[int], dict[int, frozenset[int]]]:
        scope = site.scope
        parent = scope.parent
        inherited = parent is not None and self.is_backward(parent)
        outs: frozenset[int] = self._top_outputs if parent is None else frozenset()
        if parent is not None and not inherited and scope.kind != "while_cond":
            outs = self._analysis(parent)[1].get(parent.index, frozenset())
        key = (id(scope.jaxpr), inherited, outs)
        if key not in self._cache:
            self._cache[key] = backward_equations(scope.jaxpr, inherited, outs)
        return self._cache[key]


def classify(jaxpr: Any) -> Iterator[tuple[Any, bool]]:
    """``(equation, is_backward)`` for the top-level equations of an open jaxpr."""
    backward, _ = backward_equations(jaxpr, False, frozenset())
    for i, eqn in enumerate(jaxpr.eqns):
        yield eqn, i in backward
