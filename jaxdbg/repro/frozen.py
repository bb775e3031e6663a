"""A value jit froze at trace time, shown standalone: the user's function that computes it, jit vs op by op.

:mod:`jaxdbg.repro.purity` finds that two traces of the failing call differ in a constant and names the line
that uses it (``select_n`` at train.py:23, inside ``dropout``). No cut of the captured computation can show
that (the value is a constant there). What shows it is the user's function holding that line, written alone
(:mod:`jaxdbg.repro.standalone`), called jitted and op by op (``jax.disable_jit``) on arrays of the shapes and
dtypes it was traced with: jitted twice it repeats itself, and the same check as every mismatch reproducer
fails: jitted and op by op disagree, as in the original. The call is recorded by tracing once more under a
profiler that notes the first call of that function (its tracers' shapes and dtypes, its other arguments'
values).

Example:
    >>> import jax, jax.numpy as jnp, numpy as np
    >>> def dropout(x, rate):
    ...     return jnp.where(np.random.rand(*x.shape) >= rate, x, 0.0)
    >>> step = lambda x: dropout(x, 0.5) * 2
    >>> where = SourceLocation(dropout.__code__.co_filename, dropout.__code__.co_firstlineno + 1, "dropout")
    >>> call = record_call(where, lambda: jax.make_jaxpr(step)(jnp.ones(8)))
    >>> call.function is dropout, [(name, str(value)) for name, value, _ in call.arguments]
    (True, [('x', 'float32[8]'), ('rate', '0.5')])
"""

from __future__ import annotations

import gc
import inspect
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from jaxdbg._source import SourceLocation
from jaxdbg.jaxpr.emit import EmitError, array_expr, dtype_expr
from jaxdbg.repro.call_program import OperationProgram
from jaxdbg.repro.cut import CutCheck
from jaxdbg.repro.messages import CutFinished
from jaxdbg.repro.program import REPRO_FILE, check_lines, count_lines, program_fails, write_program
from jaxdbg.repro.signature import Criterion
from jaxdbg.repro.standalone import NotStandalone, Standalone, literal, standalone

_RESERVED = {"jax", "jnp", "np", "f", "out", "ref"}
# Jitted twice, the function repeats the value of its trace (op by op, a new one each call: the check after it).
_TWICE = ("assert np.array_equal(jax.jit(f)({args}), jax.jit(f)({args}), equal_nan=True), "
          '"jit computes the value afresh"')
FILLS = ("np.ones", "np.random.default_rng(0).standard_normal")  # tried in turn for a traced argument


@dataclass(frozen=True)
class FrozenCall:
    """The first call of the user's function holding the frozen line, as tracing made it."""

    function: Any
    arguments: list  # (parameter name, value, traced): a traced argument's value is its aval (shape, dtype)
    line: int


def record_call(location: SourceLocation, trace: Callable[[], Any]) -> FrozenCall | None:
    """Run ``trace`` (one more trace of the failing call) noting the first call of the function of the user's
    that holds ``location``; None when it was not called or its arguments cannot be read."""
    seen: list = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        code = frame.f_code
        if (event == "call" and not seen and code.co_name == location.function
                and code.co_filename == location.file and any(ln == location.line for _, _, ln in code.co_lines())):
            seen.append((code, dict(frame.f_locals)))

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        trace()
    finally:
        sys.setprofile(previous)
    if not seen:
        return None
    code, local = seen[0]
    function = next((f for f in gc.get_referrers(code) if inspect.isfunction(f) and f.__code__ is code), None)
    if function is None:
        return None
    arguments = []
    for name, param in inspect.signature(function).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) or name not in local:
            return None
        value = local[name]
        traced = isinstance(value, jax.core.Tracer)
        arguments.append((name, value.aval if traced else value, traced))
    return FrozenCall(function, arguments, location.line)


def frozen_programs(call: FrozenCall, alone: Standalone, check: CutCheck, doc: str) -> Iterator[OperationProgram]:
    """The function alone, jitted vs op by op, on ones of the traced shapes, then on normal draws."""
    kinds = {p.name: p.kind for p in inspect.signature(call.function).parameters.values()}
    for fill in FILLS:
        params, assign, passed = [], [], []
        for name, value, traced in call.arguments:
            spelled = name if name not in _RESERVED and name != alone.name else f"{name}_"
            try:
                if traced:
                    expression = f"{fill}({tuple(value.shape)!r}).astype({dtype_expr(value.dtype)})"
                    params.append(spelled)
                    assign.append(f"{spelled} = {expression}")
                    text = spelled
                elif hasattr(value, "__array__") and hasattr(value, "dtype"):
                    params.append(spelled)
                    assign.append(f"{spelled} = {array_expr(np.asarray(value))}")
                    text = spelled
                else:
                    text = literal(value)
            except (EmitError, NotStandalone):
                return
            passed.append(f"{name}={text}" if kinds[name] is inspect.Parameter.KEYWORD_ONLY else text)
        args = ", ".join(params)
        defined = [row for row in alone.text().splitlines() if row not in ("import jax", "import numpy as np")]
        lines = [doc + "import jax\nimport numpy as np", *defined, "", "", f"def f({args}):",
                 f"    return {alone.name}({', '.join(passed)})", "", "", *assign, _TWICE.format(args=args),
                 *check_lines(check, args)]
        yield OperationProgram("\n".join(lines) + "\n", {}, False)


def cut_frozen(call: FrozenCall | None, what: str, origin: str, folder: str, rtol: float,
               atol: float) -> CutFinished | None:
    """The reproducer of a frozen value (see the module docstring), written into ``folder`` and checked here
    to fail as a mismatch does; None when the function cannot be written alone or does not show it."""
    if call is None:
        return None
    started = time.perf_counter()
    try:
        alone = standalone(call.function, call.line)
    except (NotStandalone, SyntaxError):
        return None
    check = CutCheck(Criterion.mismatch(), rtol=rtol, atol=atol)
    where = f"{call.function.__code__.co_filename.rpartition('/')[2]}:{call.line}"
    doc = (f'"""jaxdbg repro: jit and op-by-op (jax.disable_jit) disagree in {origin}: {what}.\n\n'
           f'`{call.function.__name__}` computes it with Python while jit traces it ({where}): jit keeps the value of '
           f'its trace,\nop by op it is computed afresh each call. This is that function alone, jitted and op by op, '
           f'on\narrays of the shapes and dtypes it was traced with.\n\n'
           f'`python {REPRO_FILE}` fails with AssertionError ("{check.criterion.assertion()}") while the bug is '
           f'present.\n"""\n')
    for checks, program in enumerate(frozen_programs(call, alone, check, doc), start=1):
        files = write_program(program, folder)
        if program_fails(files["repro"], check.criterion):
            primitive = re.search(r"`(\w+)`", what)
            return CutFinished(
                True, checks, 0, function=origin, equations=1, primitives=[primitive.group(1) if primitive else
                                                                          call.function.__name__],
                lines=count_lines(program.source), files=files, self_check=True,
                elapsed_s=time.perf_counter() - started,
                criterion=check.criterion)
    return None
