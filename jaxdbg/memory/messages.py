"""What a memory job is asked and sends back, message by message (typed: see :mod:`jaxdbg.protocol`).

Example:
    >>> row = SampleRow(0.5, "train_step", 3, {"cpu:0": 4096}, {"cpu:0": 8192})
    >>> row.estimate["cpu:0"] - row.live["cpu:0"]
    4096
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from jaxdbg.protocol import Message, Request

if TYPE_CHECKING:  # types only: a messages module stays light and out of import cycles
    from jaxdbg.memory.result import Leak, LiveGroup, OutOfMemory, ProcessMemory, ProgramMemory, RunPeak
    from jaxdbg.target import TargetSpec


@dataclass(frozen=True)
class MemoryOptions:
    """Everything ``jaxdbg memory`` can be asked, with the command line's defaults (here, beside the job that
    carries them: the child unpickles them without the parent's modules)."""

    device_memory: int | None = None  # bytes per device; None: each device's own limit, where it reports one
    budget: str | None = None
    top: int = 10
    leak_bytes: int = 1 << 20
    plot: bool = False  # memory.png too (matplotlib: about a second of CPU); memory.html is always written
    args: str | None = None
    inputs: str | None = None
    seed: int = 0
    timeout: float | None = None


@dataclass(frozen=True)
class MemoryJob(Request, handler_module="jaxdbg.memory.jobs"):
    """The request: the target, the command's options (``MemoryOptions``), and where the dumps go."""

    spec: TargetSpec
    options: MemoryOptions
    out_dir: str
    dump_folder: str


@dataclass(frozen=True)
class Devices(Message):
    """This process's devices and the limits they report (none on CPU)."""

    devices: tuple[str, ...]
    limits: dict[str, int]
    backend: str


@dataclass(frozen=True)
class ProgramAnalysed(Message):
    """One compile of a jitted function analysed (a memory.result.ProgramMemory); ``ahead``: before it ran."""

    program: ProgramMemory
    ahead: bool = True


@dataclass(frozen=True)
class SampleRow:
    """Live bytes per device at the start of a call (``function``/``call_index``; None at the end of the run),
    and the estimate of what the device holds during that call (live + what the call adds)."""

    t: float
    function: str | None
    call_index: int | None
    live: dict[str, int]
    estimate: dict[str, int]
    in_use: dict[str, int] = field(default_factory=dict)
    peak_in_use: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ThreadedArguments(Message):
    """Positions where a function got its own previous outputs back (a loop's state: donation candidates), and
    positions passed the same arrays again (kept by the caller: not candidates)."""

    function: str
    argnums: tuple[int, ...]
    reused: tuple[int, ...] = ()
    names: tuple[str, ...] = ()  # the user's parameter names by position (a framework's view when it has one)


@dataclass(frozen=True)
class Samples(Message):
    """Samples taken since the last batch, and the run's peak so far (a RunPeak with its live groups) if it moved."""

    rows: tuple[SampleRow, ...]
    peak: RunPeak | None = None
    live_at_peak: tuple[LiveGroup, ...] = ()


@dataclass(frozen=True)
class LeaksFound(Message):
    """Leaks found at the end of the run (or at an out-of-memory error): memory.result.Leak entries."""

    leaks: tuple[Leak, ...]


@dataclass(frozen=True)
class OutOfMemoryFound(Message):
    """An out-of-memory error, explained (a memory.result.OutOfMemory)."""

    oom: OutOfMemory


@dataclass(frozen=True)
class FinalLive(Message):
    """Live arrays when the run ended, by producer (memory.result.LiveGroup)."""

    groups: tuple[LiveGroup, ...]


@dataclass(frozen=True)
class MemoryNote(Message):
    """Something that went wrong on the side, or worth knowing: shown as a note."""

    text: str


@dataclass(frozen=True)
class JobMemory(Message):
    """Process 0 of a multi-process job: every process's summary (memory.result.ProcessMemory)."""

    rows: tuple[ProcessMemory, ...]
