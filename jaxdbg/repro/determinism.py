"""Can two runs of a candidate differ? Then repro runs an accepted candidate twice; else once is enough.

A second run exists for edits that make a program fail by luck: a deleted ``np.random.seed(0)``, a draw of
the global RNG, the time, a file the program appends to, string hashing (a set's order changes with
``PYTHONHASHSEED``). JAX itself is deterministic here (its keys are explicit), and so are the libraries below.
A candidate that imports only those and reads none of the sources of chance needs no second run; anything
else (any other import, an ``np.random`` draw, ``open`` or ``np.load``, ``hash``, ``set``) keeps it. Each run is
most of a check's cost (about a second: trace, lower, compile), and every accepted candidate paid it.

Example:
    >>> deterministic("import jax\\nimport jax.numpy as jnp\\nx = jax.random.normal(jax.random.key(0), (3,))")
    True
    >>> deterministic("import numpy as np\\nx = np.random.rand(3)")
    False
    >>> deterministic("import numpy as np\\nx = np.random.default_rng(0).normal(size=3)")
    True
    >>> deterministic("import time\\nt = time.time()")
    False
"""

from __future__ import annotations

import ast

from jaxdbg.repro.source import parse

# Libraries whose results depend on their inputs alone (numpy's too, but for numpy.random: see below).
DETERMINISTIC_MODULES = ("jax", "jaxlib", "numpy", "equinox", "flax", "optax", "chex", "jaxtyping", "einops",
                         "ml_dtypes", "math", "functools", "itertools", "operator", "dataclasses", "typing",
                         "collections", "__future__", "abc", "enum")
# Builtins whose result can change between two runs of the same program (hash and a str set's order change with
# PYTHONHASHSEED; open reads what an earlier run may have written).
CHANCE_BUILTINS = frozenset({"open", "input", "hash", "id", "set", "frozenset", "globals", "vars", "exec", "eval",
                             "__import__", "breakpoint"})
# Reads and writes of files (an earlier run may have written what this one reads).
FILE_IO = frozenset({"save", "savez", "savez_compressed", "load", "loadtxt", "savetxt", "genfromtxt", "fromfile",
                     "tofile", "memmap", "tree_serialise_leaves", "tree_deserialise_leaves"})
SEEDED = frozenset({"default_rng", "RandomState", "Generator", "PCG64", "Philox", "SFC64", "MT19937"})


def deterministic(text: str) -> bool:
    """True when two runs of ``text`` compute the same (see the module docstring); False when unsure."""
    try:
        tree = parse(text)
    except SyntaxError:
        return False
    numpy = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] not in DETERMINISTIC_MODULES or alias.name.startswith("numpy.random"):
                    return False
                if alias.name == "numpy":
                    numpy.add(alias.asname or "numpy")
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level or module.split(".")[0] not in DETERMINISTIC_MODULES or module.startswith("numpy.random"):
                return False
            if module == "numpy" and any(a.name == "random" for a in node.names):
                return False
        elif ((isinstance(node, ast.Name) and node.id in CHANCE_BUILTINS)
              or (isinstance(node, ast.Attribute) and node.attr in FILE_IO)):
            return False
    parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr == "random" and isinstance(node.value, ast.Name)
                and node.value.id in numpy and not _seeded(node, parents)):
            return False
    return True


def _seeded(node: ast.Attribute, parents: dict) -> bool:
    """``np.random.default_rng(seed)`` (a generator from a given seed), not ``np.random.rand()`` nor
    ``np.random.default_rng()``."""
    outer, call = parents.get(id(node)), None
    if isinstance(outer, ast.Attribute) and outer.attr in SEEDED:
        call = parents.get(id(outer))
    return isinstance(call, ast.Call) and call.func is outer and bool(call.args or call.keywords)
