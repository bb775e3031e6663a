"""Prometheus metric families from a finished report: the JSON object a command writes (``Report.to_dict()``).

The JSON is read back into the command's result types (:func:`jaxdbg.results.read_report`), so one exporter
serves every command, ``jaxdbg check`` included, and reports read back from disk, while a renamed field is an
error (and a type error) rather than a series silently gone. The families, their help and labels are the one
table's (:mod:`jaxdbg.metrics.table`); every family carries the ``process`` label (the job's process that
measured it), so process 0's report, which also holds the other processes' figures, exports those under their
own ``process`` value. docs/metrics.md lists every family.

Example:
    >>> from jaxdbg.check.result import CheckOutcome, CheckSuiteResult
    >>> from jaxdbg.report import Report
    >>> failed = CheckOutcome("no-nan", "nan-hunt", "train.py", False, 1, "nan first made by log", 2.5, "r.json")
    >>> report = Report("check", "pyproject.toml", CheckSuiteResult(False, (failed,)), 1, {}, {"process_index": 0})
    >>> for family in families(report.to_dict()):
    ...     print(family.name, family.samples[0].labels, family.samples[0].value)
    jaxdbg_check_passed {'check': 'no-nan', 'process': '0'} 0.0
    jaxdbg_check_duration_seconds {'check': 'no-nan', 'process': '0'} 2.5
    jaxdbg_check_regressions {'check': 'no-nan', 'process': '0'} 0.0
    jaxdbg_checks_passed {'process': '0'} 0.0
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client.core import Metric

from jaxdbg.metrics.pipeline import pipeline_run
from jaxdbg.metrics.table import Families, device_memory
from jaxdbg.results import is_error, read_report

if TYPE_CHECKING:
    from jaxdbg.check.result import CheckSuiteResult
    from jaxdbg.memory.result import MemoryResult, ProgramMemory
    from jaxdbg.nan.result import NanHuntResult
    from jaxdbg.pipeline.bench import BenchResult
    from jaxdbg.profile.model import FunctionProfile, MonitorSeries, ProfileResult


def families(report: dict) -> list[Metric]:
    """Every family a report has figures for (an error report has none); ReportReadError for a report whose
    ``result`` is not its command's (naming the field)."""
    read = read_report(report)
    if is_error(read.result):
        return []
    process = str((read.environment or {}).get("process_index", 0))
    out = Families()
    builder = _BUILDERS.get(read.command)
    if builder is not None:
        builder(out, read.result, process)
    return out.all()


# ---- profile -----------------------------------------------------------------------------------------------


def _profile(out: Families, result: ProfileResult, process: str) -> None:
    for fn, name in zip(result.functions, _distinct_names(result.functions)):
        labels = {"function": name, "process": process}
        execute = fn.execute
        out.add("calls", labels, execute.calls)
        out.add("compiles", labels, fn.compiles)  # None (like recompiles) in a capture: unknown, not zero
        out.add("recompiles", labels, None if fn.recompiles is None else len(fn.recompiles))
        out.add("compile_seconds", labels, None if fn.compile is None else fn.compile.total_s)
        out.add("step_seconds", labels, execute.median_s)  # a finished profile's step: the median execute time
        out.add("execute_median_seconds", labels, execute.median_s)
        out.add("execute_p90_seconds", labels, execute.p90_s)
        out.add("execute_first_seconds", labels, execute.first_s)
        out.add("execute_seconds", labels, execute.total_s)
        for op in fn.ops:
            out.add("op_seconds", {**labels, "op": op.name}, op.total_s)
        for device in fn.devices:
            out.add("device_execute_median_seconds", {**labels, "device": device.device.rpartition(":")[2]},
                    device.median_s)
    totals = result.totals
    own = {"process": process}
    for part, value in (("wall", totals.wall_s), ("compile", totals.compile_s), ("execute", totals.execute_s),
                        ("transfer", totals.transfer_s), ("other", totals.other_s)):
        out.add(f"run_{part}_seconds", own, value)
    _input_pipeline(out, result, process)
    _budget(out, result.budget, process)
    if result.monitor is not None:
        _monitor(out, result.monitor, process)
    _job_processes(out, result)


def _distinct_names(functions: Sequence[FunctionProfile]) -> list[str]:
    """Each function's ``function`` label: its name, with its line where another function has that name (two
    lambdas, a barrier at two lines): one series each, never two samples of one series.

        >>> from jaxdbg._source import SourceLocation
        >>> class F:
        ...     def __init__(self, name, line): self.name, self.source = name, SourceLocation("/w/t.py", line, "f")
        >>> _distinct_names([F("step", 3), F("sync_global_devices", 9), F("sync_global_devices", 12)])
        ['step', 'sync_global_devices (t.py:9)', 'sync_global_devices (t.py:12)']
    """
    names = [f.name for f in functions]
    shown = [f"{f.name} ({os.path.basename(f.source.file)}:{f.source.line})"
             if f.source is not None and names.count(f.name) > 1 else f.name for f in functions]
    return [name if shown.count(name) == 1 else f"{name} #{shown[:i].count(name)}" for i, name in enumerate(shown)]


class _Budget(Protocol):
    """profile's BudgetResult and memory's Budget alike."""

    @property
    def ok(self) -> bool: ...
    @property
    def violations(self) -> tuple[str, ...]: ...
    @property
    def checked(self) -> tuple[str, ...]: ...


def _budget(out: Families, budget: _Budget, process: str) -> None:
    """--budget (profile's and memory's): whether every rule held, and how many broke."""
    if budget.checked:
        out.add("budget_ok", {"process": process}, budget.ok)
        out.add("budget_violations", {"process": process}, len(budget.violations))


def _input_pipeline(out: Families, result: ProfileResult, process: str) -> None:
    """Whether the device waits for the host (per step), and the host's syncs by kind and user line."""
    pipeline = result.input_pipeline
    if pipeline is not None:
        labels = {"function": pipeline.function, "process": process}
        out.add("input_step_seconds", labels, pipeline.step_s)
        out.add("input_device_idle_fraction", labels, pipeline.device_idle_fraction)
        out.add("input_host_seconds", labels, pipeline.host_s)
        out.add("input_transfer_seconds", labels, pipeline.transfer_s)
        out.add("input_sync_wait_seconds", labels, pipeline.sync_wait_s)
    for sync in result.syncs:
        source = f"{sync.source.file}:{sync.source.line}" if sync.source is not None else ":"
        labels = {"kind": sync.kind, "source": source, "process": process}
        out.add("syncs", labels, sync.count)
        out.add("sync_device_idle_seconds", labels, sync.device_idle_s)


# (family, key of the monitor summary's `tpu`): one sample per TPU device.
_TPU_GAUGES = (
    ("tpu_duty_cycle_peak_percent", "peak_duty_cycle_percent"),
    ("tpu_duty_cycle_mean_percent", "mean_duty_cycle_percent"),
    ("tpu_tensorcore_util_mean_percent", "mean_tensorcore_util_percent"),
    ("tpu_hbm_peak_bytes", "peak_hbm_bytes"),
    ("tpu_hbm_total_bytes", "hbm_total_bytes"),
    ("tpu_hbm_bandwidth_peak_percent", "peak_hbm_bandwidth_percent"),
)


def _monitor(out: Families, monitor: MonitorSeries, process: str) -> None:
    """--monitor: the peaks and means of the series (the full series stays in the JSON). The summary is a free
    dict in the result type (profile/monitor.py's summary()), so it alone is read by key."""
    summary = monitor.summary
    own = {"process": process}
    for i, peak in enumerate(summary.get("peak_device_bytes_in_use") or []):
        out.add("device_memory_bytes", {"device": str(i), "process": process}, _number(peak))
    out.add("host_rss_peak_bytes", own, _number(summary.get("peak_host_rss_bytes")))
    out.add("host_cpu_mean_percent", own, _number(summary.get("mean_host_cpu_percent")))
    out.add("system_cpu_mean_percent", own, _number(summary.get("mean_system_cpu_percent")))
    for key, name in (("net_receive", "network_receive"), ("net_transmit", "network_transmit"),
                      ("disk_read", "disk_read"), ("disk_write", "disk_write")):
        out.add(f"host_{name}_bytes", own, _number(summary.get(f"{key}_bytes")))
        out.add(f"host_{name}_peak_bytes_per_second", own, _number(summary.get(f"peak_{key}_bytes_per_s")))
    tpu = summary.get("tpu") or {}
    for name, key in _TPU_GAUGES:
        for i, value in enumerate(tpu.get(key) or []):
            out.add(name, {"device": str(i), "process": process}, _number(value))


def _number(value: Any) -> float | None:
    """A figure of a free-form dict: a number, or None (not known)."""
    if isinstance(value, (bool, int, float)):
        return float(value)
    if value in ("nan", "inf", "-inf"):  # report.to_jsonable's spelling of non-finite floats
        return float(value)
    return None


def _job_processes(out: Families, result: ProfileResult) -> None:
    """Process 0's report of a multi-process job: every process's figures, under its own ``process`` label."""
    stragglers = set(result.stragglers)
    for row in result.processes:
        if row.note:
            continue
        labels = {"process": str(row.index)}
        for key, value in (("wall", row.wall_s), ("compile", row.compile_s), ("execute", row.execute_s),
                           ("transfer", row.transfer_s), ("host", row.host_s), ("collective", row.collective_s)):
            out.add(f"process_{key}_seconds", labels, value)
        out.add("process_steps", labels, row.steps)
        out.add("process_step_median_seconds", labels, row.step_median_s)
        out.add("process_straggler", labels, row.index in stragglers)


# ---- nan-hunt ----------------------------------------------------------------------------------------------


def _nan_hunt(out: Families, result: NanHuntResult, process: str) -> None:
    out.add("nonfinite_found", {"process": process}, result.found)
    first = result.first
    if first is not None:
        labels = {"function": first.function, "process": process}
        out.add("nonfinite", labels, 1)
        out.add("nonfinite_first_call", labels, first.call_index)
    out.add("growth_entries", {"process": process}, len(result.growth))
    for row in result.processes:
        if not row.note:
            out.add("nonfinite_found", {"process": str(row.index)}, row.found)


# ---- pipeline-bench ----------------------------------------------------------------------------------------


def _pipeline_bench(out: Families, result: BenchResult, process: str) -> None:
    for row in result.runs:
        pipeline_run(out, row, row, process, row)
    correctness = result.correctness
    if correctness is not None:
        out.add("pipeline_max_abs_grad_diff", {"process": process}, correctness.max_abs_grad_diff)
        out.add("pipeline_correct", {"process": process}, correctness.ok)


# ---- check -------------------------------------------------------------------------------------------------


def _check(out: Families, result: CheckSuiteResult, process: str) -> None:
    for check in result.checks:
        labels = {"check": check.name, "process": process}
        out.add("check_passed", labels, check.passed)
        out.add("check_duration_seconds", labels, check.duration_s)
        out.add("check_regressions", labels, len(check.regressions))
    out.add("checks_passed", {"process": process}, result.passed)


# ---- memory ------------------------------------------------------------------------------------------------


def _memory(out: Families, result: MemoryResult, process: str) -> None:
    largest: dict[str, ProgramMemory] = {}
    for fn in result.functions:  # a function's largest compile
        if fn.name not in largest or fn.peak_bytes > largest[fn.name].peak_bytes:
            largest[fn.name] = fn
    for name, fn in largest.items():
        labels = {"function": name, "process": process}
        out.add("memory_program_peak_bytes", labels, fn.peak_bytes)
        out.add("memory_program_temp_bytes", labels, fn.temp_bytes)
        out.add("memory_program_needs_bytes", labels, fn.needs_bytes)
        out.add("memory_program_fits", labels, fn.fits)
    for device in result.devices:
        measured = device.measured_peak_bytes
        device_memory(out, device.device, process, device.final_live_bytes,
                      measured if measured is not None else device.peak_live_bytes)
    own = {"process": process}
    out.add("memory_run_peak_bytes", own, None if result.peak is None else result.peak.bytes)
    out.add("memory_leaks", own, len(result.leaks))
    out.add("memory_leaked_bytes", own, sum(leak.bytes for leak in result.leaks))
    out.add("memory_out_of_memory", own, result.out_of_memory is not None)
    out.add("memory_misfits", own, len(result.budget.misfits))
    _budget(out, result.budget, process)


_BUILDERS: dict[str, Callable[[Families, Any, str], None]] = {
    "profile": _profile, "nan-hunt": _nan_hunt, "pipeline-bench": _pipeline_bench, "check": _check,
    "memory": _memory,
}
