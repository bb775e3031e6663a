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

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from jax.extend.core import Primitive

from jaxdbg._source import SourceLocation, is_user_file
from jaxdbg.jaxpr.emit import EmitError, emit_function
from jaxdbg.repro.call_program import OperationProgram, avals_text, programs_of
from jaxdbg.repro.frames import concrete, exception_chain, in_jax, tb_frames, tb_frames_with_lines, under_jax
from jaxdbg.repro.graph import Var
from jaxdbg.repro.jnp_call import call_programs, failing_call
from jaxdbg.repro.messages import CutFinished
from jaxdbg.repro.program import count_lines, program_fails, write_program
from jaxdbg.repro.signature import Criterion


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
    for exc in exception_chain(err):
        frames = list(tb_frames(exc.__traceback__))
        for k in range(len(frames) - 1, -1, -1):
            op = _operation_at(frames[k])
            if op is None:
                continue
            # Only JAX (and the libraries under it) may have run between the bind and the raise: a user (or
            # framework) frame deeper down means the error is that code's, traced inside a higher-order primitive.
            if any(not under_jax(f.f_code.co_filename) for f in frames[k + 1:]):
                break
            op.source = next((SourceLocation(f.f_code.co_filename, line, f.f_code.co_name)
                              for f, line in reversed(list(tb_frames_with_lines(exc.__traceback__))[:k])
                              if is_user_file(f.f_code.co_filename)), None)
            return op
    return None


def _operation_at(frame: Any) -> FailedOperation | None:
    """The operation a JAX frame was applying: ``bind_with_trace`` while tracing, a lowering rule's equation."""
    if not in_jax(frame.f_code.co_filename):
        return None
    local = frame.f_locals
    if frame.f_code.co_name == "bind_with_trace" and isinstance(local.get("self"), Primitive):
        args, avals = list(local.get("args") or ()), list(local.get("avals") or ())
        if len(avals) != len(args):
            return None
        return FailedOperation(local["self"], dict(local.get("params") or {}), avals,
                               [concrete(a) for a in args], None, "tracing")
    eqn = local.get("eqn")
    if frame.f_code.co_name == "jaxpr_subcomp" and isinstance(getattr(eqn, "primitive", None), Primitive):
        avals = [v.aval for v in eqn.invars]
        values = [np.asarray(v.val) if hasattr(v, "val") else None for v in eqn.invars]
        return FailedOperation(eqn.primitive, dict(eqn.params), avals, values, None, "lowering")
    return None


# ----------------------------------------------------------------------------------------------------------
# The reproducer
# ----------------------------------------------------------------------------------------------------------


def operation_programs(op: FailedOperation, exc_type: str, origin: str) -> Iterator[OperationProgram]:
    """Reproducers to try, plainest first: zeros of the recorded shapes and dtypes (a shape or dtype error does
    not depend on values), then the recorded values where the inputs were concrete."""
    invars = tuple(Var(aval) for aval in op.avals)
    eqn = _Equation(op.primitive, op.params, invars, (Var(None),))
    try:
        emitted = emit_function("f", invars, [eqn], list(eqn.outvars))
    except (EmitError, KeyError, TypeError, ValueError, AttributeError):
        return
    title = f"{op.primitive.name}({avals_text(op.avals)})"
    yield from programs_of(emitted, op.avals, op.values, docstring_parts=(
        title, "operation", op.source, f"{exc_type} while {op.stage}", origin))


def cut_operation(err: BaseException, folder: str, criterion: Criterion, origin: str) -> CutFinished:
    """The reproducer of the operation that raised ``err`` (failing as ``criterion``, an exception's, says),
    written into ``folder`` and checked here to raise the same; ``origin`` names where it ran, in words."""
    started = time.perf_counter()
    op = failing_operation(err)
    call = failing_call(err) if op is None else None
    if op is None and call is None:
        return CutFinished(False, reason="the exception was not raised by the rules of one JAX operation nor by "
                                         "one jax.numpy function")
    if op is not None:
        name, programs = op.primitive.name, operation_programs(op, criterion.type or "", origin)
    else:
        assert call is not None
        name, programs = call.label, call_programs(call, criterion.type or "", origin)
    checks = 0
    for program in programs:
        checks += 1
        files = write_program(program, folder)
        if program_fails(files["repro"], criterion):
            return CutFinished(
                True, checks, 0, function=origin, equations=1, primitives=[name],
                lines=count_lines(program.source), files=files, self_check=True,
                elapsed_s=time.perf_counter() - started,
                criterion=criterion)
    return CutFinished(False, checks, reason=f"{name} alone on the recorded shapes and dtypes does not raise the "
                                             "same exception")
