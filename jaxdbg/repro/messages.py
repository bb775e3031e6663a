"""What repro's contained runs send back (typed: see :mod:`jaxdbg.protocol`).

Example:
    >>> JitCallSeen("train_step", 0)
    JitCallSeen(function='train_step', call=0)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from jaxdbg._source import SourceLocation
from jaxdbg.protocol import Message
from jaxdbg.repro.signature import Criterion

if TYPE_CHECKING:  # types only: a messages module stays light and out of import cycles
    from jaxdbg.target import FlatInputs


@dataclass(frozen=True)
class JaxWork(Message):
    """JAX traced or compiled something (a failure before that is not a JAX bug); sent once."""

    event: str


@dataclass(frozen=True)
class JitCallSeen(Message):
    """A jitted function was entered (first few calls of each): what ran when a crash or hang struck."""

    function: str
    call: int


@dataclass(frozen=True)
class LastJit(Message):
    """The jitted function entered most recently, sent when the run raised."""

    function: str | None


@dataclass(frozen=True)
class LoweredText(Message):
    """A function's StableHLO, sent before its first call runs (kept for a crash inside compiled code)."""

    function: str
    text: str


@dataclass(frozen=True)
class FailureSeen(Message):
    """A failure the jit watch saw in a call: ``nonfinite`` (``what`` is NaN or Inf) or ``mismatch`` (against
    ``reference``, with the worst disagreement in ``detail``); ``exception`` only inside a capture."""

    kind: str
    function: str
    call: int = 0
    message: str = ""
    location: SourceLocation | None = None
    what: str | None = None
    reference: str | None = None
    detail: dict | None = None
    type: str | None = None


@dataclass(frozen=True)
class CheckFired(Message):
    """A runtime check inside jit fired (the first time, per check; :mod:`jaxdbg.repro.checks`): where it is,
    the names its condition reads and their values (``checks.value_summary`` of each, in the order of ``names``),
    with the share of the elements each value holds (``checks.value_profile``; empty where not listed one by one)
    and each array's shape."""

    location: SourceLocation
    names: tuple[str, ...]
    values: tuple[tuple, ...]
    shares: tuple[tuple[float, ...], ...] = ()
    shapes: tuple[tuple[int, ...], ...] = ()  # each array's shape


@dataclass(frozen=True)
class CutFinished(Message):
    """The result of cutting a captured computation: the reproducer's files and sizes, or why it failed."""

    ok: bool
    checks: int = 0
    equations_original: int = 0
    reason: str | None = None
    function: str = ""
    failure: FailureSeen | None = None
    equations: int = 0
    primitives: list[str] = field(default_factory=list)
    lines: int = 0
    files: dict[str, str] = field(default_factory=dict)
    self_check: bool = False
    elapsed_s: float = 0.0
    history: list[tuple[float, int]] = field(default_factory=list)
    criterion: Criterion | None = None  # how the written program fails (what its verification checks)


@dataclass(frozen=True)
class InputsBuilt(Message):
    """A function target's inputs (``--inputs file.py::make_inputs`` runs user code, so it runs contained), as
    array leaves and their nesting (a :class:`~jaxdbg.target.FlatInputs`)."""

    inputs: FlatInputs
