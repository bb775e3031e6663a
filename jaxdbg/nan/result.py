"""What ``nan-hunt`` reports: frozen dataclasses, serialised by :func:`jaxdbg.report.to_jsonable`.

The report's ``first``/``chain`` entries have a key named ``pass`` (a Python keyword): :class:`Origin`
keeps it as ``pass_``, whose field metadata gives the JSON name.

Example:
    >>> from jaxdbg.report import to_jsonable
    >>> stats = ValueStats((3,), "f32", -1.0, 2.0, 0, 0, 1, 1)
    >>> origin = Origin("nan", "log", "forward", None, "loss", 0, ("jit(loss)",), (stats,))
    >>> to_jsonable(origin)["pass"], NanHuntResult(True, origin).essential_line()
    ('forward', 'nan first made by log (forward pass) in loss, call 0')
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from jaxdbg._source import SourceLocation


@dataclass(frozen=True)
class ValueStats:
    """Summary of one array: the contract's ``{"shape", "dtype", "min", "max", "nan", "inf", "zero", "negative"}``."""

    shape: tuple[int, ...]
    dtype: str
    min: float | None
    max: float | None
    nan: int
    inf: int
    zero: int
    negative: int

    @property
    def finite(self) -> bool:
        return self.nan == 0 and self.inf == 0


OriginKind = Literal["nan", "inf", "input"]  # input: came in through an argument
Pass = Literal["forward", "backward"]
# compiled-prefix bisection: only the compiled code went non-finite; eager check: outside jit.
Strategy = Literal["op-by-op replay", "compiled-prefix bisection", "input check", "eager check"]


@dataclass(frozen=True)
class Origin:
    """Where a non-finite value was born (or came in). ``kind`` is ``nan``, ``inf`` or ``input``."""

    kind: OriginKind
    primitive: str | None
    pass_: Pass = field(metadata={"json": "pass"})
    source: SourceLocation | None = None
    function: str = ""
    call_index: int = 0
    path: tuple[str, ...] = ()
    inputs: tuple[ValueStats, ...] = ()
    argument: str | None = None
    outputs: tuple[ValueStats, ...] = ()
    name_stack: str = ""
    constant_input: bool = False  # a non-finite constant written in the code (e.g. -inf) fed this operation
    # Where the first non-finite output value sits: the process (of a multi-process job), the device, and the
    # shard's [start, stop) range per dimension (None where no value was looked at).
    process: int | None = None
    device: str | None = None
    shard: tuple[tuple[int, int], ...] | None = None

    @property
    def transformed_by(self) -> str | None:
        """The transformation applied outside jit that ran this origin's jitted function, e.g. 'jax.grad' for
        ``jax.grad(loss)(w)`` with ``loss`` jitted (its path then starts ``jax.grad(loss)``); else None.

        Example:
            >>> Origin("nan", "log", "forward", path=("jax.vmap(loss)",)).transformed_by
            'jax.vmap'
            >>> Origin("nan", "log", "forward", path=("jit(loss)",)).transformed_by is None
            True
        """
        head = self.path[0] if self.path else ""
        if not head.startswith("jax.") or not head.endswith(")") or "(" not in head:
            return None
        return head.split("(", 1)[0]

    def describe(self, job: bool = False) -> str:
        """``nan first made by log (forward pass) at train.py:12 in loss, call 3``; in a job of several processes
        (``job``), with the process and device that made it (see :meth:`placed`)."""
        at = f" at {os.path.basename(self.source.file)}:{self.source.line}" if self.source else ""
        if self.kind == "input":  # not "input in the outputs of f": it came in with an argument, made by nothing inside
            what = ("nan" if any(s.nan for s in self.inputs) else "inf" if any(s.inf for s in self.inputs)
                    else "a non-finite value")
            return (f"{what} came in with argument {self.argument or '?'} of {self.function}, call {self.call_index} "
                    "(nothing inside made it)")
        if self.primitive is None:
            return f"{self.kind} in the outputs of {self.function}, call {self.call_index}{at}"
        via = f" through {self.transformed_by}" if self.transformed_by else ""
        return (f"{self.kind} first made by {self.primitive} ({self.pass_} pass){at} in {self.function}, "
                f"call {self.call_index}{via}{self.placed(job)}")

    def placed(self, job: bool = False) -> str:
        """Where among devices, when that is part of the answer: the process of a job (``job``; any process but
        0 is one), or the device of a shard_map/pmap body whose block made it.

        Example:
            >>> Origin("nan", "div", "forward", process=1, device="cpu:2049").placed()
            ' on process 1 (cpu:2049)'
            >>> Origin("nan", "log", "forward", path=("pmap", "shard_map"), process=0, device="cpu:2").placed()
            ' on cpu:2'
            >>> origin = Origin("nan", "log", "forward", path=("jit(f)",), process=0, device="cpu:0")
            >>> origin.placed(), origin.placed(job=True)
            ('', ' on process 0 (cpu:0)')
        """
        if self.device is None:
            return ""
        if self.process or (job and self.process is not None):
            return f" on process {self.process} ({self.device})"
        return f" on {self.device}" if "shard_map" in self.path else ""


@dataclass(frozen=True)
class GrowthEntry:
    """An output that grew by ``ratio`` (peak over its first non-zero magnitude) before the non-finite call."""

    name: str
    source: SourceLocation | None
    first_call: int  # first call whose magnitude was at least growth_factor times the baseline
    ratio: float
    function: str
    baseline: float
    peak: float


@dataclass(frozen=True)
class GradNorm:
    """The gradient of one parameter leaf (function mode with ``--grad``)."""

    name: str
    norm: float
    nan: int
    inf: int


@dataclass(frozen=True)
class PrecisionCheck:
    """Whether computing a bf16/f16 origin in float32 removes the non-finite value."""

    dtype: str
    f32_removes_origin: bool
    f32_outputs_finite: bool
    detail: str


@dataclass(frozen=True)
class Overflow:
    """A float16/bfloat16 operation whose result left its dtype's range before the origin, and led to it: the root
    cause to fix (compute it in float32, scale its inputs, or scale the loss for a gradient)."""

    origin: Origin  # the operation that made the Inf (kind 'inf'): its line, pass and inputs
    dtype: str  # 'f16' or 'bf16'
    max: float  # the dtype's largest finite value
    reach: float | None  # how large its result gets computed in float32, where the inputs say (None: unknown)


@dataclass(frozen=True)
class ProcessFinding:
    """One process of a multi-process job, in process 0's report: did it find the origin, which, and where."""

    index: int
    found: bool
    origin: str | None = None  # Origin.describe() of its first origin
    process: int | None = None  # where that origin's non-finite value sits, as this process saw it
    device: str | None = None
    note: str = ""  # why it has no answer (it died or hung)


@dataclass(frozen=True)
class AnalysisWarning:
    """A step of the analysis after the origin (see :mod:`jaxdbg.nan.analyses`) that failed: what it would have
    added is missing, the rest of the answer stands. ``traceback`` is for ``-v`` (stderr), not the JSON."""

    step: str  # "bundle", "chain", "growth", ...: an analysis' name
    message: str  # the error in one line: "TypeError: ..."
    traceback: str = field(default="", compare=False, metadata={"json": None})

    def line(self) -> str:
        """``the bundle step failed (OSError: ...); the rest of the report stands``."""
        return f"the {self.step} step failed ({self.message}); the rest of the report stands"


def inf_root(first: Origin, chain: Sequence[Origin]) -> Origin | None:
    """For a NaN made of infinities: where the infinity it was made of was born (the chain's first computed
    origin). None when a constant written in the code (-inf for masking) is what fed it."""
    if first.kind != "nan" or not any(s.inf for s in first.inputs) or any(c.constant_input for c in chain):
        return None
    return next((c for c in chain if c.kind == "inf"), None)


@dataclass(frozen=True)
class NanHuntResult:
    """The contract's nan-hunt ``result`` plus extras (strategy, precision, gradient norms, notes)."""

    found: bool
    first: Origin | None = None
    chain: tuple[Origin, ...] = ()
    growth: tuple[GrowthEntry, ...] = ()
    explanation: str = ""
    hints: tuple[str, ...] = ()
    strategy: Strategy | None = None  # how the origin was found
    precision: PrecisionCheck | None = None
    grad_norms: tuple[GradNorm, ...] = ()
    calls_watched: int = 0
    functions_watched: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())
    processes: tuple[ProcessFinding, ...] = ()  # process 0 of a multi-process job: what each process found
    warnings: tuple[AnalysisWarning, ...] = ()  # steps after the origin that failed (their part is missing)
    overflow: Overflow | None = None  # a float16/bfloat16 overflow behind the origin: the root cause

    def essential_line(self, job: bool | None = None) -> str | None:
        """The origin in one line and, for a NaN made of infinities, the operation that made them (the line to
        fix): ``nan first made by mul (backward pass) at ppo.py:45 in update, call 0; the inf came from log
        (forward pass) at ppo.py:35 in act, call 0``. In a job of several processes (``job``; by default, where
        the result holds the job's processes), the origin's process is named, process 0 too."""
        if self.first is None:
            return None
        job = len(self.processes) > 1 if job is None else job
        root = self.overflow.origin if self.overflow is not None else inf_root(self.first, self.chain)
        if root is None or root == self.first or root.primitive is None:
            return self.first.describe(job)
        at = f" at {os.path.basename(root.source.file)}:{root.source.line}" if root.source else ""
        other = (root.function, root.call_index) != (self.first.function, self.first.call_index)
        call = f" in {root.function}, call {root.call_index}" if other else ""
        return f"{self.first.describe(job)}; the inf came from {root.primitive} ({root.pass_} pass){at}{call}"

    def warned(self, step: str, messages: list[str]) -> NanHuntResult:
        """This result with a warning per message of a step that failed after the analysis (``--metrics``)."""
        return replace(self, warnings=(*self.warnings, *(AnalysisWarning(step, m) for m in messages)))
