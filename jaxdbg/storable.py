"""The one way jaxdbg copies a call's input or output to the host and into an npz file, and back.

numpy holds most of what a jitted call takes and returns, but not all: an npz keeps no bfloat16 (or the
other ml_dtypes types: np.save writes their raw bytes and reads them back as void), and a typed PRNG key
array (``jax.random.key``, ``nnx.Rngs``, an NNX model with Dropout) has no numpy form at all
(``np.asarray`` raises). :func:`storable` gives what an npz can hold and the name to restore it by:

- a numpy dtype: the array itself, name None;
- an ml_dtypes type: its bit pattern as unsigned integers, named by the dtype (``bfloat16``);
- a typed PRNG key array: its key data (``jax.random.key_data``, uint32 with the implementation's trailing
  dimension), named ``key<IMPL>`` by the implementation (``key<threefry2x32>``, ``key<rbg>``).

:func:`restore` undoes it (``jax.random.wrap_key_data(data, impl=IMPL)`` for keys), and :func:`restore_source`
writes the same as Python for a generated reproducer. Imports no jax until a key is met.

Example:
    >>> import ml_dtypes
    >>> bits, name = storable(np.array([1.5], ml_dtypes.bfloat16))
    >>> bits.dtype.name, name, restore(bits, name).tolist()
    ('uint16', 'bfloat16', [1.5])
    >>> import jax
    >>> data, name = storable(jax.random.split(jax.random.key(0), 3))
    >>> data.dtype.name, data.shape, name
    ('uint32', (3, 2), 'key<threefry2x32>')
    >>> restore(data, name).dtype, restore_source("x", name)
    (key<fry>, "jax.random.wrap_key_data(x, impl='threefry2x32')")
"""

from __future__ import annotations

from typing import Any

import numpy as np

KEY_PREFIX = "key<"


def is_key(value: Any) -> bool:
    """Whether ``value`` is a typed PRNG key array (``jax.random.key``), which numpy cannot hold."""
    dtype = getattr(value, "dtype", None)
    if dtype is None or isinstance(dtype, np.dtype):
        return False
    import jax

    try:
        return bool(jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key))
    except TypeError:
        return False


def storable(value: Any) -> tuple[np.ndarray, str | None]:
    """``(array an npz keeps, name to restore it by)``; the name is None for a plain numpy dtype (see module)."""
    if is_key(value):
        import jax

        return np.asarray(jax.random.key_data(value)), key_name(value)
    array = np.asarray(value)
    if array.dtype.kind in "biufc?":
        return array, None
    return array.view(np.dtype(f"u{array.dtype.itemsize}")), array.dtype.name


def key_name(value: Any) -> str:
    """The name :func:`storable` gives a typed PRNG key array: ``key<IMPL>``."""
    import jax

    return f"{KEY_PREFIX}{jax.random.key_impl(value)}>"


def key_impl(name: str | None) -> str | None:
    """The PRNG implementation of a :func:`storable` name (``'threefry2x32'``), or None if it names no key."""
    return name[len(KEY_PREFIX):-1] if name and name.startswith(KEY_PREFIX) and name.endswith(">") else None


def restored_dtype(name: str) -> np.dtype:
    """The numpy dtype of an ml_dtypes name :func:`storable` recorded (ml_dtypes, a jax dependency, defines
    bfloat16)."""
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, name))


def restore(array: np.ndarray, name: str | None) -> Any:
    """The value :func:`storable` stored: the array, viewed as its ml_dtypes type, or wrapped back into keys."""
    if name is None:
        return array
    impl = key_impl(name)
    if impl is not None:
        import jax

        return jax.random.wrap_key_data(jax.numpy.asarray(array), impl=impl)
    return array.view(restored_dtype(name))


def restore_source(expr: str, name: str | None, jnp: str = "jnp", jax: str = "jax") -> str:
    """Python source that restores ``expr`` (an array loaded from the npz) as :func:`restore` does, for a script
    that imports ``jax`` and ``jax.numpy`` under the names given."""
    if name is None:
        return expr
    impl = key_impl(name)
    if impl is not None:
        return f"{jax}.random.wrap_key_data({expr}, impl={impl!r})"
    return f"{expr}.view({jnp}.{name})"


def dtype_name(value: Any) -> str:
    """A value's dtype as numpy names it, or jax's name for a dtype numpy does not have (``key<fry>``)."""
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        return np.asarray(value).dtype.name
    return dtype.name if isinstance(dtype, np.dtype) else str(dtype)
