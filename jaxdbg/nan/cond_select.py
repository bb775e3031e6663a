"""The ``cond_select`` analysis: a NaN born in a branch of a ``lax.cond`` that vmap turned into a select, or
one a ``jnp.where`` discarded that still reached a gradient.

Under ``vmap``, a ``lax.cond`` (or ``lax.switch``) whose predicate differs between batch elements cannot run
one branch: jax computes every branch for every element and keeps one result per element (``select_n``). A
NaN born in a branch is then either in a result the select keeps (an element that takes the branch made it:
a NaN of the branch itself) or in one it discards (the branch ran for an element that does not take it). A
discarded NaN reaches no output: the select drops it, and jax drops it from the gradient too (the batched cond
selects each branch's inputs, so no cotangent flows into a branch an element did not take; jax#1052). It is
still the origin when it is the first NaN made (``jax_debug_nans`` stops there too), and the replay goes on to
the first NaN that does reach the outputs, which the explanation names (:mod:`jaxdbg.nan.localise`).

A plain select (``jnp.where``) keeps no NaN out of a gradient: its backward pass sends a zero cotangent to the
entries it discarded, where the masked operation's derivative is NaN (or infinite), and 0 * NaN is NaN. An origin
in a differentiated forward pass whose NaN such a select discards entirely is reported with that select
(``cond`` False): the NaN reached the outputs through the gradient.

The origin's outputs are followed forward through its jaxpr (and out of the calls it sits in) to such a
select; one more replay of the call, up to that select, counts the origin's NaNs it keeps and discards.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from jaxdbg.nan.analyses import Findings
    >>> from jaxdbg.nan.calls import Call
    >>> from jaxdbg.nan.localise import localise_call
    >>> def roots(x):   # the bug: -5 < v < 0 takes the square root branch
    ...     return jax.vmap(lambda v: jax.lax.cond(v > -5, jnp.sqrt, jnp.zeros_like, v))(x)
    >>> call = Call("roots", roots, (jnp.array([4.0, -1.0, -9.0]),), {})
    >>> found = localise_call(call)
    >>> findings = Findings(found.first, call=call, localisation=found)
    >>> analyse(findings)
    >>> findings.cond_select.branch, findings.cond_select.kept, findings.cond_select.discarded
    (1, 1, 1)
    >>> masked = jax.grad(lambda x: jnp.where(x > 0, jnp.sqrt(x), 0.0).sum())   # NaN gradient at x < 0
    >>> call = Call("grad", masked, (jnp.array([4.0, -1.0]),), {})
    >>> found = localise_call(call)
    >>> findings = Findings(found.first, call=call, localisation=found)
    >>> analyse(findings)
    >>> findings.cond_select.cond, findings.cond_select.kept, findings.cond_select.discarded
    (False, 0, 1)
    >>> def branch(v):   # a where inside a branch discards the NaN before the cond's select sees it
    ...     return jnp.where(v > 0, jnp.sqrt(v), 0.0)
    >>> per_item = lambda v, p: jax.lax.cond(p, branch, jnp.negative, v)
    >>> masked = jax.grad(lambda x, p: jax.vmap(per_item)(x, p).sum())
    >>> call = Call("grad", masked, (jnp.array([4.0, -1.0]), jnp.array([True, True])), {})
    >>> found = localise_call(call)
    >>> findings = Findings(found.first, call=call, localisation=found)
    >>> analyse(findings)
    >>> findings.cond_select.cond, findings.cond_select.kept, findings.cond_select.discarded
    (False, 0, 1)
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from jaxdbg import _compat
from jaxdbg._source import SourceLocation
from jaxdbg.jaxpr import Hooks, Interpreter, Stop
from jaxdbg.nan.reach import called_jaxpr
from jaxdbg.nan.stats import host_floats, host_readable

if TYPE_CHECKING:
    from jaxdbg.jaxpr.interpreter import Scope, Site
    from jaxdbg.nan.analyses import Findings


@dataclass(frozen=True)
class CondSelect:
    """The select a cond became under vmap, reached from the origin: the cond's line (``source``), how many
    branches it has, the branch the origin's NaN flows into (``branch``, as jax numbers them: for a
    ``lax.cond``, 0 is the false branch and 1 the true one), and how many NaN values of that branch the
    select ``kept`` (the element takes the branch) and ``discarded`` (it takes another). ``cond`` False: a
    plain select (``jnp.where``) that discarded every NaN of the origin, which reached a gradient anyway."""

    source: SourceLocation | None
    branches: int
    branch: int
    kept: int
    discarded: int
    cond: bool = True


def analyse(findings: Findings) -> None:
    """Set ``findings.cond_select`` when the origin flows into a cond that vmap turned into a select (the path
    need not say vmap: a jit inside the branch has a name stack of its own)."""
    first, found, call = findings.first, findings.localisation, findings.call
    if first is None or first.kind != "nan" or found is None or call is None or call.fun is None \
            or found.closed_jaxpr is None:
        return
    record = getattr(found, "record", None)
    if record is None or record.site is None:
        return
    reached = find_select(record.site)
    counted = count_selected(call, found.closed_jaxpr, reached) if reached is not None else None
    if counted is not None and (counted.kept or counted.discarded):
        findings.cond_select = counted
    elif counted is None and reached is not None:
        return  # the replay did not reach the cond's select: nothing to say of it
    elif first.pass_ == "forward" and "jvp(" in first.name_stack:  # differentiated: a where may not keep it out
        reached = find_select(record.site, any_select=True)
        if reached is not None and _in_backward(reached):
            reached = None  # the gradient's own select (a where's transpose): the NaN went forward, unmasked
        counted = count_selected(call, found.closed_jaxpr, reached) if reached is not None else None
        if counted is not None and not counted.kept and counted.discarded:
            findings.cond_select = replace(counted, cond=False)


def _in_backward(target: Target) -> bool:
    """Whether the select is not one of the differentiated forward pass (``jvp(...)`` in its name stack, as the
    origin's): a select of the gradient computation, such as a where's transpose (its name stack reads
    ``transpose(...)``, or nothing at all under Flax NNX's ``value_and_grad``)."""
    stacks: list[str] = []
    parent = target.scope.parent  # the calls the select sits in, outermost first
    while parent is not None:
        stacks.insert(0, _compat.eqn_name_stack(parent.eqn))
        parent = parent.scope.parent
    stacks += [_compat.eqn_name_stack(eqn) for eqn, _ in target.hops]
    stack = "/".join([*stacks, _compat.eqn_name_stack(target.jaxpr.eqns[target.index])])
    return "jvp(" not in stack or "transpose(" in stack


@dataclass(frozen=True)
class Target:
    """A select to stop at: equation ``index`` of ``jaxpr``, reached from the origin's own ``scope`` (as the
    replay runs it) through the call equations ``hops`` (outermost first); ``branch``: the case the origin's
    value enters."""

    scope: Scope
    hops: tuple[tuple[Any, int], ...]
    jaxpr: Any
    index: int
    branch: int

    def at(self, site: Site) -> bool:
        """Whether the replay is at this select now (in the origin's pass through its scope)."""
        if site.index != self.index or site.scope.jaxpr is not self.jaxpr:
            return False
        scope = site.scope
        for eqn, index in reversed(self.hops):
            parent = scope.parent
            if parent is None or parent.eqn is not eqn or parent.index != index:
                return False
            scope = parent.scope
        return scope.jaxpr is self.scope.jaxpr and scope.path == self.scope.path


_PREDICATE = object()  # the value enters a select as its predicate, which is no branch


def find_select(origin: Site, any_select: bool = False) -> Target | None:
    """The first select made from a batched cond (``any_select``: the first select of any kind) that a value
    computed from the origin's outputs enters as a branch's result, looking into the calls it enters; None
    when none does (or the value enters one as its predicate, which is no branch)."""
    scope, start = origin.scope, origin.index + 1
    tainted = {id(var) for var in origin.eqn.outvars}
    while True:
        found = _search(scope.jaxpr, start, tainted, any_select, ())
        if found is _PREDICATE:
            return None
        if found is not None:
            return Target(scope, *found)
        parent = scope.parent  # an enclosing call's outputs are its equation's outputs in the caller
        outputs = [i for i, var in enumerate(scope.jaxpr.outvars) if id(var) in tainted]
        if parent is None or scope.kind != "call" or not outputs:
            return None
        tainted = {id(parent.eqn.outvars[i]) for i in outputs if i < len(parent.eqn.outvars)}
        scope, start = parent.scope, parent.index + 1


def _search(jaxpr: Any, start: int, tainted: set[int], any_select: bool, hops: tuple) -> Any:
    """``(hops, jaxpr, index, branch)`` of the first select the tainted values enter from equation ``start`` on
    (``tainted`` grows with what they compute), ``_PREDICATE``, or None."""
    for index in range(start, len(jaxpr.eqns)):
        eqn = jaxpr.eqns[index]
        entered = [i for i, atom in enumerate(eqn.invars) if not _compat.is_literal(atom) and id(atom) in tainted]
        if not entered:
            continue
        if eqn.primitive.name == "select_n" and (any_select or _compat.is_batched_cond_select(eqn)):
            return (hops, jaxpr, index, entered[0] - 1) if 0 not in entered else _PREDICATE
        inner = called_jaxpr(eqn)
        if inner is not None:  # a jnp.where is a call of its own
            found = _search(inner, 0, {id(v) for i, v in enumerate(inner.invars) if i in entered}, any_select,
                            (*hops, (eqn, index)))
            if found is not None:
                return found
        tainted.update(id(var) for var in eqn.outvars)
    return None


def count_selected(call: Any, closed: Any, target: Target) -> CondSelect | None:
    """Replay ``call`` up to the ``target`` select and count the NaNs of its branch it keeps and discards; None
    when the replay does not reach it (or cannot read its values on this host)."""
    seen = _AtSelect(target)
    with contextlib.suppress(Stop):
        Interpreter(seen).run(closed, call.leaves(), root=call.root)
    if seen.counts is None:
        return None
    eqn = target.jaxpr.eqns[target.index]
    calls = (call_eqn for call_eqn, _ in reversed(target.hops))  # a jnp.where's select has the where's line
    source = _compat.eqn_source(eqn) or next(filter(None, map(_compat.eqn_source, calls)), None)
    return CondSelect(source, len(eqn.invars) - 1, target.branch, *seen.counts)


class _AtSelect(Hooks):
    """Stops the replay at the select, counting the NaNs of one branch where the predicate chose it (kept) and
    where it chose another (discarded)."""

    def __init__(self, target: Target):
        self.target, self.branch = target, target.branch
        self.counts: tuple[int, int] | None = None

    def before(self, site: Site, invals: list, in_tags: list) -> list | None:
        if self.target.at(site):
            which, values = invals[0], invals[self.branch + 1]
            if host_readable(which) and host_readable(values):  # not a global array spanning other processes
                nan = _nan_mask(values)
                chosen = np.broadcast_to(np.asarray(which).astype(int) == self.branch, nan.shape)
                self.counts = int((nan & chosen).sum()), int((nan & ~chosen).sum())
            raise Stop()
        return None


def _nan_mask(value: Any) -> np.ndarray:
    """Where ``value`` holds a NaN, in its own shape (16-bit floats widened; a complex NaN in either part)."""
    host = np.asarray(value)
    if host.dtype.kind != "c":
        host = host_floats(host)
    return np.isnan(host) if host.dtype.kind in "fc" else np.zeros(host.shape, bool)
