r"""Framework spellings a reproducer can do without: Flax NNX and Equinox swapped for plain JAX.

A reproducer imports only jax and numpy (the contract), yet a reduced NNX or Equinox program still reads
``@nnx.jit``, ``eqx.filter_value_and_grad(loss)``, ``class MLP(nnx.Module)``. Most of these wrap a JAX
transformation, or only mark a class as a pytree: once the reduction has cut the models away, JAX's own
spelling fails the same way. These edits offer that to the source reducer, which keeps each one only if the
candidate still fails the same way (a swap that changes the failure is refused like any other edit):

- ``nnx.jit``/``eqx.filter_jit`` -> ``jax.jit`` (Equinox's filtering made explicit: the parameters called with
  Python constants become ``static_argnames``), the ``grad``/``value_and_grad``/``vmap``/``remat`` wrappers and
  NNX's re-exported activations (``nnx.relu``) -> their ``jax``/``jax.nn``/``jax.lax`` originals;
- a framework base class goes (``class MLP(nnx.Module)`` -> ``class MLP``), or an ``eqx.Module`` becomes the
  dataclass pytree it is (``jax.tree_util.register_dataclass``, ``eqx.field(static=True)`` -> field metadata);
- annotations that name framework types go (``rngs: nnx.Rngs`` -> ``rngs``).

All at once first (one check for the common case), then one by one. What the failure really needs of a
framework stays (``eqx.error_if`` raises Equinox's own error): :func:`framework_uses` names it for the header.

Example:
    >>> tree = ast.parse("from flax import nnx\n@nnx.jit\ndef step(x, rngs: nnx.Rngs):\n    return nnx.relu(x)\n")
    >>> standard_edits(tree, set())[0](list(ast.walk(tree)))
    True
    >>> print(ast.unparse(tree))
    import jax
    from flax import nnx
    <BLANKLINE>
    @jax.jit
    def step(x, rngs):
        return jax.nn.relu(x)
    >>> framework_references(tree)
    0
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Collection, Iterator

from jaxdbg.repro.rewrites import Edit, replace_node

FRAMEWORKS = ("flax", "equinox")

_ACTIVATIONS = ("celu", "elu", "gelu", "glu", "hard_sigmoid", "hard_silu", "hard_swish", "hard_tanh", "identity",
                "leaky_relu", "log_sigmoid", "log_softmax", "logsumexp", "one_hot", "relu", "relu6", "selu", "sigmoid",
                "silu", "soft_sign", "softmax", "softplus", "standardize", "swish", "tanh")
# A framework's name -> the JAX function it wraps or re-exports (same call signature for what programs pass).
SWAPS = {
    "flax.nnx.jit": "jax.jit", "flax.nnx.grad": "jax.grad", "flax.nnx.value_and_grad": "jax.value_and_grad",
    "flax.nnx.vmap": "jax.vmap", "flax.nnx.remat": "jax.checkpoint", "flax.nnx.cond": "jax.lax.cond",
    "flax.nnx.switch": "jax.lax.switch", "flax.nnx.fori_loop": "jax.lax.fori_loop",
    "flax.nnx.while_loop": "jax.lax.while_loop",
    **{f"flax.nnx.{name}": f"jax.nn.{name}" for name in _ACTIVATIONS},
    "equinox.filter_jit": "jax.jit", "equinox.filter_grad": "jax.grad",
    "equinox.filter_value_and_grad": "jax.value_and_grad", "equinox.filter_vmap": "jax.vmap",
    "equinox.filter_checkpoint": "jax.checkpoint",
}
_JITS = ("flax.nnx.jit", "equinox.filter_jit")
_EQX_MODULE = "equinox.Module"
NAMED = 4  # names a header line quotes of what a reproducer still reads from a package


def framework_aliases(tree: ast.AST, packages: Collection[str] = FRAMEWORKS) -> dict[str, str]:
    """Names bound by imports of ``packages`` -> what they stand for (``nnx`` -> ``flax.nnx``)."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top in packages:  # `import flax.nnx` binds `flax`; `import flax.nnx as nnx` the submodule
                    aliases[alias.asname or top] = alias.name if alias.asname else top
        elif (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
              and node.module.split(".")[0] in packages):
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return aliases


def qualified(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """``nnx.jit`` -> ``flax.nnx.jit`` when ``nnx`` names a framework import; else None."""
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
        return aliases.get(node.id)
    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
        owner = qualified(node.value, aliases)
        return f"{owner}.{node.attr}" if owner else None
    return None


def _uses(tree: ast.AST, packages: Collection[str] = FRAMEWORKS) -> Iterator[tuple[int, ast.expr, str]]:
    """(walk index, node, qualified name) of each outermost reference to ``packages`` (``nnx.relu``, not ``nnx``)."""
    aliases = framework_aliases(tree, packages)
    if not aliases:
        return
    inner: set[int] = set()
    for index, node in enumerate(ast.walk(tree)):
        if id(node) in inner:
            continue
        name = qualified(node, aliases)
        if name is not None and isinstance(node, ast.expr):
            inner.update(id(n) for n in ast.walk(node))
            yield index, node, name


def framework_references(tree: ast.AST) -> int:
    """How many places read a framework name: what the reducer lowers first while standardising."""
    return sum(1 for _ in _uses(tree))


# Why a reproducer still reads a package: the reduction ended without doing away with it, ran out of time, or
# the smaller candidates that did not read it failed to verify alone (a larger one was written).
KEPT_BECAUSE = {"needed": "the reduction could not do without {}", "time": "{} not reduced away within --max-time",
                "unverified": "{} kept: the smaller candidates did not verify alone"}


def beyond_jax(text: str, because: str) -> str:
    r"""The header line of a reproducer that imports more than jax, numpy and the standard library: which
    packages, what of them it still reads, and why (a key of KEPT_BECAUSE). Empty when it imports nothing more.

    Example:
        >>> beyond_jax("import equinox as eqx\nimport jax\ny = eqx.error_if(x, x < 0, 'neg')\n", "needed")
        '# needs equinox beyond jax/numpy: the reduction could not do without eqx.error_if\n'
    """
    tree = ast.parse(text)
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree)
                 if isinstance(n, ast.ImportFrom) and n.module and n.level == 0}
    packages = sorted(imported - {"jax", "jaxlib", "numpy"} - set(sys.stdlib_module_names))
    if not packages:
        return ""
    names = list(dict.fromkeys(ast.unparse(node) for _, node, _ in _uses(tree, packages)))
    uses = ", ".join(names[:NAMED]) + (f" and {len(names) - NAMED} more" if len(names) > NAMED else "") \
        if names else "its imports"
    return f"# needs {', '.join(packages)} beyond jax/numpy: {KEPT_BECAUSE[because].format(uses)}\n"


def standard_edits(tree: ast.Module, frozen: set[int]) -> list[Edit]:
    """Edits that replace framework spellings by JAX's (nodes in ``frozen``, the kept statement, stay):
    all of them at once (Equinox classes as dataclasses, then with their base dropped), then each alone."""
    swaps: list[tuple[Edit, Edit | None]] = []  # (JAX's spelling, a filter_jit's static variant or None)
    classes: list[tuple[Edit, Edit | None]] = []  # (drop the bases, an eqx.Module as a dataclass or None)
    annotations = [edit for edit in [_annotation_edit(tree, frozen)] if edit is not None]
    aliases = framework_aliases(tree)
    for index, node, name in _uses(tree):
        if id(node) not in frozen and name in SWAPS:
            static = _static_variant(tree, node, index) if name == "equinox.filter_jit" else None
            swaps.append((_swap(index, SWAPS[name]), static))
    for index, cls in enumerate(ast.walk(tree)):
        if isinstance(cls, ast.ClassDef) and id(cls) not in frozen:
            bases = [qualified(base, aliases) for base in cls.bases]
            if any(bases):
                classes.append((_drop_bases(index), _as_dataclass(index) if _EQX_MODULE in bases else None))
    singles = [edit for pair in [*swaps, *[c[::-1] for c in classes]] for edit in pair if edit is not None]
    singles += annotations
    if len(singles) <= 1:
        return singles
    # Big steps first: Equinox's filtering made explicit and the classes as dataclasses, or with their bases
    # dropped (the models are gone); then the classes kept (an nnx.Module is a pytree jax.jit takes as it is).
    common = [static or plain for plain, static in swaps] + annotations
    together = [_together([*common, *[d or b for b, d in classes]])]
    together += [_together([*common, *[b for b, _ in classes]])] if any(d for _, d in classes) else []
    together += [_together(common)] if classes and len(common) > 1 else []
    return [*together, *singles]


def _together(edits: list[Edit]) -> Edit:
    def edit(nodes: list) -> bool:
        applied = [apply(nodes) for apply in edits]  # every one, not up to the first that applies
        return any(applied)
    return edit


def _spelled(dotted: str) -> ast.expr:
    parts = dotted.split(".")
    node: ast.expr = ast.Name(parts[0], ast.Load())
    for part in parts[1:]:
        node = ast.Attribute(node, part, ast.Load())
    return node


def ensure_import(module: ast.Module, name: str) -> None:
    """``import name`` at the top of ``module`` (after the docstring and ``__future__``) unless it is there."""
    for stmt in module.body:
        if isinstance(stmt, ast.Import) and any(a.name == name and a.asname in (None, name) for a in stmt.names):
            return
    at = 0
    while at < len(module.body) and _preamble(module.body[at], at):
        at += 1
    module.body.insert(at, ast.Import([ast.alias(name)]))


def _preamble(stmt: ast.stmt, at: int) -> bool:
    """The module docstring or a ``from __future__`` import: what must come before any other import."""
    docstring = at == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
    return docstring or (isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__")


def _swap(index: int, dotted: str) -> Edit:
    def edit(nodes: list) -> bool:
        old = nodes[index]
        parents = {id(c): p for p in ast.walk(nodes[0]) for c in ast.iter_child_nodes(p)}
        call = parents.get(id(old))
        if isinstance(call, ast.Call) and call.func is old and not call.args and dotted == "jax.jit":
            # `@eqx.filter_jit(donate="all")` / `@nnx.jit(static_argnums=1)`: a decorator made by a call; JAX's
            # own keywords stay with functools.partial, the framework's own (donate) go.
            kept = [k for k in call.keywords if k.arg in _JIT_KEYWORDS]
            new: ast.expr = _partial_jit(nodes[0], kept) if kept else _spelled(dotted)
            ensure_import(nodes[0], "jax")
            return replace_node(nodes[0], call, new)
        ensure_import(nodes[0], "jax")
        return replace_node(nodes[0], old, _spelled(dotted))
    return edit


_JIT_KEYWORDS = ("static_argnums", "static_argnames", "donate_argnums", "donate_argnames", "device", "backend",
                 "inline", "keep_unused", "in_shardings", "out_shardings")


def _partial_jit(module: ast.Module, keywords: list[ast.keyword]) -> ast.expr:
    ensure_import(module, "functools")
    return ast.Call(_spelled("functools.partial"), [_spelled("jax.jit")], keywords)


def _static_variant(tree: ast.Module, node: ast.expr, index: int) -> Edit | None:
    """``@eqx.filter_jit`` on ``def f(model, n)`` called as ``f(m, 3)``: filter_jit treats the Python constant as
    static, jax.jit would trace it; ``functools.partial(jax.jit, static_argnames=("n",))`` says so."""
    function = next((f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and any(d is node for d in f.decorator_list)), None)
    if function is None:
        return None
    params = [a.arg for a in function.args.args]
    static: list[str] = []
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == function.name:
            static += [params[k] for k, arg in enumerate(call.args[:len(params)]) if _python_constant(arg)]
            static += [k.arg for k in call.keywords if k.arg in params and _python_constant(k.value)]
    if not static:
        return None
    names = ast.Tuple([ast.Constant(s) for s in dict.fromkeys(static)], ast.Load())

    def static_edit(nodes: list) -> bool:
        ensure_import(nodes[0], "jax")
        return replace_node(nodes[0], nodes[index],
                            _partial_jit(nodes[0], [ast.keyword("static_argnames", names)]))
    return static_edit


def _python_constant(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) or (isinstance(node, (ast.Tuple, ast.List)) and all(
        isinstance(e, ast.Constant) for e in node.elts))


def _drop_bases(index: int) -> Edit:
    def edit(nodes: list) -> bool:
        cls, aliases = nodes[index], framework_aliases(nodes[0])
        kept = [b for b in cls.bases if qualified(b, aliases) is None]
        if len(kept) == len(cls.bases):
            return False
        cls.bases, cls.keywords = kept, []  # (`strict=True` and the like are the framework's)
        return True
    return edit


def _as_dataclass(index: int) -> Edit:
    """An ``eqx.Module`` as what it is: a dataclass registered as a pytree, its static fields marked so."""
    def edit(nodes: list) -> bool:
        cls, aliases = nodes[index], framework_aliases(nodes[0])
        if not _drop_bases(index)(nodes):
            return False
        for stmt in cls.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.value, ast.Call) and \
                    qualified(stmt.value.func, aliases) in ("equinox.field", "equinox.static_field"):
                field = stmt.value
                static = qualified(field.func, aliases) == "equinox.static_field" or any(
                    k.arg == "static" and isinstance(k.value, ast.Constant) and k.value.value for k in field.keywords)
                keywords = [k for k in field.keywords if k.arg in ("default", "default_factory", "init", "repr")]
                if static:
                    keywords.append(ast.keyword("metadata", ast.Dict([ast.Constant("static")], [ast.Constant(True)])))
                stmt.value = ast.Call(_spelled("dataclasses.field"), [], keywords)
        cls.decorator_list[:0] = [_spelled("jax.tree_util.register_dataclass"), _spelled("dataclasses.dataclass")]
        ensure_import(nodes[0], "dataclasses")
        ensure_import(nodes[0], "jax")
        return True
    return edit


def _annotation_edit(tree: ast.AST, frozen: set[int]) -> Edit | None:
    """Annotations naming framework types go (a class field's becomes ``object``: the field stays declared)."""
    aliases = framework_aliases(tree)

    def names_framework(annotation: ast.expr | None) -> bool:
        return annotation is not None and any(qualified(n, aliases) for n in ast.walk(annotation))

    fields = {id(stmt) for cls in ast.walk(tree) if isinstance(cls, ast.ClassDef) for stmt in cls.body}
    where = [index for index, node in enumerate(ast.walk(tree)) if id(node) not in frozen and (
        (isinstance(node, ast.arg) and names_framework(node.annotation))
        or (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and names_framework(node.returns))
        or (isinstance(node, ast.AnnAssign) and id(node) in fields and names_framework(node.annotation)))]

    def edit(nodes: list) -> bool:
        for index in where:
            node = nodes[index]
            if isinstance(node, ast.arg):
                node.annotation = None
            elif isinstance(node, ast.AnnAssign):
                node.annotation = ast.Name("object", ast.Load())
            else:
                node.returns = None
        return True

    return edit if where else None
