"""Turn what a profile job sent over the channel into :class:`~jaxdbg.profile.model.FunctionProfile` s.

Topics (child -> parent): ``device``, ``function`` {id, name, source}, ``compile`` {id, call_index, stage
times, signature, recompile, hlo, module, cost, memory, dtypes}, ``calls`` {id: [(call_index, wall_s,
exec_s, compile_s, put_s)]}, ``totals`` {eager_spans, transfers, cache_hits, introspection_s} (running,
last one wins), ``run`` {wall_s, overhead_s, warmup}, ``trace`` (TraceFiles), ``ops`` {source, by, ops}
(per-op totals read from the capture), ``monitor`` (sample batches), ``peak`` (Peak), ``environment``. Everything is optional: a run cut short still assembles from what arrived.

Example:
    >>> gathered = Gathered.from_messages(outcome.messages)      # doctest: +SKIP
    >>> functions = gathered.functions(mode="script")            # doctest: +SKIP
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from jaxdbg.profile.spans import union_length
from jaxdbg.profile.model import (
    Compilation, CompileTimes, ExecuteStats, FunctionProfile, Recompile, Totals, TraceFiles, Transfer,
)


# Topics where the latest message is the whole truth (running totals, one-off facts).
_LATEST = ("device", "totals", "run", "trace", "peak", "ops", "environment", "done")


@dataclass
class Gathered:
    """Everything a job sent, grouped by topic."""

    device: dict = field(default_factory=dict)
    names: dict[int, dict] = field(default_factory=dict)
    compiles: dict[int, list[dict]] = field(default_factory=lambda: defaultdict(list))
    calls: dict[int, list[tuple]] = field(default_factory=lambda: defaultdict(list))
    totals: dict = field(default_factory=dict)
    run: dict | None = None
    trace: TraceFiles | None = None
    trace_errors: list[str] = field(default_factory=list)
    monitor: list[tuple] = field(default_factory=list)
    peak: Any = None
    ops: dict | None = None
    environment: dict | None = None
    done: bool = False

    @classmethod
    def from_messages(cls, messages: tuple[tuple[str, Any], ...]) -> "Gathered":
        got = cls()
        for topic, value in messages:
            if topic in _LATEST:
                setattr(got, topic, value)
            elif topic == "function":
                got.names[value["id"]] = value
            elif topic == "compile":
                got.compiles[value["id"]].append(value)
            elif topic == "calls":
                for ident, rows in value.items():
                    got.calls[ident].extend(rows)
            elif topic in ("trace_error", "peak_error"):
                got.trace_errors.append(value)
            elif topic == "monitor":
                got.monitor.extend(value)
        return got

    # ---- per function ------------------------------------------------------------------------------------
    def functions(self, mode: str) -> list[FunctionProfile]:
        warmup = (self.run or {}).get("warmup", 0) if mode == "function" else 0
        found = []
        for ident, meta in sorted(self.names.items()):
            infos = sorted(self.compiles.get(ident, []), key=lambda i: i["call_index"])
            calls = sorted(self.calls.get(ident, []), key=lambda c: c[0])
            if not infos and not calls:
                continue  # jitted but never called
            found.append(function_profile(meta, infos, calls, mode, warmup))
        found.sort(key=lambda f: -(f.compile.total_s + f.execute.total_s))
        return found

    # ---- run-wide ---------------------------------------------------------------------------------------
    def dtypes(self, name: str) -> list[str]:
        """Argument dtypes of a function's compiles (to pick the peak to compare against)."""
        ids = [i for i, meta in self.names.items() if meta["name"] == name]
        return [d for i in ids for info in self.compiles.get(i, []) for d in info.get("dtypes", [])]

    def transfers(self) -> list[Transfer]:
        return [Transfer(kind, int(c), float(s), int(b)) for kind, (c, s, b) in
                sorted((self.totals.get("transfers") or {}).items())]

    def eager_compile(self) -> dict[str, Any]:
        spans = self.totals.get("eager_spans") or []
        by_name: dict[str, float] = defaultdict(float)
        for stage, start, end, name in spans:
            if stage == "compile":
                by_name[name] += end - start
        top = sorted(by_name.items(), key=lambda kv: -kv[1])[:5]
        return {"count": sum(1 for s in spans if s[0] == "compile"), "total_s": union_length([(s, e) for _, s, e, _ in spans]),
                "top": [{"name": n, "compile_s": t} for n, t in top]}

    def totals_for(self, functions: list[FunctionProfile], elapsed_s: float, mode: str) -> Totals:
        run = self.run or {}
        overhead = float(run.get("overhead_s", 0.0))
        wall = float(run["wall_s"]) - overhead if "wall_s" in run else elapsed_s
        compile_s = sum(f.compile.total_s for f in functions) + self.eager_compile()["total_s"]
        if mode == "function":
            execute = sum(c[1] for rows in self.calls.values() for c in rows)
        else:
            execute = sum(f.execute.total_s for f in functions)
        transfer = sum(t.total_s for t in self.transfers())
        other = max(wall - compile_s - execute - transfer, 0.0)
        return Totals(wall, compile_s, execute, transfer, other, overhead)


def function_profile(meta: dict, infos: list[dict], calls: list[tuple], mode: str, warmup: int) -> FunctionProfile:
    times = CompileTimes(*(sum(i.get(k, 0.0) for i in infos) for k in ("trace_s", "lower_s", "compile_s", "total_s")))
    recompiles = tuple(i["recompile"] for i in infos[1:] if isinstance(i.get("recompile"), Recompile))
    compilations = tuple(
        Compilation(i["call_index"], CompileTimes(i.get("trace_s", 0.0), i.get("lower_s", 0.0), i.get("compile_s", 0.0),
                                                  i.get("total_s", 0.0)), i.get("signature", ""),
                    bool(i.get("cache_hit")))
        for i in infos)
    with_hlo = [i for i in infos if i.get("hlo")]
    latest = with_hlo[-1] if with_hlo else {}
    return FunctionProfile(
        name=meta["name"], source=meta.get("source"), compiles=len(infos), recompiles=recompiles, compile=times,
        execute=execute_stats(calls, mode, warmup), cost=normalize_cost(latest.get("cost")),
        memory=latest.get("memory"), compilations=compilations, module=latest.get("module", ""),
        hlo=dict(with_hlo[0]["hlo"]) if with_hlo else {},
    )


def execute_stats(calls: list[tuple], mode: str, warmup: int) -> ExecuteStats:
    """Call statistics. Script: median/p90 over calls that did not compile. Function: over the timed runs."""
    if not calls:
        return ExecuteStats()
    first = calls[0][1]
    if mode == "function":
        timed = [c[2] for c in calls[warmup:]] or [c[2] for c in calls]
        total = sum(timed)
        count = len(timed)
    else:
        waited = [c for c in calls if len(c) < 7 or c[6]]  # timed calls (the others' wall is a dispatch)
        steady = [c for c in waited if c[3] == 0.0]
        undisturbed = [c for c in steady if not c[5]]  # outside the profiler's capture window
        timed = [c[2] for c in (undisturbed if len(undisturbed) >= 3 else steady or waited)]
        # Calls that ran ahead untimed are counted at the timed calls' mean: an estimate.
        total = sum(c[2] for c in waited) + (len(calls) - len(waited)) * float(np.mean(timed))
        count = len(calls)
        sampled = len(waited)
    values = np.asarray(timed, dtype=float)
    median = float(np.median(values))
    p10, p90 = (float(v) for v in np.percentile(values, [10, 90]))
    return ExecuteStats(count, first, median, p90, float(values.min()), float(values.max()),
                        (p90 - p10) / median if median > 0 else None, total,
                        sampled if mode != "function" else count)


def normalize_cost(raw: dict | None) -> dict[str, float] | None:
    """Contract names for ``cost_analysis()``: flops, bytes_accessed, transcendentals, arithmetic_intensity."""
    if not raw:
        return None
    cost = {"flops": raw.get("flops"), "bytes_accessed": raw.get("bytes accessed"),
            "transcendentals": raw.get("transcendentals")}
    if cost["flops"] is not None and cost["bytes_accessed"]:
        cost["arithmetic_intensity"] = cost["flops"] / cost["bytes_accessed"]
    return {k: v for k, v in cost.items() if v is not None}
