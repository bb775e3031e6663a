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
import time
from dataclasses import replace
from typing import Any

import numpy as np

from jaxdbg.repro.cut import Criterion, CutError, Cutter, inexact
from jaxdbg.repro.graph import flatten, record
from jaxdbg.repro.messages import CutFinished, FailureSeen
from jaxdbg.repro.program import INPUTS_FILE, REPRO_FILE, STABLEHLO_FILE, build_program, can_emit, program_fails
from jaxdbg.repro.signature import normalise_message


def criterion_for(failure: FailureSeen, rtol: float, atol: float) -> Criterion:
    """The in-process test that matches a failure the watch reported."""
    if failure.kind == "nonfinite":
        return Criterion("nonfinite", what=failure.what or "NaN")
    if failure.kind == "mismatch":
        return Criterion("mismatch", rtol=rtol, atol=atol)
    return Criterion("exception", exc_type=failure.type, exc_message=normalise_message(failure.message))


def cut_captured(captured: Any, request: Any, deadline: float) -> CutFinished:
    """Cut the captured computation and write the reproducer files into ``request.work_dir``."""
    criterion = criterion_for(captured.failure, request.rtol, request.atol)
    if getattr(captured, "frozen", None):  # the mismatch is in what Python computed while tracing, not in XLA
        reason = (f"jit froze a value Python computed while tracing: {captured.frozen} differs from one trace of "
                  "the call to the next (a np.random draw, a global or a counter read inside the jitted function "
                  "is a constant of the compiled function; op by op it is computed afresh each call), so no "
                  "computation replays it; pass it in as an argument (a jax.random key for randomness)")
        from jaxdbg.repro.frozen import cut_frozen  # (it writes its program with this module's write_program)

        written = cut_frozen(captured.frozen_call, captured.frozen, f"jit({captured.function})", request.work_dir,
                             request.rtol, request.atol)
        if written is None:
            return CutFinished(False, 0, 0, reason=reason)
        function = captured.frozen_call.function.__name__
        return replace(written, reason=f"{reason}. {REPRO_FILE}: `{function}` alone, jitted and op by op")
    if criterion.kind == "nonfinite":
        finite_inputs = all(not inexact(a.dtype) or np.isfinite(a).all() for a in captured.args
                            if hasattr(a, "dtype"))
        criterion = Criterion("nonfinite", what=criterion.what, allow_nonfinite_inputs=not finite_inputs)
    graph, consts = flatten(captured.closed_jaxpr)
    recorded = record(graph, captured.args, consts)
    started = time.perf_counter()

    def progress(checks: int, size: int) -> None:
        with open(request.progress_path, "w") as handle:
            handle.write(f"{checks} {size}\n")

    cutter = Cutter(graph, recorded, criterion, deadline=deadline, on_progress=progress,
                    emittable=lambda cand: can_emit(graph, cand))
    try:
        best = cutter.run()
    except CutError as err:
        return CutFinished(False, cutter.stats.checks, len(graph.nodes), reason=str(err))
    origin = f"jit({captured.function})"
    program = build_program(graph, best, criterion, origin, len(graph.nodes))
    files = write_program(program, request.work_dir)
    self_check = program_fails(files["repro"], criterion)
    with contextlib.suppress(Exception):  # StableHLO is a bonus; the reproducer stands without it
        files["stablehlo"] = write_stablehlo(program, graph, best, request.work_dir)
    return CutFinished(
        True, cutter.stats.checks, len(graph.nodes), function=captured.function, failure=captured.failure,
        equations=len(best.nodes), primitives=[graph.nodes[i].name for i in best.nodes], lines=program.lines,
        files=files, self_check=self_check, elapsed_s=time.perf_counter() - started, history=cutter.stats.history,
        criterion={"kind": criterion.kind, "what": criterion.what, "type": criterion.exc_type,
                   "message": criterion.exc_message},
    )


def write_program(program: Any, folder: str) -> dict[str, str]:
    files = {"repro": os.path.join(folder, REPRO_FILE)}
    with open(files["repro"], "w") as handle:
        handle.write(program.source)
    if program.arrays:
        files["inputs"] = os.path.join(folder, INPUTS_FILE)
        np.savez(files["inputs"], **program.arrays)
    return files


def write_stablehlo(program: Any, graph: Any, best: Any, folder: str) -> str:
    """``jax.jit(f).lower(*inputs).as_text()`` of the emitted function, next to the reproducer."""
    import jax

    namespace: dict = {}
    exec(compile(program.function.module_source(), "<repro>", "exec"), namespace)  # noqa: S102 - our own code
    values = [best.values[v] for v in best.inputs(graph)]
    path = os.path.join(folder, STABLEHLO_FILE)
    with open(path, "w") as handle:
        handle.write(jax.jit(namespace["f"]).lower(*values).as_text())
    return path
