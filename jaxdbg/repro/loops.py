"""Reduction inside loops: a failure born in a ``lax.scan``/``while_loop`` body, cut to that body run once.

The cut (:mod:`jaxdbg.repro.cut`) keeps a loop whole: ``scan``/``while`` is one node, its body and trip count
come along (a NaN born at iteration 31 of 50 is shown by all 50). Here the loop is stepped one iteration at a
time, its body compiled once (one jitted function, called per iteration: milliseconds each); the first
iteration whose body outputs fail as the criterion says gives the body's inputs as concrete values (the
carry, and a scan's slice of ``xs``, of that iteration). The body is then an ordinary graph with recorded
values, cut like any other (its irrelevant equations go), and a loop left inside it is entered in turn.
``fori_loop`` is a scan (static bounds) or a while loop; ``lax.map`` is a scan.

Where no single iteration fails alone (a mismatch that only grows over many iterations, a NaN whose body
outputs stay finite until the loop's own outputs are combined), the loop is kept whole: nothing changes.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from jaxdbg.repro.cut import CutCheck, Cutter
    >>> from jaxdbg.repro.graph import flatten, record
    >>> from jaxdbg.repro.signature import Criterion
    >>> def f(h):
    ...     step = lambda h, _: (h - 0.25, jnp.log(h) * 2.0 + jnp.tanh(h))  # h = 1, 0.75, ..., 0, -0.25: NaN
    ...     return jax.lax.scan(step, h, None, length=50)[1]
    >>> graph, consts = flatten(jax.make_jaxpr(f)(1.0))
    >>> recorded, check = record(graph, [jnp.float32(1.0)], consts), CutCheck(Criterion.nonfinite("NaN"))
    >>> best = Cutter(graph, recorded, check).run()
    >>> [graph.nodes[i].name for i in best.nodes]
    ['scan']
    >>> inner = enter_loops(graph, recorded, best, check)
    >>> [(e.primitive, e.iteration, e.trips) for e in inner.entered]
    [('scan', 5, 50)]
    >>> [inner.graph.nodes[i].name for i in inner.best.nodes]
    ['log']
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import jax
import numpy as np

from jaxdbg import _compat
from jaxdbg._source import SourceLocation
from jaxdbg.repro.cut import Candidate, CutCheck, CutError, Cutter, inexact
from jaxdbg.repro.graph import Graph, Node, as_function, flatten, read_value, record
from jaxdbg.storable import is_key

LOOPS = ("scan", "while")
# A while loop that has not failed after this many iterations is left whole (a loop that never ends would
# otherwise be stepped until the deadline).
MAX_ITERATIONS = 100_000
MAX_DEPTH = 4  # loops inside loops entered in turn, at most this deep


@dataclass(frozen=True)
class LoopEntered:
    """A loop cut to one iteration: which (``scan``/``while``), the iteration (from 0, in execution order; a
    reversed scan's element is ``trips - 1 - iteration``) and its trip count (None for a while loop that
    failed before its condition ended it)."""

    primitive: str
    iteration: int
    trips: int | None
    source: SourceLocation | None
    reverse: bool = False  # a ``lax.scan(..., reverse=True)``: iterations run from the last element to the first

    def describe(self) -> str:
        """``iteration 10 of 16 of the loop at rnn.py:29 (a lax.scan in reverse: element 5 of its xs)``: a
        reversed scan's element is said too, as nan-hunt's ``scan[iteration=5]`` names the element."""
        where = f" at {self.source.file.rpartition('/')[2]}:{self.source.line}" if self.source else ""
        of = f" of {self.trips}" if self.trips is not None else ""
        kind = "lax.scan" if self.primitive == "scan" else "lax.while_loop"  # (fori_loop and lax.map are one)
        if self.reverse and self.trips is not None:
            kind += f" in reverse: element {self.trips - 1 - self.iteration} of its xs"
        return f"iteration {self.iteration}{of} of the loop{where} (a {kind})"


@dataclass
class Inside:
    """The failing body's graph, its cut (``best``), the loops entered from the outside in, and the checks."""

    graph: Graph
    best: Candidate
    entered: list[LoopEntered] = field(default_factory=list)
    checks: int = 0


def enter_loops(graph: Graph, recorded: dict, best: Candidate, check: CutCheck, *, deadline: float | None = None,
                on_progress: Callable[[int, int], None] | None = None,
                emittable: Callable[[Graph, Candidate], bool] | None = None) -> Inside | None:
    """The body of the loop that ``best`` keeps, cut at its first failing iteration (loops inside it entered
    too); None where ``best`` holds no loop or no single iteration fails alone."""
    inside: Inside | None = None
    for _ in range(MAX_DEPTH):
        found = _enter_one(graph, recorded, best, check, deadline, on_progress, emittable)
        if found is None:
            break
        entered, checks, graph, recorded, best = found
        inside = Inside(graph, best, [*(inside.entered if inside else []), entered],
                        (inside.checks if inside else 0) + checks)
    return inside


def batched_while(node: Node) -> bool:
    """A while loop vmap gave a predicate per batch element: an iteration is its body *and* a select of the
    elements still looping (jax's lowering adds it), so its body alone is no iteration (it is kept whole)."""
    return node.name == "while" and node.params["cond_jaxpr"].out_avals[0].shape != ()


def _enter_one(graph: Graph, recorded: dict, best: Candidate, check: CutCheck, deadline: float | None,
               on_progress: Callable[[int, int], None] | None, emittable: Callable[[Graph, Candidate], bool] | None
               ) -> tuple[LoopEntered, int, Graph, dict, Candidate] | None:
    for i in best.nodes:
        node = graph.nodes[i]
        if node.name not in LOOPS:
            continue
        if batched_while(node):
            continue
        # The loop's own recorded inputs (not the cut's simplified ones): the iteration is the program's.
        ins = [_value(a, recorded, best.values) for a in node.invars]
        if any(v is None for v in ins):
            continue
        loop_check = _check_for_loop(check, ins)
        # An Inf in a part of the carry the birth does not read (a running sum gone to -inf the iteration
        # before log(h) of a negative h) must not hide the iteration: it may be among the body's inputs while
        # stepping and cutting; the cut's own inputs are held to the loop's check below.
        stepping = replace(loop_check, allow_nonfinite_inputs=True)
        step = _Stepper.of(node, ins)
        found = step.first_failing(stepping, deadline)
        if found is None:
            continue
        iteration, args = found
        body, consts = step.body, step.body_consts
        body_recorded = record(body, args, consts)
        can_write = None if emittable is None else _bound(emittable, body)
        cutter = Cutter(body, body_recorded, stepping, deadline=deadline, on_progress=on_progress,
                        emittable=can_write)
        try:
            body_best = cutter.run()
        except CutError:
            continue
        if not _starts_as_allowed(loop_check, body_best):  # a NaN from an Inf an earlier iteration made
            continue  # (1e10 ** 4, then inf - inf): the body once would hide where the Inf came from
        entered = LoopEntered(node.name, iteration, step.length, node.source,
                              node.name == "scan" and bool(node.params.get("reverse")))
        return entered, step.checks + cutter.stats.checks, body, body_recorded, body_best
    return None


def _bound(emittable: Callable[[Graph, Candidate], bool], graph: Graph) -> Callable[[Candidate], bool]:
    return lambda cand: emittable(graph, cand)


def _starts_as_allowed(check: CutCheck, cand: Candidate) -> bool:
    """The cut's inputs pass ``check`` (a NaN/Inf birth from finite inputs, where the loop's inputs were)."""
    if check.criterion.kind != "nonfinite":
        return True
    return not any(check.rejects_input(np.asarray(v)) for v in cand.values.values() if not is_key(v))


def _value(atom: Any, recorded: dict, values: dict) -> Any:
    try:
        return read_value(recorded, atom)
    except KeyError:
        return values.get(atom)


def _check_for_loop(check: CutCheck, ins: list) -> CutCheck:
    """The check of one iteration: a loop whose own inputs hold an Inf (a running max from -inf) may start
    from it, as the program's inputs may (a NaN is never a birth)."""
    nonfinite = any(not is_key(v) and inexact(np.asarray(v).dtype) and not np.isfinite(np.asarray(v)).all()
                    for v in ins)
    return replace(check, allow_nonfinite_inputs=True) if nonfinite else check


@dataclass
class _Stepper:
    """A loop run one iteration at a time: its body (flattened), the body's loop-invariant inputs, the carry,
    and ``next_inputs(iteration, carry)``: the body's inputs past the carry (a scan's slices), or None once the
    loop has ended."""

    body: Graph
    body_consts: dict
    consts: list
    carry: list
    next_inputs: Callable[[int, list], list | None]
    length: int | None = None  # a scan's trip count
    checks: int = 0

    @staticmethod
    def of(node: Node, ins: list) -> _Stepper:
        return (_scan if node.name == "scan" else _while)(node, ins)

    def first_failing(self, check: CutCheck, deadline: float | None) -> tuple[int, list] | None:
        """(iteration, the body's arguments) of the first iteration whose body fails alone, else None."""
        fn = as_function(self.body.nodes, self.body.invars, self.body.outvars)
        jitted = jax.jit(fn)  # one function object: compiled once, whatever the iteration
        extra = list(self.body_consts.values())
        n_carry = len(self.carry)
        for iteration in range(MAX_ITERATIONS):
            rest = self.next_inputs(iteration, self.carry)
            if rest is None or (deadline is not None and time.perf_counter() > deadline):
                return None
            args = [*self.consts, *self.carry, *rest]
            self.checks += 1
            if check.failing_index(fn, [*args, *extra]) is not None:
                return iteration, args
            try:
                self.carry = [v if is_key(v) else np.asarray(v) for v in jitted(*args, *extra)[:n_carry]]
            except Exception:  # noqa: BLE001 - a body that raises is not stepped further (no iteration to cut to)
                return None
        return None


def _scan(node: Node, ins: list) -> _Stepper:
    n_consts, n_carry = _compat.scan_split(node.params)
    body, consts = flatten(node.params["jaxpr"])
    length, reverse = int(node.params["length"]), bool(node.params["reverse"])
    xs = [x if is_key(x) else np.asarray(x) for x in ins[n_consts + n_carry:]]

    def next_inputs(iteration: int, carry: list) -> list | None:
        if iteration >= length:
            return None
        at = length - 1 - iteration if reverse else iteration
        return [x[at] for x in xs]

    return _Stepper(body, consts, ins[:n_consts], ins[n_consts:n_consts + n_carry], next_inputs, length)


def _while(node: Node, ins: list) -> _Stepper:
    p = node.params
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    body, consts = flatten(p["body_jaxpr"])
    cond, cond_consts = flatten(p["cond_jaxpr"])
    test = jax.jit(as_function(cond.nodes, cond.invars, cond.outvars))
    before, after = ins[:nc], list(cond_consts.values())

    def next_inputs(iteration: int, carry: list) -> list | None:
        return [] if bool(test(*before, *carry, *after)[0]) else None

    return _Stepper(body, consts, ins[nc:nc + nb], ins[nc + nb:], next_inputs)
