"""``profile(spec, options, out_dir)``: run the target contained, then build the :class:`ProfileResult`.

The parent never runs user code: the job runs in a child (:mod:`jaxdbg.profile.jobs`), and the parent
reads what it sent, the capture it left (per-op tables, Perfetto copy) and the HLO it wrote.

Example:
    >>> from jaxdbg.target import parse_target
    >>> run = profile(parse_target("train.py"), ProfileOptions(), "out")     # doctest: +SKIP
    >>> run.exit_code, run.result.totals.compile_s                           # doctest: +SKIP
    (0, 1.25)
"""

from __future__ import annotations

import dataclasses
import os
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from jaxdbg._errors import EXIT_FOUND, EXIT_OK, EXIT_TARGET_FAILED
from jaxdbg._source import is_jaxdbg_file
from jaxdbg.launch import XLA_FLAGS_VARIABLE
from jaxdbg.outcomes import failure_line, raise_internal_failure, raise_usage_from_child
from jaxdbg.profile.assemble import Gathered
from jaxdbg.profile.budget import check_budget, parse_budget
from jaxdbg.profile.compare import compare, load_baseline, other_target_note
from jaxdbg.profile.hints import hints_for, notes_for
from jaxdbg.profile.messages import CaptureOps, JobCapture, ProfileJob
from jaxdbg.profile.model import DeviceExecutions, FunctionProfile, ProfileMode, ProfileResult, Rates
from jaxdbg.profile.monitor import monitor_hints, series
from jaxdbg.profile.peaks import Peak, achieved_rates, dtype_class, table_peak
from jaxdbg.profile.processes import failure_hints, find_stragglers, step_skew_s
from jaxdbg.profile.trace import write_perfetto
from jaxdbg.report import process_folder
from jaxdbg.runner import Outcome, run_contained
from jaxdbg.target import TargetSpec, check_inputs


@dataclass(frozen=True)
class ProfileOptions:
    """Everything ``jaxdbg profile`` can be asked, with the command line's defaults."""

    runs: int = 20
    warmup: int = 3
    top: int = 10
    trace_calls: int = 10
    xla_dump: bool = False
    monitor: bool = False
    monitor_interval: float = 0.1
    budget: str | None = None
    compare: str | None = None
    args: str | None = None
    inputs: str | None = None
    seed: int = 0
    timeout: float | None = None
    calibrate: bool = True
    python_tracer: bool = False
    command_buffers: bool = False  # keep XLA:GPU's command buffers during the capture (see child_xla_flags)
    sync_every: int = 8  # script mode: after the first calls, time one call in this many (Recorder.sampled)


@dataclass(frozen=True)
class ProfileRun:
    result: ProfileResult
    exit_code: int
    artifacts: dict[str, str] = field(default_factory=dict)
    outcome: Outcome | None = None
    environment: dict | None = None  # the target's jax, backend and devices, as the child saw them


def profile(spec: TargetSpec, options: ProfileOptions, out_dir: str) -> ProfileRun:
    """Profile a script or function TARGET; bad options raise UsageError before anything runs."""
    rules = parse_budget(options.budget)
    baseline = load_baseline(options.compare) if options.compare else None
    check_inputs(spec, options.inputs, options.args)
    out_dir = os.path.abspath(out_dir)
    artifacts: dict[str, str] = {}
    dump = os.path.join(out_dir, "xla_dump") if options.xla_dump else None
    flags, command_buffers_off = child_xla_flags(os.environ.get("XLA_FLAGS", ""), options, dump)
    env = {XLA_FLAGS_VARIABLE: flags}
    if dump:
        artifacts["xla_dump"] = dump
    outcome = run_contained(ProfileJob(spec, options, out_dir), timeout=options.timeout, env=env,
                            sigterm_as_timeout=True)
    raise_usage_from_child(outcome)
    raise_internal_failure(outcome, spec, options)
    mode: ProfileMode = "script" if spec.is_script else "function"
    gathered = Gathered.from_messages(outcome.messages)
    functions = gathered.functions(mode)
    trace = gathered.trace
    if trace is not None:
        trace = write_perfetto(trace)
    if gathered.ops:
        functions = attach_ops(functions, gathered.ops, options.top, str(gathered.device.get("backend", "")))
    peak = _peak(gathered)
    functions = [dataclasses.replace(f, rates=_rates(f, peak or _table(gathered, f))) for f in functions]
    totals = gathered.totals_for(functions, outcome.elapsed_s, mode)
    budget = check_budget(rules, tuple(functions), totals)
    error, error_source = failure_line(outcome, gathered.trace_errors)
    stragglers, straggler_hints = find_stragglers(list(gathered.job))
    other = other_target_note(baseline, spec.text) if baseline is not None else None
    other_target = (other,) if other else ()
    eager = gathered.eager_compile()
    monitor = series(gathered.monitor, options.monitor_interval)
    notes = notes_for(mode, functions, gathered, error, command_buffers_off, stopped_in_jitted_call(outcome))
    syncs = gathered.syncs()
    pipeline = gathered.input_pipeline(syncs) if mode == "script" else None
    result = ProfileResult(
        mode=mode, functions=tuple(functions), totals=totals, budget=budget, error=error, error_source=error_source,
        notes=notes + other_target,
        hints=failure_hints(list(gathered.job)) + hints_for(functions, totals, gathered.transfers(), eager, pipeline)
        + straggler_hints
        + monitor_hints(monitor),
        transfers=tuple(gathered.transfers()), syncs=tuple(syncs), input_pipeline=pipeline, eager_compile=eager,
        trace=trace,
        monitor=monitor,
        comparison=compare(baseline, tuple(functions), totals) if baseline is not None else None,
        device=gathered.device, processes=gathered.job, stragglers=stragglers,
        step_skew_s=step_skew_s(list(gathered.job)),
    )
    artifacts.update(_artifacts(result, outcome, str(process_folder(Path(out_dir), gathered.environment))))
    session = outcome.last(JobCapture)
    if session is not None:  # process 0 of a job: every process's capture as one xprof session
        artifacts["job_trace_dir"] = session.logdir
    code = EXIT_TARGET_FAILED if error else (EXIT_FOUND if not budget.ok else EXIT_OK)
    return ProfileRun(result, code, artifacts, outcome, gathered.environment)


def child_xla_flags(flags: str, options: ProfileOptions, dump: str | None) -> tuple[str, bool]:
    """The XLA flags jaxdbg adds for the profiled process, and whether it turned XLA:GPU's command buffers off.

    Kernels that XLA:GPU runs inside a command buffer (a CUDA graph; loop bodies and runs of fusions by default)
    reach the profiler without their HLO op, so xprof's per-op table loses them (openxla/xprof#3070): a
    while-loop of matmuls shows no matmul at all. With a capture to take, jaxdbg turns command buffers off
    unless the user set the flag or asked to keep them (``--command-buffers``). CPU ignores the flag.

    The child appends them to the program's own XLA_FLAGS as its backend starts (launch.XLA_FLAGS_VARIABLE).

        >>> child_xla_flags("", ProfileOptions(), None)
        ('--xla_gpu_enable_command_buffer=', True)
    """
    off = options.trace_calls > 0 and not options.command_buffers and "xla_gpu_enable_command_buffer" not in flags
    added = "--xla_gpu_enable_command_buffer=" if off else ""
    if dump:
        added = f"{added} --xla_dump_to={dump} --xla_dump_hlo_as_text"
    return added.strip(), off


_STACK_FILE = re.compile(r'File "([^"]+)", line \d+')  # a traceback's and faulthandler's frames alike


def stopped_in_jitted_call(outcome: Outcome) -> bool:
    """Whether the target failed or was stopped inside a jitted call: the jit layer's wrapper is on the stack
    of the exception (its traceback) or of the crash or hang (faulthandler's dump on stderr). A script that
    exits in its argument parsing has only defined jitted functions (its own, or those of a library it
    imported), which says nothing about where it stopped."""
    if outcome.ok:
        return False
    text = outcome.exception.traceback if outcome.exception is not None else outcome.stderr
    return any(os.path.basename(path) == "jit_layer.py" and is_jaxdbg_file(path)
               for path in _STACK_FILE.findall(text or ""))


def _rates(function: FunctionProfile, peak: Peak | None) -> Rates | None:
    """Achieved rates from cost analysis, with the matmuls of loops counted as often as they run."""
    from jaxdbg.profile.hlo import loop_note
    from jaxdbg.profile.loops import loop_matmul_flops

    cost = function.cost
    path = function.hlo.get("optimized_hlo")
    if not cost or not path or not os.path.exists(path):
        return achieved_rates(cost, function.execute.median_s, peak)
    with open(path) as handle:
        text = handle.read()
    loops, reported = loop_matmul_flops(text), cost.get("flops") or 0.0
    executed = loops.corrected(reported) if loops is not None else reported
    if executed > reported:
        cost = {**cost, "flops": executed}
    note = loop_note(text, (reported, executed) if executed > reported else None)
    rates = achieved_rates(cost, function.execute.median_s, peak)
    return dataclasses.replace(rates, note=note) if rates is not None and note else rates


def _peak(gathered: Gathered) -> Peak | None:
    return gathered.peak if isinstance(gathered.peak, Peak) else None


def _table(gathered: Gathered, function: FunctionProfile) -> Peak | None:
    return table_peak(gathered.device.get("kind", "") if gathered.device else "",
                      dtype_class(gathered.dtypes(function.name)))


def attach_ops(functions: list[FunctionProfile], captured: CaptureOps, top: int,
               backend: str = "") -> list[FunctionProfile]:
    """Per-op tables for each function from the per-op totals the child read from the capture, and for a function
    run on several devices each device's executions.

    ``captured.by_prefix``: xprof's hlo_stats keyed by framework-op prefix (``jit(train_step)``), used
    first; ``captured.by_module``: the capture's own op events keyed by HLO module (``jit_train_step``)."""
    from jaxdbg.profile.collectives import read_specs
    from jaxdbg.profile.hlo import parse_hlo
    from jaxdbg.profile.hlo_files import later_compiles
    from jaxdbg.profile.ops import assign_programs, function_ops, merged_ops

    if top <= 0:
        return functions
    modules = []
    for function in functions:
        module = None
        path = function.hlo.get("optimized_hlo")
        if path and os.path.exists(path):
            with open(path) as handle:
                module = parse_hlo(handle.read())
            if function.hlo.get("shardings"):
                read_specs(module, function.hlo["shardings"])
            # The capture names every compile's ops by the one module name (jit_update): an op only a later
            # compile has (a static argument's other branch) takes its category and line from that compile.
            for later in later_compiles(path, function.compiles or 0):
                with open(later) as handle:
                    for op_name, op in parse_hlo(handle.read()).ops.items():
                        module.ops.setdefault(op_name, op)
        modules.append((function.module or (module.name if module else f"jit_{function.name}"), module))
    # every program the capture holds under a function's module name, recompiles included; programs of one name
    # that several functions ran (jax.jit(loss) and jax.jit(jax.value_and_grad(loss))) to the one they match
    programs = assign_programs(modules, captured.by_module)
    updated = []
    for function, (name, module), keys in zip(functions, modules, programs):
        ran = {name: merged_ops(captured.by_module, keys)} if keys else {}
        rows, scopes, source = function_ops(function.name, name, module, captured.by_prefix, ran, top)
        per_device: dict = {}
        for key in keys:
            for device, runs in captured.per_device.get(key, {}).items():
                per_device.setdefault(device, []).extend(runs)
        devices = device_executions(per_device, backend)
        updated.append(dataclasses.replace(function, ops=rows, scopes=scopes, ops_source=source, devices=devices))
    return updated


def device_executions(per_device: dict[int, list[float]], backend: str) -> tuple[DeviceExecutions, ...]:
    """Each device's executions of one program, in device order.

        >>> device_executions({1: [0.002, 0.004], 0: [0.001, 0.001]}, "cpu")[1]
        DeviceExecutions(device='cpu:1', executions=2, median_s=0.003, total_s=0.006)
    """
    return tuple(DeviceExecutions(f"{backend or 'device'}:{ordinal}", len(runs), float(statistics.median(runs)),
                                  float(sum(runs)))
                 for ordinal, runs in sorted(per_device.items()) if runs)


def _artifacts(result: ProfileResult, outcome: Outcome, out_dir: str) -> dict[str, str]:
    found: dict[str, str] = {}
    if result.trace is not None:
        found["trace_dir"] = result.trace.logdir
        for key in ("xplane", "trace_json", "perfetto"):
            value = getattr(result.trace, key)
            if value:
                found[key] = value
    for function in result.functions:
        for kind, path in function.hlo.items():
            found[f"{function.name}.{kind}"] = path
    for stream in ("stdout", "stderr"):
        text = getattr(outcome, stream)
        if text:
            os.makedirs(out_dir, exist_ok=True)  # a process whose program failed before any capture has none yet
            path = os.path.join(out_dir, f"target.{stream}.txt")
            with open(path, "w") as handle:
                handle.write(text)
            found[f"target_{stream}"] = path
    return found
