"""``memory(spec, options, out_dir)``: run the target contained, then build the :class:`MemoryResult`.

The parent never runs user code: the job runs in a child (:mod:`jaxdbg.memory.jobs`) and sends what it finds
as it goes (:mod:`jaxdbg.memory.messages`); the parent assembles the report, checks the budget, writes the
CSV files and the pictures.

Example:
    >>> from jaxdbg.target import parse_target
    >>> run = memory(parse_target("train.py"), MemoryOptions(device_memory=16 * 2**30), "out")   # doctest: +SKIP
    >>> run.exit_code, run.result.peak.function                                                   # doctest: +SKIP
    (1, 'train_step')
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from jaxdbg._errors import EXIT_FOUND, EXIT_OK, EXIT_TARGET_FAILED
from jaxdbg.memory import budget as memory_budget
from jaxdbg.memory.hints import hints_for
from jaxdbg.memory.messages import (
    Devices,
    FinalLive,
    JobMemory,
    LeaksFound,
    MemoryJob,
    MemoryNote,
    MemoryOptions,
    OutOfMemoryFound,
    ProgramAnalysed,
    SampleRow,
    Samples,
    ThreadedArguments,
)
from jaxdbg.memory.output import load_matplotlib, write_html, write_png, write_samples_csv, write_tables
from jaxdbg.memory.result import Budget, BudgetOrigin, DeviceMemory, Held, MemoryResult, ProgramMemory
from jaxdbg.memory.units import format_bytes
from jaxdbg.outcomes import failure_line, raise_internal_failure, raise_usage_from_child
from jaxdbg.protocol import Environment
from jaxdbg.report import process_folder
from jaxdbg.runner import Outcome, run_contained
from jaxdbg.target import TargetSpec, check_target


@dataclass(frozen=True)
class MemoryRun:
    result: MemoryResult
    exit_code: int
    artifacts: dict[str, str] = field(default_factory=dict)
    outcome: Outcome | None = None
    environment: dict | None = None


def memory(spec: TargetSpec, options: MemoryOptions, out_dir: str) -> MemoryRun:
    """Measure what fills device memory in a script or function TARGET; bad options raise UsageError first."""
    from jaxdbg.target import check_inputs

    rules = memory_budget.parse_budget(options.budget)
    check_inputs(spec, options.inputs, options.args)
    check_target(spec)  # a syntax error or a missing function is bad input (exit 2), found without a child
    out_dir = os.path.abspath(out_dir)
    dump = os.path.join(out_dir, "xla_dump")
    loading = load_matplotlib() if options.plot else None  # meanwhile: the picture's import is off the path
    outcome = run_contained(MemoryJob(spec, options, out_dir, dump), timeout=options.timeout,
                            sigterm_as_timeout=True)
    raise_usage_from_child(outcome)
    raise_internal_failure(outcome, spec, options)
    result = assemble(outcome, options, rules)
    environment = outcome.last(Environment)
    env = environment.info if environment is not None else None
    folder = str(process_folder(Path(out_dir), env))
    os.makedirs(folder, exist_ok=True)
    if loading is not None:
        loading.join()
    artifacts, failed = write_artifacts(result, _rows(outcome), folder, spec.display_name, options.plot)
    if failed:
        result = dataclasses.replace(result, notes=result.notes + tuple(failed))
    artifacts["xla_dump"] = dump
    for stream in ("stdout", "stderr"):
        text = getattr(outcome, stream)
        if text:
            artifacts[f"target_{stream}"] = os.path.join(folder, f"target.{stream}.txt")
            Path(artifacts[f"target_{stream}"]).write_text(text)
    return MemoryRun(result, exit_code(result), artifacts, outcome, env)


def exit_code(result: MemoryResult) -> int:
    """1: something does not fit, a leak, an explained out-of-memory error, a broken budget; 3: the target failed
    otherwise; 0: everything fits."""
    if result.found:
        return EXIT_FOUND
    return EXIT_TARGET_FAILED if result.error else EXIT_OK


def _rows(outcome: Outcome) -> list[SampleRow]:
    return [row for batch in outcome.all(Samples) for row in batch.rows]


def assemble(outcome: Outcome, options: MemoryOptions, rules: tuple) -> MemoryResult:
    """The result from the child's messages."""
    programs = _programs(outcome)
    rows = _rows(outcome)
    peaks = [batch for batch in outcome.all(Samples) if batch.peak is not None]
    peak = peaks[-1].peak if peaks else None
    live_at_peak = peaks[-1].live_at_peak if peaks else ()
    leaks = tuple(leak for batch in outcome.all(LeaksFound)[-1:] for leak in batch.leaks)
    oom_message = outcome.last(OutOfMemoryFound)
    oom = oom_message.oom if oom_message is not None else None
    devices_message = outcome.last(Devices)
    devices = _devices(rows, devices_message)
    budget_bytes, origin = _budget(options, devices_message)
    misfits = tuple(p.name for p in programs if p.fits is False)
    final = outcome.last(FinalLive)
    run_figures = {"peak_bytes": peak.bytes if peak else None,
                   "live_bytes": max((d.peak_live_bytes for d in devices), default=None),
                   "leaked_bytes": sum(leak.bytes for leak in leaks)}
    violations = memory_budget.check_budget(rules, programs, run_figures)
    budget = Budget(budget_bytes, origin, misfits, not violations, violations, tuple(str(r) for r in rules))
    error, error_source = (None, None) if oom is not None else failure_line(outcome)
    notes = tuple(n.text for n in outcome.all(MemoryNote)) + _notes(outcome, programs, final, devices_message)
    job = outcome.last(JobMemory)
    # process 0's report speaks for the job: what another process found is found (and exits 1) here too
    elsewhere = any(row.leaks or row.out_of_memory or row.misfits for row in (job.rows if job else ()))
    found = bool(oom or misfits or leaks or violations or elsewhere)
    return MemoryResult(
        found=found, functions=tuple(programs), devices=tuple(devices), peak=peak, live_at_peak=tuple(live_at_peak),
        leaks=leaks, out_of_memory=oom, budget=budget,
        hints=hints_for(programs, leaks, oom, len(devices_message.devices) if devices_message else 1,
                        devices_message.backend if devices_message else "", peak.bytes if peak else None),
        notes=notes, samples=len(rows), processes=job.rows if job else (), error=error, error_source=error_source)


def _programs(outcome: Outcome) -> list[ProgramMemory]:
    """Every analysed compile, with the arguments the run turned out to thread through each function."""
    seen = {m.function: m for m in outcome.all(ThreadedArguments)}  # each message holds what was seen so far
    return [_with_threading(m.program, seen.get(m.program.name)) for m in outcome.all(ProgramAnalysed)]


def _with_threading(program: ProgramMemory, seen: ThreadedArguments | None) -> ProgramMemory:
    """Mark the held arguments the loop fed with the function's own outputs; drop those passed again as they
    were (the caller keeps them: not donatable). ``filter_jit`` packs every argument into one inner argument:
    its held arrays become one entry named after the user's arguments the loop threads."""
    if seen is None:
        return program
    fed, kept = set(seen.argnums), set(seen.reused) - set(seen.argnums)
    names = seen.names
    again = tuple(names[i] for i in sorted(kept) if i < len(names))
    if program.jit == "eqx.filter_jit":
        size, leaves = sum(h.bytes for h in program.held), sum(h.leaves for h in program.held)
        threaded_names = ", ".join(names[i] for i in sorted(fed) if i < len(names)) or "its arguments"
        held: tuple[Held, ...] = (Held(threaded_names, None, size, leaves, bool(fed)),) if size else ()
    else:
        held = tuple(dataclasses.replace(h, threaded=h.threaded or h.argnum in fed) for h in program.held
                     if h.argnum not in kept)
    return dataclasses.replace(program, held=held, passed_again=again)


def _devices(rows: list[SampleRow], devices: Devices | None) -> list[DeviceMemory]:
    names = list(devices.devices) if devices else []
    for row in rows:
        names.extend(d for d in row.live if d not in names)
    limits = devices.limits if devices else {}
    found = []
    for name in names:
        live = [row.live.get(name, 0) for row in rows]
        estimate = [row.estimate.get(name, 0) for row in rows]
        measured = [row.peak_in_use[name] for row in rows if name in row.peak_in_use]
        found.append(DeviceMemory(name, limits.get(name), max(live, default=0), max(estimate, default=0),
                                  max(measured) if measured else None, live[-1] if live else 0))
    return found


def _budget(options: MemoryOptions, devices: Devices | None) -> tuple[int | None, BudgetOrigin]:
    if options.device_memory is not None:
        return options.device_memory, "--device-memory"
    limits = list(devices.limits.values()) if devices else []
    return (min(limits), "device limit") if limits else (None, "none")


def _notes(outcome: Outcome, programs: list[ProgramMemory], final: FinalLive | None,
           devices: Devices | None) -> tuple[str, ...]:
    notes = []
    if devices is None and outcome.ok:
        notes.append("no jitted function ran: nothing was measured (jaxdbg memory follows jax.jit and jax.pmap calls)")
    if devices is not None and devices.backend == "cpu" and not any(p.fits is not None for p in programs):
        notes.append("CPU devices report no memory limit: give --device-memory to check a GPU/TPU budget ahead")
    later = [p for p in programs if p.compile_index > 0]
    if later:
        notes.append(f"{len(later)} recompile(s) were analysed after they ran (first compiles are analysed before)")
    if final is not None and final.groups:
        kept = sum(g.bytes for g in final.groups)
        notes.append(f"when the run ended, {len(final.groups)} producer group(s) still held live arrays "
                     f"({format_bytes(kept)} over every device)")
    return tuple(notes)


def write_artifacts(result: MemoryResult, rows: list[SampleRow], folder: str, title: str,
                    plot: bool) -> tuple[dict[str, str], list[str]]:
    """CSV tables and memory.html always; memory.png (with matplotlib) when ``plot``; and what failed to be
    written, as notes (the answer stands without its files). memory.png is asked for: importing matplotlib and
    drawing cost about a second of CPU, a fifth of a short run on two cores, where the page costs milliseconds."""
    artifacts: dict[str, str] = {}
    failed: list[str] = []
    Writer = Callable[[], dict[str, str | None]]
    writers: list[tuple[str, Writer]] = [
        ("samples_csv", lambda: {"samples_csv": write_samples_csv(rows, folder)}),
        ("tables", lambda: {f"{name}_csv": path for name, path in write_tables(result, folder).items()}),
        ("html", lambda: {"html": write_html(result, rows, os.path.join(folder, "memory.html"), title)})]
    if plot:
        writers.append(("plot", lambda: {"plot": write_png(result, rows, os.path.join(folder, "memory.png"))}))
    for name, write in writers:
        try:
            artifacts.update({key: path for key, path in write().items() if path})
        except Exception as err:  # noqa: BLE001 - no answer lost for a file that could not be written
            failed.append(f"writing {name} failed: {type(err).__name__}: {err}")
    return artifacts, failed
