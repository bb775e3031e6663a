"""Is a jitted function a function of its inputs alone? Trace it twice and compare what Python baked in.

``jax.jit`` runs the Python function once, while tracing; whatever Python computed then (a ``np.random``
draw, a global counter or schedule, the time) is a constant of the compiled function, reused by every later
call, while op-by-op execution (``jax.disable_jit``) computes it afresh each call. Such a jit vs op-by-op
mismatch lives in no computation: replaying the captured jaxpr jitted and op by op agrees. Two traces of
the same call tell it apart: their constants (or their equations) differ.

Example:
    >>> import jax, jax.numpy as jnp, numpy as np
    >>> def dropout(x):
    ...     return jnp.where(np.random.rand(*x.shape) >= 0.5, x, 0.0)
    >>> trace = lambda: jax.make_jaxpr(lambda x: dropout(x))(jnp.ones(64))  # a new function: no trace cache
    >>> frozen_difference(trace(), trace()).startswith("a constant used by `select_n`")
    True
    >>> frozen_difference(jax.make_jaxpr(jnp.sin)(1.0), jax.make_jaxpr(jnp.sin)(1.0)) is None
    True
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from jaxdbg._source import SourceLocation
from jaxdbg.repro.graph import Lit, Node, Var, flatten


def frozen_difference(first: Any, second: Any) -> str | None:
    """What differs between two traces (closed jaxprs) of one call, in the user's terms, or None if nothing."""
    return frozen_site(first, second)[0]


def frozen_site(first: Any, second: Any) -> tuple[str | None, SourceLocation | None]:
    """:func:`frozen_difference` and the user's line it names (None where no equation keeps one)."""
    a, a_consts = flatten(first)
    b, b_consts = flatten(second)
    if [n.name for n in a.nodes] != [n.name for n in b.nodes]:
        at = next((i for i, (x, y) in enumerate(zip(a.nodes, b.nodes)) if x.name != y.name),
                  min(len(a.nodes), len(b.nodes)))
        node = a.nodes[at] if at < len(a.nodes) else None
        return ("the traced equations differ" + (f" from `{node.name}`{_where(node)} on" if node else ""),
                node.source if node else None)
    differing = {x for x, y in zip(a_consts, b_consts) if not _same(a_consts[x], b_consts[y])}
    for at, (x, y) in enumerate(zip(a.nodes, b.nodes)):
        literal = any(isinstance(p, Lit) and isinstance(q, Lit) and not _same(p.val, q.val)
                      for p, q in zip(x.invars, y.invars))
        if literal or any(isinstance(v, Var) and v in differing for v in x.invars):
            # jax's own jitted helpers (jnp.where) keep no user line: the nearest equation before it has it
            located = next((n for n in reversed(a.nodes[:at + 1]) if n.source is not None), x)
            return f"a constant used by `{x.name}`{_where(located)}", located.source
    return (f"{len(differing)} constant(s) of the computation" if differing else None), None


def _same(x: Any, y: Any) -> bool:
    try:
        return bool(np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True))
    except (TypeError, ValueError):  # PRNG keys and other extended values: compared by what they print
        return repr(x) == repr(y)


def _where(node: Node) -> str:
    return f" at {os.path.basename(node.source.file)}:{node.source.line}" if node.source is not None else ""

