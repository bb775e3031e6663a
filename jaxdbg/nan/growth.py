"""Magnitude of each value across calls, kept cheaply: what exploded before the NaN.

Per series (a watched function's output leaves, or the arguments of its calls that were made outside it)
the tracker keeps small numpy vectors, one slot per floating leaf: the first non-zero magnitude (baseline),
the largest finite magnitude since (peak), and the first call whose magnitude reached ``factor`` times the
baseline. One vectorised update per call; a NaN magnitude means "not measured this call".

Growth that stays small is not reported: a bias initialised at 1e-6 that training moves to 1e-3 grew
1000x, and that is ordinary. A leaf counts once its peak is at least :data:`NOTABLE` as well.

Example:
    >>> import numpy as np
    >>> tracker = GrowthTracker(factor=100.0)
    >>> for call, mags in enumerate([[1.0, 2.0, 1e-6], [50.0, 2.0, 1e-4], [1e4, 3.0, 1e-3]]):
    ...     tracker.update("step", ["w", "loss", "bias"], np.array(mags), call)
    >>> [(g.name, g.first_call, g.ratio) for g in tracker.report()]
    [('w', 2, 10000.0)]
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from jaxdbg._source import SourceLocation
from jaxdbg.nan.result import GrowthEntry

if TYPE_CHECKING:
    from jaxdbg.nan.analyses import Findings

NOTABLE = 1.0  # a peak below this is small whatever the ratio (values near 0 grow by large factors)
_SMALLEST = float(np.nextafter(0, 1))  # any measured magnitude above 0 is at least this
EAGER_KEY = "eager:"  # series of values updated eagerly (jaxdbg.nan.eager_growth) start their key with this


@dataclass
class _Series:
    names: list[str]
    baseline: np.ndarray
    peak: np.ndarray
    first_call: np.ndarray
    source: SourceLocation | None = None
    sources: list[SourceLocation | None] = field(default_factory=list)
    function: str = ""
    # The magnitude at which each leaf's next event happens: its baseline is set (the smallest positive number
    # before its first non-zero measurement), or it grows (``factor`` times its baseline); inf once it grew. A call
    # below every one of these only raises the peaks (one in-place ufunc): the steady state of a long run.
    events_at: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # ``events_at`` and ``peak`` as Python floats, for :meth:`GrowthTracker.absorb` (None: to be made again). Read
    # between training steps, numpy's small-array calls cost 15-25 us each (their code is cold by then), where
    # the interpreter's own loop is not.
    bounds: list[float] | None = None
    peaks: list[float] | None = None


class GrowthTracker:
    """Tracks per-leaf magnitudes of every watched function's outputs."""

    def __init__(self, factor: float = 100.0):
        self.factor = float(factor)
        self.series: dict[str, _Series] = {}

    def update(self, function: str, names: Sequence[str] | Callable[[], Sequence[str]], magnitudes: np.ndarray,
               call_index: int, source: SourceLocation | None = None, *, key: str | None = None,
               sources: Sequence[SourceLocation | None] | None = None) -> None:
        """Record one call's magnitudes (non-finite entries are ignored: the caller reports those).

        ``key`` names the series when a function has more than one (default: ``function``); ``names`` may be
        a function that gives them, called only when the series starts; ``sources`` are per-leaf lines that
        replace the series' own where given.
        """
        key = key or function
        series = self.series.get(key)
        if series is None or len(series.names) != len(magnitudes):
            n = len(magnitudes)
            series = _Series(list(names() if callable(names) else names), np.full(n, np.nan), np.zeros(n),
                             np.full(n, -1, dtype=np.int64), source, [None] * n, function, np.full(n, _SMALLEST))
            self.series[key] = series
        finite = np.isfinite(magnitudes)
        mags = magnitudes if finite.all() else np.where(finite, magnitudes, np.nan)
        np.fmax(series.peak, mags, out=series.peak)
        series.peaks = None
        if not (mags >= series.events_at).any():
            return  # the steady state (every call of a long run): nothing grew (NaN: not measured this call)
        if sources is not None:
            series.sources = [new or old for new, old in zip(sources, series.sources)]
        unset = np.isnan(series.baseline) & (mags > 0)
        series.baseline[unset] = mags[unset]
        with np.errstate(divide="ignore", invalid="ignore"):
            grew = (series.first_call < 0) & (mags >= self.factor * series.baseline)
        series.first_call[grew] = call_index
        series.bounds = None
        series.events_at = np.where(series.first_call >= 0, np.inf,
                                    np.where(np.isnan(series.baseline), _SMALLEST, self.factor * series.baseline))

    def absorb(self, key: str, rows: array, width: int) -> bool:
        """Record many calls' magnitudes at once (``rows``: float32 rows of ``width`` leaves, one per call, end to
        end) when that is all :meth:`update` would do with them: the series exists with that many leaves, every
        value is finite and none reaches an event. Returns whether it did; else nothing is recorded (update them
        one by one, in order).

        In plain Python, not numpy: run between training steps, its three numpy calls cost ~80 us per batch of
        calls (Flax NNX MLP loop on CPU), this ~10 us.

        Example:
            >>> tracker = GrowthTracker()
            >>> tracker.update("step", ["w", "b"], np.array([1.0, 2.0]), 0)
            >>> tracker.absorb("step", array("f", [1.5, 2.0, 1.2, 2.5]), 2), tracker.series["step"].peak.tolist()
            (True, [1.5, 2.5])
            >>> tracker.absorb("step", array("f", [1.0, float("nan")]), 2)  # a NaN: read one by one
            False
        """
        series = self.series.get(key)
        if series is None or len(series.names) != width or (width and len(rows) % width):
            return False
        total = sum(rows)  # magnitudes are >= 0: NaN or Inf anywhere makes this NaN or Inf
        if total != total or total == math.inf:
            return False
        bounds = series.bounds
        if bounds is None:
            bounds = series.bounds = series.events_at.tolist()
        tops = [max(rows[leaf::width]) for leaf in range(width)] if rows else []
        if any(top >= bound for top, bound in zip(tops, bounds)):
            return False
        peaks = series.peaks
        if peaks is None:
            peaks = series.peaks = series.peak.tolist()
        for leaf, top in enumerate(tops):
            if not top <= peaks[leaf]:  # higher, or no peak yet (NaN)
                peaks[leaf] = series.peak[leaf] = top
        return True

    def set_sources(self, function: str, find: Callable[[int], SourceLocation | None]) -> None:
        """Give each leaf of ``function`` its own source line (known once its jaxpr has been traced)."""
        series = self.series.get(function)
        if series is not None:
            series.sources = [find(i) for i in range(len(series.names))]

    def report(self) -> list[GrowthEntry]:
        """Leaves that grew by at least ``factor`` to at least :data:`NOTABLE`, earliest first (then by ratio). A
        value also seen as the argument of a jitted call is reported as that (its calls are the jitted
        function's), not again as the eager update that made it (``key`` of that series: ``eager:...``)."""
        entries, seen = [], set()
        for key, s in sorted(self.series.items(), key=lambda item: item[0].startswith(EAGER_KEY)):
            for i in np.nonzero((s.first_call >= 0) & (s.peak >= NOTABLE))[0]:
                source = s.sources[i] if i < len(s.sources) and s.sources[i] is not None else s.source
                if key.startswith(EAGER_KEY) and (s.names[i], source) in seen:
                    continue
                seen.add((s.names[i], source))
                entries.append(GrowthEntry(s.names[i], source, int(s.first_call[i]), float(s.peak[i] / s.baseline[i]),
                                           s.function, float(s.baseline[i]), float(s.peak[i])))
        return sorted(entries, key=lambda e: (e.first_call, -e.ratio))


def analyse(findings: Findings) -> None:
    """The ``growth`` analysis: what the watch saw grow before the finding, each output leaf of the failing
    function named by the line that computes it (known once its jaxpr is traced)."""
    watch = findings.watch
    closed = getattr(findings.localisation, "closed_jaxpr", None)
    if findings.call is not None and closed is not None:
        watch.growth.set_sources(findings.call.series or findings.call.name, _output_sources(closed))
    findings.growth = tuple(watch.growth.report())


def _output_sources(closed: Any) -> Callable[[int], SourceLocation | None]:
    """Floating output ``i`` of a closed jaxpr -> the source line of the equation that computes it."""
    from jaxdbg import _compat
    from jaxdbg.nonfinite import is_inexact

    jaxpr, _ = _compat.open_jaxpr(closed)
    producer = {}
    for eqn in jaxpr.eqns:
        for var in eqn.outvars:
            producer[var] = eqn
    floats = [v for v in jaxpr.outvars if is_inexact(getattr(v, "aval", None))]

    def find(i: int) -> SourceLocation | None:
        if i >= len(floats) or _compat.is_literal(floats[i]) or floats[i] not in producer:
            return None
        return _compat.eqn_source(producer[floats[i]])

    return find
