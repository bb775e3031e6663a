"""The one JAX operation an exception came from, written out alone as a jax/numpy reproducer.

A shape or dtype error in a real program is raised by one primitive's rules while JAX traces (or lowers) the
program: ``dot_general`` refuses ``bf16[8,32,48] x bf16[64,64]`` three framework layers below the user's line.
The exception's traceback still holds that moment: the frame of ``Primitive.bind_with_trace`` has the
primitive, its parameters and its input avals (a lowering rule's frame has the equation). Written out as that
one ``lax`` call on arrays of the recorded shapes and dtypes, it fails the same way with no framework, data
or optimiser around it. It is taken only when nothing but JAX ran between that frame and the ``raise`` (an
error raised by user code traced inside a higher-order primitive is not the primitive's), and only once the
written program, run here, raises the same exception type with the same normalised message.

Runs in the contained child (:func:`jaxdbg.repro.jobs.target_job`) while the exception passes through: the
frames are the user's program's, alive only until the exception is reported.

The frames must be there: JAX's traceback filtering (on by default) removes them, so the contained runs
set ``JAX_TRACEBACK_FILTERING=off``.

Example:
    >>> import numpy as np
    >>> from jax import lax
    >>> try:
    ...     lax.dot_general(np.ones((2, 3)), np.ones((4, 5)), (((1,), (0,)), ((), ())))
    ... except TypeError as err:
    ...     op = failing_operation(err)
    >>> op.primitive.name, [tuple(a.shape) for a in op.avals]
    ('dot_general', [(2, 3), (4, 5)])
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import numpy as np

from jaxdbg._source import SourceLocation, is_user_file
from jaxdbg.jaxpr.emit import (
    HEADER,
    PRIMS_IMPORT,
    EmitError,
    EmittedFunction,
    array_expr,
    dtype_expr,
    emit_function,
)
from jaxdbg.repro.cut import Criterion
from jaxdbg.repro.cutting import write_program
from jaxdbg.repro.failures import _jax_roots
from jaxdbg.repro.graph import Var
from jaxdbg.repro.messages import CutFinished
from jaxdbg.repro.program import INPUTS_FILE, REPRO_FILE, count_lines, program_fails
from jaxdbg.storable import restore_source, storable

# Concrete inputs up to this many elements are written inline when their values are needed.
INLINE_ELEMENTS = 64
# Inputs of a written operation up to this many bytes in all: the check runs it, and an operation that does not
# fail as it did would then copy them to the device (a traced program's arrays can be far larger than memory).
MAX_INPUT_BYTES = 1 << 30


@dataclass
class FailedOperation:
    """A primitive application that raised: what was bound, on what, and where the user's code called it."""

    primitive: Any
    params: dict
    avals: list
    values: list  # the concrete input (numpy) where it was one, else None (a tracer: only its aval is known)
    source: SourceLocation | None
    stage: str  # "tracing" (the primitive's rules while binding) or "lowering"

    @property
    def multiple_results(self) -> bool:
        return bool(getattr(self.primitive, "multiple_results", False))


@dataclass(frozen=True)
class _Equation:
    """The failed application as the emitter reads an equation (its outputs were never made: no avals)."""

    primitive: Any
    params: dict
    invars: tuple
    outvars: tuple = field(default=())


def failing_operation(err: BaseException) -> FailedOperation | None:
    """The primitive whose tracing or lowering rule raised ``err`` (or an exception it was raised from)."""
    for exc in _chain(err):
        frames = list(_frames(exc.__traceback__))
        for k in range(len(frames) - 1, -1, -1):
            op = _operation_at(frames[k])
            if op is None:
                continue
            # Only JAX (and the libraries under it) may have run between the bind and the raise: a user (or
            # framework) frame deeper down means the error is that code's, traced inside a higher-order primitive.
            if any(not _under_jax(f.f_code.co_filename) for f in frames[k + 1:]):
                break
            op.source = next((SourceLocation(f.f_code.co_filename, line, f.f_code.co_name)
                              for f, line in reversed(list(_frames_with_lines(exc.__traceback__))[:k])
                              if is_user_file(f.f_code.co_filename)), None)
            return op
    return None


def _chain(err: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__  # type: ignore[assignment]


def _frames(tb: TracebackType | None) -> Iterator[Any]:
    while tb is not None:
        yield tb.tb_frame
        tb = tb.tb_next


def _frames_with_lines(tb: TracebackType | None) -> Iterator[tuple[Any, int]]:
    while tb is not None:
        yield tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next


def _in_jax(path: str) -> bool:
    return os.path.realpath(path).startswith(_jax_roots())


@functools.lru_cache(maxsize=1)
def _below_jax() -> tuple[str, ...]:
    """Folders of what JAX's own rules call: numpy, ml_dtypes and the standard library."""
    import ml_dtypes

    folders = [os.path.dirname(m.__file__ or "") for m in (np, ml_dtypes, os)]
    return tuple(os.path.realpath(f) + os.sep for f in folders if f)


def _under_jax(path: str) -> bool:
    return path.startswith("<frozen") or _in_jax(path) or os.path.realpath(path).startswith(_below_jax())


def _operation_at(frame: Any) -> FailedOperation | None:
    """The operation a JAX frame was applying: ``bind_with_trace`` while tracing, a lowering rule's equation."""
    if not _in_jax(frame.f_code.co_filename):
        return None
    from jax.extend.core import Primitive

    local = frame.f_locals
    if frame.f_code.co_name == "bind_with_trace" and isinstance(local.get("self"), Primitive):
        args, avals = list(local.get("args") or ()), list(local.get("avals") or ())
        if len(avals) != len(args):
            return None
        return FailedOperation(local["self"], dict(local.get("params") or {}), avals,
                               [_concrete(a) for a in args], None, "tracing")
    eqn = local.get("eqn")
    if frame.f_code.co_name == "jaxpr_subcomp" and isinstance(getattr(eqn, "primitive", None), Primitive):
        avals = [v.aval for v in eqn.invars]
        values = [np.asarray(v.val) if hasattr(v, "val") else None for v in eqn.invars]
        return FailedOperation(eqn.primitive, dict(eqn.params), avals, values, None, "lowering")
    return None


def _concrete(value: Any) -> np.ndarray | None:
    import jax

    if isinstance(value, jax.core.Tracer):
        return None
    try:
        return np.asarray(value)
    except Exception:  # noqa: BLE001 - a value numpy cannot hold (a PRNG key): its aval is all we have
        return None


# ----------------------------------------------------------------------------------------------------------
# The reproducer
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OperationProgram:
    """The written reproducer of one operation: source, arrays for ``inputs.npz`` (maybe none), values used."""

    source: str
    arrays: dict
    recorded_values: bool  # True: the recorded input values; False: zeros of the recorded shapes and dtypes


def operation_programs(op: FailedOperation, exc_type: str, origin: str) -> Iterator[OperationProgram]:
    """Reproducers to try, plainest first: zeros of the recorded shapes and dtypes (a shape or dtype error does
    not depend on values), then the recorded values where the inputs were concrete."""
    invars = tuple(Var(aval) for aval in op.avals)
    eqn = _Equation(op.primitive, op.params, invars, (Var(None),))
    try:
        emitted = emit_function("f", invars, [eqn], list(eqn.outvars))
    except (EmitError, KeyError, TypeError, ValueError, AttributeError):
        return
    title = f"{op.primitive.name}({_avals_text(op.avals)})"
    yield from programs_of(emitted, op.avals, op.values, docstring_parts=(
        title, "operation", op.source, f"{exc_type} while {op.stage}", origin))


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


def _avals_text(avals: list) -> str:
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


def cut_operation(err: BaseException, folder: str, exc_type: str, message: str, origin: str) -> CutFinished:
    """The reproducer of the operation that raised ``err`` (``exc_type`` with the normalised ``message``),
    written into ``folder`` and checked here to raise the same; ``origin`` names where it ran, in words."""
    from jaxdbg.repro.jnp_call import call_programs, failing_call

    started = time.perf_counter()
    op = failing_operation(err)
    call = failing_call(err) if op is None else None
    if op is None and call is None:
        return CutFinished(False, reason="the exception was not raised by the rules of one JAX operation nor by "
                                         "one jax.numpy function")
    if op is not None:
        name, programs = op.primitive.name, operation_programs(op, exc_type, origin)
    else:
        assert call is not None
        name, programs = call.label, call_programs(call, exc_type, origin)
    checks = 0
    for program in programs:
        checks += 1
        files = write_program(program, folder)
        if program_fails(files["repro"], Criterion("exception", exc_type=exc_type, exc_message=message)):
            return CutFinished(
                True, checks, 0, function=origin, equations=1, primitives=[name],
                lines=count_lines(program.source), files=files, self_check=True,
                elapsed_s=time.perf_counter() - started,
                criterion={"kind": "exception", "what": None, "type": exc_type, "message": message})
    return CutFinished(False, checks, reason=f"{name} alone on the recorded shapes and dtypes does not raise the "
                                             "same exception")
