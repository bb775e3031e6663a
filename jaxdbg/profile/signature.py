"""Abstract argument signatures of a jitted call, and why a call compiled again.

jax compiles again when what it keys its caches on changes: an argument's shape, dtype, weak type or
sharding, the value of a static argument, the pytree structure, or the Python callable itself. jaxdbg
records the signature of every call that compiled and diffs it against the closest earlier one, which
names the argument and the change (``jax_explain_cache_misses`` only logs text, and not for every cause).

A signature is what jax keys on, not what the user passed: dtypes canonicalised (a float64 numpy array is
float32 to jax unless x64 is on), a Python number is a weakly typed scalar like the array jax returns for
it. Only the compiled calls' signatures are kept, one per cache entry, so a difference between two of them
is a difference jax compiled for. Arguments of framework wrappers (``eqx.filter_jit``, ``nnx.jit``) are
named as the user passed them (:mod:`jaxdbg.frameworks`).

A signature is computed only for calls that compiled, so steady-state calls pay nothing for it.

Example:
    >>> import numpy as np
    >>> old = call_signature(lambda batch: 0, (np.zeros((8, 32)),), {}, ())
    >>> new = call_signature(lambda batch: 0, (np.zeros((9, 32)),), {}, ())
    >>> explain([old], new, same_callable=True).reason
    "argument 'batch' shape changed (8, 32) -> (9, 32)"
"""

from __future__ import annotations

import contextlib
import inspect
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from jaxdbg import frameworks
from jaxdbg.profile.model import ArgChange, Recompile

# A Python number is a scalar of its kind's widest dtype, canonicalised like an array (int32 without x64);
# bool is the one kind jax does not type weakly.
_SCALAR_KINDS = {bool: ("bool", False), int: ("int64", True), float: ("float64", True),
                 complex: ("complex128", True)}
_MAX_VALUE_TEXT = 60


@dataclass(frozen=True)
class LeafSig:
    """What jax keys a compile on for one argument leaf."""

    kind: str  # 'array', 'scalar' (a Python number), 'static', 'other'
    shape: tuple[int, ...] | None = None
    dtype: str | None = None  # as jax canonicalises it
    weak_type: bool = False
    sharding: str | None = None
    value: str | None = None  # static arguments: the value in short (compared by equality via `token`)
    token: Any = None
    attribute: bool = False  # a static value inside an argument (a module's field): listed last

    def describe(self) -> str:
        if self.kind == "static":
            return f"static {self.value}"
        if self.kind == "scalar":
            return f"a Python {self.value} (weakly typed {self.dtype})"
        if self.kind == "array":
            weak = " weakly typed" if self.weak_type else ""
            return f"{self.dtype}{list(self.shape or ())}{weak}"
        return self.value or "an object"


@dataclass(frozen=True)
class Signature:
    """The signature of one call: leaves by argument path, in order."""

    leaves: tuple[tuple[str, LeafSig], ...]

    def as_dict(self) -> dict[str, LeafSig]:
        return dict(self.leaves)

    def short(self, limit: int = 6) -> str:
        """'batch: f32[8, 32], n: static 3, ...' for reports (modules' static fields after the arguments)."""
        ordered = sorted(self.leaves, key=lambda item: item[1].attribute)
        parts = [f"{path}: {leaf.describe()}" for path, leaf in ordered[:limit]]
        if len(self.leaves) > limit:
            parts.append(f"... {len(self.leaves) - limit} more")
        return ", ".join(parts)


def parameter_names(fun: Callable) -> list[str] | None:
    """Positional parameter names of ``fun`` (None when it has no readable signature); of the user's function
    inside a jax transformation's wrapper (``checkify.checkify(step)``: step's, not ``args``)."""
    from jaxdbg.jit_layer import parameter_function

    try:
        params = inspect.signature(parameter_function(fun)).parameters.values()
    except (TypeError, ValueError):
        return None
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def compiled_dtype(dtype: Any) -> str:
    """The dtype jax compiles for (float64 -> f32 without x64), in the contract's spelling."""
    import jax

    from jaxdbg.target import short_dtype

    with contextlib.suppress(TypeError, ValueError):  # extended dtypes (PRNG keys) are their own canonical form
        dtype = jax.dtypes.canonicalize_dtype(dtype)
    try:
        return short_dtype(dtype)
    except TypeError:
        return str(dtype)


def leaf_signature(value: Any) -> LeafSig:
    """The signature of one dynamic leaf (jax array, numpy array, Python number or other), as jax keys on it."""
    if type(value) in _SCALAR_KINDS:
        widest, weak = _SCALAR_KINDS[type(value)]
        return LeafSig("scalar", (), compiled_dtype(widest), weak, value=type(value).__name__)
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        sharding = getattr(value, "sharding", None)
        return LeafSig(
            "array", tuple(int(d) for d in shape), compiled_dtype(dtype), bool(getattr(value, "weak_type", False)),
            _describe_sharding(sharding) if sharding is not None else None,
        )
    return LeafSig("other", value=type(value).__name__)


def _describe_sharding(sharding: Any) -> str:
    spec = getattr(sharding, "spec", None)
    devices = getattr(sharding, "device_set", None)
    count = len(devices) if devices is not None else "?"
    if spec is not None:
        return f"{type(sharding).__name__}({spec}, {count} devices)"
    return f"{type(sharding).__name__}({count} device{'s' if count != 1 else ''})"


def _static_leaf(value: Any, attribute: bool = False) -> LeafSig:
    text = frameworks.readable(value, _MAX_VALUE_TEXT)
    try:
        hash(value)
        token = value
    except TypeError:
        token = text
    return LeafSig("static", value=text, token=token, attribute=attribute)


def call_signature(
    fun: Callable,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    static_argnums: Sequence[int],
    static_argnames: Sequence[str] = (),
    names: list[str] | None = None,
) -> Signature:
    """The signature of ``fun(*args, **kwargs)`` as jit sees it (static arguments by value), by the user's
    names (a framework wrapper's inner function is mapped back to the user's function first)."""
    arguments = frameworks.user_arguments(fun, tuple(args), kwargs)
    if arguments is None:
        names = parameter_names(fun) if names is None else names
        statics = {i % len(args) for i in static_argnums if args and -len(args) <= i < len(args)}
        arguments = [frameworks.Argument(names[i] if names and i < len(names) else f"args[{i}]", value, i in statics)
                     for i, value in enumerate(args)]
        arguments += [frameworks.Argument(key, value, key in static_argnames) for key, value in kwargs.items()]
    leaves: list[tuple[str, LeafSig]] = []
    for argument in arguments:
        if argument.static:
            leaves.append((argument.name, _static_leaf(argument.value)))
            continue
        found = False
        for path, leaf, attribute in frameworks.named_leaves(argument.value):
            found = True
            if attribute or (argument.filtered and not _is_array(leaf)):
                leaves.append((argument.name + path, _static_leaf(leaf, attribute=bool(path))))
            else:
                leaves.append((argument.name + path, leaf_signature(leaf)))
        if not found:
            leaves.append((argument.name, LeafSig("other", value=f"empty {type(argument.value).__name__}")))
    return Signature(tuple(leaves))


def _is_array(value: Any) -> bool:
    """What a filtering wrapper (eqx.filter_jit) traces: jax and numpy arrays; every other leaf is static."""
    import jax
    import numpy as np

    return isinstance(value, (jax.Array, np.ndarray, np.generic))


def diff(old: Signature, new: Signature) -> list[ArgChange]:
    """The changes from ``old`` to ``new``, argument by argument, in argument order."""
    before, after = old.as_dict(), new.as_dict()
    changes: list[ArgChange] = []
    for path, leaf in new.leaves:
        prev = before.get(path)
        if prev is None:
            changes.append(_appeared(path, leaf, "absent", leaf.describe()))
        else:
            changes.extend(_leaf_changes(path, prev, leaf))
    for path, leaf in old.leaves:
        if path not in after:
            changes.append(_appeared(path, leaf, leaf.describe(), "absent"))
    return changes


_DEFAULT = "its default (not passed)"


def _appeared(path: str, leaf: LeafSig, before: str, after: str) -> ArgChange:
    """A leaf in one signature only. A static keyword argument passed in one call and left to its default in
    the other is a static value change to jit (its cache keys the keywords passed), not a pytree change."""
    if leaf.kind != "static" or leaf.attribute:
        return ArgChange(path, "structure", before, after)
    if before == "absent":
        return ArgChange(path, "static", _DEFAULT, str(leaf.value))
    return ArgChange(path, "static", str(leaf.value), _DEFAULT)


def _leaf_changes(path: str, prev: LeafSig, leaf: LeafSig) -> list[ArgChange]:
    if "static" in (prev.kind, leaf.kind) or "other" in (prev.kind, leaf.kind):
        if prev.kind != leaf.kind:
            return [ArgChange(path, "type", prev.describe(), leaf.describe())]
        if leaf.kind == "static":
            if prev.token == leaf.token:
                return []
            if prev.value == leaf.value:  # objects without a telling repr: say which of their fields differ
                return _field_changes(path, prev, leaf)
            return [ArgChange(path, "static", str(prev.value), str(leaf.value))]
        return [] if prev.value == leaf.value else [ArgChange(path, "type", str(prev.value), str(leaf.value))]
    if _is_key(prev) != _is_key(leaf):
        # A typed key (jax.random.key) and a raw uint32 one (jax.random.PRNGKey) differ in shape and dtype
        # alike; one change of kind says it, not a shape change whose fix (bucketing) does not apply.
        return [ArgChange(path, "type", _key_text(prev), _key_text(leaf))]
    # An array and a Python number are alike to jax: a Python int and the weakly typed i32[] jax returns for
    # it share a compile, so only the abstract value is compared.
    out = []
    if prev.shape != leaf.shape:
        out.append(ArgChange(path, "shape", str(prev.shape), str(leaf.shape)))
    if prev.dtype != leaf.dtype:
        out.append(ArgChange(path, "dtype", str(prev.dtype), str(leaf.dtype)))
    elif prev.weak_type != leaf.weak_type:  # a dtype change says it already
        out.append(ArgChange(path, "weak_type", _weak(prev), _weak(leaf)))
    if prev.sharding != leaf.sharding and prev.sharding is not None and leaf.sharding is not None:
        out.append(ArgChange(path, "sharding", prev.sharding, leaf.sharding))
    return out


def _field_changes(path: str, prev: LeafSig, leaf: LeafSig) -> list[ArgChange]:
    """Two static objects that print alike (``<Model object>``) but compare unequal: the fields (``vars``) that
    differ, e.g. ``self.scale 1.0 -> 2.0``; else the one change, said to be equal in print only."""
    before, after = getattr(prev.token, "__dict__", None), getattr(leaf.token, "__dict__", None)
    if isinstance(before, dict) and isinstance(after, dict) and type(prev.token) is type(leaf.token):
        changed = [ArgChange(f"{path}.{name}", "static", frameworks.readable(before.get(name), _MAX_VALUE_TEXT),
                             frameworks.readable(after.get(name), _MAX_VALUE_TEXT))
                   for name in dict.fromkeys([*before, *after]) if not _same(before.get(name), after.get(name))]
        if changed:
            return changed
    return [ArgChange(path, "static", str(prev.value), f"{leaf.value} (prints the same, compares unequal)")]


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a is b or a == b)
    except Exception:  # noqa: BLE001 - arrays and odd __eq__: not provably equal
        return False


def _is_key(leaf: LeafSig) -> bool:
    return (leaf.dtype or "").startswith("key<")


def _key_text(leaf: LeafSig) -> str:
    kind = "a typed PRNG key" if _is_key(leaf) else "a raw key array" if leaf.dtype == "u32" else "an array"
    return f"{kind} {leaf.describe()}"


def _weak(leaf: LeafSig) -> str:
    typed = f"weakly typed {leaf.dtype}" if leaf.weak_type else f"strongly typed {leaf.dtype}"
    return f"a Python {leaf.value} ({typed})" if leaf.kind == "scalar" else typed


def change_text(change: ArgChange) -> str:
    """One change in words, e.g. "argument 'batch' shape changed (8, 32) -> (9, 32)"."""
    what = {
        "shape": "shape changed", "dtype": "dtype changed", "weak_type": "weak type changed",
        "sharding": "sharding changed", "structure": "pytree structure changed", "type": "kind changed",
    }
    if change.kind == "static":
        noun = "argument" if change.argument.isidentifier() else "value"  # a field inside an argument
        return f"static {noun} '{change.argument}' changed {change.before} -> {change.after}"
    if change.kind == "callable":
        return change.after
    return f"argument '{change.argument}' {what.get(change.kind, 'changed')} {change.before} -> {change.after}"


def explain(previous: Sequence[Signature], new: Signature, *, same_callable: bool, call_index: int = 0,
            callable_site: str = "") -> Recompile:
    """Why a call with signature ``new`` compiled although ``previous`` signatures had compiled before.

    Diffs against the closest earlier signature (fewest changes, latest on ties).
    """
    best: list[ArgChange] | None = None
    for old in previous:
        changes = diff(old, new)
        if best is None or len(changes) <= len(best):
            best = changes
    changes = best or []
    if not same_callable:
        where = f" (defined at {callable_site})" if callable_site else ""
        text = (f"a new Python callable: jax.jit was applied to a fresh function object{where}; "
                "create the jitted function once, outside the loop")
        changes = [ArgChange("<callable>", "callable", "earlier function object", text), *changes]
    elif not changes:
        text = ("same argument signature as an earlier compile: jax's caches were cleared, a jax config "
                "option changed, or the cache evicted the executable")
        return Recompile(call_index, text, ())
    shown = "; ".join(change_text(c) for c in changes[:3])
    if len(changes) > 3:
        shown += f"; and {len(changes) - 3} more changes"
    return Recompile(call_index, shown, tuple(changes))


def main_cause(recompiles: Sequence[Recompile]) -> tuple[str, int]:
    """The kind of change behind the most recompiles, and on how many: a recompile counts once per kind,
    however many leaves changed (twelve parameter arrays changing dtype in one recompile are one cause).

    Example:
        >>> shape = ArgChange("batch", "shape", "(8, 4)", "(9, 4)")
        >>> dtypes = tuple(ArgChange(f"params[{i}]", "dtype", "f32", "bf16") for i in range(6))
        >>> main_cause([Recompile(1, "", (shape,)), Recompile(2, "", (shape,)), Recompile(3, "", dtypes)])
        ('shape', 2)
    """
    counts: Counter[str] = Counter(kind for r in recompiles for kind in dict.fromkeys(c.kind for c in r.changes))
    counts.update("unknown" for r in recompiles if not r.changes)
    return max(counts.items(), key=lambda item: item[1]) if counts else ("unknown", 0)
