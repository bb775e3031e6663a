"""A capture's :class:`~jaxdbg.profile.model.ProfileResult`: the same per-op tables, step breakdown and hints
as a profiled run, read from xplane files alone.

Per process (one xplane file): every jitted program that ran in the window becomes a function (``jit_step``
-> ``step``) with its execution statistics and its per-op table (:func:`jaxdbg.profile.ops.function_ops`,
shared with a profiled run: xprof's hlo_stats off CPU, the XLA:CPU op events on CPU). Source lines come from
the program's optimised HLO, which xprof's own graph_viewer converter returns from the capture with its
stack-frame tables. What a capture cannot know (compile times, recompile causes, cost analysis) is None.

Example:
    >>> run = profile_capture("out", from_capture="logdir")                             # doctest: +SKIP
    >>> result = capture_result("out/capture/plugins/profile/run", "capture", top=10)   # doctest: +SKIP
    >>> result.functions[0].ops[0].source                                              # doctest: +SKIP
    SourceLocation(file='train.py', line=12, function='loss')
"""

from __future__ import annotations

import bisect
import glob
import itertools
import json
import os
from typing import Any

from jaxdbg._errors import EXIT_FOUND, EXIT_OK, UsageError
from jaxdbg.profile.assemble import duration_stats
from jaxdbg.profile.budget import BudgetRule, check_budget, parse_budget
from jaxdbg.profile.capture import attach, copy_run, find_run, host_label, parse_addresses
from jaxdbg.profile.hints import op_hints
from jaxdbg.profile.hlo import HloModule, parse_hlo
from jaxdbg.profile.model import (
    CaptureHost,
    CaptureInfo,
    CaptureSource,
    ExecuteStats,
    FunctionProfile,
    ProfileResult,
    StepFigures,
    Totals,
    TraceFiles,
)
from jaxdbg.profile.ops import (
    XplaneEvents,
    function_ops,
    module_of,
    quiet_native_stderr,
    read_xplane,
    xprof_hlo_stats,
)
from jaxdbg.profile.run import ProfileRun
from jaxdbg.profile.spans import union_length

HOST_BOUND_FRACTION = 0.3  # a step that spends this share outside its programs waits on the host
IDLE = "no jitted program ran during the capture: capture while the job is in its training loop, or longer"
NOTE = ("a capture of a running job: compile times, recompile causes and cost analysis are unknown (null); "
        "run the program under jaxdbg profile for them")


def profile_capture(out_dir: str, *, attach_to: str | None = None, from_capture: str | None = None,
                    duration_s: float = 2.0, top: int = 10, budget: str | None = None) -> ProfileRun:
    """Capture ``duration_s`` seconds of the processes at ``attach_to`` (``HOST:PORT,...``), or read the capture
    in the folder ``from_capture``; bad input raises UsageError (exit 2), a failed capture TargetFailedError."""
    if (attach_to is None) == (from_capture is None):
        raise UsageError("give one of --attach HOST:PORT or --from-capture DIR")
    rules = parse_budget(budget)
    out_dir = os.path.abspath(out_dir)
    if attach_to is not None:
        addresses = parse_addresses(attach_to)
        run = attach(addresses, duration_s, os.path.join(out_dir, "capture"))
        result = capture_result(run, "attach", top, rules, duration_s)
    else:
        assert from_capture is not None
        original = find_run(from_capture)
        result = capture_result(copy_run(original, out_dir), "capture", top, rules)
    artifacts = {"trace_dir": result.trace.logdir} if result.trace else {}
    artifacts.update({f"xplane.{h.label}": h.file for h in result.capture.hosts} if result.capture else {})
    return ProfileRun(result, EXIT_OK if result.budget.ok else EXIT_FOUND, artifacts)


def capture_result(run: str, source: CaptureSource, top: int, rules: tuple[BudgetRule, ...] = (),
                   duration_s: float | None = None) -> ProfileResult:
    """Analyse every xplane file of the run folder ``run`` (a copy jaxdbg owns: xprof writes cache files there)."""
    paths = sorted(glob.glob(os.path.join(run, "*.xplane.pb")))
    functions: list[FunctionProfile] = []
    hosts = []
    backend = "cpu"
    for path in paths:
        events = read_xplane(path)
        backend = _backend(events) if events.devices else backend
        found, host = _host(path, events, top)
        functions.extend(found)
        hosts.append(host)
    first = hosts[0]
    wall = duration_s or first.duration_s
    totals = Totals(wall, None, first.execute_s, None, max(wall - first.execute_s, 0.0))
    info = CaptureInfo(source, tuple(hosts), wall, first.steps.count if first.steps else None, run)
    hints = op_hints(functions, wall) + tuple(_step_hint(h) for h in hosts if _step_hint(h))
    logdir = os.path.dirname(os.path.dirname(os.path.dirname(run)))
    return ProfileResult(
        mode="capture", functions=tuple(functions), totals=totals, budget=check_budget(rules, tuple(functions), totals),
        notes=(NOTE,) + (() if functions else (IDLE,)), hints=hints,
        eager_compile={"count": 0, "total_s": 0.0, "top": []},
        trace=TraceFiles(logdir, paths[0] if paths else None, None, None, 0),
        device={"backend": backend, "count": sum(len(h.devices) for h in hosts)}, capture=info,
    )


def _host(path: str, events: XplaneEvents, top: int) -> tuple[list[FunctionProfile], CaptureHost]:
    label = host_label(path)
    by_prefix = xprof_hlo_stats(path) if events.devices else {}  # xprof's per-op tools are empty on CPU
    functions = []
    for module, runs in events.executions.items():
        durations = [(end - start) * 1e-9 for start, end in runs]
        median, p90, low, high, spread = duration_stats(durations)
        execute = ExecuteStats(len(runs), None, median, p90, low, high, spread, sum(durations), len(runs))
        base = module_of(module)  # jit_loss#7: one of several programs named jit_loss
        name = base[len("jit_"):] if base.startswith("jit_") else base
        if base != module:
            name += f" (program {events.programs.get(module)})"
        hlo = module_hlo(path, base, events.programs.get(module))
        rows, scopes, ops_source = function_ops(name, module, hlo, by_prefix, events.ops, top)
        functions.append(FunctionProfile(
            name=name, source=None, compiles=None, recompiles=None, compile=None, execute=execute, ops=rows,
            scopes=scopes, module=base, ops_source=ops_source, host=label))
    functions.sort(key=lambda f: -f.execute.total_s)
    spans = [s for runs in events.executions.values() for s in runs]
    marks = [(s, e) for steps in events.steps.values() for _, s, e in steps]
    edges = [t for span in spans + marks for t in span]
    duration = (max(edges) - min(edges)) * 1e-9 if edges else 0.0
    return functions, CaptureHost(label, path, duration, union_length(spans) * 1e-9, step_figures(events),
                                  events.devices, xprof_overview(path) if events.devices else None)


# xprof's overview_page fields kept (milliseconds per step, averaged), under jaxdbg's names.
OVERVIEW = {"steptime_ms_average": "step_ms", "device_compute_time_ms_avg": "device_compute_ms",
            "device_collectives_time_ms_avg": "device_collectives_ms",
            "device_to_device_time_ms_avg": "device_to_device_ms",
            "host_compute_time_ms_avg": "host_compute_ms", "kernel_launch_time_ms_avg": "kernel_launch_ms",
            "infeed_time_ms_avg": "input_ms", "compile_time_ms_avg": "compile_ms", "other_time_ms_avg": "other_ms"}


def xprof_overview(xplane: str) -> dict[str, Any] | None:
    """xprof's own step-time breakdown and bottleneck verdict (overview_page), GPU/TPU captures; None where it
    has none. ``bottleneck`` is xprof's word (``device``, ``host``, ``input``...), ``conclusion`` its sentence."""
    try:
        from xprof.convert.raw_to_tool_data import xspace_to_tool_data

        with quiet_native_stderr():
            data, _ = xspace_to_tool_data([xplane], "overview_page", {})
        parts = [p.get("p", p) for p in json.loads(data)] if data else []
    except Exception:  # noqa: BLE001 - xprof's verdict is extra: the step figures stand without it
        return None
    found: dict[str, Any] = {}
    for part in parts:
        if "steptime_ms_average" in part:
            found.update({ours: float(part[theirs]) for theirs, ours in OVERVIEW.items() if _number(part.get(theirs))})
            found["conclusion"] = str(part.get("input_conclusion", ""))
        if part.get("bottleneck"):
            found["bottleneck"] = str(part["bottleneck"])
    return found if "step_ms" in found else None


def _number(text: object) -> bool:
    try:
        float(str(text))
    except ValueError:
        return False
    return True


def module_hlo(xplane: str, module: str, program_id: int | None) -> HloModule | None:
    """A program's optimised HLO with its stack-frame tables, from xprof's graph_viewer converter (None where
    the capture holds none). xprof writes ``<module>(<id>).hlo_proto.pb`` beside ``xplane``: a copy's folder."""
    try:
        from xprof.convert.raw_to_tool_data import xspace_to_tool_data, xspace_to_tool_names
    except ImportError:
        return None
    if not os.path.exists(os.path.join(os.path.dirname(xplane), f"{module}({program_id}).hlo_proto.pb")):
        with quiet_native_stderr():  # listing the tools is what writes the programs' HLO files
            xspace_to_tool_names([xplane])
    options = {"type": "long_txt", "module_name": f"{module}({program_id})", "program_id": str(program_id),
               "show_metadata": 1}
    try:
        with quiet_native_stderr():
            data, _ = xspace_to_tool_data([xplane], "graph_viewer", {"graph_viewer_options": options})
    except Exception:  # noqa: BLE001 - without the HLO the table still stands, without sources
        return None
    text = data.decode() if isinstance(data, bytes) else str(data or "")
    return parse_hlo(text) if text.startswith("HloModule") else None


def step_figures(events: XplaneEvents) -> StepFigures | None:
    """Steps from the most frequent step marker, or else from the most-run program's executions."""
    spans = [s for runs in events.executions.values() for s in runs]
    if events.steps:
        name, marks = max(events.steps.items(), key=lambda kv: len(kv[1]))
        steps = sorted((s, e) for _, s, e in marks)
        marker = f"StepTraceAnnotation {name}"
    elif events.executions:
        module, runs = max(events.executions.items(), key=lambda kv: len(kv[1]))
        if len(runs) < 2:
            return None
        steps = [(a[0], b[0]) for a, b in itertools.pairwise(runs)]
        marker = f"executions of {module}"
    else:
        return None
    lengths = [(e - s) * 1e-9 for s, e in steps]
    busy = busy_within(spans, steps)
    median, p90, *_ = duration_stats(lengths)
    total = sum(lengths)
    host = [max(length - b, 0.0) for length, b in zip(lengths, busy)]
    return StepFigures(marker, len(steps), median, p90, sum(busy) / total if total > 0 else None,
                       duration_stats(host)[0])


def capture_environment(result: ProfileResult) -> dict:
    """The report's ``environment`` for a capture: the captured job's backend, devices and processes (from
    its device planes; none listed for CPU), with the jax that read it (without starting a backend here)."""
    import platform

    import jax
    import jaxlib

    hosts = result.capture.hosts if result.capture else ()
    backend = str(result.device.get("backend", "cpu"))
    devices = [{"id": int(name.rpartition(":")[2]) if name.rpartition(":")[2].isdigit() else 0,
                "platform": backend, "kind": "", "process_index": index}
               for index, host in enumerate(hosts) for name in host.devices]
    return {"jax": jax.__version__, "jaxlib": getattr(jaxlib, "__version__", "unknown"), "backend": backend,
            "devices": devices, "python": platform.python_version(), "process_index": 0,
            "process_count": max(len(hosts), 1)}


def busy_within(spans: list[tuple[float, float]], windows: list[tuple[float, float]]) -> list[float]:
    """Seconds of each window (ns bounds) covered by the spans (ns), overlaps counted once: the spans are merged
    first, so each window is a bisection and a short walk (thousands of steps and calls in a capture).

        >>> busy_within([(0, 4e9), (2e9, 5e9), (8e9, 9e9)], [(1e9, 3e9), (4e9, 10e9)])
        [2.0, 2.0]
    """
    merged: list[list[float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    ends = [end for _, end in merged]
    found = []
    for low, high in windows:
        covered, i = 0.0, bisect.bisect_right(ends, low)
        while i < len(merged) and merged[i][0] < high:
            covered += min(merged[i][1], high) - max(merged[i][0], low)
            i += 1
        found.append(covered * 1e-9)
    return found


def _step_hint(host: CaptureHost) -> str:
    verdict = host.overview or {}
    if verdict.get("bottleneck") not in (None, "", "device") and verdict.get("conclusion"):
        return f"{host.label} (xprof): {verdict['conclusion']}"
    steps = host.steps
    if steps is None or steps.execute_fraction is None or steps.execute_fraction > 1 - HOST_BOUND_FRACTION:
        return ""
    return (f"{host.label}: jitted programs run {100 * steps.execute_fraction:.0f}% of each step "
            f"({steps.count} steps of {1e3 * (steps.median_s or 0):.3g} ms); the rest waits on the host (input "
            "pipeline, Python, logging): prefetch batches, or read device values less often")


def _backend(events: XplaneEvents) -> str:
    names = " ".join(events.devices).upper()
    return "tpu" if "TPU" in names else "gpu" if "GPU" in names else "cpu"
