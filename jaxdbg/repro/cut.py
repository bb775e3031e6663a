"""Computation reduction: cut a failing jitted computation down to the few equations that still fail.

This is where knowing JAX pays: any equation's outputs can be replaced by their recorded concrete values
(recorded op by op), so the graph can be cut anywhere, not only where the source allows. The passes, each
checked by compiling the candidate with ``jax.jit`` and running it (in this process, milliseconds each):

1. keep one failing output and its backward slice (dead code goes);
2. for NaN/Inf, try the single equation whose recorded output first turns non-finite from finite inputs;
3. move the output up to the earliest intermediate that still fails (bisection over the chain);
4. delta-debug the equations: remove chunks, their outputs become recorded inputs, dead code goes;
5. shrink shapes (the failing element alone, then length-1 slices) and simplify values (0, 1, ±1, round);
   a plainer value must keep a NaN/Inf born where it was (a numerator set to 0 would turn ``x / 0 = inf``,
   then ``0 * inf``, into a ``0 / 0`` at the first equation: another failure, with the rest of the chain
   left hanging on);
6. where values became plainer, passes 3 and 4 once more: equations the plainer values made idle
   (``x + 0`` eight times, a sum of zeros) go.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from jaxdbg.repro.graph import flatten, record
    >>> from jaxdbg.repro.signature import Criterion
    >>> x = jnp.array([0.5, 2.0, 3.0])
    >>> graph, consts = flatten(jax.make_jaxpr(lambda x: jnp.tanh(x) * 2.0 + jnp.log(x - 1.0).sum())(x))
    >>> values = record(graph, [x], consts)              # every intermediate, recorded op by op
    >>> best = Cutter(graph, values, CutCheck(Criterion.nonfinite("NaN"))).run()
    >>> len(graph.nodes), [graph.nodes[i].primitive.name for i in best.nodes]
    (6, ['log'])
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import jax
import numpy as np

from jaxdbg.repro.graph import Graph, Lit, Var, as_function, backward_slice, free_inputs, inner_jaxprs, nested_equations
from jaxdbg.repro.signature import Criterion
from jaxdbg.storable import is_key

# Elementwise primitives: their parameters do not hold shapes, so they re-run on any (equal) shapes.
ELEMENTWISE = frozenset(
    "abs acos acosh add and asin asinh atan atan2 atanh cbrt ceil clamp convert_element_type cos cosh div eq "
    "erf erf_inv erfc exp exp2 expm1 floor ge gt imag integer_pow is_finite le lgamma digamma log log1p "
    "logistic lt max min mul ne neg nextafter not or pow real reduce_precision rem round rsqrt select_n sign "
    "sin sinh sqrt square sub tan tanh xor copy copy_p".split()
)


@dataclass(frozen=True)
class CutCheck:
    """How a candidate is checked here for failing as ``criterion`` says: jitted, it raises the same exception,
    produces the NaN/Inf (``criterion.what``) from finite inputs, or (a mismatch) differs from op-by-op
    execution beyond ``rtol``/``atol``."""

    criterion: Criterion
    rtol: float = 1e-3
    atol: float = 1e-5
    allow_nonfinite_inputs: bool = False

    def failing_index(self, fn: Callable, args: Sequence[Any]) -> tuple | None:
        """None if the candidate does not fail; else the index of a failing element of its first output."""
        kind = self.criterion.kind
        if kind == "nonfinite" and any(self.rejects_input(np.asarray(a)) for a in args if not is_key(a)):
            return None
        try:
            outs = jax.jit(fn)(*args)
            if kind == "exception":
                return None
            outs = [np.asarray(o) for o in outs]
            if kind == "nonfinite":
                return _first_nonfinite(outs, self.criterion.what)
            with jax.disable_jit():
                refs = [np.asarray(r) for r in fn(*args)]
            return _worst_mismatch(outs, refs, self.rtol, self.atol)
        except Exception as err:  # noqa: BLE001 - a candidate that does not even run is not interesting
            return () if self.criterion.same_exception(type(err).__name__, str(err)) else None

    def rejects_input(self, value: np.ndarray) -> bool:
        """An input a NaN/Inf birth may not start from: any non-finite one, or where the program's own inputs
        hold Inf (a -inf bias), one holding a NaN (the cut would otherwise start from a NaN it only passes on)."""
        if not inexact(value.dtype):
            return False
        if self.allow_nonfinite_inputs:
            return self.criterion.what == "NaN" and bool(np.isnan(value).any())
        return not bool(np.isfinite(value).all())


def inexact(dtype: Any) -> bool:
    """A floating or complex dtype, bfloat16 included (numpy files the ml_dtypes types as kind 'V')."""
    try:
        return bool(jax.numpy.issubdtype(dtype, jax.numpy.inexact))
    except TypeError:  # an extended dtype (PRNG key)
        return False


def _first_nonfinite(outs: Sequence[np.ndarray], what: str | None) -> tuple | None:
    """Index of the first bad element of the first output that has one (candidates end with one output)."""
    for out in outs:
        if not inexact(out.dtype):
            continue
        bad = np.isnan(out) if what == "NaN" else np.isinf(out)
        if bad.any():
            return tuple(int(i) for i in np.argwhere(bad)[0])
    return None


def _worst_mismatch(outs: Sequence[np.ndarray], refs: Sequence[np.ndarray], rtol: float, atol: float) -> tuple | None:
    for out, ref in zip(outs, refs):
        if out.shape != ref.shape or not inexact(out.dtype):
            continue
        a, b = out.astype(np.float64), ref.astype(np.float64)
        close = np.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
        if not close.all():
            excess = np.where(close, 0.0, np.nan_to_num(np.abs(a - b), nan=np.inf, posinf=np.inf))
            return tuple(int(i) for i in np.unravel_index(int(np.argmax(excess)), excess.shape))
    return None


@dataclass
class Candidate:
    """A sub-computation: nodes kept (indices into the graph), outputs, and the values fed to its inputs."""

    nodes: tuple[int, ...]
    outvars: tuple
    values: dict  # Var -> np.ndarray, for every free input (recorded, or shrunk/simplified)
    index: tuple = ()  # a failing element of the first output

    def inputs(self, graph: Graph) -> list[Var]:
        return free_inputs(graph.nodes, self.nodes, self.outvars)


@dataclass
class CutStats:
    checks: int = 0
    original_equations: int = 0
    history: list[tuple[float, int]] = field(default_factory=list)  # (elapsed, equations) on each improvement


class CutError(Exception):
    """The captured computation does not fail when replayed, so there is nothing to cut."""


class Cutter:
    """Delta debugging over a flat graph with recorded values (see the module docstring for the passes)."""

    def __init__(self, graph: Graph, recorded: dict, check: CutCheck, *, deadline: float | None = None,
                 on_progress: Callable[[int, int], None] | None = None,
                 emittable: Callable[[Candidate], bool] | None = None):
        self.graph, self.recorded, self.check = graph, recorded, check
        self.deadline = deadline
        self.on_progress = on_progress or (lambda checks, size: None)
        self.emittable = emittable or (lambda cand: True)
        self.stats = CutStats(original_equations=len(graph.nodes))
        self.started = time.perf_counter()
        self.best: Candidate | None = None
        self.simplified = False  # simplify replaced some input by a plainer value

    # The test -----------------------------------------------------------------------------------------------

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.perf_counter() > self.deadline

    def make(self, nodes: Sequence[int], outvars: Sequence[Any], values: dict | None = None) -> Candidate | None:
        """A candidate with dead code removed and every input given a value (None if some value is missing)."""
        keep = tuple(backward_slice(self.graph.nodes, outvars, nodes))
        cand = Candidate(keep, tuple(outvars), {})
        for var in cand.inputs(self.graph):
            source = values if values is not None and var in values else self.recorded
            if var not in source:
                return None
            cand.values[var] = source[var]
        return cand

    def test(self, cand: Candidate | None, accept: Callable[[Candidate], bool] | None = None) -> Candidate | None:
        """The candidate with its failing index if it fails the same way (and can be written out, and ``accept``
        takes it), else None."""
        if cand is None or self.out_of_time():
            return None
        inputs = cand.inputs(self.graph)
        fn = as_function([self.graph.nodes[i] for i in cand.nodes], inputs, cand.outvars)
        self.stats.checks += 1
        index = self.check.failing_index(fn, [cand.values[v] for v in inputs])
        self.on_progress(self.stats.checks, len(self.best.nodes) if self.best else len(cand.nodes))
        if index is None:
            return None
        found = replace(cand, index=index)
        if accept is not None and not accept(found):
            return None
        # Only a candidate that can be written as Python may become the result; others still guide the search.
        if (self.best is None or _size(found) <= _size(self.best)) and self.emittable(found):
            self.best = found
            self.stats.history.append((time.perf_counter() - self.started, len(found.nodes)))
        return found

    # The passes ---------------------------------------------------------------------------------------------

    def run(self) -> Candidate:
        every = range(len(self.graph.nodes))
        start = self.test(self.make(every, self.graph.outvars))
        if start is None and self.out_of_time():
            raise CutError("no time was left to replay the captured computation (raise --max-time)")
        if start is None:
            raise CutError("the captured computation does not fail when replayed from its jaxpr")
        cand = self.one_output(start)
        for step in (self.single_node, self.earliest_output, self.delta_debug, self.shrink, self.simplify):
            if self.out_of_time():
                break
            cand = step(cand) or cand
        if self.simplified and not self.out_of_time():  # plainer values can leave equations with nothing to do
            for step in (self.earliest_output, self.delta_debug):
                cand = step(cand) or cand
        if self.best is None:
            raise CutError("every failing sub-computation holds an equation that cannot be written as Python")
        return self.best

    def one_output(self, cand: Candidate) -> Candidate:
        """Keep a single failing output: the one with the smallest backward slice."""
        outs = [o for o in cand.outvars if isinstance(o, Var)]
        ranked = sorted(outs, key=lambda o: len(backward_slice(self.graph.nodes, [o], cand.nodes)))
        for out in ranked:
            found = self.test(self.make(cand.nodes, [out]))
            if found is not None:
                return found
        return cand

    def single_node(self, cand: Candidate) -> Candidate | None:
        """NaN/Inf: the first node whose recorded output is non-finite while its recorded inputs are finite (or,
        where the program's own inputs hold Inf, free of NaN)."""
        if self.check.criterion.kind != "nonfinite":
            return None
        for i in cand.nodes:
            node = self.graph.nodes[i]
            if any(self._rejected(a) for a in node.invars):
                continue
            for out in node.outvars:
                if out in self.recorded and not _finite(self.recorded[out]):
                    found = self.test(self.make([i], [out]))
                    if found is not None:
                        return found
        return self.birth_chain(cand)

    def birth_chain(self, cand: Candidate, depth: int = 8) -> Candidate | None:
        """The first node whose output holds the NaN (Inf) looked for, with the nodes that made the other
        non-finite values it was given (``0.5 / sqrt(0)`` = inf, then ``0 * inf``): a chain from finite inputs."""
        made = {var: i for i in cand.nodes for var in self.graph.nodes[i].outvars}
        for i in cand.nodes:
            outs = [o for o in self.graph.nodes[i].outvars if o in self.recorded
                    and _holds(self.recorded[o], self.check.criterion.what)]
            if not outs:
                continue
            chain, frontier = {i}, [i]
            for _ in range(depth):
                bad = [a for k in frontier for a in self.graph.nodes[k].invars
                       if isinstance(a, Var) and self._rejected(a)]
                if not bad:
                    break
                if any(a not in made for a in bad):
                    return None
                frontier = [made[a] for a in bad if made[a] not in chain]
                chain.update(frontier)
            return self.test(self.make(sorted(chain), outs[:1]))
        return None

    def earliest_output(self, cand: Candidate) -> Candidate | None:
        """Bisect for the earliest node whose output (with its slice) still fails: cuts everything after it."""
        order = list(cand.nodes)
        lo, hi, best = 0, len(order) - 1, None
        while lo <= hi and not self.out_of_time():
            mid = (lo + hi) // 2
            node = self.graph.nodes[order[mid]]
            found = None
            for out in node.outvars:
                found = self.test(self.make(order[: mid + 1], [out]))
                if found is not None:
                    break
            if found is not None:
                best, hi = found, mid - 1
            else:
                lo = mid + 1
        return best

    def delta_debug(self, cand: Candidate) -> Candidate:
        """Remove chunks of nodes (halving the chunk size) while the failure holds; 1-minimal at the end."""
        chunk = max(1, len(cand.nodes) // 2)
        while not self.out_of_time():
            progress, start = False, 0
            while start < len(cand.nodes) and not self.out_of_time():
                dropped = set(cand.nodes[start:start + chunk])
                found = self.test(self.make([i for i in cand.nodes if i not in dropped], cand.outvars, cand.values))
                if found is not None and len(found.nodes) < len(cand.nodes):
                    cand, progress = found, True  # the list shifted left: same start, next chunk
                else:
                    start += chunk
            if not progress:
                if chunk == 1:
                    break
                chunk = max(1, chunk // 2)
        return cand

    def shrink(self, cand: Candidate) -> Candidate:
        """Smaller inputs: the failing element alone, then length-1 slices along each axis of each input.

        Inputs of a node that holds an inner program (scan, while, cond, a nested jit) keep their shapes: the
        inner program was traced for them (a scan's length is its inputs' leading size), and binding the
        primitive here would not notice what `lax.scan` in the written reproducer rejects."""
        inputs = cand.inputs(self.graph)
        fixed = {v for i in cand.nodes for v in self.graph.nodes[i].invars
                 if inner_jaxprs(self.graph.nodes[i].params)}
        out_shape = self._output_shape(cand)
        if out_shape and all(self.graph.nodes[i].name in ELEMENTWISE for i in cand.nodes):
            idx = cand.index
            values = {v: (cand.values[v][idx] if np.shape(cand.values[v]) == out_shape else cand.values[v])
                      for v in inputs}
            cand = self.test(replace(cand, values=values)) or cand
        for var in inputs:
            if var in fixed or is_key(cand.values[var]):  # a PRNG key is cut whole
                continue
            for axis in range(np.ndim(cand.values[var])):
                value = np.asarray(cand.values[var])
                if value.shape[axis] <= 1:
                    continue
                at = cand.index[axis] if value.shape == self._output_shape(cand) and cand.index else 0
                smaller = np.take(value, [at], axis=axis)
                cand = self.test(replace(cand, values={**cand.values, var: smaller})) or cand
        return cand

    def simplify(self, cand: Candidate) -> Candidate:
        """Plainer input values: all zeros, all ones, ±1, the failing element everywhere, rounded.

        Not the inputs of a node that runs a ``while_loop`` (an adaptive ODE solver's, a Newton iteration's): its
        trip count depends on them, and a plainer value (a zero tolerance, a zero step) can make one candidate
        run for ever, past the deadline, with the cut found so far lost with it."""
        looping = {v for i in cand.nodes for v in self.graph.nodes[i].invars if _runs_a_while(self.graph.nodes[i])}
        born = self.birth(cand)
        same_birth = (lambda found: self.birth(found) == born) if born is not None else None
        for var in cand.inputs(self.graph):
            if var in looping or is_key(cand.values[var]):
                continue
            value = np.asarray(cand.values[var])
            if not inexact(value.dtype) or value.size == 0:
                continue
            same = value.shape == self._output_shape(cand) and cand.index
            pick = value[cand.index] if same else value.reshape(-1)[0]
            options = [np.zeros_like(value), np.ones_like(value), np.full_like(value, np.sign(pick)),
                       np.full_like(value, 2 * np.sign(pick)), np.full_like(value, pick), np.round(value)]
            for option in options:
                if np.array_equal(option, value, equal_nan=True):
                    break
                found = self.test(replace(cand, values={**cand.values, var: option}), accept=same_birth)
                if found is not None:
                    cand, self.simplified = found, True
                    break
        return cand

    def birth(self, cand: Candidate) -> int | None:
        """NaN/Inf: the node of the candidate whose output first holds the value looked for (jitted, as the check
        runs it); None for another kind of failure, or where it cannot be told."""
        what = self.check.criterion.what
        if self.check.criterion.kind != "nonfinite":
            return None
        inputs = cand.inputs(self.graph)
        outs = [(i, o) for i in cand.nodes for o in self.graph.nodes[i].outvars if isinstance(o, Var)]
        try:
            fn = as_function([self.graph.nodes[i] for i in cand.nodes], inputs, [o for _, o in outs])
            values = jax.jit(fn)(*[cand.values[v] for v in inputs])
        except Exception:  # noqa: BLE001 - no telling: plainer values are judged by the failure alone
            return None
        return next((i for (i, _), value in zip(outs, values) if _holds(value, what)), None)

    # Helpers ------------------------------------------------------------------------------------------------

    def _value(self, atom: Any) -> Any:
        return atom.val if isinstance(atom, Lit) else self.recorded.get(atom, np.zeros(()))

    def _rejected(self, atom: Any) -> bool:
        """The criterion rejects this input's recorded value (a PRNG key never: its bits are no number)."""
        value = self._value(atom)
        return not is_key(value) and self.check.rejects_input(np.asarray(value))

    def _output_shape(self, cand: Candidate) -> tuple:
        out = cand.outvars[0]
        if isinstance(out, Lit):
            return np.shape(out.val)
        inputs = cand.inputs(self.graph)
        if out in inputs:
            return np.shape(cand.values[out])
        fn = as_function([self.graph.nodes[i] for i in cand.nodes], inputs, cand.outvars[:1])
        try:
            return tuple(jax.eval_shape(fn, *[cand.values[v] for v in inputs])[0].shape)
        except Exception:  # noqa: BLE001 - shape unknown: no shape-based shrinking
            return ()


def _holds(value: Any, what: str | None) -> bool:
    if is_key(value):
        return False
    value = np.asarray(value)
    if not inexact(value.dtype):
        return False
    return bool(np.isnan(value).any() if what == "NaN" else np.isinf(value).any())


def _finite(value: Any) -> bool:
    if is_key(value):
        return True
    value = np.asarray(value)
    return not inexact(value.dtype) or bool(np.isfinite(value).all())


def _size(cand: Candidate) -> tuple[int, int]:
    """Smaller is better: fewer equations, then fewer input elements."""
    return len(cand.nodes), sum(int(np.size(v)) for v in cand.values.values())



def _runs_a_while(node: Any) -> bool:
    """Whether a node is a ``while`` or holds one at any depth (a scan of whiles, a custom_vjp around them)."""
    return any(eqn.primitive.name == "while" for eqn in nested_equations([node]))
