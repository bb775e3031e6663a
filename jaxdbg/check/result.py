"""What ``jaxdbg check`` reports: frozen dataclasses, serialised by :func:`jaxdbg.report.to_jsonable`.

Example:
    >>> ok = CheckOutcome("no-nan", "nan-hunt", "train.py", True, 0, None, 1.2, "out/no-nan/report.json")
    >>> bad = CheckOutcome("budget", "profile", "train.py", False, 1, "budget broken: recompiles 2 > 0", 2.0,
    ...                    "out/budget/report.json")
    >>> CheckSuiteResult(False, (ok, bad)).essential_line()
    '1 of 2 checks failed: budget: budget broken: recompiles 2 > 0'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from jaxdbg._source import SourceLocation
from jaxdbg.check.config import Command


@dataclass(frozen=True)
class Regression:
    """A figure of one function compared with the baseline (``regressions`` lists those beyond its noise).

    ``ratio`` is current over baseline median (after calibration across machines); ``test`` names the
    test, ``p_value`` its one-sided p-value, ``interval`` the bootstrap interval of the ratio from the calls'
    times (null for compile time, one figure a run), ``noise`` the ratio a rerun of the same program stays
    under at confidence 1 - alpha, from the spread of the baseline's repeated runs (1.0: one run, unmeasured).
    """

    function: str
    metric: Literal["execute_median_s", "compile_s"]
    baseline_s: float
    current_s: float
    ratio: float
    test: str
    p_value: float | None
    interval: tuple[float, float] | None
    noise: float

    def describe(self) -> str:
        """``execute_median_s of matmul 4.02x the baseline (<test>: p=0.0005, interval 3.9-4.1x; run-to-run noise
        bound 1.3x)``."""
        how = f"{self.test} p={self.p_value:.2g}" if self.p_value is not None else self.test
        if self.interval is not None:
            how += f", interval {self.interval[0]:.3g}-{self.interval[1]:.3g}x"
        return (f"{self.metric} of {self.function} {self.ratio:.3g}x the baseline ({how}; run-to-run noise bound "
                f"{self.noise:.3g}x)")


@dataclass(frozen=True)
class CheckOutcome:
    """One check: the shared ``checks[]`` entry (HELPERS: name, command, target, passed, exit_code, finding,
    duration_s, report, location, regressions)."""

    name: str
    command: Command
    target: str
    passed: bool
    exit_code: int
    finding: str | None
    duration_s: float
    report: str
    location: SourceLocation | None = None
    regressions: tuple[Regression, ...] = ()


@dataclass(frozen=True)
class CheckSuiteResult:
    """The ``result`` of ``jaxdbg check``."""

    passed: bool
    checks: tuple[CheckOutcome, ...]

    def essential_line(self) -> str | None:
        failed = [c for c in self.checks if not c.passed]
        if not failed:
            return None
        first = failed[0]
        return f"{len(failed)} of {len(self.checks)} checks failed: {first.name}: {first.finding}"
