"""Compile time from jax.monitoring time spans: per stage, and overall, without counting nesting twice.

Example:
    >>> span_times([("trace", 0.0, 1.0), ("trace", 0.2, 0.5), ("compile", 1.0, 3.0)])["total_s"]
    3.0
"""

from __future__ import annotations


def span_times(spans: list[tuple[str, float, float]]) -> dict[str, float]:
    """Seconds per stage (union of spans, so nested traces are not counted twice) and their total."""
    out = {}
    for stage in ("trace", "lower", "compile"):
        out[f"{stage}_s"] = union_length([(s, e) for kind, s, e in spans if kind == stage])
    out["total_s"] = union_length([(s, e) for kind, s, e in spans if kind in ("trace", "lower", "compile")])
    return out


def union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total
