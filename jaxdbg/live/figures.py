"""The live figures of a running watch, per function (what ``metrics_port`` serves).

Plain counters updated on the watched calls' path (no locks: one writer per call, readers take a snapshot).

Example:
    >>> figures = Figures()
    >>> row = figures.function("train_step")
    >>> row.called(10.0); row.called(10.25)
    >>> row.calls, row.step_s
    (2, 0.25)
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class FunctionFigures:
    """One function's figures since the watch started."""

    name: str
    calls: int = 0
    compiles: int = 0
    compile_s: float = 0.0
    nonfinite: int = 0
    step_s: float | None = None  # interval between its two latest calls
    last_call: float | None = None

    def called(self, now: float) -> None:
        if self.last_call is not None:
            self.step_s = now - self.last_call
        self.last_call = now
        self.calls += 1


@dataclass
class Figures:
    """Every watched function's figures, by name."""

    functions: dict[str, FunctionFigures] = field(default_factory=dict)

    def function(self, name: str) -> FunctionFigures:
        row = self.functions.get(name)
        if row is None:
            row = self.functions[name] = FunctionFigures(name)
        return row
