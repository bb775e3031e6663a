"""Cheap questions about values: is it floating point, does it hold NaN/Inf, and its summary statistics.

Small values are inspected on the host; large ones are reduced on the device first (one compiled
reduction per shape and dtype), so a device array is never copied whole just to ask about it.

Example:
    >>> import numpy as np
    >>> nonfinite_flags(np.array([1.0, np.inf]))
    (False, True)
    >>> value_stats(np.array([0.0, -2.0, np.nan])).negative
    1
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdbg.nan.result import ValueStats
from jaxdbg.target import short_dtype

HOST_CHECK_ELEMENTS = 1 << 14  # below this many elements, copying to the host is cheaper than a dispatch


def is_inexact(value: Any) -> bool:
    """True for floating-point and complex values (the only ones that can hold NaN or Inf)."""
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        return isinstance(value, (float, complex))
    try:
        return jnp.issubdtype(dtype, jnp.inexact)
    except TypeError:  # extended dtypes (PRNG keys)
        return False


@jax.jit
def _device_flags_jaxdbg(x: jax.Array) -> jax.Array:
    return jnp.stack([jnp.any(jnp.isnan(x)), jnp.any(jnp.isinf(x))])


def nonfinite_flags(value: Any) -> tuple[bool, bool]:
    """``(has NaN, has Inf)``; ``(False, False)`` for integers, booleans and keys."""
    if not is_inexact(value):
        return False, False
    size = int(np.prod(np.shape(value), dtype=np.int64))
    if size == 0:
        return False, False
    if isinstance(value, jax.Array) and size > HOST_CHECK_ELEMENTS:
        flags = np.asarray(_device_flags_jaxdbg(value))
        return bool(flags[0]), bool(flags[1])
    host = _host(value)
    return bool(np.isnan(host).any()), bool(np.isinf(host).any())


def _host(value: Any) -> np.ndarray:
    host = np.asarray(value)
    if host.dtype.kind == "V" or host.dtype.name in ("bfloat16",) or host.dtype.itemsize < 4 and host.dtype.kind == "f":
        host = host.astype(np.float32)
    if host.dtype.kind == "c":
        host = np.concatenate([host.real.ravel(), host.imag.ravel()])
    return host


def value_stats(value: Any) -> ValueStats:
    """Shape, dtype, min, max (finite or not; NaN ignored) and counts of NaN, Inf, zeros and negatives."""
    shape = tuple(int(d) for d in np.shape(value))
    dtype = getattr(value, "dtype", None) or np.asarray(value).dtype
    try:
        name = short_dtype(dtype)
    except TypeError:
        return ValueStats(shape, str(dtype), None, None, 0, 0, 0, 0)
    host = _host(value)
    if host.dtype == np.bool_:
        host = host.astype(np.int8)
    if host.size == 0:
        return ValueStats(shape, name, None, None, 0, 0, 0, 0)
    is_float = host.dtype.kind == "f"
    nan = int(np.isnan(host).sum()) if is_float else 0
    inf = int(np.isinf(host).sum()) if is_float else 0
    real = host[~np.isnan(host)] if nan else host
    lo = float(real.min()) if real.size else float("nan")
    hi = float(real.max()) if real.size else float("nan")
    return ValueStats(shape, name, lo, hi, nan, inf, int((host == 0).sum()), int((host < 0).sum()))
