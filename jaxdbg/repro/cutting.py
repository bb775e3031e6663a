"""Child side of computation reduction: from a captured jitted call to a written, self-checked reproducer.

Runs inside the contained child of :func:`jaxdbg.repro.jobs.cut_job` (the computation is the user's, so it
stays out of the jaxdbg process). Progress goes to a small file the parent polls: ``"<checks> <size>"``.

Example:
    >>> summary = cut_captured(watch.captured, request, deadline)   # doctest: +SKIP
    >>> summary.equations, summary.self_check                        # doctest: +SKIP
    (1, True)
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import jax
import numpy as np

from jaxdbg._source import SourceLocation
from jaxdbg.repro.cut import CutCheck, CutError, Cutter, inexact
from jaxdbg.repro.frozen import cut_frozen
from jaxdbg.repro.graph import equation_count, flatten, record
from jaxdbg.repro.loops import LOOPS, batched_while, enter_loops
from jaxdbg.repro.messages import CutFinished, FailureSeen
from jaxdbg.repro.program import REPRO_FILE, STABLEHLO_FILE, build_program, can_emit, program_fails, write_program
from jaxdbg.repro.signature import Criterion

# Past the cut's deadline, a candidate still running (one XLA execution: it cannot be interrupted) is abandoned
# after this long, and the best cut found by then is written and sent: the parent would otherwise kill the child
# at its own timeout and lose the cut with it.
OVERRUN_S = 10.0


class OverrunGuard:
    """Sends the best cut so far, once, if the cut runs ``OVERRUN_S`` past its deadline, then ends the child
    (``end``); otherwise :meth:`deliver` sends the cut's own summary.

    Example:
        >>> sent = []
        >>> guard = OverrunGuard(time.perf_counter() + 60, sent.append)
        >>> guard.arm(lambda: CutFinished(False, reason="late"))
        >>> guard.deliver(CutFinished(True)); [m.ok for m in sent]
        [True]
    """

    def __init__(self, at: float, send: Callable[[CutFinished], None], end: Callable[[int], Any] = os._exit):
        self.at, self.send, self.end = at, send, end
        self._claimed = threading.Lock()  # whoever takes it sends the one summary
        self._ended = threading.Event()
        self._timer: threading.Timer | None = None

    def arm(self, late: Callable[[], CutFinished]) -> None:
        def fire() -> None:
            if not self._claimed.acquire(blocking=False):
                return
            try:
                summary = late()
            except Exception as err:  # noqa: BLE001 - the parent must hear why, whatever went wrong
                summary = CutFinished(False, reason=f"the cut ran past its deadline ({type(err).__name__}: {err})")
            self.send(summary)
            sys.stdout.flush()
            sys.stderr.flush()
            self._ended.set()
            self.end(0)  # the candidate still running would hold the child until the parent's kill

        self._timer = threading.Timer(max(self.at - time.perf_counter(), 0.0), fire)
        self._timer.daemon = True
        self._timer.start()

    def deliver(self, summary: CutFinished) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._claimed.acquire(blocking=False):
            self.send(summary)
            return
        self._ended.wait()  # the guard sent the best cut so far and is ending the child


def check_for(failure: FailureSeen, rtol: float, atol: float) -> CutCheck:
    """The in-process check of a candidate for the failure the watch reported."""
    if failure.kind == "nonfinite":
        return CutCheck(Criterion.nonfinite(failure.what or "NaN"))
    if failure.kind == "mismatch":
        return CutCheck(Criterion.mismatch(failure.reference or "op-by-op"), rtol=rtol, atol=atol)
    return CutCheck(Criterion.exception(failure.type, failure.message))


def cut_captured(captured: Any, request: Any, deadline: float, guard: OverrunGuard | None = None) -> CutFinished:
    """Cut the captured computation and write the reproducer files into ``request.work_dir``; ``guard``, if
    given, is armed to send the best cut so far should a candidate run past the deadline."""
    check = check_for(captured.failure, request.rtol, request.atol)
    if getattr(captured, "frozen", None):  # the mismatch is in what Python computed while tracing, not in XLA
        reason = (f"jit froze a value Python computed while tracing: {captured.frozen} differs from one trace of "
                  "the call to the next (a np.random draw, a global or a counter read inside the jitted function "
                  "is a constant of the compiled function; op by op it is computed afresh each call), so no "
                  "computation replays it; pass it in as an argument (a jax.random key for randomness)")
        written = cut_frozen(captured.frozen_call, captured.frozen, f"jit({captured.function})", request.work_dir,
                             request.rtol, request.atol)
        if written is None:
            return CutFinished(False, 0, 0, reason=reason)
        function = captured.frozen_call.function.__name__
        return replace(written, reason=f"{reason}. {REPRO_FILE}: `{function}` alone, jitted and op by op")
    if check.criterion.kind == "nonfinite":
        finite_inputs = all(not inexact(a.dtype) or np.isfinite(a).all() for a in captured.args
                            if hasattr(a, "dtype"))
        check = replace(check, allow_nonfinite_inputs=not finite_inputs)
    graph, consts = flatten(captured.closed_jaxpr)
    recorded = record(graph, captured.args, consts)
    started = time.perf_counter()

    def progress(checks: int, size: int) -> None:
        with open(request.progress_path, "w") as handle:
            handle.write(f"{checks} {size}\n")

    cutter = Cutter(graph, recorded, check, deadline=deadline, on_progress=progress,
                    emittable=lambda cand: can_emit(graph, cand))
    original = equation_count(graph.nodes)
    origin = f"jit({captured.function})"
    if guard is not None:
        guard.arm(lambda: best_so_far(cutter, captured, origin, original, request.work_dir, started))
    try:
        best = cutter.run()
    except CutError as err:
        return CutFinished(False, cutter.stats.checks, original, reason=str(err))
    checks, note, program = cutter.stats.checks, None, None
    inside = enter_loops(graph, recorded, best, check, deadline=deadline, on_progress=progress, emittable=can_emit)
    if inside is not None:  # the loop's body once, at its first failing iteration, if that fails here alone
        checks += inside.checks
        where = "; in it, ".join(e.describe() for e in inside.entered)
        body = build_program(inside.graph, inside.best, check, origin, original,
                             context=f"The failure is born in {where}:\nthis is the loop's body run once, on "
                                     "the inputs of that iteration.")
        files = write_program(body, request.work_dir)
        if program_fails(files["repro"], check.criterion):
            graph, best, program, self_check = inside.graph, inside.best, body, True
            note = (f"{REPRO_FILE} is the loop's body at its first failing iteration ({where}), run once on that "
                    "iteration's inputs (the carry, and a scan's slice), not the whole loop")
    loops = [graph.nodes[i] for i in best.nodes if graph.nodes[i].name in LOOPS]
    if program is None and loops and batched_while(loops[0]):
        note = (f"{REPRO_FILE} keeps the whole loop{_at(loops[0].source)}: vmap gave it a condition per batch "
                "element, so one iteration is its body and a select of the elements still looping")
    elif program is None and loops:
        note = (f"{REPRO_FILE} keeps the whole loop{_at(loops[0].source)}: no single iteration of it fails alone "
                "(e.g. a NaN from an Inf an earlier iteration made, a mismatch that grows over the iterations)")
    if program is None:  # no loop, or its body alone does not fail: the cut as it is, loops whole
        program = build_program(graph, best, check, origin, original)
        files = write_program(program, request.work_dir)
        self_check = program_fails(files["repro"], check.criterion)
    with contextlib.suppress(Exception):  # StableHLO is a bonus; the reproducer stands without it
        files["stablehlo"] = write_stablehlo(program, graph, best, request.work_dir)
    return _finished(captured, graph, best, check, program, files, self_check, checks, original, note, started,
                     cutter.stats.history)


def best_so_far(cutter: Cutter, captured: Any, origin: str, original: int, work_dir: str,
                started: float) -> CutFinished:
    """The smallest cut ``cutter`` has found so far, written and self-checked (no loop entered, no StableHLO):
    what a cut stopped at its deadline still gives."""
    best, check = cutter.best, cutter.check
    if best is None:
        return CutFinished(False, cutter.stats.checks, original,
                           reason=f"a candidate was still running {OVERRUN_S:g} s past the cut's deadline, before "
                                  "any cut was found (raise --max-time)")
    program = build_program(cutter.graph, best, check, origin, original)
    files = write_program(program, work_dir)
    note = (f"the cut stopped at its deadline with a candidate still running: {REPRO_FILE} is the smallest cut "
            "found by then (raise --max-time for a smaller one)")
    return _finished(captured, cutter.graph, best, check, program, files,
                     program_fails(files["repro"], check.criterion), cutter.stats.checks, original, note, started,
                     cutter.stats.history)


def _finished(captured: Any, graph: Any, best: Any, check: CutCheck, program: Any, files: dict[str, str],
              self_check: bool, checks: int, original: int, note: str | None, started: float,
              history: list) -> CutFinished:
    return CutFinished(
        True, checks, original, reason=note, function=captured.function, failure=captured.failure,
        equations=equation_count(graph.nodes[i] for i in best.nodes),
        primitives=[graph.nodes[i].name for i in best.nodes], lines=program.lines, files=files,
        self_check=self_check, elapsed_s=time.perf_counter() - started, history=history,
        criterion=check.criterion,
    )


def _at(source: SourceLocation | None) -> str:
    return f" at {os.path.basename(source.file)}:{source.line}" if source else ""


def write_stablehlo(program: Any, graph: Any, best: Any, folder: str) -> str:
    """``jax.jit(f).lower(*inputs).as_text()`` of the emitted function, next to the reproducer."""
    namespace: dict = {}
    exec(compile(program.function.module_source(), "<repro>", "exec"), namespace)  # noqa: S102 - our own code
    values = [best.values[v] for v in best.inputs(graph)]
    path = os.path.join(folder, STABLEHLO_FILE)
    with open(path, "w") as handle:
        handle.write(jax.jit(namespace["f"]).lower(*values).as_text())
    return path
