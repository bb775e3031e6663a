"""pipeline-bench's families of one run, the same for the export of a finished bench
(:mod:`jaxdbg.metrics.families`) and for its live endpoint while it runs (:mod:`jaxdbg.metrics.live`).

Example:
    >>> from jaxdbg.metrics.table import Families
    >>> from jaxdbg.pipeline.bench import BenchOptions, run_bench
    >>> result, _ = run_bench(BenchOptions(stages=2, microbatches=4, policies=("fixed",)))
    >>> out = Families()
    >>> pipeline_run(out, result.runs[0], result.runs[0], "0", result.runs[0])
    >>> sorted(f.name for f in out.all())[:2]
    ['jaxdbg_pipeline_bubble_fraction', 'jaxdbg_pipeline_makespan_over_lower_bound']
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jaxdbg.metrics.table import RUN_LABELS, Families

if TYPE_CHECKING:
    from jaxdbg.pipeline.bench import RunKey, RunRow
    from jaxdbg.pipeline.metrics import RunMetrics


def run_labels(key: RunKey) -> dict[str, Any]:
    """The labels naming one pipeline-bench run (a fixed run's hint and memory cap are empty)."""
    return {name: getattr(key, name) for name in RUN_LABELS}


def pipeline_run(out: Families, key: RunKey, metrics: RunMetrics, process: str, row: RunRow | None = None) -> None:
    """One run's families: the live endpoint's (its key and metrics as it ends) and the export's (``row``,
    the report's, which also compares the run with the others and with its bounds)."""
    from jaxdbg.pipeline.metrics import occupancy  # the pipeline package imports jax

    labels = {**run_labels(key), "process": process}
    for w, value in enumerate(occupancy(metrics.stage_busy, metrics.makespan_s)):
        out.add("stage_occupancy", {**labels, "stage": str(w)}, value)
    out.add("pipeline_makespan_seconds", labels, metrics.makespan_s)
    out.add("pipeline_throughput_microbatches_per_second", labels, metrics.throughput_mb_s)
    out.add("pipeline_bubble_fraction", labels, metrics.bubble_fraction)
    if row is not None:
        out.add("pipeline_speedup_vs_fixed", labels, row.speedup_vs_fixed)
        out.add("pipeline_makespan_over_lower_bound", labels, row.makespan_over_lower_bound)
        out.add("pipeline_makespan_over_memory_bound", labels, row.makespan_over_memory_bound)
