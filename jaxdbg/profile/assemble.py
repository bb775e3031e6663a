"""Turn what a profile job sent (:mod:`jaxdbg.profile.messages`) into
:class:`~jaxdbg.profile.model.FunctionProfile` s. Every message is optional: a run cut short still assembles
from what arrived.

Example:
    >>> from jaxdbg.profile.messages import CallBatch, CallTiming, FunctionDefined
    >>> got = Gathered.from_messages([FunctionDefined(0, "step", None),
    ...                               CallBatch({0: [CallTiming(i, 0.01, 0.01) for i in range(4)]})])
    >>> [(f.name, f.execute.calls) for f in got.functions(mode="script")]
    [('step', 4)]
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from jaxdbg.profile.host_bound import input_pipeline
from jaxdbg.profile.messages import (
    CallBatch,
    CallTiming,
    CaptureOps,
    CompileRecord,
    DeviceInfo,
    FunctionDefined,
    JobFigures,
    MonitorSamples,
    PeakMeasured,
    ProfileNote,
    RunFinished,
    RunTotals,
    TraceCaptured,
)
from jaxdbg.profile.model import (
    Compilation,
    CompileTimes,
    ExecuteStats,
    FunctionProfile,
    HostSync,
    InputPipeline,
    Recompile,
    Totals,
    TraceFiles,
    Transfer,
    TransferSite,
)
from jaxdbg.profile.spans import union_length
from jaxdbg.protocol import Environment, Message

MAX_SITES = 5  # user lines kept per kind of transfer


@dataclass
class Gathered:
    """Everything a job sent, grouped by kind (for running totals and one-off facts the latest wins)."""

    device: dict = field(default_factory=dict)
    names: dict[int, FunctionDefined] = field(default_factory=dict)
    compiles: dict[int, list[CompileRecord]] = field(default_factory=lambda: defaultdict(list))
    calls: dict[int, list[CallTiming]] = field(default_factory=lambda: defaultdict(list))
    totals: RunTotals | None = None
    run: RunFinished | None = None
    trace: TraceFiles | None = None
    trace_errors: list[str] = field(default_factory=list)
    monitor: list[tuple] = field(default_factory=list)
    peak: Any = None
    ops: CaptureOps | None = None
    environment: dict | None = None
    job: tuple = ()  # process 0 of a multi-process job: every process's ProcessFigures

    @classmethod
    def from_messages(cls, messages: Iterable[Message]) -> Gathered:
        got = cls()
        for message in messages:
            if isinstance(message, DeviceInfo):
                got.device = asdict(message)
            elif isinstance(message, FunctionDefined):
                got.names[message.id] = message
            elif isinstance(message, CompileRecord):
                got.compiles[message.id].append(message)
            elif isinstance(message, CallBatch):
                for ident, rows in message.rows.items():
                    got.calls[ident].extend(rows)
            elif isinstance(message, RunTotals):
                got.totals = message
            elif isinstance(message, RunFinished):
                got.run = message
            elif isinstance(message, TraceCaptured):
                got.trace = message.files
            elif isinstance(message, ProfileNote):
                got.trace_errors.append(message.text)
            elif isinstance(message, MonitorSamples):
                got.monitor.extend(message.rows)
            elif isinstance(message, PeakMeasured):
                got.peak = message.peak
            elif isinstance(message, CaptureOps):
                got.ops = message
            elif isinstance(message, Environment):
                got.environment = message.info
            elif isinstance(message, JobFigures):
                got.job = tuple(message.rows)
        return got

    # ---- per function ------------------------------------------------------------------------------------
    def functions(self, mode: str) -> list[FunctionProfile]:
        warmup = self.run.warmup if self.run is not None and mode == "function" else 0
        made = self.totals.calls if self.totals is not None else {}
        late = self.totals.late if self.totals is not None else {}
        found = []
        for ident, meta in sorted(self.names.items()):
            infos = sorted(self.compiles.get(ident, []), key=lambda i: i.call_index)
            calls = sorted(self.calls.get(ident, []), key=lambda c: c.call_index)
            if not infos and not calls:
                continue  # jitted but never called
            found.append(function_profile(meta, infos, calls, mode, warmup, made.get(ident, 0), late.get(ident, 0.0)))
        found.sort(key=lambda f: -(f.compile_total_s + f.execute.total_s))
        return found

    # ---- run-wide ---------------------------------------------------------------------------------------
    def dtypes(self, name: str) -> list[str]:
        """Argument dtypes of a function's compiles (to pick the peak to compare against)."""
        ids = [i for i, meta in self.names.items() if meta.name == name]
        return [d for i in ids for info in self.compiles.get(i, []) for d in info.dtypes]

    def transfers(self) -> list[Transfer]:
        """One row per kind of copy, with the user lines that made them (most time first)."""
        by_kind: dict[str, list[TransferSite]] = defaultdict(list)
        for kind, source, count, seconds, nbytes in (self.totals.transfers if self.totals is not None else []):
            by_kind[kind].append(TransferSite(source, int(count), float(seconds), int(nbytes)))
        rows = []
        for kind, sites in sorted(by_kind.items()):
            sites.sort(key=lambda site: -site.total_s)
            rows.append(Transfer(kind, sum(s.count for s in sites), sum(s.total_s for s in sites),
                                 sum(s.bytes for s in sites), tuple(s for s in sites[:MAX_SITES] if s.source)))
        return rows

    def syncs(self) -> list[HostSync]:
        """The forced synchronisations by kind and user line, the one behind the most device idle time first."""
        rows = [HostSync(kind, source, int(count), float(wait), float(idle), int(nbytes))
                for kind, source, count, wait, idle, nbytes in (self.totals.syncs if self.totals is not None else [])]
        return sorted(rows, key=lambda r: -(r.device_idle_s + r.wait_s))

    def input_pipeline(self, syncs: list[HostSync]) -> InputPipeline | None:
        """Whether the device waits for the host, for the function with the most steady steps."""
        if self.totals is None:
            return None
        names = {ident: meta.name for ident, meta in self.names.items()}
        made = self.totals.calls  # the calls that ran ahead unseen sent no timing
        calls = {ident: max(len(rows), made.get(ident, 0)) for ident, rows in self.calls.items()}
        return input_pipeline(self.totals.steps, names, syncs, calls)

    def eager_compile(self) -> dict[str, Any]:
        spans = self.totals.eager_spans if self.totals is not None else []
        by_name: dict[str, float] = defaultdict(float)
        for stage, start, end, name in spans:
            if stage == "compile":
                by_name[name] += end - start
        top = sorted(by_name.items(), key=lambda kv: -kv[1])[:5]
        return {"count": sum(1 for s in spans if s[0] == "compile"),
                "total_s": union_length([(s, e) for _, s, e, _ in spans]),
                "top": [{"name": n, "compile_s": t} for n, t in top]}

    def totals_for(self, functions: list[FunctionProfile], elapsed_s: float, mode: str) -> Totals:
        overhead = self.run.overhead_s if self.run is not None else 0.0
        wall = self.run.wall_s - overhead if self.run is not None else elapsed_s
        compile_s = sum(f.compile_total_s for f in functions) + self.eager_compile()["total_s"]
        if mode == "function":
            execute = sum(c.wall_s for rows in self.calls.values() for c in rows)
        else:
            execute = sum(f.execute.total_s for f in functions)
        transfer = sum(t.total_s for t in self.transfers())
        other = max(wall - compile_s - execute - transfer, 0.0)
        return Totals(wall, compile_s, execute, transfer, other, overhead)


def function_profile(meta: FunctionDefined, infos: list[CompileRecord], calls: list[CallTiming], mode: str,
                     warmup: int, made: int = 0, late: float = 0.0) -> FunctionProfile:
    def stages(i: CompileRecord) -> CompileTimes:
        return CompileTimes(i.trace_s, i.lower_s, i.compile_s, i.total_s)

    times = CompileTimes(*(sum(getattr(i, k) for i in infos) for k in ("trace_s", "lower_s", "compile_s", "total_s")))
    recompiles = tuple(i.recompile for i in infos[1:] if isinstance(i.recompile, Recompile))
    compilations = tuple(Compilation(i.call_index, stages(i), i.signature, i.cache_hit) for i in infos)
    with_hlo = [i for i in infos if i.hlo]
    latest = with_hlo[-1] if with_hlo else None
    return FunctionProfile(
        name=meta.name, source=meta.source, called_as=meta.called_as, kind=meta.kind, compiles=len(infos),
        recompiles=recompiles, compile=times, execute=execute_stats(calls, mode, warmup, made, late),
        cost=normalize_cost(latest.cost if latest else None), memory=latest.memory if latest else None,
        compilations=compilations, module=latest.module if latest else "",
        hlo=dict(with_hlo[0].hlo) if with_hlo else {},
    )


def execute_stats(calls: list[CallTiming], mode: str, warmup: int, made: int = 0, late: float = 0.0) -> ExecuteStats:
    """Call statistics. Script: median/p90 over calls that did not compile; ``made`` calls in all (those that
    ran ahead unseen send no row; ``late``: what they ran beyond the timed calls' mean, as syncs saw it). Function:
    over the timed runs."""
    if not calls:
        return ExecuteStats()
    first = calls[0].wall_s
    if mode == "function":
        timed = [c.execute_s for c in calls[warmup:]] or [c.execute_s for c in calls]
        total = sum(timed)
        count = len(timed)
    else:
        waited = [c for c in calls if c.timed]  # the others' wall is a dispatch
        steady = [c for c in waited if c.compile_s == 0.0]
        undisturbed = [c for c in steady if not c.captured]  # outside the profiler's capture window
        timed = [c.execute_s for c in (undisturbed if len(undisturbed) >= 3 else steady or waited)]
        # Calls that ran ahead untimed are counted at the timed calls' mean: an estimate.
        count = max(len(calls), made)
        total = sum(c.execute_s for c in waited) + (count - len(waited)) * float(np.mean(timed)) + late
        sampled = len(waited)
    median, p90, low, high, spread = duration_stats(timed)
    return ExecuteStats(count, first, median, p90, low, high, spread, total, sampled if mode != "function" else count,
                        tuple(float(v) for v in timed))


def duration_stats(durations: Iterable[float]) -> tuple[float, float, float, float, float | None]:
    """``(median, p90, min, max, spread)`` of some durations (at least one); spread = (p90 - p10) / median.

        >>> duration_stats([1.0, 2.0, 3.0])[:2]
        (2.0, 2.8)
    """
    values = np.asarray(list(durations), dtype=float)
    median = float(np.median(values))
    p10, p90 = (float(v) for v in np.percentile(values, [10, 90]))
    return median, p90, float(values.min()), float(values.max()), (p90 - p10) / median if median > 0 else None


def normalize_cost(raw: dict | None) -> dict[str, float] | None:
    """Contract names for ``cost_analysis()``: flops, bytes_accessed, transcendentals, arithmetic_intensity."""
    if not raw:
        return None
    cost = {"flops": raw.get("flops"), "bytes_accessed": raw.get("bytes accessed"),
            "transcendentals": raw.get("transcendentals")}
    if cost["flops"] is not None and cost["bytes_accessed"]:
        cost["arithmetic_intensity"] = cost["flops"] / cost["bytes_accessed"]
    return {k: v for k, v in cost.items() if v is not None}
