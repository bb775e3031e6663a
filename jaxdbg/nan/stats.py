"""Cheap questions about values: is it floating point, does it hold NaN/Inf, and its summary statistics.

The NaN/Inf questions themselves live in :mod:`jaxdbg.nonfinite` (the one non-finite check) and are
re-exported here; this module adds the summary statistics of a value that reports show.

Example:
    >>> import numpy as np
    >>> nonfinite_flags(np.array([1.0, np.inf]))
    (False, True)
    >>> value_stats(np.array([0.0, -2.0, np.nan])).negative
    1
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxdbg.nan.result import ValueStats
from jaxdbg.nonfinite import host_floats, host_readable, is_inexact, nonfinite_flags  # re-exported: callers ask here
from jaxdbg.target import short_dtype

__all__ = ["host_floats", "host_readable", "is_inexact", "nonfinite_flags", "value_stats"]


def value_stats(value: Any) -> ValueStats:
    """Shape, dtype, min, max (finite or not; NaN ignored) and counts of NaN, Inf, zeros and negatives."""
    shape = tuple(int(d) for d in np.shape(value))
    dtype = getattr(value, "dtype", None) or np.asarray(value).dtype
    try:
        name = short_dtype(dtype)
    except TypeError:
        return ValueStats(shape, str(dtype), None, None, 0, 0, 0, 0)
    if not host_readable(value):
        return _device_stats(value, shape, name)
    host = host_floats(value)
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
    if np.iscomplexobj(value):  # min and max of the parts; counts per number (zero: both parts are)
        whole = np.asarray(value)
        return ValueStats(shape, name, lo, hi, int(np.isnan(whole).sum()), int(np.isinf(whole).sum()),
                          int((whole == 0).sum()), 0)
    return ValueStats(shape, name, lo, hi, nan, inf, int((host == 0).sum()), int((host < 0).sum()))


def _device_stats(value: Any, shape: tuple[int, ...], name: str) -> ValueStats:
    """The same summary reduced on the devices (a global array spanning other processes' devices)."""
    import jax
    import jax.numpy as jnp

    @jax.jit
    def summary_jaxdbg(x: Any) -> tuple[Any, Any]:
        floating = jnp.issubdtype(x.dtype, jnp.inexact)
        real = x.astype(jnp.float32)
        nan = jnp.isnan(real) if floating else jnp.zeros(x.shape, bool)
        bounds = jnp.stack([jnp.min(jnp.where(nan, jnp.inf, real)), jnp.max(jnp.where(nan, -jnp.inf, real))])
        counts = jnp.stack([jnp.sum(nan), jnp.sum(jnp.isinf(real)) if floating else 0, jnp.sum(real == 0),
                            jnp.sum(real < 0)]).astype(jnp.int32)
        return bounds, counts

    if int(np.prod(shape, dtype=np.int64)) == 0:
        return ValueStats(shape, name, None, None, 0, 0, 0, 0)
    bounds, counts = (np.asarray(v) for v in summary_jaxdbg(value))  # replicated results: readable everywhere
    nan, inf, zero, negative = (int(c) for c in counts)
    size = int(np.prod(shape, dtype=np.int64))
    lo, hi = (float(b) for b in bounds) if nan < size else (float("nan"), float("nan"))
    return ValueStats(shape, name, lo, hi, nan, inf, zero, negative)
