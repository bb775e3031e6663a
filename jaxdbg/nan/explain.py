"""One paragraph in plain words, and fixes that fit the pattern found.

Each pattern is a small function of the origin (primitive, pass, input statistics, the text of the user's
line) that returns a sentence and hints, or None. The first pattern that fits explains the origin; growth,
precision and the strategy add their own sentences.

Example:
    >>> from jaxdbg.nan.result import Origin, ValueStats
    >>> neg = ValueStats((2,), "f32", -1.0, 1.0, 0, 0, 0, 1)
    >>> text, hints = explain(Origin("nan", "log", "forward", None, "loss", 3, ("jit(loss)",), (neg,)))
    >>> "negative" in text, any("eps" in h for h in hints)
    (True, True)
"""

from __future__ import annotations

import linecache
from collections.abc import Callable, Sequence

from jaxdbg.nan.result import GrowthEntry, Origin, PrecisionCheck, ValueStats

Pattern = Callable[[Origin, str], "tuple[str, list[str]] | None"]

DOUBLE_WHERE = ("use the double-where trick so the masked branch never sees a bad value: "
                "`safe = jnp.where(mask, x, 1.0); y = jnp.where(mask, f(safe), 0.0)` "
                "(a single where still sends 0 * inf = NaN into the gradient)")
EPSILON_LOG = "clamp the input away from zero: `jnp.log(jnp.maximum(x, 1e-12))` (or add a small epsilon)"
EPSILON_DIV = "keep the denominator away from zero: `x / jnp.maximum(d, 1e-12)` or `x / (d + 1e-12)`"
LOG_SUM_EXP = ("compute in log space: `jax.nn.logsumexp`, `jax.nn.log_softmax`, `jax.nn.log_sigmoid` "
               "instead of log(sum(exp(...))) / log(softmax) / log(sigmoid)")
SUBTRACT_MAX = "subtract the maximum before exponentiating (what `jax.nn.softmax`/`logsumexp` do)"
CLIP = "clip gradients (e.g. `optax.clip_by_global_norm(1.0)`) and/or lower the learning rate (or add warmup)"
UPCAST = "compute this part in float32 (`x.astype(jnp.float32)`), and cast back afterwards"
LOSS_SCALE = "with float16 gradients use loss scaling (scale the loss up, unscale the gradients, skip steps with Inf)"
EXP_LIMIT = {"f16": 11.09, "bf16": 88.72, "f32": 88.72, "f64": 709.78}
EXPLODING = 1e6  # growth beyond this is divergence, not a loss that merely rose
OVERFLOW_AT = {"f16": 65504.0, "bf16": 3.39e38, "f32": 3.40e38, "f64": 1.8e308}


def _line_text(origin: Origin) -> str:
    if origin.source is None:
        return ""
    return linecache.getline(origin.source.file, origin.source.line).strip()


def _stat(origin: Origin, i: int) -> ValueStats | None:
    return origin.inputs[i] if i < len(origin.inputs) else None


def _biggest(origin: Origin) -> float:
    values = [abs(v) for s in origin.inputs for v in (s.min, s.max) if v is not None and v == v]
    return max(values, default=0.0)


def _dtype(origin: Origin) -> str:
    stats = origin.outputs or origin.inputs
    return stats[0].dtype if stats else "f32"


def _input_pattern(origin: Origin, line: str) -> tuple[str, list[str]] | None:
    if origin.kind != "input":
        return None
    value = "a NaN" if origin.inputs and origin.inputs[0].nan else "an Inf"
    return (f"{value} was already in argument `{origin.argument}` when `{origin.function}` was called "
            f"(call {origin.call_index}); nothing inside the function created it.",
            ["check the data that feeds this call: e.g. `assert np.isfinite(batch).all()` in the input pipeline, "
             "and find or drop the bad samples",
             "if missing values are expected, replace them before the step (`jnp.nan_to_num`, or a mask)"])


def _masked_softmax(origin: Origin, line: str) -> tuple[str, list[str]] | None:
    first = _stat(origin, 0)
    second = _stat(origin, 1)
    if origin.primitive != "sub" or first is None or second is None or not (first.inf and second.inf):
        return None
    if not ("softmax" in line or "max" in line or origin.constant_input or second.min == float("-inf")):
        return None
    return ("a row where every entry is -inf (fully masked) was normalised: its maximum is -inf, and "
            "x - max = -inf - (-inf) = NaN.",
            ["mask with a large finite negative value instead of -inf: `jnp.finfo(x.dtype).min`",
             "or pass the mask to softmax (`jax.nn.softmax(x, where=mask)`) and zero the fully masked rows "
             "afterwards: `jnp.where(mask.any(-1, keepdims=True), p, 0.0)`"])


def _masked_gradient(origin: Origin, line: str) -> tuple[str, list[str]] | None:
    if origin.pass_ != "backward" or origin.primitive not in ("mul", "div") or origin.kind != "nan":
        return None
    zeros = [s for s in origin.inputs if s.zero]
    if not zeros or ("where" not in line and "select" not in origin.name_stack):
        return None
    return ("the forward value is masked out (by `where`), so its gradient should be 0, but the derivative "
            "of the masked branch is infinite or undefined at the masked entries and 0 * inf (or 0 / 0) gives NaN.",
            [DOUBLE_WHERE])


def _log(origin: Origin, line: str) -> tuple[str, list[str]] | None:
    if origin.primitive not in ("log", "log1p"):
        return None
    s = _stat(origin, 0)
    limit = -1.0 if origin.primitive == "log1p" else 0.0
    if s is not None and s.min is not None and s.min < limit:
        what = f"{origin.primitive} of a negative number is NaN (smallest input {s.min:.3g})"
    else:
        what = f"{origin.primitive}({limit:g}) is -inf ({s.zero if s else 0} zero input(s))"
    hints = [EPSILON_LOG]
    if "softmax" in line or "sigmoid" in line or "sum" in line:
        hints.insert(0, LOG_SUM_EXP)
    return what + ".", hints


def _sqrt(origin: Origin, line: str) -> tuple[str, list[str]] | None:
    if origin.primitive not in ("sqrt", "rsqrt", "pow") or origin.pass_ == "backward":
        return None
    s = _stat(origin, 0)
    if s is not None and s.negative:
        return (f"{origin.primitive} of a negative number is NaN (smallest input {s.min:.3g}).",
                ["clamp the input: `jnp.sqrt(jnp.maximum(x, 0.0))`, or find why it went negative (rounding in a "
                 "variance `E[x^2] - E[x]^2` is a classic)"])
    if origin.primitive == "rsqrt" and s is not None and s.zero:
        return "rsqrt(0) is inf.", [EPSILON_DIV]
    return None


def _singular_derivative(origin: Origin, line: str) -> tuple[str, list[str]] | None:
    if origin.pass_ != "backward" or origin.primitive not in ("div", "rsqrt", "pow", "mul", "integer_pow"):
        return None
    if any(s.inf for s in origin.inputs):  # inf arithmetic on values that overflowed earlier, not a singularity
        return None
    for name in ("sqrt", "norm", "pow", "**", "log", "arcsin", "arccos", "abs"):
        if name in line:
            what = {"norm": "a norm at the zero vector", "**": "a fractional power at 0"}.get(name, f"{name} at 0")
            hints = (["add an epsilon inside: `jnp.sqrt(x + 1e-12)`", DOUBLE_WHERE]
                     if name in ("sqrt", "norm") else [EPSILON_DIV, DOUBLE_WHERE])
            return (f"the derivative of {what} is infinite, so this backward-pass operation made "
                    f"{'a NaN' if origin.kind == 'nan' else 'an Inf'} although the forward value is finite.", hints)
    return None


def _division(origin: Origin, line: str) -> tuple[str, list[str]] | None:
    if origin.primitive not in ("div", "rem"):
        return None
    num, den = _stat(origin, 0), _stat(origin, 1)
    if den is not None and den.inf and num is not None and num.inf:
        return ("inf / inf is NaN: both values overflowed before (see the chain for where).",
                _overflow_hints(origin, line))
    if den is not None and den.zero:
        both = num is not None and num.zero
        where = "in the gradient, " if origin.pass_ == "backward" else ""
        return (f"{where}a division by zero ({den.zero} zero denominator(s))"
                f"{': 0 / 0 is NaN' if both else ' gives inf'}.",
                [EPSILON_DIV, DOUBLE_WHERE] if origin.pass_ == "backward" else [EPSILON_DIV])
    return None


def _inf_arithmetic(origin: Origin, line: str) -> tuple[str, list[str]] | None:
    if origin.kind != "nan" or origin.primitive not in ("mul", "sub", "add", "add_any", "dot_general", "reduce_sum"):
        return None
    infs = [s for s in origin.inputs if s.inf]
    if not infs:
        return None
    if origin.primitive in ("mul", "dot_general"):
        what = "0 * inf is NaN: one input holds inf and the other holds zeros"
    else:
        what = "inf - inf is NaN: the inputs hold infinities of opposite sign"
    return what + " (see the chain for where the infinities came from).", _overflow_hints(origin, line)


def _overflow_hints(origin: Origin, line: str) -> list[str]:
    """Hints for NaN made from infinities: avoid the overflow; max-subtraction only where exp is at work."""
    hints = [SUBTRACT_MAX] if any(word in line for word in ("exp", "softmax", "logsumexp", "sigmoid")) else []
    hints.append(CLIP)  # (a float16/bfloat16 origin also gets the float32 hint, from the precision check)
    return hints


def _overflow(origin: Origin, line: str) -> tuple[str, list[str]] | None:
    if origin.kind != "inf" and origin.primitive not in ("exp", "expm1"):
        return None
    dtype = _dtype(origin)
    if origin.primitive in ("exp", "expm1", "exp2", "cosh", "sinh"):
        limit = EXP_LIMIT.get(dtype, 88.72)
        return (f"{origin.primitive} overflows in {dtype} for inputs above about {limit:g}; the largest input "
                f"was {_biggest(origin):.3g}.", [SUBTRACT_MAX, LOG_SUM_EXP] + ([UPCAST] if dtype == "f16" else []))
    if origin.primitive == "convert_element_type":
        return (f"converting to {dtype} overflowed: the value ({_biggest(origin):.3g}) is beyond {dtype}'s range "
                f"(max {OVERFLOW_AT.get(dtype, 3.4e38):.3g}).", [UPCAST, LOSS_SCALE if dtype == "f16" else CLIP])
    if not any(s.inf for s in origin.inputs):
        return (f"{origin.primitive} overflowed {dtype} (largest input {_biggest(origin):.3g}, limit "
                f"{OVERFLOW_AT.get(dtype, 3.4e38):.3g}).",
                [CLIP] + ([UPCAST, LOSS_SCALE] if dtype in ("f16", "bf16") else []))
    return None


def _domain(origin: Origin, line: str) -> tuple[str, list[str]] | None:
    s = _stat(origin, 0)
    if origin.primitive not in ("acos", "asin", "atanh", "acosh") or s is None:
        return None
    return (f"{origin.primitive} is only defined on a limited range and got {s.min:.3g} .. "
            f"{s.max:.3g}.",
            ["clip the input to the valid range, e.g. `jnp.clip(x, -1 + 1e-7, 1 - 1e-7)`"])


PATTERNS: tuple[Pattern, ...] = (_input_pattern, _masked_softmax, _masked_gradient, _log, _sqrt,
                                 _singular_derivative, _division, _inf_arithmetic, _domain, _overflow)


def _where(origin: Origin) -> str:
    inner = list(origin.path[1:])
    place = f" inside {' > '.join(inner)}" if inner else ""
    src = f" at {origin.source.file.rsplit('/', 1)[-1]}:{origin.source.line}" if origin.source else ""
    value = {"nan": "A NaN", "inf": "An Inf", "input": "A non-finite value"}[origin.kind]
    if origin.kind == "input":
        return f"{value} reached `{origin.function}` in call {origin.call_index}"
    pass_ = "backward pass (the gradient)" if origin.pass_ == "backward" else "forward pass"
    eager = " (run eagerly, outside jit)" if origin.path[:1] == ("eager",) else ""
    return (f"{value} was first made by `{origin.primitive}` in the {pass_} of `{origin.function}`, "
            f"call {origin.call_index}{eager}{place}{src}")


def explain(first: Origin | None, chain: Sequence[Origin] = (), growth: Sequence[GrowthEntry] = (),
            precision: PrecisionCheck | None = None, strategy: str | None = None) -> tuple[str, tuple[str, ...]]:
    """``(paragraph, hints)`` for a finding; an empty paragraph when nothing was found."""
    if first is None:
        return "", ()
    line = _line_text(first)
    parts, hints = [_where(first) + ":"], []
    for pattern in PATTERNS:
        found = pattern(first, line)
        if found:
            parts.append(found[0])
            hints += found[1]
            break
    else:
        parts.append(f"`{first.primitive}` produced it from inputs that held no "
                     f"{'NaN' if first.kind == 'nan' else 'Inf'}.")
    if "custom_vjp_bwd(" in " ".join(first.path):
        rule = next(p for p in first.path if p.startswith("custom_vjp_bwd("))[15:-1]
        parts.append(f"This happens inside your own custom_vjp backward rule `{rule}` (the line shown is in it).")
        hints = [f"guard the operation in `{rule}`: e.g. `jnp.where(n > 0, g * x / n, 0.0)` with a safe "
                 "denominator, or divide by `jnp.maximum(n, eps)`"] + [h for h in hints if h != DOUBLE_WHERE]
    if "vmap" in first.path:
        parts.append("It runs under vmap: only some batch elements are affected (see the input statistics).")
    for origin in chain:
        if origin.constant_input:
            parts.append(f"The infinity fed into it was written in the code as a constant (`{origin.primitive}` at "
                         f"line {origin.source.line if origin.source else '?'}).")
            break
    else:
        if chain:
            src = chain[0].source
            parts.append(f"Its infinite inputs came from `{chain[0].primitive}`"
                         f"{f' at line {src.line}' if src else ''} (see chain).")
    if growth:
        top = max(growth, key=lambda g: g.ratio)
        more = f" (and {len(growth) - 1} more output(s))" if len(growth) > 1 else ""
        if top.ratio >= EXPLODING:
            parts.append(f"Before this, `{top.name}`{more} grew {top.ratio:.2g}x from call {top.first_call} on: the "
                         "run was diverging, and the non-finite value is where that ended, not its cause.")
            hints.insert(0, CLIP)
        else:
            parts.append(f"Before this, `{growth[0].name}`{more} grew {growth[0].ratio:.2g}x from call "
                         f"{growth[0].first_call} on; if that is unexpected, the run was starting to diverge.")
            hints.append(CLIP)
    if precision is not None:
        parts.append(precision.detail[0].upper() + precision.detail[1:] + ".")
        if precision.f32_removes_origin:
            hints.insert(0, UPCAST)
    elif first.kind != "input" and _dtype(first) in ("bf16", "f16"):
        hints.append(UPCAST + " (run with --precision to test whether float32 fixes it)")
        if _dtype(first) == "f16":
            hints.append(LOSS_SCALE)
    if strategy == "compiled-prefix bisection":
        parts.append("Replayed one operation at a time the values stay finite; only the compiled program (XLA "
                     "fuses and rewrites algebra, e.g. (y + c) - c becomes y) produces it, so jaxdbg bisected "
                     "over compiled prefixes of the computation.")
    return " ".join(parts), tuple(dict.fromkeys(hints))
