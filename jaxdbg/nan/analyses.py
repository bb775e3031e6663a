"""What nan-hunt works out once the origin is found: a registry of analyses, each run under one guard.

The origin is the answer; the analyses after it add to it: where its infinities came from (``chain``), what
grew before it (``growth``), whether float32 cures it (``precision``), a float16/bfloat16 overflow behind it
(``overflow``), where a zero it divided by was made (``zero``), whether a cond that vmap turned into a select
kept or discarded it (``cond_select``), the paragraph and hints (``explanation``), the failing call saved to
disk (``bundle``). Each is a function ``analyse(findings)`` in a module of its own
that reads and fills one shared :class:`Findings`;
:data:`ANALYSES` lists them in the order they run. One that raises loses only what it would have added: the
guard turns the failure into an :class:`~jaxdbg.nan.result.AnalysisWarning` (the step, the error in one
line, its traceback for ``-v``), the next one runs, and the command still reports what was found, with its
exit code. The localisation itself runs under the same guard (step ``localise``): when the replay fails,
the origin is the call.

A new analysis is one module with ``analyse(findings)`` (and, if it adds to the report, a field of
:class:`Findings` and of :class:`~jaxdbg.nan.result.NanHuntResult`), one entry here, and its docs
(docs/report.md, the schema).

Example:
    >>> findings = Findings(first=None)
    >>> run_analyses(findings, (Analysis("boom", lambda f: 1 / 0), Analysis("fine", lambda f: None)))
    >>> [(w.step, w.message) for w in findings.warnings]
    [('boom', 'ZeroDivisionError: division by zero')]
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from jaxdbg.nan import bundle, chain, cond_select, explain, growth, overflow, precision, zero_source
from jaxdbg.nan.result import (
    AnalysisWarning,
    GrowthEntry,
    NanHuntResult,
    Origin,
    Overflow,
    PrecisionCheck,
    Strategy,
)
from jaxdbg.runner import first_line


@dataclass
class Findings:
    """What the analyses share: the finding and its localisation (read), and what each adds (written).

    ``finding`` is the watch's (a ``JitFinding`` or ``EagerFinding``), ``watch`` the
    :class:`~jaxdbg.nan.watch.Watch` that saw the run, ``options`` the command's ``HuntOptions``; ``call`` and
    ``localisation`` are those of a jitted finding (None for an eager one).
    """

    first: Origin | None
    finding: Any = None
    watch: Any = None
    options: Any = None
    call: Any = None
    localisation: Any = None
    strategy: Strategy | None = None
    chain: list[Origin] = field(default_factory=list)
    sources: dict = field(default_factory=dict)  # origin -> the user lines that computed its inputs
    notes: list[str] = field(default_factory=list)
    came_in: bool = False  # the origin's call (or eager operation) got an Inf through an argument
    growth: tuple[GrowthEntry, ...] = ()
    precision: PrecisionCheck | None = None
    overflow: Overflow | None = None
    zero_source: zero_source.ZeroSource | None = None  # where the zero the origin divided by was made
    globals_named: dict[int, str] = field(default_factory=dict)  # id -> name of the ended script's global arrays
    cond_select: cond_select.CondSelect | None = None  # the select a cond became under vmap, the origin's NaN in it
    explanation: str = ""
    hints: tuple[str, ...] = ()
    artifacts: dict[str, str] = field(default_factory=dict)
    warnings: list[AnalysisWarning] = field(default_factory=list)

    def result(self, calls_watched: int, functions: tuple[str, ...], grad_norms: tuple = ()) -> NanHuntResult:
        """The report's ``result``; an explanation that failed is the origin in one line."""
        text = self.explanation or (self.first.describe() + "." if self.first is not None else "")
        return NanHuntResult(True, self.first, tuple(self.chain), self.growth, text, self.hints, self.strategy,
                             self.precision, grad_norms, calls_watched, functions, tuple(self.notes),
                             warnings=tuple(self.warnings), overflow=self.overflow)


@dataclass(frozen=True)
class Analysis:
    """One step after the origin: its name (as warnings say it) and the function that runs it."""

    name: str
    analyse: Callable[[Findings], None]


def guarded(warnings: list[AnalysisWarning], step: str, work: Callable[[], Any]) -> bool:
    """Run ``work()``; a failure becomes a warning of ``step`` in ``warnings``. Returns whether it succeeded.

    Example:
        >>> said = []
        >>> guarded(said, "plot", lambda: int("x")), said[0].step, said[0].message
        (False, 'plot', "ValueError: invalid literal for int() with base 10: 'x'")
    """
    try:
        work()
    except Exception as err:  # noqa: BLE001 - the guard: a failure of one step costs only that step
        message = f"{type(err).__name__}: {first_line(str(err))}".rstrip(": ")
        warnings.append(AnalysisWarning(step, message, traceback.format_exc()))
        return False
    return True


def run_analyses(findings: Findings, analyses: Sequence[Analysis] | None = None) -> None:
    """Run every analysis (default :data:`ANALYSES`) in order, each under :func:`guarded`."""
    for analysis in ANALYSES if analyses is None else analyses:
        guarded(findings.warnings, analysis.name, lambda: analysis.analyse(findings))  # noqa: B023 - called at once


ANALYSES: tuple[Analysis, ...] = (
    Analysis("chain", chain.analyse),
    Analysis("growth", growth.analyse),
    Analysis("precision", precision.analyse),
    Analysis("overflow", overflow.analyse),
    Analysis("zero", zero_source.analyse),
    Analysis("cond_select", cond_select.analyse),
    Analysis("explanation", explain.analyse),
    Analysis("bundle", bundle.analyse),
)
"""The analyses after the origin, in the order they run (the explanation reads what the others found)."""
