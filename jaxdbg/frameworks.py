"""Framework wrappers seen as the user wrote them: Equinox's ``filter_jit`` and Flax NNX's ``nnx.jit``.

Both call ``jax.jit`` on an inner function of their own, with arguments of their own: ``filter_jit`` on a
``fun_wrapped(dynamic_donate, dynamic_nodonate, static)`` that holds every non-array leaf in one static
tuple, ``nnx.jit`` on a ``JitFn`` whose graph-node arguments arrive split into a graph definition and flat
state lists. The jit layer sees only those; this module maps them back to the user's function, parameter
names (``temperature``, ``x``) and leaves (``model.layers[0].weight``), and names module fields that jax
keys a compile on without them being arguments (Equinox ``eqx.field(static=True)``, NNX attributes such
as ``model.dropout.deterministic``, flax.struct ``pytree_node=False`` fields).

Every framework-specific fact of jaxdbg lives here. A framework is consulted only when the user's program
has imported it (``sys.modules``), so jaxdbg neither needs flax or equinox installed nor imports them.

Example:
    >>> def step(params, batch):
    ...     return params
    >>> user_function(step) is step, user_arguments(step, (1, 2), {})
    (True, None)
    >>> [(path, leaf) for path, leaf, _ in named_leaves({"w": 1.0, "b": [2, 3]})]
    [("['b'][0]", 2), ("['b'][1]", 3), ("['w']", 1.0)]
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

_FRAMES_UP = 24  # how far above jax.jit to look for filter_jit's frame (a few frames in equinox 0.13)


@dataclass(frozen=True)
class Argument:
    """One argument of a call as the user passed it. ``filtered``: its array leaves are traced and every other
    leaf is static (``eqx.filter_jit``); ``static``: the whole value is static (``static_argnums``)."""

    name: str
    value: Any
    static: bool = False
    filtered: bool = False


def user_function(fun: Any) -> Any:
    """The user's function behind ``fun`` when ``fun`` is a framework's inner function, else ``fun``.

    NNX's ``JitFn`` already names it (``__wrapped__``); Equinox's inner function does not hold it, so it is
    read from ``filter_jit``'s frame while ``jax.jit`` is being applied (the only time it is on the stack).
    """
    if _is_filter_jit_inner(fun):
        return _filter_jit_target(fun) or fun
    return fun


@contextlib.contextmanager
def tracing_context(fun: Any) -> Iterator[None]:
    """What a framework's inner function needs around a trace made outside its wrapper's call.

    NNX's ``JitFn`` (and ``ShardMapFn``) merge and split their graph nodes in the update context that
    ``nnx.jit``'s ``__call__`` opens for its tag (the ``JitWrapped``); traced later (nan-hunt's replay of a
    call whose flags were read after it returned) they raise "No update context found". A fresh context for
    that tag is pushed for the trace and popped after it: one under way (the user's next call) is left as it
    was. Other functions trace as they are.

    Example:
        >>> with tracing_context(lambda x: x):
        ...     pass
    """
    tag = _nnx_context_tag(fun)
    if tag is None:
        yield
        return
    with sys.modules["flax.nnx.graphlib"].update_context(tag):
        yield


def jit_kind(fun: Any) -> Literal["jax.jit", "nnx.jit", "eqx.filter_jit"]:
    """How the user jitted the function whose inner function jax.jit got: ``eqx.filter_jit``, ``nnx.jit`` or
    ``jax.jit``.

    Example:
        >>> jit_kind(lambda x: x)
        'jax.jit'
    """
    if _is_filter_jit_inner(fun):
        return "eqx.filter_jit"
    if type(fun).__module__.startswith("flax.nnx") or _is_jit_partial_inner(getattr(fun, "f", fun)):
        return "nnx.jit"
    return "jax.jit"


def donation_option(kind: str, argnums: Sequence[int], kept: Sequence[str] = ()) -> str:
    """How to donate the arguments at ``argnums`` with the wrapper ``kind`` (see :func:`jit_kind`; or ``jax.pmap``);
    ``kept``: array arguments the caller passes again, which must not be donated. ``filter_jit`` donates by groups of
    arguments (``donate="all"`` or ``"all-except-first"``), not by position.

    Example:
        >>> donation_option("nnx.jit", [0, 1])
        'nnx.jit(..., donate_argnums=(0, 1))'
        >>> donation_option("eqx.filter_jit", [0, 1], kept=["x"])  # doctest: +NORMALIZE_WHITESPACE
        'eqx.filter_jit(..., donate="all") (it donates every array argument: the loop passes x again, so take
         it out of the arguments or pass a copy)'
    """
    numbers = ", ".join(str(n) for n in argnums) + ("," if len(argnums) == 1 else "")
    if kind == "eqx.filter_jit":
        caution = (f" (it donates every array argument: the loop passes {', '.join(kept)} again, so take "
                   f"{'it' if len(kept) == 1 else 'them'} out of the arguments or pass a copy)") if kept else ""
        return f'eqx.filter_jit(..., donate="all"){caution}'
    if kind in ("nnx.jit", "jax.pmap"):
        return f"{kind}(..., donate_argnums=({numbers}))"
    return f"jax.jit(..., donate_argnums=({numbers}))"


def _nnx_context_tag(fun: Any) -> Any:
    """The update-context tag of an NNX transform's inner function, or None for any other function."""
    kind = type(fun)
    if not kind.__module__.startswith("flax.nnx") or "flax.nnx.graphlib" not in sys.modules:
        return None
    return getattr(fun, "ctxtag", None)


def user_arguments(fun: Any, args: tuple, kwargs: dict) -> list[Argument] | None:
    """The arguments of a call of a framework's inner function as the user passed them, by the user's
    parameter names; None when ``fun`` is no framework's inner function (or its arguments are not the
    shape this module knows)."""
    try:
        if _is_filter_jit_inner(fun):
            return _filter_jit_arguments(args, kwargs)
        inner = getattr(fun, "f", None) if type(fun).__name__ == "SimpleJitPartialFn" else fun  # jax.jit's target
        if _is_jit_partial_inner(inner):
            return _jit_partial_arguments(inner, args, kwargs)
    except Exception:  # noqa: BLE001 - another framework version: fall back to the inner function's view
        return None
    return None


def user_leaf_names(fun: Any, args: tuple, kwargs: dict, parameters: Sequence[str] = ()) -> dict[int, str]:
    """The user's name (``model.layers[0].weight``, ``x``) of each array leaf of a call of a framework's inner
    function, by the leaf's ``id``: the wrapper's own argument paths (filter_jit's
    ``dynamic_nodonate['rest'][13]``, nnx.jit's ``model.states[0][3]``) mean nothing to the user. ``parameters``:
    the inner function's positional parameter names (nnx.jit's are the user's). Empty for any other function.

    Example:
        >>> user_leaf_names(lambda x: x, (1.0,), {}, ["x"])
        {}
    """
    arguments = user_arguments(fun, args, kwargs)
    if arguments is None:  # nnx.jit: the user's arguments, a graph node's split into graph definition + states
        split = _split_node_types()
        arguments = [Argument(name, value) for name, value in zip(parameters, args)
                     if split and isinstance(value, split)]
    names: dict[int, str] = {}
    for argument in arguments:  # a module called as the function is named by its class: MLP.layers[0].weight
        for path, leaf, attribute in named_leaves(argument.value):
            if not attribute:
                names.setdefault(id(leaf), f"{argument.name}{path}")
    return names


def named_leaves(value: Any) -> Iterator[tuple[str, Any, bool]]:
    """``(path, leaf, attribute)`` for each leaf of ``value``, paths as the user writes them (``.layers[0]``,
    ``['x']``). ``attribute`` marks a module field that jax keys on by value (static) although it is no
    pytree leaf; NNX graph nodes (also split into a graph definition and states) are walked as modules."""
    kinds = _node_kinds()
    if not kinds:
        yield from _pytree_leaves(value, "", lambda x: False)
        return
    yield from _walk(value, "", kinds)


def readable(value: Any, limit: int = 60) -> str:
    """A short text for a static value: functions and classes by name, reprs without memory addresses.

    Example:
        >>> readable(len), readable(float), readable(object())
        ('len', 'float', '<object object>')
    """
    target = value
    for _ in range(8):  # jax.jit/functools.wraps wrappers: name what they wrap
        inner = getattr(target, "__wrapped__", None)
        if inner is None or inner is target or inspect.ismethod(target):
            break
        target = inner
    if inspect.ismethod(target):  # by the class of its object: TextClassifier.apply, not Module.apply
        text = f"{type(target.__self__).__name__}.{target.__name__}"
    elif isinstance(target, type) or inspect.isroutine(target):
        text = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or repr(target)
    elif isinstance(value, tuple) and hasattr(value, "_fields"):  # a NamedTuple: optax's transformations
        text = f"{type(value).__name__}({', '.join(f'{k}={readable(v, limit)}' for k, v in zip(value._fields, value))})"
    else:
        try:
            text = repr(value)
        except Exception:  # noqa: BLE001 - a broken __repr__ must not break the user's run
            text = f"<{type(value).__name__}>"
        text = re.sub(r"0x[0-9a-fA-F]{6,}", "...", re.sub(r" at 0x[0-9a-fA-F]+", "", text))
    text = text.replace("<locals>.", "")
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---- walking values ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _NodeKind:
    """A framework's module type: which values it claims and how it lists their leaves and fields."""

    claims: Callable[[Any], bool]
    walk: Callable[[Any, str, tuple], Iterator[tuple[str, Any, bool]]]


def _node_kinds() -> tuple[_NodeKind, ...]:
    kinds = []
    if "equinox" in sys.modules:
        kinds.append(_NodeKind(_is_eqx_module, _walk_eqx_module))
    if "flax.nnx" in sys.modules:
        kinds.append(_NodeKind(_is_nnx_node, _walk_nnx_node))
    if "flax.struct" in sys.modules:
        kinds.append(_NodeKind(_is_flax_struct, _walk_flax_struct))
    return tuple(kinds)


def _walk(value: Any, prefix: str, kinds: tuple) -> Iterator[tuple[str, Any, bool]]:
    for kind in kinds:
        if _safe(kind.claims, value):
            yield from kind.walk(value, prefix, kinds)
            return

    def claimed(x: Any) -> bool:
        return any(_safe(k.claims, x) for k in kinds)

    for path, leaf, _ in _pytree_leaves(value, prefix, claimed):
        if claimed(leaf):
            yield from _walk(leaf, path, kinds)
        else:
            yield path, leaf, False


def _pytree_leaves(value: Any, prefix: str, stop: Callable[[Any], bool]) -> Iterator[tuple[str, Any, bool]]:
    import jax

    flat, _ = jax.tree_util.tree_flatten_with_path(value, is_leaf=lambda x: x is not value and stop(x))
    for path, leaf in flat:
        yield prefix + jax.tree_util.keystr(path), leaf, False


def _safe(claims: Callable[[Any], bool], value: Any) -> bool:
    try:
        return bool(claims(value))
    except Exception:  # noqa: BLE001 - an odd object is simply not a module
        return False


def _dataclass_fields(value: Any, is_static: Callable[[Any], bool], prefix: str,
                      kinds: tuple) -> Iterator[tuple[str, Any, bool]]:
    """A dataclass module: static fields as attributes, the others walked as pytrees."""
    for field in dataclasses.fields(value):
        if not hasattr(value, field.name):
            continue
        child = getattr(value, field.name)
        path = f"{prefix}.{field.name}"
        if is_static(field):
            yield path, child, True
        else:
            yield from _walk(child, path, kinds)


# ---- Equinox ---------------------------------------------------------------------------------------------------


def _is_eqx_module(value: Any) -> bool:
    return isinstance(value, sys.modules["equinox"].Module)


def _walk_eqx_module(value: Any, prefix: str, kinds: tuple) -> Iterator[tuple[str, Any, bool]]:
    yield from _dataclass_fields(value, lambda f: bool(f.metadata.get("static", False)), prefix, kinds)


def _is_filter_jit_inner(fun: Any) -> bool:
    """``filter_jit``'s inner function: defined in equinox's jit module, taking (donate, nodonate, static)."""
    code = getattr(fun, "__code__", None)
    return (code is not None and getattr(fun, "__module__", "") == "equinox._jit"
            and code.co_varnames[:3] == ("dynamic_donate", "dynamic_nodonate", "static"))


def _filter_jit_target(inner: Any) -> Any:
    """The function ``filter_jit`` was given, from its frame on the stack (equinox names its inner function
    after it: the names must match)."""
    wanted = (getattr(inner, "__name__", None), getattr(inner, "__qualname__", None))
    frame: Any = sys._getframe(1)
    for _ in range(_FRAMES_UP):
        frame = frame.f_back
        if frame is None:
            return None
        if not str(frame.f_globals.get("__name__", "")).startswith("equinox"):
            continue
        for local in ("fun", "user_fn"):
            candidate = frame.f_locals.get(local)
            if callable(candidate) and _names_of(candidate) == wanted:
                return candidate
    return None


def unwrap_function(fun: Any) -> Any:
    """The Python function behind a callable (partials and ``functools.wraps`` wrappers unwrapped).

    Example:
        >>> unwrap_function(functools.partial(functools.partial(len), "ab")) is len
        True
    """
    for _ in range(8):
        if isinstance(fun, functools.partial):
            fun = fun.func
        elif hasattr(fun, "__wrapped__"):
            fun = fun.__wrapped__
        else:
            break
    return fun


def _names_of(fun: Any) -> tuple[str | None, str | None]:
    """A callable's (name, qualname) as equinox names its inner function (wrappers and partials unwrapped)."""
    fun = unwrap_function(fun)
    if hasattr(fun, "__name__"):
        return fun.__name__, getattr(fun, "__qualname__", None)
    return type(fun).__name__, type(fun).__qualname__


def _combine(dynamic: tuple, static: tuple) -> Any:
    """Undo filter_jit's split of a pytree into array leaves and (other leaves, treedef)."""
    import jax

    static_leaves, treedef = static
    leaves = [d if s is None else s for d, s in zip(dynamic, static_leaves)]
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _filter_jit_arguments(args: tuple, kwargs: dict) -> list[Argument] | None:
    if kwargs or len(args) != 3:
        return None
    donate, nodonate, static = args
    dynamic = {**donate, **nodonate}
    static_fun, static_first, static_rest = static
    fun = _combine(dynamic["fun"], static_fun)
    first = _combine(dynamic["first"], static_first)
    rest, user_kwargs = _combine(dynamic["rest"], static_rest)
    positional = (first, *rest)[:-1]  # filter_jit appends a None so that no call has zero arguments
    out = [Argument(name, value, filtered=True)
           for name, value in zip(_positional_names(fun, len(positional)), positional)]
    out += [Argument(key, value, filtered=True) for key, value in user_kwargs.items()]
    if not inspect.isfunction(fun):
        # Callables other than plain functions share filter_jit's compiled function by name, so the callable
        # itself (a module, a partial) is part of what is compiled: show it, named by its class (MLP).
        out.insert(0, Argument(type(fun).__name__, fun, filtered=True))
    return out


def _positional_names(fun: Any, count: int) -> list[str]:
    """Names of ``count`` positional arguments bound to ``fun`` (``*args`` as ``args[i]``)."""
    try:
        params = list(inspect.signature(fun).parameters.values())
    except (TypeError, ValueError):
        params = []
    names: list[str] = []
    for p in params:
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
        elif p.kind == p.VAR_POSITIONAL:
            names += [f"{p.name}[{i}]" for i in range(count - len(names))]
    names += [f"args[{i}]" for i in range(len(names), count)]
    return names[:count]


def _is_jit_partial_inner(fun: Any) -> bool:
    """``nnx.jit_partial``'s inner function: ``wrapped_fun(flat_partial_list, *args, **kwargs)`` (jax.jit gets it
    inside NNX's ``SimpleJitPartialFn``), wrapped to look like the user's function: its signature would name
    the flat list after the user's first parameter and every later argument one parameter off."""
    code = getattr(fun, "__code__", None)
    return (code is not None and str(getattr(code, "co_filename", "")).replace("\\", "/").endswith(
        "flax/nnx/transforms/compilation.py") and code.co_varnames[:1] == ("flat_partial_list",))


def _jit_partial_arguments(fun: Any, args: tuple, kwargs: dict) -> list[Argument] | None:
    """The bound arguments (``model``, ``optimizer``) rebuilt from the flat list, then the call's own."""
    import jax

    cells = dict(zip(fun.__code__.co_freevars, (c.cell_contents for c in fun.__closure__ or ())))
    if "partial_treedef" not in cells or "fun" not in cells or not args:
        return None
    bound = jax.tree_util.tree_unflatten(cells["partial_treedef"], list(args[0]))
    positional = (*bound, *args[1:])
    out = [Argument(name, value) for name, value in zip(_positional_names(cells["fun"], len(positional)), positional)]
    return out + [Argument(key, value) for key, value in kwargs.items()]


# ---- Flax NNX and flax.struct --------------------------------------------------------------------------------


def _nnx() -> Any:
    return sys.modules["flax.nnx"]


def _split_node_types() -> tuple[type, ...]:
    """NNX's forms of a graph node split for jax: NodeStates (nnx.jit) and TreeState (tree-mode updates)."""
    extract = sys.modules.get("flax.nnx.extract")
    return tuple(t for t in (getattr(extract, "NodeStates", None), getattr(extract, "TreeState", None))
                 if isinstance(t, type))


def _is_nnx_node(value: Any) -> bool:
    if isinstance(value, _split_node_types()):
        return True
    graph = sys.modules.get("flax.nnx.graphlib")
    return graph is not None and graph.is_graph_node(value)


def _as_graph_node(value: Any) -> Any:
    """The module behind NNX's split form (graph definition + states), rebuilt from the call's arrays."""
    extract: Any = sys.modules["flax.nnx.extract"]
    if isinstance(value, extract.NodeStates):
        return _nnx().merge(value.graphdef, *value.states)
    if isinstance(value, extract.TreeState):
        return extract.from_tree2(value)
    return value


def _walk_nnx_node(value: Any, prefix: str, kinds: tuple) -> Iterator[tuple[str, Any, bool]]:
    """Variables as leaves (their arrays), every other attribute as a static field: the graph definition jax
    keys on holds them (``deterministic``, ``use_running_average``, layer sizes)."""
    import jax

    try:
        node = _as_graph_node(value)
        items = list(sys.modules["flax.nnx.graphlib"].iter_graph(node))
    except Exception:  # noqa: BLE001 - not rebuildable here: show the split form as jax sees it
        yield from _pytree_leaves(value, prefix, lambda x: False)
        return
    variable = _nnx().Variable
    paths = [path for path, _ in items]
    inner = {path[:i] for path in paths for i in range(len(path))}  # every proper prefix: a node, not a leaf
    for path, leaf in items:
        if path in inner or any(isinstance(part, str) and part.startswith("_") for part in path):
            continue  # containers, and NNX's own bookkeeping (_pytree__state, _length)
        name = prefix + "".join(f".{p}" if isinstance(p, str) and p.isidentifier() else f"[{p!r}]" for p in path)
        if isinstance(leaf, variable):
            yield name, _variable_value(leaf), False
        elif isinstance(leaf, jax.Array) or hasattr(leaf, "__array__"):
            yield name, leaf, False
        else:
            yield name, leaf, True


def _variable_value(variable: Any) -> Any:
    for getter in ("get_value", "get_raw_value"):
        method = getattr(variable, getter, None)
        if callable(method):
            return method()
    return variable.value


def _is_flax_struct(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and getattr(type(value), "_flax_dataclass", False) is True


def _walk_flax_struct(value: Any, prefix: str, kinds: tuple) -> Iterator[tuple[str, Any, bool]]:
    # pytree_node=False fields (a TrainState's apply_fn and tx) sit in the treedef: jax keys on them by value.
    yield from _dataclass_fields(value, lambda f: f.metadata.get("pytree_node", True) is False, prefix, kinds)
