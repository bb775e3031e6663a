"""Magnitude of each output leaf across calls, kept cheaply: what exploded before the NaN.

Per watched function the tracker keeps four small numpy vectors (one slot per floating output leaf):
the first non-zero magnitude (baseline), the largest finite magnitude since (peak), the latest, and the
first call whose magnitude reached ``factor`` times the baseline. One vectorised update per call.

Example:
    >>> import numpy as np
    >>> tracker = GrowthTracker(factor=100.0)
    >>> for call, mags in enumerate([[1.0, 2.0], [50.0, 2.0], [1e4, 3.0]]):
    ...     tracker.update("step", ["w", "loss"], np.array(mags), call)
    >>> [(g.name, g.first_call, g.ratio) for g in tracker.report()]
    [('w', 2, 10000.0)]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from jaxdbg._source import SourceLocation
from jaxdbg.nan.result import GrowthEntry


@dataclass
class _Series:
    names: list[str]
    baseline: np.ndarray
    peak: np.ndarray
    first_call: np.ndarray
    source: SourceLocation | None = None
    sources: list[SourceLocation | None] = field(default_factory=list)


class GrowthTracker:
    """Tracks per-leaf magnitudes of every watched function's outputs."""

    def __init__(self, factor: float = 100.0):
        self.factor = float(factor)
        self.series: dict[str, _Series] = {}

    def update(self, function: str, names: Sequence[str], magnitudes: np.ndarray, call_index: int,
               source: SourceLocation | None = None) -> None:
        """Record one call's magnitudes (non-finite entries are ignored: the caller reports those)."""
        series = self.series.get(function)
        if series is None or len(series.names) != len(magnitudes):
            n = len(magnitudes)
            series = _Series(list(names), np.full(n, np.nan), np.zeros(n), np.full(n, -1, dtype=np.int64), source)
            self.series[function] = series
        mags = np.where(np.isfinite(magnitudes), magnitudes, np.nan)
        unset = np.isnan(series.baseline) & (mags > 0)
        series.baseline[unset] = mags[unset]
        series.peak = np.fmax(series.peak, mags)
        with np.errstate(divide="ignore", invalid="ignore"):
            grew = (series.first_call < 0) & (mags >= self.factor * series.baseline)
        series.first_call[grew] = call_index

    def set_sources(self, function: str, find: Callable[[int], SourceLocation | None]) -> None:
        """Give each leaf of ``function`` its own source line (known once its jaxpr has been traced)."""
        series = self.series.get(function)
        if series is not None:
            series.sources = [find(i) for i in range(len(series.names))]

    def report(self) -> list[GrowthEntry]:
        """Leaves that grew by at least ``factor``, earliest first (then by ratio)."""
        entries = []
        for function, s in self.series.items():
            for i in np.nonzero(s.first_call >= 0)[0]:
                source = s.sources[i] if i < len(s.sources) and s.sources[i] is not None else s.source
                ratio = float(s.peak[i] / s.baseline[i])
                entries.append(GrowthEntry(s.names[i], source, int(s.first_call[i]), ratio, function,
                                           float(s.baseline[i]), float(s.peak[i])))
        return sorted(entries, key=lambda e: (e.first_call, -e.ratio))
