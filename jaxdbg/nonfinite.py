"""The one non-finite check: is a value floating point, does it hold NaN/Inf, reduced on the device.

Every part of jaxdbg that asks "did this produce a NaN or an Inf?" asks here, so the answer and its cost
are the same everywhere: a device array is reduced where it lives and only a few numbers cross to the host.

- :func:`magnitudes` reduces a whole output tree to one small vector, ``max(|x|)`` per floating leaf
  (NaN and Inf propagate into it); :func:`with_magnitudes` compiles it into a jitted (or pmap'd) function's own
  program; a pmap'd function's gives a row per device, :func:`over_devices` reduces them on the host.
- :func:`nonfinite_flags` answers ``(has NaN, has Inf)`` for one value (small host values are looked at
  directly, larger ones reduced on the device by one compiled reduction per shape and dtype).
- :func:`kind_of` reads a host copy of :func:`magnitudes`: ``'nan'``, ``'inf'`` or None.

Example:
    >>> import numpy as np, jax, jax.numpy as jnp
    >>> nonfinite_flags(np.array([1.0, np.inf]))
    (False, True)
    >>> mags = np.asarray(magnitudes({"w": jnp.array([1.0, -3.0]), "step": jnp.array(2)}))
    >>> mags.tolist(), kind_of(mags)
    ([3.0], None)
    >>> kind_of(np.asarray(magnitudes([jnp.array([jnp.inf]), jnp.array([jnp.nan])])))
    'nan'
    >>> kind_of(np.asarray(jax.jit(magnitudes)(jnp.ones((512, 512)).at[3, 5].set(jnp.nan))))
    'nan'
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

HOST_CHECK_ELEMENTS = 1 << 14  # below this many elements, copying to the host is cheaper than a dispatch


def is_inexact(value: Any) -> bool:
    """True for floating-point and complex values (the only ones that can hold NaN or Inf)."""
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        return isinstance(value, (float, complex))
    try:
        return _inexact_dtype(dtype)
    except TypeError:  # an unhashable dtype: asked directly
        return _inexact_dtype.__wrapped__(dtype)


@functools.lru_cache(maxsize=256)  # asked for every leaf of every watched call: jnp.issubdtype is slow
def _inexact_dtype(dtype: Any) -> bool:
    try:
        return bool(jnp.issubdtype(dtype, jnp.inexact))
    except TypeError:  # extended dtypes (PRNG keys)
        return False


def magnitudes(tree: Any) -> jax.Array:
    """``max(|x|)`` of every floating leaf of ``tree``, as one float32 vector (empty when there is none)."""
    leaves = [x for x in jax.tree_util.tree_leaves(tree) if is_inexact(x)]
    if not leaves:
        return jnp.zeros((0,), jnp.float32)
    return jnp.stack([_magnitude(x) for x in leaves])


def _magnitude(x: jax.Array) -> jax.Array:
    # A max does not reliably carry a NaN through: XLA:CPU's YNNPACK fusion returns 0.0 for max(|x|) of an
    # all-NaN 256x256 array (jax 0.10/0.11). The NaN test is a boolean reduction of its own, done in the same
    # pass over x (one variadic reduce): two separate reductions read every output twice, ~10% of a CPU
    # training step against ~4% for one.
    biggest, has_nan = lax.reduce(
        (jnp.abs(x).astype(jnp.float32), jnp.isnan(x)), (np.float32(0), np.bool_(False)),
        lambda a, b: (lax.max(a[0], b[0]), lax.bitwise_or(a[1], b[1])), tuple(range(jnp.ndim(x))))
    return jnp.where(has_nan, jnp.float32(jnp.nan), biggest)


@jax.jit
def device_magnitudes_jaxdbg(leaves: list) -> jax.Array:
    """:func:`magnitudes` of a list of arrays (arguments made outside the watched calls), compiled once per
    list signature; a program of jaxdbg's own (its name ends in ``_jaxdbg``)."""
    return magnitudes(leaves)


def over_devices(rows: np.ndarray) -> np.ndarray:
    """Host copies of a pmap'd call's magnitudes, a row per device (devices, leaves: :func:`with_magnitudes` under
    ``jax.pmap``), or of several calls' (calls, devices, leaves), reduced over the devices: one magnitude per leaf,
    NaN and Inf kept.

    Example:
        >>> out, rows = jax.pmap(with_magnitudes(lambda x: (jnp.log(x), 2 * x), "f"))(jnp.array([[1.0, -3.0]]))
        >>> np.asarray(rows).shape, over_devices(np.asarray(rows)).tolist()
        ((1, 2), [nan, 6.0])
        >>> over_devices(np.array([[1.0, 2.0], [np.nan, 5.0]])).tolist()
        [nan, 5.0]
    """
    return rows.max(axis=-2)


@jax.jit
def stacked_jaxdbg(vectors: list) -> jax.Array:
    """Several pmap'd calls' magnitude rows (of one shape) stacked into one array: read with one copy, not one each
    (a host copy of a pmap'd call's rows assembles one block per device: ~28 us, on 4 CPU devices).

    Example:
        >>> np.asarray(stacked_jaxdbg([jnp.array([1.0, 2.0]), jnp.array([3.0, jnp.inf])])).tolist()
        [[1.0, 2.0], [3.0, inf]]
    """
    return jnp.stack(vectors)


def with_magnitudes(fun: Callable, name: str) -> Callable:
    """``fun`` returning ``(outputs, magnitudes(outputs))``; jitted, the check runs in the same program.

    Example:
        >>> out, mags = jax.jit(with_magnitudes(lambda x: (x * 2, jnp.int32(7)), "double"))(jnp.array([1.0, -4.0]))
        >>> np.asarray(mags).tolist()
        [8.0]
    """

    @functools.wraps(fun)
    def checked(*args: Any, **kwargs: Any) -> tuple[Any, jax.Array]:
        out = fun(*args, **kwargs)
        return out, magnitudes(out)

    checked.__name__ = checked.__qualname__ = name
    return checked


def kind_of(host_magnitudes: np.ndarray, nan_only: bool = False) -> str | None:
    """'nan' if a magnitude is NaN, 'inf' if one is infinite (unless ``nan_only``), else None."""
    if np.isnan(host_magnitudes).any():
        return "nan"
    if not nan_only and np.isinf(host_magnitudes).any():
        return "inf"
    return None


@jax.jit
def _device_flags_jaxdbg(x: jax.Array) -> jax.Array:
    return jnp.stack([jnp.any(jnp.isnan(x)), jnp.any(jnp.isinf(x))])


@jax.jit
def _device_flags_magnitude_jaxdbg(x: jax.Array) -> jax.Array:
    finite = jnp.where(jnp.isfinite(x), jnp.abs(x), 0).astype(jnp.float32)
    return jnp.stack([jnp.any(jnp.isnan(x)), jnp.any(jnp.isinf(x)), jnp.max(finite)]).astype(jnp.float32)


def host_readable(value: Any) -> bool:
    """False for a global array of a multi-process job that spans other processes' devices: it cannot be
    copied to this host; reduce it on the devices instead (every process then runs the same reduction)."""
    if not isinstance(value, jax.Array):
        return True
    return bool(value.is_fully_addressable or value.is_fully_replicated)


def nonfinite_flags(value: Any) -> tuple[bool, bool]:
    """``(has NaN, has Inf)``; ``(False, False)`` for integers, booleans and keys."""
    host = _host_or_none(value)
    if host is None:
        if not is_inexact(value) or _size(value) == 0:
            return False, False
        flags = np.asarray(_device_flags_jaxdbg(value))
        return bool(flags[0]), bool(flags[1])
    return bool(np.isnan(host).any()), bool(np.isinf(host).any())


def flags_and_magnitude(value: Any) -> tuple[bool, bool, float]:
    """``(has NaN, has Inf, largest finite |x|)``, read in one go (the magnitude feeds growth); ``(False, False,
    0.0)`` for integers, booleans and keys.

    Example:
        >>> flags_and_magnitude(np.array([1.0, -3.0, np.inf]))
        (False, True, 3.0)
    """
    host = _host_or_none(value)
    if host is None:
        if not is_inexact(value) or _size(value) == 0:
            return False, False, 0.0
        flags = np.asarray(_device_flags_magnitude_jaxdbg(value))
        return bool(flags[0]), bool(flags[1]), float(flags[2])
    finite = np.abs(host[np.isfinite(host)])
    return bool(np.isnan(host).any()), bool(np.isinf(host).any()), float(finite.max()) if finite.size else 0.0


def _size(value: Any) -> int:
    return int(np.prod(np.shape(value), dtype=np.int64))


def _host_or_none(value: Any) -> np.ndarray | None:
    """A host copy to look at (small, readable, floating), or None: not floating, empty, or to be reduced on
    the device (large, or a global array spanning other processes' devices)."""
    if not is_inexact(value):
        return None
    size = _size(value)
    if size == 0 or (isinstance(value, jax.Array) and (size > HOST_CHECK_ELEMENTS or not host_readable(value))):
        return None
    return host_floats(value)


def host_floats(value: Any) -> np.ndarray:
    """A host copy numpy can compute on: 16-bit floats widened to float32, complex split into real parts."""
    host = np.asarray(value)
    if host.dtype.kind == "V" or host.dtype.name == "bfloat16" or (host.dtype.itemsize < 4 and host.dtype.kind == "f"):
        host = host.astype(np.float32)
    if host.dtype.kind == "c":
        host = np.concatenate([host.real.ravel(), host.imag.ravel()])
    return host
