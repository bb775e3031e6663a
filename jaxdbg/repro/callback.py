"""A failure raised inside a host callback, cut to that callback.

A host function called through ``jax.debug.callback``, ``jax.pure_callback`` or ``io_callback`` runs while
the jitted computation executes; its exception reaches the user as a ``JaxRuntimeError`` ("CpuCallback error
...: KeyError: 'accuracy'") at the call of the jitted function, framework layers away from the host function.
jax logs the exception while it passes (:func:`jaxdbg._compat.host_callback_call`): the host function, the
arguments of the failing call (step 5's, not step 0's) and the frames of the raise are alive then, and
:class:`CallbackRecorder` keeps them. The reproducer is that host function, written alone and reduced while it
still raises the same exception here (:mod:`jaxdbg.repro.standalone`), called through the same callback kind
from a tiny jitted function on the recorded values. Where the function cannot be written alone (it reads a
framework object, it has no source), nothing is cut here and the source reduction answers: a host function
that only raised the same exception would be a ``raise`` of constants, never a reproducer. A program is kept
only once it raises the same exception type with the same normalised message (checked here; the parent then
runs it alone in an empty folder).

Example:
    >>> import jax
    >>> def log(step):
    ...     raise KeyError("accuracy")
    >>> with recorded_callbacks() as recorder:
    ...     try:
    ...         jax.jit(lambda s: jax.debug.callback(log, s))(5)
    ...     except Exception as err:
    ...         outer = err
    >>> recorder.failure.kind, recorder.failure.raised(), recorder.failure.explains(outer)
    ('jax.debug.callback', "KeyError: 'accuracy'", True)
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from jaxdbg._compat import HOST_CALLBACK_LOGGERS, host_callback_call
from jaxdbg._source import SourceLocation, innermost_user_frame
from jaxdbg._tracebacks import without_tracebacks
from jaxdbg.jaxpr.emit import EmitError, array_expr, dtype_expr
from jaxdbg.repro.call_program import INLINE_ELEMENTS, OperationProgram, write_inputs
from jaxdbg.repro.messages import CutFinished
from jaxdbg.repro.program import REPRO_FILE, count_lines, program_fails, write_program
from jaxdbg.repro.signature import Criterion
from jaxdbg.repro.standalone import NotStandalone, Standalone, standalone

REDUCE_SECONDS = 10.0  # the in-process reduction of the host function (each check is one call: milliseconds)


@dataclass
class FailedCallback:
    """A host callback that raised: how it was called (``kind``), the user's function and what it got."""

    kind: str  # jax.debug.callback, jax.pure_callback or io_callback
    function: Any
    args: tuple
    kwargs: dict
    result_avals: list
    ordered: bool
    error: BaseException
    raised_at: SourceLocation | None

    def raised(self) -> str:
        return f"{type(self.error).__name__}: {self.error}"

    def explains(self, err: BaseException) -> bool:
        """Is ``err`` (what reached the caller) this callback's exception, as XLA passed it on?"""
        return err is not self.error and without_tracebacks(str(err)).rstrip().endswith(self.raised())

    @property
    def title(self) -> str:
        function = getattr(self.function, "__func__", self.function)
        return getattr(function, "__qualname__", None) or f"{type(function).__name__}.__call__"


class CallbackRecorder(logging.Handler):
    """Keeps the last host callback failure jax logged (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.failure: FailedCallback | None = None

    def emit(self, record: logging.LogRecord) -> None:
        error = record.exc_info[1] if record.exc_info else None
        if error is None:
            return
        with contextlib.suppress(Exception):  # a recorder must never change how the program fails
            call = host_callback_call(error.__traceback__)
            if call is not None:
                self.failure = FailedCallback(**call, error=error, raised_at=innermost_user_frame(error.__traceback__))


@contextlib.contextmanager
def recorded_callbacks() -> Iterator[CallbackRecorder]:
    recorder = CallbackRecorder()
    loggers = [logging.getLogger(name) for name in HOST_CALLBACK_LOGGERS]
    for logger in loggers:
        logger.addHandler(recorder)
    try:
        yield recorder
    finally:
        for logger in loggers:
            logger.removeHandler(recorder)


# ----------------------------------------------------------------------------------------------------------
# The reproducer
# ----------------------------------------------------------------------------------------------------------


def host_function(failed: FailedCallback) -> tuple[Standalone | None, str]:
    """The user's host function written alone and reduced, or None and why it cannot be."""
    def fails(namespace: dict) -> bool:
        try:
            eval(alone.name, namespace)(*failed.args, **failed.kwargs)  # a name: `logger`, `saver.save`
        except Exception as err:  # noqa: BLE001 - the exception is what we compare
            return type(err) is type(failed.error) and raised.same_exception(type(err).__name__, str(err))
        return False

    raised = Criterion.exception(type(failed.error).__name__, str(failed.error))  # (a count in it may differ)
    line = failed.raised_at.line if failed.raised_at is not None else None
    try:
        alone = standalone(failed.function, line, name=_user_name(failed.function))
        return alone.reduce(fails, REDUCE_SECONDS), ""
    except (NotStandalone, SyntaxError) as err:
        return None, str(err)


def _user_name(function: Any) -> str | None:
    """The name the user's module binds the instance of a bound method or callable instance to (``logger``)."""
    if inspect.ismethod(function):
        owner, code_of = function.__self__, function.__func__
    else:
        owner, code_of = function, vars(type(function)).get("__call__")
    if inspect.isfunction(owner) or not inspect.isfunction(code_of):
        return None
    return next((n for n, v in code_of.__globals__.items() if v is owner and not n.startswith("_")), None)


def callback_programs(failed: FailedCallback, exc_type: str, origin: str) -> Iterator[tuple[OperationProgram, str]]:
    """The reproducer to try, with what it is: the user's host function written alone. A host function that
    cannot be written alone gives none (the source reduction answers): a function that only raises the same
    exception would be a ``raise`` of constants, which the contract says is never a reproducer."""
    host, _ = host_function(failed)
    if host is None:
        return
    with contextlib.suppress(EmitError):
        yield _program(failed, host, exc_type, origin), (
            f"{REPRO_FILE}: the host function {failed.title} (raised at {_where(failed.raised_at)}) written alone, "
            f"called through {failed.kind} from a jitted function with the values of the failing call")


def _program(failed: FailedCallback, host: Standalone, exc_type: str, origin: str) -> OperationProgram:
    arrays: list = []
    parts = [_tree(a, arrays) for a in failed.args] + [f"{k}={_tree(v, arrays)}" for k, v in failed.kwargs.items()]
    names = [chr(ord("a") + i) if i < 26 else f"x{i}" for i in range(len(arrays))]
    call = ", ".join([host.name, *_results(failed), *parts]).format(*names)
    if failed.kind == "jax.debug.callback":
        body = f"    jax.debug.callback({call})"
    else:
        spelled = "jax.pure_callback" if failed.kind == "jax.pure_callback" else "io_callback"
        body = f"    return {spelled}({call}{', ordered=True' if failed.ordered else ''})"
    try:
        inline = [array_expr(np.asarray(a), INLINE_ELEMENTS) for a in arrays]
        assign: list[str] = []
        files: dict = {}
    except EmitError:
        inline = names
        assign, files = write_inputs(names, [np.asarray(a) for a in arrays], [np.asarray(a) for a in arrays], True)
    imports = ["import jax", "import numpy as np"] + (
        ["from jax.experimental import io_callback"] if failed.kind == "io_callback" else [])
    defined = [row for row in host.text().splitlines() if row not in imports]
    doc = (f'"""jaxdbg repro: {failed.title} raises {failed.raised()} inside {failed.kind}'
           f'{f" in {origin}" if origin else ""}.\n\nRaised at {_where(failed.raised_at)}. This is the host function, '
           f'called through {failed.kind} from a\njitted function with the values of the failing call.'
           f'\n\n`python {REPRO_FILE}` fails with {exc_type} while the bug is present.\n"""\n')
    lines = [doc + "\n".join(imports), *defined, "", "", f"def f({', '.join(names)}):", body, "", "", *assign,
             f"jax.jit(f)({', '.join(inline)})"]
    return OperationProgram("\n".join(lines) + "\n", files, True)


def _tree(value: Any, arrays: list) -> str:
    """``value`` written as the callback got it: arrays become the jitted function's arguments (``{0}``...),
    containers keep their shape, other leaves stay Python values."""
    if hasattr(value, "__array__") and hasattr(value, "dtype"):
        arrays.append(value)
        return "{" + str(len(arrays) - 1) + "}"
    if isinstance(value, dict):
        return "{{" + ", ".join(f"{_static(k)}: {_tree(v, arrays)}" for k, v in value.items()) + "}}"
    if isinstance(value, (list, tuple)):
        items = [_tree(v, arrays) for v in value]
        if isinstance(value, list):
            return "[" + ", ".join(items) + "]"
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    return _static(value).replace("{", "{{").replace("}", "}}")


def _static(value: Any) -> str:
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    raise EmitError(f"a {type(value).__name__} argument has no literal")


def _results(failed: FailedCallback) -> list[str]:
    if failed.kind == "jax.debug.callback":
        return []
    shapes = [f"jax.ShapeDtypeStruct({tuple(a.shape)!r}, {dtype_expr(a.dtype)})" for a in failed.result_avals]
    return [shapes[0] if len(shapes) == 1 else "(" + ", ".join(shapes) + ("," if len(shapes) == 1 else "") + ")"]


def _where(location: SourceLocation | None) -> str:
    return f"{os.path.basename(location.file)}:{location.line}" if location else "an unknown place"


def cut_callback(failed: FailedCallback, folder: str, criterion: Criterion, origin: str) -> CutFinished:
    """The reproducer of the host callback that raised, written into ``folder`` and checked here to fail as
    ``criterion`` (an exception's) says."""
    started = time.perf_counter()
    checks = 0
    for program, what in callback_programs(failed, criterion.type or "", origin):
        checks += 1
        files = write_program(program, folder)
        if program_fails(files["repro"], criterion):
            return CutFinished(
                True, checks, 0, reason=what, function=origin, equations=1, primitives=[failed.kind],
                lines=count_lines(program.source), files=files, self_check=True,
                elapsed_s=time.perf_counter() - started,
                criterion=criterion)
    return CutFinished(False, checks, reason=f"the host function of {failed.kind} alone does not raise the same "
                                             "exception")
