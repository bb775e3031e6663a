"""Prometheus metric families from a finished report: the JSON object a command writes (``Report.to_dict()``).

Working from the JSON (not the result dataclasses) lets one exporter serve every command, ``jaxdbg check``
included, and reports read back from disk. Names are prefixed ``jaxdbg_``; every family carries the
``process`` label (the job's process that measured it), so process 0's report, which also holds the other
processes' figures, exports those under their own ``process`` value. docs/metrics.md lists every family.

Example:
    >>> report = {"command": "check", "environment": {"process_index": 0},
    ...           "result": {"passed": False, "checks": [{"name": "no-nan", "passed": False, "duration_s": 2.5}]}}
    >>> for family in families(report):
    ...     print(family.name, family.samples[0].labels, family.samples[0].value)
    jaxdbg_check_passed {'check': 'no-nan', 'process': '0'} 0.0
    jaxdbg_check_duration_seconds {'check': 'no-nan', 'process': '0'} 2.5
    jaxdbg_checks_passed {'process': '0'} 0.0
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

PREFIX = "jaxdbg_"

# The labels that name one pipeline-bench run (every combination of options is a run).
RUN_LABELS = ("schedule", "policy", "hint", "admission", "comm", "memory_cap", "variability", "seed")


class Families:
    """Families by name, created on first use, each with its type, help and label names fixed then."""

    def __init__(self) -> None:
        self._by_name: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}

    def add(self, kind: str, name: str, help_text: str, labels: dict[str, Any], value: Any) -> None:
        """One sample; a missing or non-numeric value (a field the report could not know) is left out."""
        number = _number(value)
        if number is None:
            return
        family = self._by_name.get(name)
        if family is None:
            make: type[CounterMetricFamily | GaugeMetricFamily] = (
                CounterMetricFamily if kind == "counter" else GaugeMetricFamily)
            family = make(PREFIX + name, help_text, labels=list(labels))
            self._by_name[name] = family
        family.add_metric([_text(v) for v in labels.values()], number)

    def gauge(self, name: str, help_text: str, labels: dict[str, Any], value: Any) -> None:
        self.add("gauge", name, help_text, labels, value)

    def counter(self, name: str, help_text: str, labels: dict[str, Any], value: Any) -> None:
        self.add("counter", name, help_text, labels, value)

    def all(self) -> list[Metric]:
        return list(self._by_name.values())


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if value in ("nan", "inf", "-inf"):  # report.to_jsonable's spelling of non-finite floats
        return float(value)
    return None


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        return f"{value:g}"
    return str(value)


def families(report: dict) -> list[Metric]:
    """Every family a report has figures for (an error report has none)."""
    result = report.get("result") or {}
    if not isinstance(result, dict) or ("error" in result and len(result) == 1):
        return []
    process = (report.get("environment") or {}).get("process_index", 0)
    out = Families()
    builder = _BUILDERS.get(report.get("command", ""))
    if builder is not None:
        builder(out, result, str(process))
    return out.all()


# ---- profile -----------------------------------------------------------------------------------------------


# (family, help, key of the function's `execute` figures); step_seconds is the table's shared name for the
# step time, which a finished profile knows as the median execute time.
_EXECUTE_GAUGES = (
    ("step_seconds", "Step time: the median execute time of the profiled calls.", "median_s"),
    ("execute_median_seconds", "Median execute time of a jitted function.", "median_s"),
    ("execute_p90_seconds", "90th percentile of a jitted function's execute time.", "p90_s"),
    ("execute_first_seconds", "The first call's wall time (compile included).", "first_s"),
    ("execute_seconds", "Execute time summed over the calls (compile left out).", "total_s"),
)


def _profile(out: Families, result: dict, process: str) -> None:
    for fn in result.get("functions") or []:
        labels = {"function": fn["name"], "process": process}
        execute = fn.get("execute") or {}
        compile_ = fn.get("compile") or {}
        out.counter("calls", "Top-level calls of a jitted function.", labels, execute.get("calls"))
        out.counter("compiles", "Compiles of a jitted function (the first one included).", labels, fn.get("compiles"))
        recompiles = fn.get("recompiles")  # null in a capture: unknown, not zero
        out.counter("recompiles", "Compiles after the first.", labels,
                    None if recompiles is None else len(recompiles))
        out.counter("compile_seconds", "Time spent compiling (trace, lower, backend).", labels, compile_.get("total_s"))
        for name, help_text, key in _EXECUTE_GAUGES:
            out.gauge(name, help_text, labels, execute.get(key))
        for op in fn.get("ops") or []:
            out.gauge("op_seconds", "Device time of one HLO op over the traced calls.",
                      {**labels, "op": op["name"]}, op.get("total_s"))
        for device in fn.get("devices") or []:
            out.gauge("device_execute_median_seconds", "Median execution of a function on one of its devices "
                      "(a pmap or SPMD program, captured calls).",
                      {**labels, "device": device["device"].rpartition(":")[2]},
                      device.get("median_s"))
    totals = result.get("totals") or {}
    own = {"process": process}
    for part in ("wall", "compile", "execute", "transfer", "other"):
        out.gauge(f"run_{part}_seconds", f"The run's {part} time (profile totals).", own, totals.get(f"{part}_s"))
    _input_pipeline(out, result, process)
    budget = result.get("budget") or {}
    if budget.get("checked"):
        out.gauge("budget_ok", "1 when every --budget rule held, else 0.", own, budget.get("ok"))
        out.gauge("budget_violations", "Broken --budget rules.", own, len(budget.get("violations") or []))
    _monitor(out, result.get("monitor"), process)
    _job_processes(out, result)


# (family, help, key of result.input_pipeline): per step of the function called most.
_INPUT_GAUGES = (
    ("input_step_seconds", "Mean step time of the function called most (input-pipeline analysis).", "step_s"),
    ("input_device_idle_fraction", "Share of the step the device waits for the host.", "device_idle_fraction"),
    ("input_host_seconds", "Per step: the host's own work (building batches, Python).", "host_s"),
    ("input_transfer_seconds", "Per step: host/device copies.", "transfer_s"),
    ("input_sync_wait_seconds", "Per step: the host waiting for the device in syncs.", "sync_wait_s"),
)


def _input_pipeline(out: Families, result: dict, process: str) -> None:
    """Whether the device waits for the host (per step), and the host's syncs by kind and user line."""
    pipeline = result.get("input_pipeline")
    if pipeline:
        labels = {"function": pipeline["function"], "process": process}
        for name, help_text, key in _INPUT_GAUGES:
            out.gauge(name, help_text, labels, pipeline.get(key))
    for sync in result.get("syncs") or []:
        source = sync.get("source") or {}
        labels = {"kind": sync["kind"], "source": f"{source.get('file', '')}:{source.get('line', '')}",
                  "process": process}
        out.counter("syncs", "Forced synchronisations (the host waited for the device) at one user line.", labels,
                    sync.get("count"))
        out.counter("sync_device_idle_seconds", "Device idle time after the syncs at one user line.", labels,
                    sync.get("device_idle_s"))


def _monitor(out: Families, monitor: dict | None, process: str) -> None:
    """--monitor: the peaks and means of the series (the full series stays in the JSON)."""
    if not monitor:
        return
    summary = monitor.get("summary") or {}
    own = {"process": process}
    for i, peak in enumerate(summary.get("peak_device_bytes_in_use") or []):
        out.gauge("device_memory_bytes", "Device memory in use (profile --monitor: the peak of the run).",
                  {"device": str(i), "process": process}, peak)
    out.gauge("host_rss_peak_bytes", "Peak resident memory of the profiled process.", own,
              summary.get("peak_host_rss_bytes"))
    out.gauge("host_cpu_mean_percent", "Mean CPU use of the profiled process (one core = 100).", own,
              summary.get("mean_host_cpu_percent"))
    out.gauge("system_cpu_mean_percent", "Mean CPU use of the whole machine (all cores = 100).", own,
              summary.get("mean_system_cpu_percent"))
    for key, name, what in (("net_receive", "host_network_receive_bytes", "received over the network"),
                            ("net_transmit", "host_network_transmit_bytes", "sent over the network"),
                            ("disk_read", "host_disk_read_bytes", "read from disks"),
                            ("disk_write", "host_disk_write_bytes", "written to disks")):
        out.counter(name, f"Bytes the host {what} during the run (all interfaces/disks).", own,
                    summary.get(f"{key}_bytes"))
        out.gauge(name.replace("_bytes", "_peak_bytes_per_second"), f"Peak rate of bytes {what}.", own,
                  summary.get(f"peak_{key}_bytes_per_s"))
    tpu = summary.get("tpu") or {}
    for name, help_text, key in _TPU_GAUGES:
        for i, value in enumerate(tpu.get(key) or []):
            out.gauge(name, help_text, {"device": str(i), "process": process}, value)


# (family, help, key of the monitor summary's `tpu`): one sample per TPU device.
_TPU_GAUGES = (
    ("tpu_duty_cycle_peak_percent", "TPU runtime: peak TensorCore duty cycle.", "peak_duty_cycle_percent"),
    ("tpu_duty_cycle_mean_percent", "TPU runtime: mean TensorCore duty cycle.", "mean_duty_cycle_percent"),
    ("tpu_tensorcore_util_mean_percent", "TPU runtime: mean TensorCore utilisation.", "mean_tensorcore_util_percent"),
    ("tpu_hbm_peak_bytes", "TPU runtime: peak HBM in use.", "peak_hbm_bytes"),
    ("tpu_hbm_total_bytes", "TPU runtime: HBM capacity.", "hbm_total_bytes"),
    ("tpu_hbm_bandwidth_peak_percent", "TPU runtime: peak HBM bandwidth utilisation.", "peak_hbm_bandwidth_percent"),
)


def _job_processes(out: Families, result: dict) -> None:
    """Process 0's report of a multi-process job: every process's figures, under its own ``process`` label."""
    stragglers = set(result.get("stragglers") or [])
    for row in result.get("processes") or []:
        if row.get("note"):
            continue
        labels = {"process": str(row["index"])}
        for key in ("wall", "compile", "execute", "transfer", "host", "collective"):
            out.gauge(f"process_{key}_seconds", f"A process of the job: its {key} time.", labels, row.get(f"{key}_s"))
        out.gauge("process_steps", "A process of the job: steps (calls of its step function).", labels,
                  row.get("steps"))
        out.gauge("process_step_median_seconds", "A process of the job: its median step time.", labels,
                  row.get("step_median_s"))
        out.gauge("process_straggler", "1 for a process the others waited for in collectives.", labels,
                  row["index"] in stragglers)


# ---- nan-hunt ----------------------------------------------------------------------------------------------


def _nan_hunt(out: Families, result: dict, process: str) -> None:
    out.gauge("nonfinite_found", "1 when nan-hunt found where a NaN/Inf is born, else 0.", {"process": process},
              bool(result.get("found")))
    first = result.get("first")
    if first:
        labels = {"function": first.get("function") or "", "process": process}
        out.counter("nonfinite", "Calls whose outputs held NaN/Inf (nan-hunt stops at the first).", labels, 1)
        out.gauge("nonfinite_first_call", "0-based call of the function where the first NaN/Inf appeared.", labels,
                  first.get("call_index"))
    out.gauge("growth_entries", "Outputs whose magnitude exploded before the NaN/Inf.", {"process": process},
              len(result.get("growth") or []))
    for row in result.get("processes") or []:
        if not row.get("note"):
            out.gauge("nonfinite_found", "1 when nan-hunt found where a NaN/Inf is born, else 0.",
                      {"process": str(row["index"])}, bool(row.get("found")))


# ---- pipeline-bench ----------------------------------------------------------------------------------------


def run_labels(row: dict) -> dict[str, Any]:
    """The labels naming one pipeline-bench run (a fixed run's hint and memory cap are empty)."""
    return {name: row.get(name) for name in RUN_LABELS}


def pipeline_run(out: Families, row: dict, process: str) -> None:
    """One run's families (used by the final export and by the live endpoint)."""
    labels = {**run_labels(row), "process": process}
    from jaxdbg.pipeline.metrics import occupancy

    for w, value in enumerate(occupancy(row.get("stage_busy") or [], _number(row.get("makespan_s")) or 0.0)):
        out.gauge("stage_occupancy", "pipeline-bench: busy fraction of a stage over a run (0..1).",
                  {**labels, "stage": str(w)}, value)
    for name, help_text, key in _RUN_GAUGES:
        out.gauge(name, help_text, labels, row.get(key))


# (family, help, key of a pipeline-bench run row).
_RUN_GAUGES = (
    ("pipeline_makespan_seconds", "pipeline-bench: a run's makespan.", "makespan_s"),
    ("pipeline_throughput_microbatches_per_second", "pipeline-bench: microbatches per second.", "throughput_mb_s"),
    ("pipeline_bubble_fraction", "pipeline-bench: the run's idle fraction of stage time.", "bubble_fraction"),
    ("pipeline_speedup_vs_fixed", "pipeline-bench: fixed order's makespan over this run's.", "speedup_vs_fixed"),
    ("pipeline_makespan_over_lower_bound", "pipeline-bench: makespan over the run's lower bound.",
     "makespan_over_lower_bound"),
    ("pipeline_makespan_over_memory_bound", "pipeline-bench: makespan over the lower bound at the run's memory cap.",
     "makespan_over_memory_bound"),
)


def _pipeline_bench(out: Families, result: dict, process: str) -> None:
    for row in result.get("runs") or []:
        pipeline_run(out, row, process)
    correctness = result.get("correctness")
    if correctness:
        out.gauge("pipeline_max_abs_grad_diff", "pipeline-bench real mode: gradients vs the single-device reference.",
                  {"process": process}, correctness.get("max_abs_grad_diff"))
        out.gauge("pipeline_correct", "pipeline-bench real mode: 1 when the gradients match the reference.",
                  {"process": process}, correctness.get("ok"))


# ---- check -------------------------------------------------------------------------------------------------


def _check(out: Families, result: dict, process: str) -> None:
    for check in result.get("checks") or []:
        labels = {"check": check["name"], "process": process}
        out.gauge("check_passed", "jaxdbg check: 1 when the check passed, else 0.", labels, check.get("passed"))
        out.gauge("check_duration_seconds", "jaxdbg check: how long the check took.", labels, check.get("duration_s"))
        out.gauge("check_regressions", "jaxdbg check: figures past the baseline's noise.", labels,
                  len(check["regressions"]) if "regressions" in check else None)
    if "passed" in result:
        out.gauge("checks_passed", "jaxdbg check: 1 when every check passed.", {"process": process}, result["passed"])


# ---- memory ------------------------------------------------------------------------------------------------


def device_memory(out: Families, device: str, process: str, live: Any, peak: Any) -> None:
    """A device's live and peak bytes: the same two families for a memory report and a live watch."""
    labels = {"device": device, "process": process}
    out.gauge("device_memory_live_bytes", "Bytes of live jax arrays on a device.", labels, live)
    out.gauge("device_memory_peak_bytes", "A device's peak memory: its own peak_bytes_in_use where it keeps one "
              "(GPU, TPU), else the most bytes of live arrays seen.", labels, peak)


def _memory(out: Families, result: dict, process: str) -> None:
    largest: dict[str, dict] = {}
    for fn in result.get("functions") or []:  # a function's largest compile
        if fn["name"] not in largest or fn["peak_bytes"] > largest[fn["name"]]["peak_bytes"]:
            largest[fn["name"]] = fn
    for name, fn in largest.items():
        labels = {"function": name, "process": process}
        out.gauge("memory_program_peak_bytes", "jaxdbg memory: what a call of the function holds at once (per "
                  "device).", labels, fn.get("peak_bytes"))
        out.gauge("memory_program_temp_bytes", "jaxdbg memory: the function's temporaries (per device).", labels,
                  fn.get("temp_bytes"))
        out.gauge("memory_program_needs_bytes", "jaxdbg memory: live bytes when called plus what the call adds.",
                  labels, fn.get("needs_bytes"))
        out.gauge("memory_program_fits", "jaxdbg memory: 1 when the function fits the device memory budget, else 0.",
                  labels, fn.get("fits"))
    for device in result.get("devices") or []:
        measured = device.get("measured_peak_bytes")
        device_memory(out, device["device"], process, device.get("final_live_bytes"),
                      measured if measured is not None else device.get("peak_live_bytes"))
    own = {"process": process}
    peak = result.get("peak") or {}
    out.gauge("memory_run_peak_bytes", "jaxdbg memory: the run's peak (live at a call's start + what it adds).",
              own, peak.get("bytes"))
    leaks = result.get("leaks") or []
    out.gauge("memory_leaks", "jaxdbg memory: producers whose live arrays pile up call after call.", own, len(leaks))
    out.gauge("memory_leaked_bytes", "jaxdbg memory: bytes the leaks hold.", own, sum(leak["bytes"] for leak in leaks))
    out.gauge("memory_out_of_memory", "jaxdbg memory: 1 when the run ended in an out-of-memory error.", own,
              result.get("out_of_memory") is not None)
    budget = result.get("budget") or {}
    out.gauge("memory_misfits", "jaxdbg memory: functions that do not fit the device memory budget.", own,
              len(budget.get("misfits") or []))
    if budget.get("checked"):
        out.gauge("budget_ok", "1 when every --budget rule held, else 0.", own, budget.get("ok"))
        out.gauge("budget_violations", "Broken --budget rules.", own, len(budget.get("violations") or []))


_BUILDERS: dict[str, Callable[[Families, dict, str], None]] = {
    "profile": _profile, "nan-hunt": _nan_hunt, "pipeline-bench": _pipeline_bench, "check": _check,
    "memory": _memory,
}
