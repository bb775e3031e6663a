"""The one table of jaxdbg's Prometheus metric families: name, type, help and label names.

Every family jaxdbg serves comes from here: the export of a finished report (:mod:`jaxdbg.metrics.families`),
pipeline-bench's live endpoint (:mod:`jaxdbg.metrics.live`) and ``jaxdbg.watch(metrics_port=...)``
(:mod:`jaxdbg.live.metrics`), so one name has one meaning and one set of labels wherever it is served.
docs/metrics.md lists the same families (tests/test_metrics.py holds the two equal). Names here are without
the ``jaxdbg_`` prefix; a counter's samples end in ``_total``.

Example:
    >>> out = Families()
    >>> out.add("calls", {"function": "step", "process": "0"}, 3)
    >>> out.add("step_seconds", {"function": "step", "process": "0"}, None)  # not known: no sample
    >>> [(f.name, f.type, f.samples[0].value) for f in out.all()]
    [('jaxdbg_calls', 'counter', 3.0)]
    >>> out.add("calls", {"function": "step"}, 1)
    Traceback (most recent call last):
    ...
    ValueError: metric family calls: labels ['function'], the table says ['function', 'process']
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

PREFIX = "jaxdbg_"

# The labels that name one pipeline-bench run (every combination of options is a run).
RUN_LABELS = ("schedule", "policy", "hint", "admission", "comm", "memory_cap", "variability", "seed")

FUNCTION = ("function", "process")
PROCESS = ("process",)
DEVICE = ("device", "process")
RUN = (*RUN_LABELS, "process")


@dataclass(frozen=True)
class Family:
    """One metric family: its name without the prefix, its type, its help text and its label names."""

    name: str
    type: Literal["counter", "gauge"]
    help: str
    labels: tuple[str, ...]


def _counter(name: str, help_text: str, labels: tuple[str, ...]) -> Family:
    return Family(name, "counter", help_text, labels)


def _gauge(name: str, help_text: str, labels: tuple[str, ...]) -> Family:
    return Family(name, "gauge", help_text, labels)


_SYNC = ("kind", "source", "process")
_HOST_IO = (("network_receive", "received over the network"), ("network_transmit", "sent over the network"),
            ("disk_read", "read from disks"), ("disk_write", "written to disks"))

TABLE: tuple[Family, ...] = (
    # profile (calls, compiles, recompiles, compile_seconds, step_seconds, nonfinite: jaxdbg.watch too)
    _counter("calls", "Top-level calls of a jitted function.", FUNCTION),
    _counter("compiles", "Compiles of a jitted function (the first one included).", FUNCTION),
    _counter("recompiles", "Compiles after the first.", FUNCTION),
    _counter("compile_seconds", "Time spent compiling (trace, lower, backend).", FUNCTION),
    _gauge("step_seconds", "Step time of a jitted function: profile, the median execute time of its calls; "
           "jaxdbg.watch, the interval between its two latest calls.", FUNCTION),
    _gauge("execute_median_seconds", "Median execute time of a jitted function.", FUNCTION),
    _gauge("execute_p90_seconds", "90th percentile of a jitted function's execute time.", FUNCTION),
    _gauge("execute_first_seconds", "The first call's wall time (compile included).", FUNCTION),
    _gauge("execute_seconds", "Execute time summed over the calls (compile left out).", FUNCTION),
    _gauge("op_seconds", "Device time of one HLO op over the traced calls.", ("function", "process", "op")),
    _gauge("device_execute_median_seconds", "Median execution of a function on one of its devices (a pmap or SPMD "
           "program, captured calls).", ("function", "process", "device")),
    *(_gauge(f"run_{part}_seconds", f"The run's {part} time (profile totals).", PROCESS)
      for part in ("wall", "compile", "execute", "transfer", "other")),
    _gauge("input_step_seconds", "Mean step time of the function called most (input-pipeline analysis).", FUNCTION),
    _gauge("input_device_idle_fraction", "Share of the step the device waits for the host.", FUNCTION),
    _gauge("input_host_seconds", "Per step: the host's own work (building batches, Python).", FUNCTION),
    _gauge("input_transfer_seconds", "Per step: host/device copies.", FUNCTION),
    _gauge("input_sync_wait_seconds", "Per step: the host waiting for the device in syncs.", FUNCTION),
    _counter("syncs", "Forced synchronisations (the host waited for the device) at one user line.", _SYNC),
    _counter("sync_device_idle_seconds", "Device idle time after the syncs at one user line.", _SYNC),
    _gauge("budget_ok", "1 when every --budget rule held, else 0.", PROCESS),
    _gauge("budget_violations", "Broken --budget rules.", PROCESS),
    # profile --monitor, and jaxdbg.watch at each scrape
    _gauge("device_memory_bytes", "Device memory in use where the backend counts it (GPU, TPU): profile --monitor, "
           "the peak of the run; jaxdbg.watch, at the scrape.", DEVICE),
    _gauge("host_rss_peak_bytes", "Peak resident memory of the profiled process.", PROCESS),
    _gauge("host_cpu_mean_percent", "Mean CPU use of the profiled process (one core = 100).", PROCESS),
    _gauge("system_cpu_mean_percent", "Mean CPU use of the whole machine (all cores = 100).", PROCESS),
    *(_counter(f"host_{key}_bytes", f"Bytes the host {what} during the run (all interfaces/disks).", PROCESS)
      for key, what in _HOST_IO),
    *(_gauge(f"host_{key}_peak_bytes_per_second", f"Peak rate of bytes {what}.", PROCESS) for key, what in _HOST_IO),
    _gauge("tpu_duty_cycle_peak_percent", "TPU runtime: peak TensorCore duty cycle.", DEVICE),
    _gauge("tpu_duty_cycle_mean_percent", "TPU runtime: mean TensorCore duty cycle.", DEVICE),
    _gauge("tpu_tensorcore_util_mean_percent", "TPU runtime: mean TensorCore utilisation.", DEVICE),
    _gauge("tpu_hbm_peak_bytes", "TPU runtime: peak HBM in use.", DEVICE),
    _gauge("tpu_hbm_total_bytes", "TPU runtime: HBM capacity.", DEVICE),
    _gauge("tpu_hbm_bandwidth_peak_percent", "TPU runtime: peak HBM bandwidth utilisation.", DEVICE),
    # profile, process 0 of a multi-process job: one sample per process
    *(_gauge(f"process_{key}_seconds", f"A process of the job: its {key} time.", PROCESS)
      for key in ("wall", "compile", "execute", "transfer", "host", "collective")),
    _gauge("process_steps", "A process of the job: steps (calls of its step function).", PROCESS),
    _gauge("process_step_median_seconds", "A process of the job: its median step time.", PROCESS),
    _gauge("process_straggler", "1 for a process the others waited for in collectives.", PROCESS),
    # nan-hunt (nonfinite: jaxdbg.watch too)
    _gauge("nonfinite_found", "1 when nan-hunt found where a NaN/Inf is born, else 0.", PROCESS),
    _counter("nonfinite", "Calls whose outputs held NaN/Inf (nan-hunt stops at the first, so 1 at the origin's "
             "function; jaxdbg.watch counts every such call).", FUNCTION),
    _gauge("nonfinite_first_call", "0-based call of the function where the first NaN/Inf appeared.", FUNCTION),
    _gauge("growth_entries", "Outputs whose magnitude exploded before the NaN/Inf.", PROCESS),
    # pipeline-bench (export and live endpoint)
    _gauge("stage_occupancy", "pipeline-bench: busy fraction of a stage over a run (0..1).", (*RUN, "stage")),
    _gauge("pipeline_makespan_seconds", "pipeline-bench: a run's makespan.", RUN),
    _gauge("pipeline_throughput_microbatches_per_second", "pipeline-bench: microbatches per second.", RUN),
    _gauge("pipeline_bubble_fraction", "pipeline-bench: the run's idle fraction of stage time.", RUN),
    _gauge("pipeline_speedup_vs_fixed", "pipeline-bench: fixed order's makespan over this run's.", RUN),
    _gauge("pipeline_makespan_over_lower_bound", "pipeline-bench: makespan over the run's lower bound.", RUN),
    _gauge("pipeline_makespan_over_memory_bound", "pipeline-bench: makespan over the lower bound at the run's "
           "memory cap.", RUN),
    _gauge("pipeline_max_abs_grad_diff", "pipeline-bench real mode: gradients vs the single-device reference.",
           PROCESS),
    _gauge("pipeline_correct", "pipeline-bench real mode: 1 when the gradients match the reference.", PROCESS),
    _gauge("pipeline_runs_done", "pipeline-bench: runs finished so far.", PROCESS),
    _gauge("pipeline_runs_total", "pipeline-bench: runs this bench will make.", PROCESS),
    # check
    _gauge("check_passed", "jaxdbg check: 1 when the check passed, else 0.", ("check", "process")),
    _gauge("check_duration_seconds", "jaxdbg check: how long the check took.", ("check", "process")),
    _gauge("check_regressions", "jaxdbg check: figures past the baseline's noise.", ("check", "process")),
    _gauge("checks_passed", "jaxdbg check: 1 when every check passed.", PROCESS),
    # memory (device_memory_*: jaxdbg.watch too)
    _gauge("device_memory_live_bytes", "Bytes of live jax arrays on a device.", DEVICE),
    _gauge("device_memory_peak_bytes", "A device's peak memory: its own peak_bytes_in_use where it keeps one "
           "(GPU, TPU), else the most bytes of live arrays seen.", DEVICE),
    _gauge("memory_program_peak_bytes", "jaxdbg memory: what a call of the function holds at once (per device).",
           FUNCTION),
    _gauge("memory_program_temp_bytes", "jaxdbg memory: the function's temporaries (per device).", FUNCTION),
    _gauge("memory_program_needs_bytes", "jaxdbg memory: live bytes when called plus what the call adds.", FUNCTION),
    _gauge("memory_program_fits", "jaxdbg memory: 1 when the function fits the device memory budget, else 0.",
           FUNCTION),
    _gauge("memory_run_peak_bytes", "jaxdbg memory: the run's peak (live at a call's start + what it adds).",
           PROCESS),
    _gauge("memory_leaks", "jaxdbg memory: producers whose live arrays pile up call after call.", PROCESS),
    _gauge("memory_leaked_bytes", "jaxdbg memory: bytes the leaks hold.", PROCESS),
    _gauge("memory_out_of_memory", "jaxdbg memory: 1 when the run ended in an out-of-memory error.", PROCESS),
    _gauge("memory_misfits", "jaxdbg memory: functions that do not fit the device memory budget.", PROCESS),
)

FAMILIES: dict[str, Family] = {family.name: family for family in TABLE}
assert len(FAMILIES) == len(TABLE), "a family name is in the table twice"


class Families:
    """The samples of one scrape or export, by family (the table's): a family is made on its first sample."""

    def __init__(self) -> None:
        self._made: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}

    def add(self, name: str, labels: Mapping[str, object], value: float | None) -> None:
        """One sample of the table's family ``name`` (labels by name, any order); None (a figure the report or
        the watch does not know, e.g. a capture's compiles) is no sample."""
        family = FAMILIES[name]
        if set(labels) != set(family.labels):
            raise ValueError(f"metric family {name}: labels {sorted(labels)}, the table says {sorted(family.labels)}")
        if value is None:
            return
        made = self._made.get(name)
        if made is None:
            make = CounterMetricFamily if family.type == "counter" else GaugeMetricFamily
            made = self._made[name] = make(PREFIX + name, family.help, labels=list(family.labels))
        made.add_metric([_text(labels[label]) for label in family.labels], float(value))

    def all(self) -> list[Metric]:
        return list(self._made.values())


def device_memory(out: Families, device: str, process: str, live: int | None, peak: int | None) -> None:
    """A device's live and peak bytes: the same two families for a memory report and a live watch."""
    labels = {"device": device, "process": process}
    out.add("device_memory_live_bytes", labels, live)
    out.add("device_memory_peak_bytes", labels, peak)


def _text(value: object) -> str:
    """A label value as text: None is empty, a whole float has no '.0' (memory_cap 2.0 is '2')."""
    if value is None:
        return ""
    if isinstance(value, float) and not math.isinf(value) and value.is_integer():
        return f"{value:g}"
    return str(value)
