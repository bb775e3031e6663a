"""One call written alone as a reproducer: a JAX operation, a ``jax.numpy`` function, a host function or a
function of the user's, called jitted on inputs of the recorded shapes and dtypes (zeros, or the recorded values).

:mod:`jaxdbg.repro.operation`, :mod:`jaxdbg.repro.jnp_call`, :mod:`jaxdbg.repro.callback` and
:mod:`jaxdbg.repro.frozen` each write their call with these pieces; :func:`jaxdbg.repro.program.write_program`
writes the result.

Example:
    >>> from jax import core
    >>> avals = [core.ShapedArray((2, 3), np.float32), core.ShapedArray((3,), np.int32)]
    >>> write_inputs(["a", "b"], avals, [None, np.arange(3)], recorded=True)  # a was a tracer: its aval alone
    (['a = np.zeros((2, 3), dtype=np.float32)', 'b = np.array([0, 1, 2], dtype=np.int32)'], {})
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from jaxdbg._source import SourceLocation
from jaxdbg.jaxpr.emit import HEADER, PRIMS_IMPORT, EmitError, EmittedFunction, array_expr, dtype_expr
from jaxdbg.repro.program import INPUTS_FILE, REPRO_FILE
from jaxdbg.storable import restore_source, storable

# Concrete inputs up to this many elements are written inline when their values are needed.
INLINE_ELEMENTS = 64
# Inputs of a written operation up to this many bytes in all: the check runs it, and an operation that does not
# fail as it did would then copy them to the device (a traced program's arrays can be far larger than memory).
MAX_INPUT_BYTES = 1 << 30


@dataclass(frozen=True)
class OperationProgram:
    """The written reproducer of one call: source, arrays for ``inputs.npz`` (maybe none), values used."""

    source: str
    arrays: dict
    recorded_values: bool  # True: the recorded input values; False: zeros of the recorded shapes and dtypes


def programs_of(emitted: EmittedFunction, avals: list, values: list,
                docstring_parts: tuple[str, str, SourceLocation | None, str, str]) -> Iterator[OperationProgram]:
    """``emitted`` called jitted on zeros of ``avals``, then on ``values`` where they were concrete; nothing
    when the inputs cannot be written (a PRNG key) or are too large to run here."""
    try:
        if sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in avals) > MAX_INPUT_BYTES:
            return
    except (TypeError, AttributeError):  # a PRNG key or another value numpy cannot hold: nothing to write
        return
    for recorded in [False] + ([True] if any(v is not None for v in values) else []):
        try:
            assign, arrays = write_inputs(emitted.arg_names, avals, values, recorded)
        except EmitError:
            continue
        lines = [docstring(*docstring_parts, recorded) + HEADER + (PRIMS_IMPORT if emitted.uses_prims else "")]
        if any(np.dtype(a.dtype).itemsize == 8 and np.dtype(a.dtype).kind in "iuf" for a in avals):
            lines.append('jax.config.update("jax_enable_x64", True)\n')  # else 64-bit inputs become 32-bit
        lines += ["", emitted.source, *assign, f"jax.jit(f)({', '.join(emitted.arg_names)})"]
        yield OperationProgram("\n".join(lines) + "\n", arrays, recorded)


def write_inputs(names: Sequence[str], avals: list, values: list, recorded: bool) -> tuple[list[str], dict]:
    """Lines assigning each input (zeros of its aval, or its recorded value inline or from ``inputs.npz``) and
    the arrays that go into ``inputs.npz``."""
    assign, arrays, loads = [], {}, []
    for name, aval, value in zip(names, avals, values):
        shape, dtype = tuple(aval.shape), np.dtype(aval.dtype)
        if recorded and value is not None:
            value = np.asarray(value, dtype=dtype)
            if value.size <= INLINE_ELEMENTS:
                assign.append(f"{name} = {array_expr(value)}")
                continue
            bits, special = storable(value)
            arrays[name] = bits
            loads.append(f"{name} = " + restore_source(f"_inputs[{name!r}]", special))
            continue
        assign.append(f"{name} = np.zeros({shape!r}, dtype={dtype_expr(dtype)})")
    if loads:
        loads.insert(0, f'_inputs = np.load((__file__.rpartition("/")[0] or ".") + "/{INPUTS_FILE}")')
    return loads + assign, arrays


def avals_text(avals: list) -> str:
    return ", ".join(a.str_short() if hasattr(a, "str_short") else str(a) for a in avals)


def docstring(title: str, what: str, source: SourceLocation | None, failure: str, origin: str,
              recorded: bool) -> str:
    """The reproducer's docstring: ``title`` raises ``failure`` (``TypeError while tracing``) in ``origin``."""
    exc_type = failure.split()[0]
    values = "the values it was called with" if recorded else "zeros of the shapes and dtypes it was called with"
    within = f" {origin}" if origin else ""
    return (f'"""jaxdbg repro: {title} raises {failure}{within}.\n\n'
            f'Called at {_where(source)}. This is that one {what} alone, on\n{values}.\n\n'
            f'`python {REPRO_FILE}` fails with {exc_type} while the bug is present.\n"""\n')


def _where(source: SourceLocation | None) -> str:
    if source is None:
        return "an unknown place"
    return f"{os.path.basename(source.file)}:{source.line} ({source.function})"
