"""What a profile job is asked and sends back, message by message (typed: see :mod:`jaxdbg.protocol`).

Example:
    >>> row = CallTiming(call_index=4, wall_s=0.02, execute_s=0.02)
    >>> row.timed, row.compile_s
    (True, 0.0)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from jaxdbg._source import SourceLocation
from jaxdbg.profile.model import FunctionKind
from jaxdbg.protocol import Message, Request

if TYPE_CHECKING:  # types only: a messages module stays light and out of import cycles
    from jaxdbg.profile.model import Recompile, TraceFiles
    from jaxdbg.profile.peaks import Peak
    from jaxdbg.profile.processes import ProcessFigures
    from jaxdbg.profile.run import ProfileOptions
    from jaxdbg.target import TargetSpec


@dataclass(frozen=True)
class CallTiming:
    """One call of a jitted function. ``timed``: the call waited for its outputs (an untimed call ran ahead,
    and its wall is the dispatch alone); ``captured``: it ran inside the profiler's capture window."""

    call_index: int
    wall_s: float
    execute_s: float
    compile_s: float = 0.0
    put_s: float = 0.0  # copying host (numpy) arguments to the device just before the call
    captured: bool = False
    timed: bool = True


@dataclass(frozen=True)
class ProfileJob(Request, handler_module="jaxdbg.profile.jobs"):
    """The request: what to profile and how (``options`` is the command's ``ProfileOptions``, as given)."""

    spec: TargetSpec
    options: ProfileOptions
    out_dir: str


@dataclass(frozen=True)
class DeviceInfo(Message):
    """The default backend the target runs on (sent first)."""

    backend: str
    kind: str
    count: int


@dataclass(frozen=True)
class FunctionDefined(Message):
    """A jitted function (``id`` is the jit layer's record: one per name and definition site); ``kind``: ``jit``, or
    ``pmap`` for a function given to ``jax.pmap``; ``called_as``: a multihost helper's jit, the helper as the user
    called it at ``source`` (sent again when a later call names it otherwise: the latest one counts)."""

    id: int
    name: str
    source: SourceLocation | None
    kind: FunctionKind = "jit"
    called_as: str | None = None


@dataclass(frozen=True)
class CompileRecord(Message):
    """One compile of a function: stage times, why it happened, and (first few) its HLO, cost and memory."""

    id: int
    call_index: int
    trace_s: float = 0.0
    lower_s: float = 0.0
    compile_s: float = 0.0
    total_s: float = 0.0
    failed: bool = False
    cache_hit: bool = False
    signature: str = ""
    dtypes: tuple[str, ...] = ()
    recompile: Recompile | None = None  # for every compile after the first
    hlo: dict[str, str] = field(default_factory=dict)
    module: str = ""
    cost: dict | None = None
    memory: dict | None = None
    introspection_error: str | None = None
    introspection_recompiled: bool = False


@dataclass(frozen=True)
class CallBatch(Message):
    """Call timings gathered since the last flush, per function id."""

    rows: dict[int, list[CallTiming]]


@dataclass(frozen=True)
class RunTotals(Message):
    """Running totals (the latest one is the whole truth): eager compile spans ``(stage, start, end, name)``,
    transfers ``(kind, source, count, seconds, bytes)`` per kind and user line, persistent-cache hits, time spent
    introspecting, forced synchronisations ``(kind, source, count, wait_s, idle_s, bytes)`` per kind and user line,
    per function id its steady steps' sums (:data:`jaxdbg.profile.host_bound.STEP_FIELDS`), the calls made of
    each function (id -> count; the calls that ran ahead unseen send no timing), and what its unseen calls ran
    beyond the estimate (id -> seconds: the syncs that waited for them waited that much longer)."""

    eager_spans: list[tuple[str, float, float, str]]
    transfers: list[tuple[str, SourceLocation | None, int, float, int]]
    cache_hits: int
    introspection_s: float
    syncs: list[tuple[str, SourceLocation | None, int, float, float, int]] = field(default_factory=list)
    steps: dict[int, list[float]] = field(default_factory=dict)
    calls: dict[int, int] = field(default_factory=dict)
    late: dict[int, float] = field(default_factory=dict)  # id -> what its unseen calls ran beyond their estimate


@dataclass(frozen=True)
class RunFinished(Message):
    """The target's run ended: its wall time, jaxdbg's own overhead inside it, and warm-up calls (function)."""

    wall_s: float
    overhead_s: float
    warmup: int = 0


@dataclass(frozen=True)
class CaptureOps(Message):
    """Per-op totals read from the capture: xprof's hlo_stats by name prefix (off CPU), thunk events by module;
    ``per_device``: ``{module: {device ordinal: [seconds per execution]}}`` for programs run on several devices."""

    by_prefix: dict
    by_module: dict
    per_device: dict = field(default_factory=dict)


@dataclass(frozen=True)
class TraceCaptured(Message):
    """The profiler capture's files (a profile.model.TraceFiles)."""

    files: TraceFiles


@dataclass(frozen=True)
class MonitorSamples(Message):
    """A batch of host/device monitor samples (rows of profile.monitor.Sampler)."""

    rows: list[tuple]


@dataclass(frozen=True)
class PeakMeasured(Message):
    """The device's calibrated peak (CPU): a profile.peaks.Peak."""

    peak: Peak


@dataclass(frozen=True)
class JobFigures(Message):
    """Process 0 of a multi-process job: every process's figures (profile.processes.ProcessFigures)."""

    rows: tuple[ProcessFigures, ...]


@dataclass(frozen=True)
class JobCapture(Message):
    """Process 0 of a multi-process job: the job's xprof session (``logdir/plugins/profile/run/``) and the
    processes whose capture is in it (profile.job_capture)."""

    logdir: str
    run: str
    processes: tuple[int, ...]


@dataclass(frozen=True)
class ProfileNote(Message):
    """Something that went wrong on the side (the capture, the calibration): shown as a note."""

    text: str
