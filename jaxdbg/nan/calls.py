"""One call of a function, kept so it can be replayed: the function, its arguments, and naming helpers.

jaxdbg traces the call again as a jaxpr with the static arguments fixed, so the flat jaxpr inputs are the
leaves of the dynamic arguments; each leaf gets a readable name from the function's signature, e.g.
``batch['x']`` or ``params[0]['w']``.

Example:
    >>> def step(params, batch, lr=0.1): ...
    >>> call = Call("step", step, ({"w": 1.0}, [2.0]), {}, static_argnums=())
    >>> call.leaf_names()
    ["params['w']", 'batch[0]']
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
from jax.tree_util import keystr, tree_flatten, tree_flatten_with_path

from jaxdbg import _compat, frameworks


@dataclass
class Call:
    """A call to replay: ``fun(*args, **kwargs)`` with jit's static arguments, by name and position."""

    name: str
    fun: Callable | None  # None: an eager operation, replayed from its jaxpr only
    args: tuple
    kwargs: dict
    static_argnums: Sequence[int] = ()
    static_argnames: Sequence[str] = ()
    call_index: int = 0
    call_site: Any = None
    output_names: list[str] | None = field(default=None)
    series: str = ""  # the growth series of the call's outputs (jaxdbg.nan.watch: Watch.series_key); "": its name
    pmap: bool = False  # ``fun`` is a ``jax.pmap``'d function: its jaxpr is jax's own jit of a shard_map
    # Positions of the flat outputs that only a later backward pass reads: the residuals of a forward program that
    # jax.grad, applied outside jit, runs eagerly (what computes only them is backward: jaxdbg.nan.passes).
    backward_outputs: frozenset[int] = frozenset()

    @property
    def root(self) -> str:
        """The first element of every path inside the call: ``jit(name)``, or ``pmap``."""
        return "pmap" if self.pmap else f"jit({self.name})"

    def _static_sets(self) -> tuple[set[int], set[str]]:
        nums = {i % len(self.args) if self.args else i
                for i in (self.static_argnums or ()) if -len(self.args) <= i < len(self.args)}
        names = set(self.static_argnames or ())
        for i, param in enumerate(self._positional_params()):
            if param in names:
                nums.add(i)
            if i in nums:
                names.add(param)
        return nums, names

    def _positional_params(self) -> list[str]:
        if self.fun is None:
            return []
        try:
            return list(_positional_params(self.fun))
        except TypeError:  # an unhashable callable
            return list(_positional_params.__wrapped__(self.fun))

    def dynamic(self) -> tuple[Callable, tuple, dict]:
        """``(fn, dyn_args, dyn_kwargs)``: ``fn(*dyn_args, **dyn_kwargs)`` is the call with statics fixed."""
        nums, names = self._static_sets()
        dyn_args = tuple(a for i, a in enumerate(self.args) if i not in nums)
        dyn_kwargs = {k: v for k, v in self.kwargs.items() if k not in names}
        statics = {i: a for i, a in enumerate(self.args) if i in nums}
        static_kwargs = {k: v for k, v in self.kwargs.items() if k in names}
        fun = self.fun

        def replay(*dargs: Any, **dkwargs: Any) -> Any:
            assert fun is not None  # only a call with a function is traced from it
            it = iter(dargs)
            full = [statics[i] if i in statics else next(it) for i in range(len(dargs) + len(statics))]
            return fun(*full, **dkwargs, **static_kwargs)

        replay.__name__ = self.name
        return replay, dyn_args, dyn_kwargs

    def leaves(self) -> list:
        """Flat dynamic argument leaves, in the order of the traced jaxpr's inputs."""
        if not self.static_argnums and not self.static_argnames:  # asked per watched call: nothing to leave out
            return tree_flatten((tuple(self.args), dict(self.kwargs)))[0]
        _, dyn_args, dyn_kwargs = self.dynamic()
        return tree_flatten((dyn_args, dyn_kwargs))[0]

    def leaf_names(self) -> list[str]:
        """A readable name per leaf: the parameter name plus the pytree path inside it; a framework wrapper's
        leaves by the user's own arguments (``model.layers[0].weight``, not filter_jit's
        ``dynamic_nodonate['rest'][3]``)."""
        # jax names a transformation wrapper's arguments after its own signature (checkify's args[0]); the
        # user's function inside names them as the user wrote them
        from jaxdbg.jit_layer import parameter_function

        names = self._names(readable_keystr, list(_positional_params.__wrapped__(parameter_function(self.fun)))
                            if self.fun is not None else None)
        users = (frameworks.user_leaf_names(self.fun, self.args, self.kwargs, self._positional_params())
                 if self.fun is not None else {})
        if users:
            names = [users.get(id(leaf), name) for leaf, name in zip(self.leaves(), names)]
        return names

    def jax_names(self) -> list[str]:
        """Each leaf's name as jax writes it in the compiled program's metadata (``dynamic_nodonate['rest'][3]``).

        Example:
            >>> Call("step", lambda params, x: x, ({"w": 1.0}, 2.0), {}).jax_names()
            ["params['w']", 'x']
        """
        return self._names(lambda value, path: _FLAT_INDEX.sub(r"\1", keystr(path)))  # jax writes [0]

    def _names(self, render: Callable[[Any, tuple], str], params: list[str] | None = None) -> list[str]:
        """Parameter name (positional ones from the signature, or ``params``; keywords by key) +
        ``render(argument, path)``."""
        nums, _ = self._static_sets()
        params = self._positional_params() if params is None else params
        positions = [i for i in range(len(self.args)) if i not in nums]
        _, dyn_args, dyn_kwargs = self.dynamic()
        names = []
        tree = (dyn_args, dyn_kwargs)
        for path, _leaf in tree_flatten_with_path(tree)[0]:
            group, key, rest = path[0].idx, path[1], path[2:]
            if group == 0:
                original = positions[key.idx]
                base = params[original] if original < len(params) else f"args[{original}]"
            else:
                base = str(getattr(key, "key", key))
            names.append(base + render(tree[group][key.idx if group == 0 else key.key], rest))
        return names

    def trace(self) -> Any:
        """The call's closed jaxpr (traced afresh from the Python function, in the context a framework's inner
        function needs: see :func:`jaxdbg.frameworks.tracing_context`). A pmap'd call's is the body of pmap's own
        jit (a shard_map of the user's function), as nan-hunt's eager check sees a pmap."""
        fn, dyn_args, dyn_kwargs = self.dynamic()
        with frameworks.tracing_context(self.fun):
            closed = jax.make_jaxpr(fn)(*dyn_args, **dyn_kwargs)
        return _compat.pmap_body(closed) if self.pmap else closed


_FLAT_INDEX = re.compile(r"<flat index ([^>]+)>")


@functools.lru_cache(maxsize=1024)  # asked on every watched call: inspect.signature is slow
def _positional_params(fun: Callable) -> tuple[str, ...]:
    try:
        params = inspect.signature(fun).parameters.values()
    except (TypeError, ValueError):
        return ()
    return tuple(p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


def output_leaf_names(out: Any, base_names: Sequence[str] | None, function: str) -> list[str]:
    """Names for the leaves of a call's output: ``params['w']`` when the call was ``params, loss = f(...)``
    (a NamedTuple output unpacked the same way too).

    Example:
        >>> import collections
        >>> Out = collections.namedtuple("Out", "params loss")
        >>> output_leaf_names(Out({"w": 1.0}, 2.0), ["params", "loss"], "step")
        ["params['w']", 'loss']
    """
    leaves = tree_flatten_with_path(out)[0]
    names = []
    top_is_tuple = isinstance(out, (tuple, list))
    for path, _ in leaves:
        if base_names and top_is_tuple and len(base_names) == len(out) and path:
            position = getattr(path[0], "idx", None)  # a NamedTuple's entries are keyed by field name
            if position is None:
                position = out._fields.index(path[0].name) if hasattr(out, "_fields") else 0
            names.append(base_names[position] + readable_keystr(out[position], path[1:]))
        elif base_names and len(base_names) == 1:
            names.append(base_names[0] + readable_keystr(out, path))
        else:
            names.append(f"{function}(...)" + readable_keystr(out, path))
    return names


def readable_keystr(tree: Any, path: Sequence[Any]) -> str:
    """``keystr(path)`` of a leaf inside ``tree``, with a class's positional children named by attribute.

    A pytree class registered without keys (``register_pytree_node_class``: a sparse ``BCOO``, many user
    classes) has its children keyed by position, which jax writes ``[<flat index 0>]``; when the child is one
    of the object's attributes, its name says more: ``adj.data`` rather than ``adj[<flat index 0>]``.

    Example:
        >>> from jax.experimental import sparse
        >>> import jax.numpy as jnp
        >>> adj = sparse.BCOO.fromdense(jnp.eye(2))
        >>> [readable_keystr(adj, path) for path, _ in tree_flatten_with_path(adj)[0]]
        ['.data', '.indices']
    """
    parts, node = [], tree
    for key in path:
        child, name = _child(node, key)
        parts.append(f".{name}" if name else keystr((key,)))
        node = child
    return "".join(parts)


def _child(node: Any, key: Any) -> tuple[Any, str | None]:
    """The child of ``node`` at ``key``, and the attribute holding it when jax keys it only by position."""
    if not isinstance(key, jax.tree_util.FlattenedIndexKey):
        try:
            return key_child(node, key), None
        except Exception:  # noqa: BLE001 - naming only: a node we cannot walk keeps jax's own spelling
            return None, None
    children = tree_flatten(node, is_leaf=lambda x: x is not node)[0]
    child = children[key.key] if key.key < len(children) else None
    attributes = getattr(node, "__dict__", None) or {}
    name = next((a for a, value in attributes.items() if value is child and not a.startswith("_")), None)
    return child, name


def key_child(node: Any, key: Any) -> Any:
    """The child of ``node`` a key path entry (``DictKey``, ``SequenceKey``, ``GetAttrKey``) names."""
    if isinstance(key, jax.tree_util.DictKey):
        return node[key.key]
    if isinstance(key, jax.tree_util.SequenceKey):
        return node[key.idx]
    return getattr(node, key.name)
