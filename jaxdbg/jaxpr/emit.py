"""Turn a jaxpr (or a flat list of equations) back into plain ``jax.numpy``/``lax`` Python source.

The emitted code imports only jax and numpy (``import jax``, ``import jax.numpy as jnp``, ``import numpy
as np``, ``from jax import lax``), so it can go straight into a bug report. Each equation becomes one
``lax`` call; calls of inner jitted functions, ``custom_jvp``/``custom_vjp`` and ``remat`` are inlined, and a
``custom_linear_solve`` becomes its ``solve`` (the values are the same; only differentiation rules are lost);
``scan``, ``while`` and ``cond`` become nested functions handed to ``lax.scan``/``lax.while_loop``/
``lax.switch``. A primitive without a public ``lax`` spelling falls back to
``jax.extend.core.primitives.<name>_p.bind(...)``; one that cannot be written as Python at all (a host
callback, a PRNG key) raises :class:`EmitError`, so a caller can cut it away first.

Equations are duck-typed: anything with ``primitive``, ``params``, ``invars`` and ``outvars``, whose atoms
are variables (hashable, with an ``aval``) or literals (with ``val`` and ``aval``).

Example:
    >>> import jax, jax.numpy as jnp
    >>> print(emit_jaxpr(jax.make_jaxpr(lambda x: jnp.log(x) * 2.0)(1.0), name="f").source, end="")
    def f(a):
        b = lax.log(a)
        c = lax.mul(b, np.float32(2.0))
        return c
"""

from __future__ import annotations

import enum
import inspect
import keyword
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxdbg import _compat

HEADER = "import jax\nimport jax.numpy as jnp\nimport numpy as np\nfrom jax import lax\n"
PRIMS_IMPORT = "from jax.extend.core import primitives as prims\n"

# Names the emitted code uses for modules and helpers: never given to a variable.
_RESERVED = {"jax", "jnp", "np", "lax", "prims", "f", "out", "ref", "bad"}
# Largest constant written out element by element (bigger ones must come in as arguments).
MAX_INLINE_ELEMENTS = 64
# Parameters that carry only placement on one device; dropped when empty.
_PLACEMENT_PARAMS = ("sharding", "out_sharding", "accuracy")


class EmitError(Exception):
    """An equation that cannot be written as plain jax/numpy Python (e.g. a host callback)."""


@dataclass(frozen=True)
class EmittedFunction:
    """Source of one ``def`` and what it needs: argument names and whether it uses ``prims``."""

    name: str
    source: str
    arg_names: tuple[str, ...]
    uses_prims: bool

    def module_source(self) -> str:
        """The function with the imports it needs, ready to ``exec``."""
        return HEADER + (PRIMS_IMPORT if self.uses_prims else "") + "\n\n" + self.source


def emit_jaxpr(closed: Any, name: str = "f") -> EmittedFunction:
    """Python source of a closed jaxpr as ``def name(*args)``; its constants are written inline."""
    jaxpr, consts = _compat.open_jaxpr(closed)
    emitter = Emitter()
    for var, value in zip(jaxpr.constvars, consts):
        emitter.names.alias(var, array_expr(np.asarray(value)))
    return emitter.function(name, jaxpr.invars, jaxpr.eqns, jaxpr.outvars)


def emit_function(name: str, invars: Sequence[Any], eqns: Sequence[Any], outvars: Sequence[Any]) -> EmittedFunction:
    """Python source of ``def name(*invars)`` computing ``outvars`` from ``eqns`` (flat or nested)."""
    return Emitter().function(name, invars, eqns, outvars)


# ----------------------------------------------------------------------------------------------------------
# Values and parameters as Python expressions
# ----------------------------------------------------------------------------------------------------------


def dtype_expr(dtype: Any) -> str:
    """``np.float32``, and ``jnp.bfloat16`` for the ml_dtypes types (bfloat16, float8_*, int4, ...) numpy files
    as kind 'V' like raw bytes; raises EmitError for extended dtypes (PRNG keys).

    >>> dtype_expr("float32"), dtype_expr(jnp.bfloat16), dtype_expr(jnp.float8_e4m3fn)
    ('np.float32', 'jnp.bfloat16', 'jnp.float8_e4m3fn')
    """
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise EmitError(f"dtype {dtype} has no numpy spelling") from None
    if dt.kind != "V" and dt.name != "object" and _same_dtype(getattr(np, dt.name, None), dt):
        return f"np.{dt.name}"
    if _same_dtype(getattr(jnp, dt.name, None), dt):
        return f"jnp.{dt.name}"
    raise EmitError(f"dtype {dtype} has no numpy spelling")


def _same_dtype(candidate: Any, dt: np.dtype) -> bool:
    try:
        return candidate is not None and np.dtype(candidate) == dt
    except TypeError:
        return False


def _kind_letter(dtype: Any) -> str:
    """numpy's kind letter, with the ml_dtypes types filed as the floats/integers they are (numpy says 'V')."""
    dt = np.dtype(dtype)
    if dt.kind != "V":
        return dt.kind
    if jnp.issubdtype(dt, jnp.floating):
        return "f"
    return "u" if jnp.issubdtype(dt, jnp.unsignedinteger) else "i" if jnp.issubdtype(dt, jnp.integer) else "V"


def scalar_text(value: Any) -> str:
    """A Python literal for one number: floats keep full precision; nan/inf spelled for the dtype call."""
    if isinstance(value, (bool, np.bool_)):
        return "True" if value else "False"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    number = float(value)
    if math.isnan(number):
        return "'nan'"
    if math.isinf(number):
        return "'inf'" if number > 0 else "'-inf'"
    return repr(number)


def array_expr(value: np.ndarray, limit: int = MAX_INLINE_ELEMENTS) -> str:
    """A numpy expression that rebuilds a small array exactly (``np.float32(2.0)``, ``np.full(...)``, ...).

    >>> array_expr(np.array([1.5, 2.0], dtype=jnp.bfloat16))
    'np.array([1.5, 2.0], dtype=jnp.bfloat16)'
    """
    value = np.asarray(value)
    dtype, kind = dtype_expr(value.dtype), _kind_letter(value.dtype)
    if value.ndim == 0:
        if np.iscomplexobj(value):
            return f"{dtype}({complex(value)!r})"
        text = scalar_text(int(value) if kind in "biu" else float(value))
        if dtype.startswith("jnp."):  # jnp's scalar types take no strings: 'nan' goes through float()
            return f"{dtype}({'float(' + text + ')' if text.startswith(chr(39)) else text})"
        return f"{dtype}({text})"
    flat = value.reshape(-1)
    if (flat.size and np.all(flat == flat[0])) or (flat.size and kind == "f" and np.all(np.isnan(flat))):
        return f"np.full({tuple(value.shape)}, {array_expr(flat[0])}, dtype={dtype})"
    if flat.size == 0:
        return f"np.zeros({tuple(value.shape)}, dtype={dtype})"
    if flat.size > limit:
        raise EmitError(f"array of {flat.size} elements is too large to write inline")
    if kind == "f" and not np.all(np.isfinite(value.astype(np.float64))):
        items = ", ".join(f"float({scalar_text(float(v))})" if not np.isfinite(v) else repr(float(v)) for v in flat)
        return f"np.array([{items}], dtype={dtype}).reshape({tuple(value.shape)})"
    items = value.astype(np.float64).tolist() if kind == "f" else value.astype(np.int64).tolist() if kind in "iu" \
        else value.tolist()
    return f"np.array({items!r}, dtype={dtype})"


def param_expr(value: Any) -> str:
    """A Python expression for an equation parameter (shapes, dtypes, lax enums and dimension numbers)."""
    if value is None or isinstance(value, (bool, str)):
        return repr(value)
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        text = scalar_text(value)
        return f"float({text})" if text.startswith("'") else text
    if isinstance(value, np.ndarray):
        return array_expr(value)
    if isinstance(value, (np.dtype, type)) and _is_dtype(value):
        return dtype_expr(value)
    if isinstance(value, enum.Enum):
        owner = type(value).__name__
        if getattr(lax, owner, None) is type(value):
            return f"lax.{owner}.{value.name}"
        raise EmitError(f"parameter value {value!r} has no public spelling")
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        owner = type(value).__name__
        if getattr(lax, owner, None) is type(value):
            fields = ", ".join(f"{k}={param_expr(v)}" for k, v in zip(value._fields, value))
            return f"lax.{owner}({fields})"
        raise EmitError(f"parameter value {value!r} has no public spelling")
    if isinstance(value, (tuple, list)):
        items = [param_expr(v) for v in value]
        if isinstance(value, list):
            return "[" + ", ".join(items) + "]"
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    if _is_dtype(value):
        return dtype_expr(value)
    raise EmitError(f"parameter value {value!r} of type {type(value).__name__} cannot be written as Python")


def _is_dtype(value: Any) -> bool:
    try:
        np.dtype(value)
    except TypeError:
        return False
    return not isinstance(value, (int, float, str, tuple, list))


# ----------------------------------------------------------------------------------------------------------
# Names
# ----------------------------------------------------------------------------------------------------------


class Names:
    """Short jaxpr-style names (a, b, ..., z, ba, ...) per atom, skipping keywords and reserved names."""

    def __init__(self) -> None:
        self._names: dict[int, str] = {}
        self._keep: list[Any] = []  # holds atoms alive so their ids stay unique
        self._count = 0

    def fresh(self) -> str:
        while True:
            name, n = "", self._count
            self._count += 1
            while True:
                name = chr(ord("a") + n % 26) + name
                n //= 26
                if n == 0:
                    break
            if not keyword.iskeyword(name) and name not in _RESERVED:
                return name

    def alias(self, atom: Any, text: str) -> None:
        """Make ``atom`` read as ``text`` (an outer variable, a constant expression)."""
        self._keep.append(atom)
        self._names[id(atom)] = text

    def bind(self, atom: Any) -> str:
        """A new name for a variable being defined (``_`` for a dropped output)."""
        if _compat.is_drop_var(atom):
            return "_"
        name = self.fresh()
        self.alias(atom, name)
        return name

    def read(self, atom: Any) -> str:
        if _compat.is_literal(atom):
            return array_expr(np.asarray(atom.val, dtype=_aval_dtype(atom)))
        try:
            return self._names[id(atom)]
        except KeyError:
            raise EmitError(f"variable {atom} is used before it is defined") from None


def _aval_dtype(atom: Any) -> Any:
    aval = getattr(atom, "aval", None)
    return getattr(aval, "dtype", None) or np.asarray(atom.val).dtype


# ----------------------------------------------------------------------------------------------------------
# The emitter
# ----------------------------------------------------------------------------------------------------------


class Emitter:
    """Writes equations as lines of Python; one instance per emitted function (names are shared with bodies)."""

    def __init__(self) -> None:
        self.names = Names()
        self.uses_prims = False

    def function(self, name: str, invars: Sequence[Any], eqns: Sequence[Any],
                 outvars: Sequence[Any]) -> EmittedFunction:
        args = [self.names.bind(v) for v in invars]
        body = self.body(eqns, outvars, indent=1, single=len(outvars) == 1)
        source = f"def {name}({', '.join(args)}):\n" + "\n".join(body) + "\n"
        return EmittedFunction(name, source, tuple(args), self.uses_prims)

    def body(self, eqns: Sequence[Any], outvars: Sequence[Any], indent: int, single: bool) -> list[str]:
        lines = self.equations(eqns, indent)
        results = [self.names.read(v) for v in outvars]
        ret = results[0] if single and len(results) == 1 else _tuple(results)
        return [*lines, "    " * indent + f"return {ret}"]

    def equations(self, eqns: Sequence[Any], indent: int) -> list[str]:
        lines: list[str] = []
        for eqn in eqns:
            lines.extend(self.equation(eqn, indent))
        return lines

    def equation(self, eqn: Any, indent: int) -> list[str]:
        name = eqn.primitive.name
        call = _compat.inlined_call(eqn)
        if call is not None:
            return self._inline(eqn, *call, indent)
        structured = _STRUCTURED.get(name)
        if structured is not None:
            return structured(self, eqn, indent)
        args = [self.names.read(v) for v in eqn.invars]
        rule = _RULES.get(name)
        expr = rule(eqn, args) if rule is not None else self._generic(eqn, args)
        if expr is None:  # no value: nothing to write
            return []
        return ["    " * indent + f"{self._targets(eqn)} = {expr}"]

    def _targets(self, eqn: Any) -> str:
        names = [self.names.bind(v) for v in eqn.outvars]
        if eqn.primitive.multiple_results:
            return ", ".join(names) + ("," if len(names) == 1 else "") if names else "_"
        return names[0]

    def _inline(self, eqn: Any, inner: Any, operands: Sequence[Any], indent: int) -> list[str]:
        jaxpr, consts = _compat.open_jaxpr(inner)
        for var, value in zip(jaxpr.constvars, consts):
            self.names.alias(var, array_expr(np.asarray(value)))
        for var, atom in zip(jaxpr.invars, operands):
            self.names.alias(var, self.names.read(atom))
        lines = self.equations(jaxpr.eqns, indent)
        for out, res in zip(eqn.outvars, jaxpr.outvars):
            if _compat.is_drop_var(out):
                continue
            if _compat.is_literal(res):
                lines.append("    " * indent + f"{self.names.bind(out)} = {self.names.read(res)}")
            else:
                self.names.alias(out, self.names.read(res))
        return lines

    def _generic(self, eqn: Any, args: list[str]) -> str:
        name = eqn.primitive.name.replace("-", "_")
        params = {k: v for k, v in eqn.params.items() if not (k in _PLACEMENT_PARAMS and v is None)}
        fn = getattr(lax, name, None)
        if fn is not None and _accepts(fn, params):
            params = {k: v for k, v in params.items() if not (v is None and _default(fn, k) is None)}
            kwargs = "".join(f", {k}={param_expr(v)}" for k, v in params.items())
            return f"lax.{name}({', '.join(args)}{kwargs})"
        return self._bind(eqn, args, params)

    def _bind(self, eqn: Any, args: list[str], params: dict) -> str:
        import jax.extend.core.primitives as prims

        attr = eqn.primitive.name.replace("-", "_") + "_p"
        if getattr(prims, attr, None) is not eqn.primitive:
            raise EmitError(f"primitive '{eqn.primitive.name}' has no public Python spelling")
        kwargs = "".join(f", {k}={param_expr(v)}" for k, v in params.items())
        self.uses_prims = True
        return f"prims.{attr}.bind({', '.join(args)}{kwargs})"

    # Nested functions for control flow -------------------------------------------------------------------

    def nested(self, prefix: str, closed: Any, operands: Sequence[str], indent: int,
               signature: Callable) -> tuple[str, list[str]]:
        """A nested ``def`` for a body jaxpr: ``signature(names) -> (param text, unpack lines)``."""
        jaxpr, consts = _compat.open_jaxpr(closed)
        for var, value in zip(jaxpr.constvars, consts):
            self.names.alias(var, array_expr(np.asarray(value)))
        for var, text in zip(jaxpr.invars, operands):  # leading invars closed over from outside
            self.names.alias(var, text)
        free = [self.names.bind(v) for v in jaxpr.invars[len(operands):]]
        fname = f"{prefix}_{self.names.fresh()}"
        params, unpack, result = signature(free)
        pad = "    " * (indent + 1)
        lines = ["    " * indent + f"def {fname}({params}):"] + [pad + u for u in unpack]
        lines += self.equations(jaxpr.eqns, indent + 1)
        outs = [self.names.read(v) for v in jaxpr.outvars]
        lines.append(pad + f"return {result(outs)}")
        return fname, lines


def _accepts(fn: Callable, params: dict) -> bool:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        return True
    named = {k for k, p in sig.parameters.items() if p.kind is not p.VAR_POSITIONAL}
    return set(params) <= named


def _default(fn: Callable, name: str) -> Any:
    """Default of a keyword of ``fn`` (a sentinel when it has none), to leave out parameters left as default."""
    param = inspect.signature(fn).parameters.get(name)
    return param.default if param is not None and param.default is not param.empty else _NO_DEFAULT


_NO_DEFAULT = object()


def _tuple(items: Sequence[str]) -> str:
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def _unpack(names: Sequence[str], source: str) -> list[str]:
    return [f"{_tuple(names)} = {source}"] if names else []


# Equations whose lax spelling differs from ``lax.<name>(*args, **params)``.
_RULES: dict[str, Callable[[Any, list[str]], str | None]] = {
    "convert_element_type": lambda e, a: f"lax.convert_element_type({a[0]}, {dtype_expr(e.params['new_dtype'])})",
    "broadcast_in_dim": lambda e, a: (
        f"lax.broadcast_in_dim({a[0]}, {param_expr(tuple(e.params['shape']))}, "
        f"{param_expr(tuple(e.params['broadcast_dimensions']))})"),
    "reshape": lambda e, a: (
        f"lax.reshape({a[0]}, {param_expr(tuple(e.params['new_sizes']))}"
        + (f", {param_expr(e.params['dimensions'])})" if e.params.get("dimensions") is not None else ")")),
    "iota": lambda e, a: (
        f"lax.broadcasted_iota({dtype_expr(e.params['dtype'])}, {param_expr(tuple(e.params['shape']))}, "
        f"{e.params['dimension']})"),
    "concatenate": lambda e, a: f"lax.concatenate([{', '.join(a)}], {e.params['dimension']})",
    "dynamic_slice": lambda e, a: (
        f"lax.dynamic_slice({a[0]}, {_tuple(a[1:])}, {param_expr(tuple(e.params['slice_sizes']))})"),
    "dynamic_update_slice": lambda e, a: f"lax.dynamic_update_slice({a[0]}, {a[1]}, {_tuple(a[2:])})",
    "argmax": lambda e, a: f"lax.argmax({a[0]}, {e.params['axes'][0]}, {dtype_expr(e.params['index_dtype'])})",
    "argmin": lambda e, a: f"lax.argmin({a[0]}, {e.params['axes'][0]}, {dtype_expr(e.params['index_dtype'])})",
    "add_any": lambda e, a: f"lax.add({a[0]}, {a[1]})",
    "and": lambda e, a: f"lax.bitwise_and({a[0]}, {a[1]})",
    "or": lambda e, a: f"lax.bitwise_or({a[0]}, {a[1]})",
    "xor": lambda e, a: f"lax.bitwise_xor({a[0]}, {a[1]})",
    "not": lambda e, a: f"lax.bitwise_not({a[0]})",
    "copy": lambda e, a: f"jnp.copy({a[0]})",
    "copy_p": lambda e, a: f"jnp.copy({a[0]})",
    "sort": lambda e, a: (  # sort_p always has a tuple of results; lax.sort unwraps a single one
        ("(" if len(a) == 1 else "")
        + f"lax.sort({a[0] if len(a) == 1 else _tuple(a)}, dimension={e.params['dimension']}, "
        f"is_stable={e.params['is_stable']}, num_keys={e.params['num_keys']})" + (",)" if len(a) == 1 else "")),
    "debug_callback": lambda e, a: None,
}


def _scatter_rule(kind: str) -> Callable[[Any, list[str]], str]:
    def rule(e: Any, a: list[str]) -> str:
        p = e.params
        return (f"lax.{kind}({a[0]}, {a[1]}, {a[2]}, {param_expr(p['dimension_numbers'])}, "
                f"indices_are_sorted={p['indices_are_sorted']}, unique_indices={p['unique_indices']}, "
                f"mode={param_expr(p['mode'])})")
    return rule


for _kind in ("scatter", "scatter_add", "scatter_mul", "scatter_min", "scatter_max", "scatter_sub"):
    _RULES[_kind] = _RULES[_kind.replace("_", "-")] = _scatter_rule(_kind)


def _collective_rule(kind: str) -> Callable[[Any, list[str]], str]:
    """``lax.psum``/``pmax``/``pmin`` over named axes: the primitive binds a tuple of operands, lax takes a
    pytree (one operand stays one)."""
    def rule(e: Any, a: list[str]) -> str:
        groups = e.params.get("axis_index_groups")
        extra = f", axis_index_groups={param_expr(groups)}" if groups is not None else ""
        operand = a[0] if len(a) == 1 else _tuple(a)
        return f"lax.{kind}({operand}, {param_expr(tuple(e.params['axes']))}{extra})"
    return rule


for _kind in ("psum", "pmax", "pmin"):
    _RULES[_kind] = _collective_rule(_kind)


def _emit_scan(em: Emitter, eqn: Any, indent: int) -> list[str]:
    num_consts, num_carry = _compat.scan_split(eqn.params)
    ops = [em.names.read(v) for v in eqn.invars]
    consts, init, xs = ops[:num_consts], ops[num_consts:num_consts + num_carry], ops[num_consts + num_carry:]
    n_x = len(xs)

    def signature(free: list[str]) -> tuple[str, list[str], Callable]:
        carry, x = free[:num_carry], free[num_carry:]
        unpack = _unpack(carry, "carry") + _unpack(x, "xs")
        return "carry, xs", unpack, lambda outs: f"{_tuple(outs[:num_carry])}, {_tuple(outs[num_carry:])}"

    fname, lines = em.nested("scan_body", eqn.params["jaxpr"], consts, indent, signature)
    outs = [em.names.bind(v) for v in eqn.outvars]
    p = eqn.params
    call = (f"lax.scan({fname}, {_tuple(init)}, {_tuple(xs) if n_x else 'None'}, length={p['length']}, "
            f"reverse={p['reverse']}, unroll={param_expr(p['unroll'])})")
    lines.append("    " * indent + f"{_tuple(outs[:num_carry])}, {_tuple(outs[num_carry:])} = {call}")
    return lines


def _emit_while(em: Emitter, eqn: Any, indent: int) -> list[str]:
    p = eqn.params
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    ops = [em.names.read(v) for v in eqn.invars]
    cond_consts, body_consts, init = ops[:nc], ops[nc:nc + nb], ops[nc + nb:]

    def signature(free: list[str]) -> tuple[str, list[str], Callable]:
        return "carry", _unpack(free, "carry"), _tuple

    def cond_signature(free: list[str]) -> tuple[str, list[str], Callable]:
        return "carry", _unpack(free, "carry"), lambda outs: outs[0]

    cname, lines = em.nested("cond", p["cond_jaxpr"], cond_consts, indent, cond_signature)
    bname, body = em.nested("body", p["body_jaxpr"], body_consts, indent, signature)
    outs = [em.names.bind(v) for v in eqn.outvars]
    lines += [*body, "    " * indent + f"{_tuple(outs)} = lax.while_loop({cname}, {bname}, {_tuple(init)})"]
    return lines


def _emit_cond(em: Emitter, eqn: Any, indent: int) -> list[str]:
    ops = [em.names.read(v) for v in eqn.invars]
    index, operands = ops[0], ops[1:]
    lines, names = [], []
    for branch in eqn.params["branches"]:
        def signature(free: list[str]) -> tuple[str, list[str], Callable]:
            return ", ".join(free), [], _tuple

        name, body = em.nested("branch", branch, [], indent, signature)
        lines += body
        names.append(name)
    outs = [em.names.bind(v) for v in eqn.outvars]
    args = "".join(f", {o}" for o in operands)
    lines.append("    " * indent + f"{_tuple(outs)} = lax.switch({index}, [{', '.join(names)}]{args})")
    return lines


_STRUCTURED: dict[str, Callable[[Emitter, Any, int], list[str]]] = {
    "scan": _emit_scan,
    "while": _emit_while,
    "cond": _emit_cond,
}
