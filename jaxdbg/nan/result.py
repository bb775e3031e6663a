"""What ``nan-hunt`` reports: frozen dataclasses, serialised by :func:`jaxdbg.report.to_jsonable`.

The contract's ``first``/``chain`` entries have a key named ``pass`` (a Python keyword), so an
:class:`Origin` is turned into that mapping by :meth:`Origin.to_contract`; everything else is a dataclass.

Example:
    >>> stats = ValueStats((3,), "f32", -1.0, 2.0, 0, 0, 1, 1)
    >>> Origin("nan", "log", "forward", None, "loss", 0, ("jit(loss)",), (stats,)).to_contract()["pass"]
    'forward'
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

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


@dataclass(frozen=True)
class Origin:
    """Where a non-finite value was born (or came in). ``kind`` is ``nan``, ``inf`` or ``input``."""

    kind: str
    primitive: str | None
    pass_: str
    source: SourceLocation | None
    function: str
    call_index: int
    path: tuple[str, ...]
    inputs: tuple[ValueStats, ...] = ()
    argument: str | None = None
    outputs: tuple[ValueStats, ...] = ()
    name_stack: str = ""
    constant_input: bool = False  # a non-finite constant written in the code (e.g. -inf) fed this operation

    def to_contract(self) -> dict:
        """The contract's mapping (``pass`` as a key; plain data), plus extras: ``outputs``, ``name_stack``, ``constant_input``."""
        return {
            "kind": self.kind, "primitive": self.primitive, "pass": self.pass_,
            "source": self.source.as_dict() if self.source else None,
            "function": self.function, "call_index": self.call_index, "path": list(self.path),
            "inputs": [asdict(s) for s in self.inputs], "argument": self.argument,
            "outputs": [asdict(s) for s in self.outputs], "name_stack": self.name_stack,
            "constant_input": self.constant_input,
        }


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
class NanHuntResult:
    """The contract's nan-hunt ``result`` plus extras (strategy, precision, gradient norms, notes)."""

    found: bool
    first: dict | None = None
    chain: tuple[dict, ...] = ()
    growth: tuple[GrowthEntry, ...] = ()
    explanation: str = ""
    hints: tuple[str, ...] = ()
    strategy: str | None = None  # how the origin was found: op-by-op replay, compiled-prefix bisection, ...
    precision: PrecisionCheck | None = None
    grad_norms: tuple[GradNorm, ...] = ()
    calls_watched: int = 0
    functions_watched: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())
