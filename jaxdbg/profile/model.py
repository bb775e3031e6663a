"""The results of ``jaxdbg profile``: frozen dataclasses, serialised by :func:`jaxdbg.report.to_jsonable`.

The field names follow the contract's profile ``result`` (docs/report.md, "profile"); fields beyond it add detail
(per-compile records, rates against the device peak, transfers, the monitor series).

Example:
    >>> CompileTimes(trace_s=0.01, lower_s=0.02, compile_s=0.1, total_s=0.13).total_s
    0.13
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from jaxdbg._source import SourceLocation
from jaxdbg.profile.processes import ProcessFigures

# What made a recompile: what jax keys its cache on (profile.signature's comparison of two calls).
ChangeKind = Literal["shape", "dtype", "weak_type", "static", "sharding", "structure", "type", "callable"]
ProfileMode = Literal["script", "function", "capture"]  # capture: --attach / --from-capture
FunctionKind = Literal["jit", "pmap"]  # pmap: a function given to jax.pmap
Bound = Literal["compute", "memory"]  # by the roofline
InputVerdict = Literal["highly input-bound", "moderately input-bound", "not input-bound"]
CaptureSource = Literal["attach", "capture"]


@dataclass(frozen=True)
class CompileTimes:
    """Seconds spent tracing to a jaxpr, lowering to StableHLO, and in the backend compiler (summed)."""

    trace_s: float = 0.0
    lower_s: float = 0.0
    compile_s: float = 0.0
    total_s: float = 0.0


@dataclass(frozen=True)
class ExecuteStats:
    """Timed calls of one function. ``first_s`` is the first call's wall time (compile included);
    median/p90/min/max are over calls that did not compile (all calls if every one compiled);
    ``total_s`` sums execution time only (compile time inside a call left out), estimated for the calls
    that ran ahead untimed (``timed_calls`` of ``calls`` were timed)."""

    calls: int = 0
    first_s: float | None = None
    median_s: float | None = None
    p90_s: float | None = None
    min_s: float | None = None
    max_s: float | None = None
    spread: float | None = None  # (p90 - p10) / median: how much the timed calls vary
    total_s: float = 0.0
    timed_calls: int = 0  # calls waited for and timed; the rest ran ahead (script mode, --sync-every)
    samples_s: tuple[float, ...] = ()  # the execute times the median is over, in call order (jaxdbg check's baselines)


@dataclass(frozen=True)
class ArgChange:
    """One difference between two argument signatures: ``kind`` is shape, dtype, weak_type, static,
    sharding, structure, type, or callable."""

    argument: str
    kind: ChangeKind
    before: str
    after: str


@dataclass(frozen=True)
class Recompile:
    """A compile after the first: the 0-based call that caused it and why, in words and as changes."""

    call_index: int
    reason: str
    changes: tuple[ArgChange, ...] = ()
    source: SourceLocation | None = None  # the user's line that made the call (where CI annotates it)


@dataclass(frozen=True)
class Compilation:
    """One compile of a function (first or later), as seen from inside the call that triggered it."""

    call_index: int
    times: CompileTimes
    signature: str
    cache_hit: bool = False


@dataclass(frozen=True)
class ShardedArgument:
    """An argument of the jitted function by the user's name (``batch['x']``) and its sharding
    (``P('data', 'model')``, or the HLO's text where the PartitionSpec is unknown)."""

    argument: str
    sharding: str


@dataclass(frozen=True)
class ShardingCause:
    """Why a collective is in a compiled function: the arguments split between the devices it joins, the mesh
    axes it runs over, its device groups as the HLO writes them, and the op of the user's program it belongs
    to (``dot_general``, its full name and its line)."""

    arguments: tuple[ShardedArgument, ...]
    axes: tuple[str, ...]
    devices: str
    op: str
    op_name: str
    source: SourceLocation | None


@dataclass(frozen=True)
class OpRow:
    """One HLO operation of a compiled function, aggregated over the traced calls."""

    name: str
    category: str
    count: int
    total_s: float
    fraction: float
    source: SourceLocation | None
    module: str = ""
    expression: str = ""
    sharding_cause: ShardingCause | None = None  # collectives only


@dataclass(frozen=True)
class ScopeRow:
    """The op time of a function under one scope the user named (``jax.named_scope``, ``jax.named_call``, a Flax
    module), over all its ops; ``scope`` '' for the ops under none."""

    scope: str
    total_s: float
    fraction: float


@dataclass(frozen=True)
class DeviceExecutions:
    """One device's executions of a function run on several (a pmap, an SPMD program), from the capture window:
    ``device`` is ``backend:ordinal``; seconds from its first op to its last, per execution."""

    device: str
    executions: int
    median_s: float
    total_s: float


@dataclass(frozen=True)
class Rates:
    """Achieved rates of a function at its median time, against the device peak where one is known."""

    flops_per_s: float | None
    bytes_per_s: float | None
    arithmetic_intensity: float | None  # flops per byte accessed
    peak_flops_per_s: float | None
    peak_bytes_per_s: float | None
    flops_fraction: float | None
    bytes_fraction: float | None
    peak_source: str  # 'table: NVIDIA H100 (bf16)', 'calibrated on this CPU', or 'unknown'
    bound: Bound | None = None  # 'compute' or 'memory' by the roofline ridge point, when peaks are known
    note: str | None = None


@dataclass(frozen=True)
class FunctionProfile:
    """Everything measured about one jitted function."""

    name: str
    source: SourceLocation | None
    compiles: int | None  # None (like recompiles and compile): a capture of a running job cannot know them
    recompiles: tuple[Recompile, ...] | None
    compile: CompileTimes | None
    execute: ExecuteStats
    cost: dict[str, float] | None = None
    memory: dict[str, int] | None = None
    ops: tuple[OpRow, ...] = ()
    scopes: tuple[ScopeRow, ...] = ()  # op time by named scope, largest first; () where no op is under one
    rates: Rates | None = None
    compilations: tuple[Compilation, ...] = ()
    module: str = ""
    hlo: dict[str, str] = field(default_factory=dict)  # 'stablehlo' / 'optimized_hlo' -> file path
    ops_source: str = ""  # where the op table came from: 'xprof hlo_stats', 'xplane op events', ''
    host: str | None = None  # a capture: the process it ran in (its xplane file's name); None in a profiled run
    devices: tuple[DeviceExecutions, ...] = ()  # run on several devices: each one's executions in the capture
    kind: FunctionKind = "jit"  # 'pmap' for a function given to jax.pmap
    # A jit of jax's multihost helpers: the helper as the user called it (``sync_global_devices('saved')``), ``name``
    # the helper and ``source`` the user's line that called it (jaxdbg.multihost_calls); None for every other function.
    called_as: str | None = None

    @property
    def compile_total_s(self) -> float:
        """Seconds compiling (0 where unknown: a capture)."""
        return self.compile.total_s if self.compile is not None else 0.0


@dataclass(frozen=True)
class Totals:
    """The script's wall time split up; ``overhead_s`` is jaxdbg's own time (left out of the rest)."""

    wall_s: float
    compile_s: float | None  # None in a capture (jaxdbg did not see the compiles)
    execute_s: float
    transfer_s: float | None  # None in a capture
    other_s: float
    overhead_s: float = 0.0


@dataclass(frozen=True)
class TransferSite:
    """The copies of one kind made at one user line."""

    source: SourceLocation | None
    count: int
    total_s: float
    bytes: int


@dataclass(frozen=True)
class Transfer:
    """Host<->device copies of one kind: device_put, jnp.asarray (a numpy array made a jax array),
    implicit_args (numpy arguments of a jitted call), device_get, to_host (reading an array); ``sources``:
    the user lines that made them, most time first."""

    kind: str
    count: int
    total_s: float
    bytes: int
    sources: tuple[TransferSite, ...] = ()


@dataclass(frozen=True)
class HostSync:
    """A forced synchronisation at one user line: the host waited there for the device's results (``float(x)``,
    ``np.asarray(x)``, ``.item()``, ``print``, ``block_until_ready``, ``jax.device_get``). ``wait_s``: time it
    waited; ``device_idle_s``: time the device then sat with nothing queued, until the program's next jitted call
    (jaxdbg's own waits for timing taken out of both)."""

    kind: str
    source: SourceLocation | None
    count: int
    wait_s: float
    device_idle_s: float
    bytes: int


@dataclass(frozen=True)
class InputPipeline:
    """Whether the device waits for the host, per step of the function called most (seconds are per-step means
    over its steady steps, from one call to the next): the device's executions and idle time, the host's own
    work (building batches, Python: outside jitted calls, transfers and syncs), its transfers, its waits in
    syncs and its time dispatching the jitted calls; ``sync_idle_s``: the part of the idle time that followed a
    sync. ``verdict``: xprof's words, 'highly' / 'moderately' / 'not' input-bound when the device waits 20% / 5%
    of the step or more; ``fixes``: largest gain first; ``host_blocked_s``: the part of ``host_s`` the main thread
    spent off its CPU (blocked in a queue, a read, a lock; None where not measured)."""

    function: str
    steps: int
    step_s: float
    device_s: float
    host_s: float
    transfer_s: float
    sync_wait_s: float
    dispatch_s: float
    device_idle_s: float
    device_idle_fraction: float
    sync_idle_s: float
    verdict: InputVerdict
    fixes: tuple[str, ...] = ()
    host_blocked_s: float | None = None


@dataclass(frozen=True)
class BudgetResult:
    ok: bool
    violations: tuple[str, ...] = ()
    checked: tuple[str, ...] = ()


@dataclass(frozen=True)
class MonitorSeries:
    """Host and device samples taken through the run (one list entry per sample)."""

    interval_s: float
    t_s: tuple[float, ...]
    host_rss_bytes: tuple[int, ...]
    host_cpu_percent: tuple[float, ...]  # of one core, like top
    host_available_bytes: tuple[int | None, ...]
    device_bytes_in_use: tuple[tuple[int, ...] | None, ...]
    system_cpu_percent: tuple[float | None, ...]  # the whole machine, all cores = 100
    summary: dict[str, Any] = field(default_factory=dict)
    # The whole host's I/O in bytes/s since the sample before (None: the first sample, or not known here).
    net_receive_bytes_per_s: tuple[float | None, ...] = ()
    net_transmit_bytes_per_s: tuple[float | None, ...] = ()
    disk_read_bytes_per_s: tuple[float | None, ...] = ()
    disk_write_bytes_per_s: tuple[float | None, ...] = ()
    # The TPU runtime's figures, one list per sample, one entry per device (empty off TPU).
    tpu_duty_cycle_percent: tuple[tuple[float, ...] | None, ...] = ()
    tpu_hbm_bytes_in_use: tuple[tuple[int, ...] | None, ...] = ()
    tpu_hbm_bandwidth_percent: tuple[tuple[float, ...] | None, ...] = ()
    tpu_tensorcore_util_percent: tuple[tuple[float, ...] | None, ...] = ()


@dataclass(frozen=True)
class FunctionDelta:
    """A function's change against an earlier report (``--compare``): metric -> {old, new, delta, ratio}."""

    name: str
    status: Literal["changed", "new", "gone"]
    metrics: dict[str, dict[str, float | None]] = field(default_factory=dict)


@dataclass(frozen=True)
class TraceFiles:
    """Where the jax.profiler capture went."""

    logdir: str
    xplane: str | None
    trace_json: str | None
    perfetto: str | None
    calls_traced: int


@dataclass(frozen=True)
class StepFigures:
    """The steps one process ran during a capture: from its ``StepTraceAnnotation`` markers, or else the
    intervals between the starts of its most-run jitted program. ``execute_fraction``: the share of step time
    its programs ran; ``host_median_s``: per step, the time outside them (input pipeline, Python, logging)."""

    marker: str  # 'StepTraceAnnotation train' or 'executions of jit_train_step'
    count: int
    median_s: float | None
    p90_s: float | None
    execute_fraction: float | None
    host_median_s: float | None


@dataclass(frozen=True)
class CaptureHost:
    """One process of a captured session (one xplane file)."""

    label: str  # the file's name without .xplane.pb: 'host_port' for an attached process
    file: str
    duration_s: float  # from its first to its last recorded program execution or step
    execute_s: float  # time its jitted programs ran (union)
    steps: StepFigures | None
    devices: tuple[str, ...] = ()  # its device planes ('/device:GPU:0'); none for CPU
    overview: dict[str, Any] | None = None  # GPU/TPU: xprof's overview_page step breakdown (capture_report.OVERVIEW)


@dataclass(frozen=True)
class CaptureInfo:
    """Where a capture's figures came from: ``attach`` (jaxdbg took it from the live job) or ``capture``
    (read from a folder); ``steps``: the first process's step count."""

    source: CaptureSource
    hosts: tuple[CaptureHost, ...]
    duration_s: float
    steps: int | None
    run: str  # the copy under --out that was read (the user's folder is never written)


@dataclass(frozen=True)
class ProfileResult:
    """The profile ``result`` of the contract, plus detail."""

    mode: ProfileMode
    functions: tuple[FunctionProfile, ...]
    totals: Totals
    budget: BudgetResult
    error: str | None = None
    error_source: SourceLocation | None = None
    notes: tuple[str, ...] = ()
    hints: tuple[str, ...] = ()
    transfers: tuple[Transfer, ...] = ()
    syncs: tuple[HostSync, ...] = ()
    input_pipeline: InputPipeline | None = None
    eager_compile: dict[str, Any] = field(default_factory=dict)
    trace: TraceFiles | None = None
    monitor: MonitorSeries | None = None
    comparison: tuple[FunctionDelta, ...] | None = None
    device: dict[str, Any] = field(default_factory=dict)
    # A multi-process job, in process 0's report: every process's figures, the ones the others waited for,
    # and the per-step spread of the time the processes spent working rather than waiting.
    processes: tuple[ProcessFigures, ...] = ()
    stragglers: tuple[int, ...] = ()
    step_skew_s: float | None = None
    capture: CaptureInfo | None = None  # --attach / --from-capture only

    def essential_line(self) -> str | None:
        if not self.budget.ok:
            return "budget broken: " + "; ".join(self.budget.violations)
        return self.error
