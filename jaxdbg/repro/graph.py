"""A jaxpr flattened into one list of equations, with recorded values: the thing computation reduction cuts.

Calls of inner jitted functions, ``custom_jvp``/``custom_vjp`` and ``remat`` are inlined, and a
``custom_linear_solve`` (``jnp.linalg.solve``) becomes its ``solve`` (their values are the same), so every
equation left is one primitive (``scan``/``while``/``cond`` stay whole). Equations are evaluated with
``primitive.bind(*invals, **params)``: outside ``jit`` that is op-by-op execution, which is how intermediates
are recorded; inside ``jax.jit`` it traces a candidate sub-computation.

Example:
    >>> import jax, jax.numpy as jnp
    >>> graph, consts = flatten(jax.make_jaxpr(lambda x: jnp.log(jax.jit(jnp.sin)(x)))(1.0))
    >>> [node.primitive.name for node in graph.nodes]
    ['sin', 'log']
    >>> values = record(graph, [jnp.float32(1.0)], consts)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdbg import _compat
from jaxdbg._source import SourceLocation
from jaxdbg.storable import is_key


class Var:
    """A value of the flat graph; compared by identity. ``aval`` has the original shape and dtype."""

    __slots__ = ("__weakref__", "aval")

    def __init__(self, aval: Any):
        self.aval = aval

    def __repr__(self) -> str:
        return f"Var({self.aval})"


class Lit:
    """A literal written in an equation (``val``), as jaxprs keep scalars like ``2.0:f32[]``."""

    __slots__ = ("aval", "val")

    def __init__(self, val: Any, aval: Any):
        self.val, self.aval = val, aval


Atom = Any  # Var | Lit


@dataclass(frozen=True, eq=False)
class Node:
    """One primitive application of the flat graph."""

    primitive: Any
    params: dict
    invars: tuple
    outvars: tuple
    source: SourceLocation | None = None

    @property
    def name(self) -> str:
        return self.primitive.name


@dataclass
class Graph:
    """Arguments (then constants) -> nodes in execution order -> outputs."""

    invars: list[Var]
    nodes: list[Node]
    outvars: list[Atom]


def flatten(closed: Any) -> tuple[Graph, dict[Var, Any]]:
    """Flatten a closed jaxpr; returns the graph and the values of its constants (which are inputs too)."""
    jaxpr, consts = _compat.open_jaxpr(closed)
    env: dict[Any, Atom] = {}
    const_values: dict[Var, Any] = {}
    nodes: list[Node] = []

    def read(atom: Any) -> Atom:
        if _compat.is_literal(atom):
            return Lit(atom.val, atom.aval)
        return env[atom]

    def add_consts(inner: Any, values: Sequence[Any]) -> None:
        for var, value in zip(inner.constvars, values):
            mine = Var(var.aval)
            const_values[mine] = value
            env[var] = mine

    def walk(inner: Any, atoms: Sequence[Atom]) -> list[Atom]:
        env.update(zip(inner.invars, atoms))
        for eqn in inner.eqns:
            call = _compat.inlined_call(eqn)
            if call is not None:
                called_jaxpr, called_consts = _compat.open_jaxpr(call[0])
                add_consts(called_jaxpr, called_consts)
                results = walk(called_jaxpr, [read(a) for a in call[1]])
                env.update(zip(eqn.outvars, results))
                continue
            ins = [read(a) for a in eqn.invars]
            outs = tuple(Var(o.aval) for o in eqn.outvars)
            env.update(zip(eqn.outvars, outs))
            nodes.append(Node(eqn.primitive, dict(eqn.params), tuple(ins), outs, _compat.eqn_source(eqn)))
        return [read(o) for o in inner.outvars]

    invars = [Var(v.aval) for v in jaxpr.invars]
    add_consts(jaxpr, consts)
    outvars = walk(jaxpr, invars)
    return Graph(invars + list(const_values), nodes, outvars), const_values


def read_value(env: Mapping[Var, Any], atom: Atom) -> Any:
    return atom.val if isinstance(atom, Lit) else env[atom]


def evaluate(nodes: Iterable[Node], env: dict[Var, Any], on_node: Callable[[Node, list], None] | None = None) -> dict:
    """Bind each node's primitive on the values in ``env`` (filled in place); op-by-op outside jit. Under
    ``jax.disable_jit`` a loop runs its body op by op, one iteration at a time, as ``lax.scan`` and
    ``lax.while_loop`` do there (bound whole, a loop is compiled even outside jit: no op-by-op reference)."""
    for node in nodes:
        ins = [read_value(env, a) for a in node.invars]
        if node.name in _LOOPS_BY_HAND and getattr(jax.config, "jax_disable_jit", False):  # (untyped flag)
            outs = _LOOPS_BY_HAND[node.name](node, ins)
        else:
            outs = node.primitive.bind(*ins, **node.params)
            outs = list(outs) if node.primitive.multiple_results else [outs]
        env.update(zip(node.outvars, outs))
        if on_node is not None:
            on_node(node, outs)
    return env


def _call(closed: Any, args: Sequence[Any]) -> list:
    inner, consts = flatten(closed)
    env = evaluate(inner.nodes, {**dict(zip(inner.invars, args)), **consts})
    return [read_value(env, o) for o in inner.outvars]


def _scan_by_hand(node: Node, ins: list) -> list:
    n_consts, n_carry = _compat.scan_split(node.params)
    length, reverse = node.params["length"], node.params["reverse"]
    consts, carry, xs = ins[:n_consts], ins[n_consts:n_consts + n_carry], ins[n_consts + n_carry:]
    steps = []
    for i in range(length):
        at = length - 1 - i if reverse else i
        outs = _call(node.params["jaxpr"], [*consts, *carry, *[x[at] for x in xs]])
        carry = outs[:n_carry]
        steps.append(outs[n_carry:])
    steps = steps[::-1] if reverse else steps
    ys = [jnp.stack([step[j] for step in steps]) if steps else jnp.zeros(v.aval.shape, v.aval.dtype)
          for j, v in enumerate(node.outvars[n_carry:])]
    return [*carry, *ys]


def _while_by_hand(node: Node, ins: list) -> list:
    p = node.params
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    cond_consts, body_consts, carry = ins[:nc], ins[nc:nc + nb], ins[nc + nb:]
    pred = _call(p["cond_jaxpr"], [*cond_consts, *carry])[0]
    # A vmapped while whose predicate differs between batch elements keeps a predicate per element: it loops while
    # any holds, and an element whose predicate is false keeps its carry (as jax's lowering selects it).
    while bool(jnp.any(pred)):
        new = _call(p["body_jaxpr"], [*body_consts, *carry])
        carry = new if jnp.ndim(pred) == 0 else [
            jnp.where(jnp.reshape(pred, jnp.shape(pred) + (1,) * (jnp.ndim(x) - jnp.ndim(pred))), n, x)
            for n, x in zip(new, carry)]
        pred = _call(p["cond_jaxpr"], [*cond_consts, *carry])[0]
    return carry


_LOOPS_BY_HAND: dict[str, Callable[[Node, list], list]] = {"scan": _scan_by_hand, "while": _while_by_hand}


def as_function(nodes: Sequence[Node], invars: Sequence[Var], outvars: Sequence[Atom]) -> Callable:
    """A Python function ``f(*invals) -> list of outputs`` running ``nodes`` (jit it to compile them)."""

    def run(*values: Any) -> list:
        env = evaluate(nodes, dict(zip(invars, values)))
        return [read_value(env, o) for o in outvars]

    return run


def record(graph: Graph, args: Sequence[Any], const_values: Mapping[Var, Any]) -> dict[Var, np.ndarray]:
    """Every value of the graph, computed op by op; stops quietly at the first node that raises."""
    n_args = len(graph.invars) - len(const_values)
    env: dict[Var, Any] = dict(zip(graph.invars[:n_args], args))
    env.update(const_values)
    with contextlib.suppress(Exception):  # values up to the failing node are still useful cut points
        evaluate(graph.nodes, env)
    return {var: value if is_key(value) else np.asarray(value) for var, value in env.items()
            if is_key(value) or not _compat.is_extended_dtype(_dtype(value))}  # PRNG keys are kept as jax arrays


def _dtype(value: Any) -> Any:
    return value.dtype if hasattr(value, "dtype") else np.asarray(value).dtype  # (a PRNG key has no numpy form)


def inner_jaxprs(params: Mapping[str, Any]) -> list[Any]:
    """The (open) jaxprs a primitive's parameters hold: a loop's body and condition, a cond's branches."""
    found = []
    for param in params.values():
        for item in param if isinstance(param, (tuple, list)) else (param,):
            inner = item if hasattr(item, "eqns") else getattr(item, "jaxpr", None)
            if hasattr(inner, "eqns"):
                found.append(inner)
    return found


def nested_equations(nodes: Iterable[Any]) -> Iterator[Any]:
    """The equations (or graph nodes) given and, depth first, every equation inside their loop, cond and call
    bodies.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> jaxpr = jax.make_jaxpr(lambda h: jax.lax.scan(lambda c, _: (jnp.sin(c), None), h, None, 3))(1.0)
        >>> [e.primitive.name for e in nested_equations(jaxpr.eqns)]
        ['scan', 'sin']
    """
    for node in nodes:
        yield node
        for inner in inner_jaxprs(node.params):
            yield from nested_equations(inner.eqns)


def equation_count(nodes: Iterable[Any]) -> int:
    """Equations, those inside loop and cond bodies included: a scan of a 14-equation body is 15 equations
    to read, as written out. Takes graph nodes or jaxpr equations.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> jaxpr = jax.make_jaxpr(lambda h: jax.lax.scan(lambda c, _: (jnp.sin(c) * 2.0, None), h, None, 3))(1.0)
        >>> len(jaxpr.eqns), equation_count(jaxpr.eqns)
        (1, 3)
    """
    return sum(1 for _ in nested_equations(nodes))


def producers(nodes: Sequence[Node]) -> dict[Var, int]:
    """Which node (index into ``nodes``) defines each variable."""
    return {var: i for i, node in enumerate(nodes) for var in node.outvars}


def backward_slice(nodes: Sequence[Node], outvars: Iterable[Atom], keep: Iterable[int] | None = None) -> list[int]:
    """Indices of the nodes (among ``keep``, default all) that the outputs depend on, in order."""
    allowed = set(range(len(nodes)) if keep is None else keep)
    made = producers(nodes)
    needed: set[int] = set()
    stack = [made[v] for v in outvars if isinstance(v, Var) and made.get(v) in allowed]
    while stack:
        i = stack.pop()
        if i in needed:
            continue
        needed.add(i)
        for atom in nodes[i].invars:
            j = made.get(atom) if isinstance(atom, Var) else None
            if j is not None and j in allowed and j not in needed:
                stack.append(j)
    return sorted(needed)


def free_inputs(nodes: Sequence[Node], keep: Sequence[int], outvars: Sequence[Atom]) -> list[Var]:
    """Variables the kept nodes (and outputs) read but do not define, in first-use order."""
    defined: set[Var] = set()
    inputs: list[Var] = []
    seen: set[Var] = set()

    def use(atom: Atom) -> None:
        if isinstance(atom, Var) and atom not in defined and atom not in seen:
            seen.add(atom)
            inputs.append(atom)

    for i in keep:
        for atom in nodes[i].invars:
            use(atom)
        defined.update(nodes[i].outvars)
    for atom in outvars:
        use(atom)
    return inputs
