"""Reading an exception's frames while it passes: which lie in JAX (or below it), and the values they hold.

Repro cuts an exception to the one JAX operation (or ``jax.numpy`` function) that raised it by reading the
frames of its traceback (:mod:`jaxdbg.repro.operation`, :mod:`jaxdbg.repro.jnp_call`); the parent asks the
same of a traceback's text (:func:`jaxdbg.repro.failures.raised_inside_jax`).

Example:
    >>> import jax.numpy as jnp
    >>> in_jax(jnp.__file__), under_jax(os.__file__), under_jax(__file__)
    (True, True, False)
    >>> try:
    ...     try:
    ...         raise KeyError("inner")
    ...     except KeyError as inner:
    ...         raise ValueError("outer") from inner
    ... except ValueError as err:
    ...     [type(e).__name__ for e in exception_chain(err)]
    ['ValueError', 'KeyError']
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Iterator
from types import TracebackType
from typing import Any

import jax
import ml_dtypes
import numpy as np


@functools.lru_cache(maxsize=1)
def jax_roots() -> tuple[str, ...]:
    """Folders of jax, jaxlib and opt_einsum (whose contract_path checks jnp.einsum's operands for jax)."""
    specs = [importlib.util.find_spec(name) for name in ("jax", "jaxlib", "opt_einsum")]
    return tuple(os.path.realpath(os.path.dirname(spec.origin)) + os.sep for spec in specs if spec and spec.origin)


def in_jax(path: str) -> bool:
    return os.path.realpath(path).startswith(jax_roots())


@functools.lru_cache(maxsize=1)
def _below_jax() -> tuple[str, ...]:
    """Folders of what JAX's own rules call: numpy, ml_dtypes and the standard library."""
    folders = [os.path.dirname(m.__file__ or "") for m in (np, ml_dtypes, os)]
    return tuple(os.path.realpath(f) + os.sep for f in folders if f)


def under_jax(path: str) -> bool:
    """A file of JAX or of what JAX's rules call (numpy, ml_dtypes, the standard library)."""
    return path.startswith("<frozen") or in_jax(path) or os.path.realpath(path).startswith(_below_jax())


def exception_chain(err: BaseException) -> Iterator[BaseException]:
    """``err``, then the exceptions it was raised from or while handling, each once."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__  # type: ignore[assignment]


def tb_frames(tb: TracebackType | None) -> Iterator[Any]:
    while tb is not None:
        yield tb.tb_frame
        tb = tb.tb_next


def tb_frames_with_lines(tb: TracebackType | None) -> Iterator[tuple[Any, int]]:
    while tb is not None:
        yield tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next


def concrete(value: Any) -> np.ndarray | None:
    """A value a frame holds, as a numpy array; None for a tracer (only its aval is known) or a value numpy
    cannot hold."""
    if isinstance(value, jax.core.Tracer):
        return None
    try:
        return np.asarray(value)
    except Exception:  # noqa: BLE001 - a value numpy cannot hold (a PRNG key): its aval is all we have
        return None
