"""Pictures of pipeline runs: a Chrome/Perfetto trace (one process per run, one track per stage), a PNG
timeline, and a PNG of speedup against the memory cap. matplotlib is imported only when plotting.

``write_trace(path, records)`` writes the same trace to a file; ``plot_timeline(path, records)`` draws it.

Example:
    >>> from jaxdbg.pipeline.bench import BenchOptions, run_bench
    >>> result, records = run_bench(BenchOptions(stages=2, microbatches=2, policies=("fixed",)))
    >>> trace = chrome_trace({"1f1b fixed": records[result.runs[0].key()]})
    >>> sum(1 for event in trace["traceEvents"] if event["ph"] == "X")   # 2 stages x 2 microbatches x F, B
    8
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from jaxdbg.pipeline.arbiter import RunRecord
from jaxdbg.pipeline.tasks import FORWARD, WEIGHT

MAX_TRACE_EVENTS = 400_000  # beyond this, further runs are left out of the trace (Perfetto stays fast)
_COLOURS = {FORWARD: "#4C72B0", 1: "#DD8452", WEIGHT: "#55A868"}


def chrome_trace(records: Mapping[str, RunRecord]) -> dict:
    """Trace Event Format: each run a process, each stage a thread, each task a complete event (µs)."""
    events: list[dict] = []
    omitted = []
    for pid, (label, record) in enumerate(records.items()):
        shape = record.shape
        if len(events) + shape.num_tasks > MAX_TRACE_EVENTS:
            omitted.append(label)
            continue
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": label}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}})
        events.extend({"ph": "M", "name": "thread_name", "pid": pid, "tid": w, "args": {"name": f"stage {w}"}}
                      for w in range(shape.stages))
        worker = shape.graph().worker
        for task in range(shape.num_tasks):
            kind, model_stage, mb = shape.decode(task)
            events.append({
                "ph": "X", "name": shape.name(task), "cat": shape.letter(kind), "pid": pid, "tid": worker[task],
                "ts": float(record.start[task]) * 1e6, "dur": float(record.end[task] - record.start[task]) * 1e6,
                "args": {"microbatch": mb, "model_stage": model_stage},
            })
    trace: dict[str, object] = {"traceEvents": events, "displayTimeUnit": "ms"}
    if omitted:
        trace["otherData"] = {"omitted_runs": omitted, "why": f"more than {MAX_TRACE_EVENTS} events"}
    return trace


def write_trace(path: str | Path, records: Mapping[str, RunRecord]) -> None:
    Path(path).write_text(json.dumps(chrome_trace(records)))


def plot_timeline(path: str | Path, records: Mapping[str, RunRecord]) -> None:
    """One panel per run, one row per stage, a bar per task coloured by kind (shared time axis)."""
    plt = _pyplot()
    from matplotlib.patches import Patch

    fig, axes = plt.subplots(len(records), 1, figsize=(12, 1.2 + 0.35 * _stages(records) * len(records)),
                             sharex=True, squeeze=False)
    for ax, (label, record) in zip(axes[:, 0], records.items()):
        shape = record.shape
        kinds = np.arange(shape.num_tasks) // (shape.model_stages * shape.microbatches)
        worker = np.asarray(shape.graph().worker)
        for kind in range(shape.kinds):
            for w in range(shape.stages):
                mask = (kinds == kind) & (worker == w)
                spans = list(zip(record.start[mask], record.end[mask] - record.start[mask]))
                ax.broken_barh(spans, (w - 0.4, 0.8), facecolors=_COLOURS[kind], edgecolors="white", linewidth=0.4)
        ax.set_yticks(range(shape.stages))
        ax.set_ylim(shape.stages - 0.5, -0.5)
        ax.set_ylabel("stage")
        ax.set_title(f"{label}: makespan {record.end.max() * 1e3:.1f} ms", fontsize=9, loc="left")
    split = any(r.shape.split for r in records.values())
    legend = [Patch(color=_COLOURS[FORWARD], label="F"), Patch(color=_COLOURS[1], label="I" if split else "B")]
    if split:
        legend.append(Patch(color=_COLOURS[WEIGHT], label="W"))
    axes[0, 0].legend(handles=legend, loc="upper right", fontsize=8, ncol=3)
    axes[-1, 0].set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_memory(path: str | Path, points: Mapping[str, list[tuple[float, float]]]) -> None:
    """Median speedup over fixed order against the memory cap (multiples of 1F1B's), one line per series."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, series in points.items():
        xs, ys = zip(*sorted(series))
        ax.plot(xs, ys, marker="o", label=label)
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xlabel("memory cap (multiples of 1F1B's in-flight microbatches)")
    ax.set_ylabel("median speedup vs fixed order")
    ax.set_xscale("log", base=2)
    caps = sorted({x for series in points.values() for x, _ in series})
    ax.set_xticks(caps, [f"{c:g}x" for c in caps])
    ax.minorticks_off()
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _stages(records: Mapping[str, RunRecord]) -> int:
    return max(r.shape.stages for r in records.values())


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt
