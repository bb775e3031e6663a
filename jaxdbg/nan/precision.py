"""``--precision``: would computing in float32 have avoided a bf16/f16 non-finite value?

The failing call is replayed op by op with every bfloat16/float16 value (inputs, constants, and the dtype
parameters of conversions and matmuls) promoted to float32. The answer compares, at the origin's own
site, what float32 gives: a bf16 ``1 - p`` that rounds to 0 and then feeds ``log`` is cured by float32; a
bf16 ``exp(100)`` is not (bf16 and f32 share their exponent range; f16 overflows above 65504).

Example:
    >>> import jax.numpy as jnp
    >>> from jaxdbg.nan.calls import Call
    >>> from jaxdbg.nan.localise import localise_call
    >>> call = Call("f", lambda x: jnp.exp(x) / jnp.exp(x), (jnp.float16(12.0),), {})
    >>> found = localise_call(call)
    >>> check_precision(found, call).f32_removes_origin
    True
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax.numpy as jnp
import numpy as np

from jaxdbg import _compat
from jaxdbg.jaxpr import Hooks, Interpreter, Site
from jaxdbg.nan.calls import Call
from jaxdbg.nan.localise import Localisation
from jaxdbg.nan.result import PrecisionCheck
from jaxdbg.nan.stats import nonfinite_flags

if TYPE_CHECKING:
    from jaxdbg.nan.analyses import Findings

LOW = ("bf16", "f16")
_DTYPE_PARAMS = ("new_dtype", "preferred_element_type", "dtype")


def _is_low(dtype: Any) -> bool:
    try:
        return np.dtype(dtype) in (np.dtype(jnp.bfloat16), np.dtype(jnp.float16))
    except TypeError:
        return False


def _promote(value: Any) -> Any:
    dtype = getattr(value, "dtype", None)
    return jnp.asarray(value, jnp.float32) if dtype is not None and _is_low(dtype) else value


class _Promoted(Hooks):
    """Evaluates leaf equations in float32 and watches the origin's site."""

    def __init__(self, target: Site):
        self.target = target
        self.at_origin: list[tuple[bool, bool]] = []

    def before(self, site: Site, invals: list, in_tags: list) -> list | None:
        if _compat.has_inner_jaxprs(site.eqn):
            return None  # the rules descend; leaf equations inside are promoted one by one
        params = {k: (jnp.float32 if k in _DTYPE_PARAMS and _is_low(v) else v) for k, v in site.eqn.params.items()}
        if site.primitive == "reduce_precision":
            return [_promote(invals[0])]
        if site.primitive == "bitcast_convert_type":  # bit patterns (random floats): original width, then widen
            original = [jnp.asarray(v, var.aval.dtype) for v, var in zip(invals, site.eqn.invars)]
            return [_promote(out) for out in _compat.bind_eqn(site.eqn, original)]
        return _compat.bind_eqn(site.eqn.replace(params=params), [_promote(v) for v in invals])

    def after(self, site: Site, invals: list, outvals: list, in_tags: list, out_tags: list,
              descended: bool) -> None:
        if site.eqn is self.target.eqn and site.path == self.target.path:
            flags = [nonfinite_flags(v) for v in outvals]
            self.at_origin.append((any(n for n, _ in flags), any(i for _, i in flags)))


def low_precision_dtype(found: Localisation) -> str | None:
    """'bf16' or 'f16' when the origin computed in that dtype (its inputs or outputs), else None."""
    origin = found.first
    if origin is None or origin.kind == "input":
        return None
    for stats in (*origin.outputs, *origin.inputs):
        if stats.dtype in LOW:
            return stats.dtype
    return None


def check_precision(found: Localisation, call: Call) -> PrecisionCheck | None:
    """Replay in float32 and say whether the origin's value becomes finite; None if not bf16/f16 or no site."""
    dtype = low_precision_dtype(found)
    if dtype is None or found.first is None or found.record is None or found.record.site is None:
        return None
    hooks = _Promoted(found.record.site)
    try:
        outs, _ = Interpreter(hooks).run(found.closed_jaxpr, call.leaves(), root=call.root)
    except Exception as err:  # noqa: BLE001 - a primitive that refuses float32 operands: say so, do not fail
        return PrecisionCheck(dtype, False, False, f"could not replay in float32 ({type(err).__name__}: {err})")
    outputs_finite = not any(n or i for n, i in (nonfinite_flags(v) for v in outs))
    if not hooks.at_origin:
        return PrecisionCheck(dtype, True, outputs_finite,
                              "in float32 the computation takes another path and never reaches this operation")
    nan, inf = hooks.at_origin[0]
    removes = not (nan or inf)
    kind = "NaN" if found.first.kind == "nan" else "Inf"
    if removes:
        detail = (f"computing in float32 removes the {kind}: {dtype} lost it through rounding or range; "
                  f"upcast this computation to float32")
    else:
        detail = (f"float32 gives a non-finite value here too: the values themselves are out of range "
                  f"({'bf16 shares float32' + chr(39) + 's exponent range' if dtype == 'bf16' else 'not only f16'}); "
                  "rescale or restructure the computation instead of upcasting")
    if not outputs_finite and removes:
        detail += "; other outputs stay non-finite in float32"
    return PrecisionCheck(dtype, removes, outputs_finite, detail)


def analyse(findings: Findings) -> None:
    """The ``precision`` analysis (``--precision``): for a bf16/f16 origin found by replay, whether float32 cures it."""
    if findings.options.precision and findings.strategy == "op-by-op replay" and findings.call is not None:
        findings.precision = check_precision(findings.localisation, findings.call)
