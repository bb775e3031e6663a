"""What ``jaxdbg repro`` reports: frozen dataclasses, serialised by :func:`jaxdbg.report.to_jsonable`.

Example:
    >>> from jaxdbg.repro.signature import FailureSignature
    >>> result = ReproResult(FailureSignature("timeout"), Size(17), Size(6), checks=9, elapsed_s=15.0, verified=True,
    ...                      strategy="source", verification="fresh run of repro.py alone in an empty folder timed out")
    >>> result.essential_line()
    'fresh run of repro.py alone in an empty folder timed out'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from jaxdbg.repro.signature import FailureSignature


@dataclass(frozen=True)
class Size:
    lines: int | None
    equations: int | None = None


@dataclass(frozen=True)
class ReproResult:
    """The contract's repro result, plus how it was obtained."""

    signature: FailureSignature
    original: Size
    minimized: Size
    checks: int
    elapsed_s: float
    verified: bool
    strategy: Literal["computation", "source"]  # cut jaxpr, or reduced script
    flaky: bool = False
    runs: list[str] = field(default_factory=list)
    timed_out: bool = False
    verification: str = ""
    failing_primitives: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def essential_line(self) -> str | None:
        if self.verified:
            return self.verification or None
        why = next((note.split("; trying")[0] for note in self.notes if "did not verify" in note), None)
        return f"reproducer NOT verified: {self.verification or 'no fresh run'}" + (f"; {why}" if why else "")
