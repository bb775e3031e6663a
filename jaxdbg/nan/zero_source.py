"""The ``zero`` analysis: where the zero came from that the origin divided by (or took the log of).

"0 / 0 at line 8" is where the NaN is born; what to fix is usually where the 0 was made: an ``exp`` of a
parameter that one bad update sent to -377 underflows to 0 three lines earlier, a ``sum`` of a mask that is
all padding, ``x - x``. The origin's zero operand is followed back through the equations that computed it
(in the origin's own jaxpr), with the values they held in one more replay of the call up to the origin, to
the operation that made a zero from inputs that held none (an underflow, a cancellation), or to the
argument of the call that brought it in.

Example:
    >>> import jax.numpy as jnp
    >>> from jaxdbg.nan.analyses import Findings
    >>> from jaxdbg.nan.calls import Call
    >>> from jaxdbg.nan.localise import localise_call
    >>> call = Call("f", lambda x, s: x / jnp.exp(s) ** 2, (jnp.float32(0.0), jnp.float32(-377.0)), {})
    >>> found = localise_call(call)
    >>> findings = Findings(found.first, call=call, localisation=found)
    >>> analyse(findings)
    >>> findings.zero_source.primitive, findings.zero_source.how, findings.zero_source.arguments
    ('exp', 'underflow', ('s',))
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jaxdbg import _compat
from jaxdbg._source import SourceLocation
from jaxdbg.jaxpr import Hooks, Interpreter, Stop
from jaxdbg.nan.result import ValueStats
from jaxdbg.nan.stats import value_stats

if TYPE_CHECKING:
    from jaxdbg.jaxpr.interpreter import Site
    from jaxdbg.nan.analyses import Findings

# primitive -> which operand a zero makes it non-finite
ZERO_OPERAND = {"div": 1, "rem": 1, "log": 0, "rsqrt": 0, "pow": 0, "integer_pow": 0}
UNDERFLOWS = ("exp", "exp2", "mul", "integer_pow", "pow", "square", "div", "dot_general", "logistic", "sqrt")
CANCELS = ("sub", "add", "add_any", "reduce_sum")
COMPARES = ("eq", "ne", "lt", "le", "gt", "ge", "and", "or", "not")  # a False is made here, whatever went in


@dataclass(frozen=True)
class ZeroSource:
    """Where the origin's zero operand was made: by ``primitive`` at ``source`` from ``inputs`` (``how``:
    ``underflow``, ``cancellation`` or ``made``), or brought in by an argument of the call (``primitive`` None,
    ``how`` ``argument``) or of the loop or inner function the origin is in (``outside``); ``arguments``: the
    call's arguments it was computed from."""

    primitive: str | None
    source: SourceLocation | None
    how: str
    inputs: tuple[ValueStats, ...] = ()
    arguments: tuple[str, ...] = ()


def analyse(findings: Findings) -> None:
    """Set ``findings.zero_source`` when the origin is a division by zero (or log/rsqrt/pow of 0)."""
    first, found, call = findings.first, findings.localisation, findings.call
    if first is None or first.kind == "input" or found is None or call is None or call.fun is None:
        return
    operand = ZERO_OPERAND.get(first.primitive or "")
    record = getattr(found, "record", None)
    if operand is None or operand >= len(first.inputs) or not first.inputs[operand].zero or record is None \
            or record.site is None or found.closed_jaxpr is None:
        return
    findings.zero_source = trace_zero(call, found.closed_jaxpr, record.site, operand)


def trace_zero(call: Any, closed: Any, origin: Site, operand: int) -> ZeroSource | None:
    """Follow the zero in operand ``operand`` of the equation at ``origin`` back to where it was made."""
    jaxpr = origin.scope.jaxpr
    producers = {id(v): i for i, eqn in enumerate(jaxpr.eqns[:origin.index]) for v in eqn.outvars}
    needed = _slice(jaxpr, origin.eqn.invars[operand], producers)
    seen = _Recorder(origin, operand, needed)
    with contextlib.suppress(Stop):  # the replay ends at the origin
        Interpreter(seen).run(closed, call.leaves(), root=call.root)
    if not seen.reached:
        return None
    names = call.leaf_names()
    var = origin.eqn.invars[operand]
    for _ in range(len(jaxpr.eqns) + 1):
        index = producers.get(id(var))
        if index is None:
            how = "argument" if _is_argument(origin, var) else "outside"  # made before the inner jaxpr began
            return ZeroSource(None, None, how, (), _arguments(origin, [var], names))
        eqn, (ins, _) = jaxpr.eqns[index], seen.stats[index]
        zero_inputs = [i for i, stats in enumerate(ins) if stats is not None and stats.zero
                       and eqn.primitive.name not in COMPARES and not (eqn.primitive.name == "select_n" and i == 0)]
        if not zero_inputs:
            return ZeroSource(eqn.primitive.name, _compat.eqn_source(eqn), _how(eqn.primitive.name, ins),
                              tuple(s for s in ins if s is not None),
                              _arguments(origin, list(eqn.invars), names))
        var = eqn.invars[zero_inputs[0]]
    return None


def _how(primitive: str, inputs: list[ValueStats | None]) -> str:
    finite = all(s is not None and s.finite for s in inputs)
    if finite and primitive in UNDERFLOWS:
        return "underflow"
    if finite and primitive in CANCELS:
        return "cancellation"
    return "made"


def _slice(jaxpr: Any, var: Any, producers: dict[int, int]) -> set[int]:
    """The equations (indices) that compute ``var``."""
    needed: set[int] = set()
    stack = [var]
    while stack:
        atom = stack.pop()
        index = None if _compat.is_literal(atom) else producers.get(id(atom))
        if index is not None and index not in needed:
            needed.add(index)
            stack.extend(jaxpr.eqns[index].invars)
    return needed


def _is_argument(origin: Site, var: Any) -> bool:
    """Whether ``var``, an input of the origin's jaxpr, is an argument of the call itself (passed unchanged
    through the enclosing calls)."""
    scope = origin.scope
    while scope.parent is not None:
        position = next((i for i, v in enumerate(scope.jaxpr.invars) if v is var), None)
        if scope.kind != "call" or position is None or position >= len(scope.parent.eqn.invars):
            return False
        var, scope = scope.parent.eqn.invars[position], scope.parent.scope
    return any(v is var for v in scope.jaxpr.invars)


def _arguments(origin: Site, atoms: list, names: list[str]) -> tuple[str, ...]:
    """The call's arguments (by name) that the values ``atoms`` (in the origin's jaxpr) are computed from,
    followed out through enclosing calls (a nested jit's inputs are its caller's operands); empty when a loop
    or a map stands between them and the call's arguments."""
    scope, index = origin.scope, origin.index
    while True:
        jaxpr = scope.jaxpr
        producers = {id(v): i for i, eqn in enumerate(jaxpr.eqns[:index]) for v in eqn.outvars}
        positions = {id(v): i for i, v in enumerate(jaxpr.invars)}
        reached: set[int] = set()
        stack, seen = list(atoms), set()
        while stack:
            atom = stack.pop()
            if _compat.is_literal(atom) or id(atom) in seen:
                continue
            seen.add(id(atom))
            if id(atom) in positions:
                reached.add(positions[id(atom)])
            elif id(atom) in producers:
                stack.extend(jaxpr.eqns[producers[id(atom)]].invars)
        parent = scope.parent
        if parent is None:
            return tuple(names[i] for i in sorted(reached) if i < len(names))
        if scope.kind != "call":
            return ()
        atoms = [parent.eqn.invars[i] for i in sorted(reached) if i < len(parent.eqn.invars)]
        scope, index = parent.scope, parent.index


class _Recorder(Hooks):
    """Replays the call up to the origin, keeping the statistics of the equations in the zero's slice (in the
    origin's scope: the latest pass through it, the one the origin is in)."""

    def __init__(self, origin: Site, operand: int, needed: set[int]):
        self.origin, self.operand, self.needed = origin, operand, needed
        self.stats: dict[int, tuple[list[ValueStats | None], list[ValueStats]]] = {}
        self.reached = False

    def _here(self, site: Site) -> bool:
        return site.scope.jaxpr is self.origin.scope.jaxpr and site.path == self.origin.path

    def before(self, site: Site, invals: list, in_tags: list) -> list | None:
        if self._here(site) and site.index == self.origin.index and value_stats(invals[self.operand]).zero:
            self.reached = True
            raise Stop()
        return None

    def keeps_inputs(self, site: Site) -> bool:
        return site.index in self.needed and self._here(site)  # a nested jit in the slice: its inputs' statistics

    def after(self, site: Site, invals: list, outvals: list, in_tags: list, out_tags: list,
              descended: bool) -> list | None:
        if site.index in self.needed and self._here(site):
            # a literal (a constant written in the code) is never followed: an operation by a constant 0 made it
            self.stats[site.index] = ([None if _compat.is_literal(a) else value_stats(v)
                                       for a, v in zip(site.eqn.invars, invals)], [value_stats(v) for v in outvals])
        return None
