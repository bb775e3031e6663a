"""What ``jaxdbg memory`` reports: frozen dataclasses, serialised by :func:`jaxdbg.report.to_jsonable`.

Sizes are bytes per device: a program's figures are those of the one SPMD program every device of the call
runs; live figures are per device. docs/report.md ("memory") describes every field.

Example:
    >>> program = ProgramMemory("train_step", None, 0, 0, "f32[8,128]", argument_bytes=4096, output_bytes=4096,
    ...                         alias_bytes=0, temp_bytes=2048, code_bytes=0, peak_bytes=10240)
    >>> MemoryResult(functions=(program,)).essential_line() is None
    True
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from jaxdbg._source import SourceLocation
from jaxdbg.memory.units import format_bytes

# What a buffer listed holds (constants and thread-local scalars are not what fills memory).
BufferKind = Literal["argument", "output", "temp"]
JitKind = Literal["jax.jit", "nnx.jit", "eqx.filter_jit", "jax.pmap"]  # frameworks.jit_kind, or a pmap
HintKind = Literal["donate", "remat", "dtype", "shard", "leak", "fit"]
BudgetOrigin = Literal["--device-memory", "device limit", "none"]


@dataclass(frozen=True)
class Buffer:
    """One buffer of a compiled program (live at its peak, or among its largest): what made it and where."""

    name: str  # the HLO value, e.g. 'wrapped_tanh.3'
    kind: BufferKind
    bytes: int
    shape: str  # e.g. 'f32[1024,256]'
    op: str | None = None  # the operation that made it ('tanh', 'dot_general'), None for an argument
    op_name: str = ""  # jax's name stack, e.g. 'jit(step)/jvp()/tanh'
    source: SourceLocation | None = None  # the user's line that made it
    argument: str | None = None  # for an argument: its path as the user passed it, e.g. "params['w1']"
    pass_: Literal["forward", "backward"] | None = field(default=None, metadata={"json": "pass"})  # gradient programs
    # a buffer a loop fills one slice per iteration: a scan's outputs ('ys') or what its forward pass saves for the
    # backward pass ('residuals'); op and source are then those of what the loop body writes into it
    stacked: Literal["ys", "residuals"] | None = None
    # for a block the function returns: which output, as the user reads the result (output['w'], output[1])
    output: str | None = None

    def label(self) -> str:
        """What the buffer is, in the user's terms: an argument's or output's name, what a loop stacks and over
        how many steps, else the operation that made it (and the pass of a gradient program).

        Example:
            >>> Buffer("dus", "output", 1 << 20, "f32[20,128,128]", None, stacked="ys", output="output[1]").label()
            "output[1]: a loop's outputs (scan ys) stacked over 20 steps"
            >>> Buffer("dot", "temp", 4096, "f32[32,32]", "dot_general", pass_="backward").label()
            'dot_general (backward)'
        """
        if self.kind == "argument":
            return self.argument or self.name
        what = self.op or ("" if self.stacked else self.name)
        if self.stacked:
            steps = _LEADING.match(self.shape)
            over = f" stacked over {steps.group(1)} steps" if steps else " stacked one slice per step"
            what = f"{what + ', ' if what else ''}{_STACKED[self.stacked]}{over}"
        elif self.pass_:
            what += f" ({self.pass_})"
        return f"{self.output}: {what}" if self.output else what


_STACKED = {"ys": "a loop's outputs (scan ys)", "residuals": "saved for the gradient"}
_LEADING = re.compile(r"\w+\[(\d+)")


@dataclass(frozen=True)
class Held:
    """An argument not donated whose buffers an output of the same shape could have reused: the call holds both."""

    argument: str  # 'state' or 'argument 0'
    argnum: int | None  # position in the call (None for a keyword argument)
    bytes: int  # per device
    leaves: int
    threaded: bool = False  # the run passed this function's previous outputs back in that place (a loop's state)


@dataclass(frozen=True)
class ProgramMemory:
    """One compile of a jitted function: ``Compiled.memory_analysis()`` and XLA's buffer assignment."""

    name: str
    source: SourceLocation | None  # where the function is defined (a multihost helper's jit: the call's line)
    call_index: int  # the call that compiled it
    compile_index: int  # 0 for the first compile of the function, 1 for its first recompile, ...
    signature: str
    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    code_bytes: int
    peak_bytes: int  # what a call holds at once: arguments + outputs - aliased + temporaries + code
    schedule_peak_bytes: int | None = None  # XLA's sequential peak (live-range dump): values live at once
    xla_peak_bytes: int | None = None  # memory_analysis().peak_memory_in_bytes as reported (not meaningful on CPU)
    devices: int = 1  # devices the program runs on (the figures are per device)
    largest: tuple[Buffer, ...] = ()
    held: tuple[Held, ...] = ()
    forward_kept_bytes: int = 0  # forward-pass values live at the peak of a gradient program (kept for backward)
    checkpointed: bool = False  # it already rematerialises (jax.checkpoint / remat in its ops' names)
    needs_bytes: int | None = None  # live memory when it was called + what the call adds (its peak device)
    live_before_bytes: int | None = None
    fits: bool | None = None  # against the device memory budget (None: no budget known)
    over_bytes: int | None = None
    dump: str | None = None  # the buffer-assignment file read
    note: str | None = None
    jit: JitKind = "jax.jit"  # how it was jitted
    passed_again: tuple[str, ...] = ()  # array arguments the loop passed again as they were (not donatable)
    # A recompile: what changed since the closest earlier compile, e.g. "static argument 'lr' changed 0.1 -> 0.05"
    recompiled_because: str | None = None
    # A jit of jax's multihost helpers: the call of the helper that compiled it, as the user made it
    # (``sync_global_devices('saved')``), ``name`` the helper and ``source`` that call's line; None for any other.
    called_as: str | None = None


@dataclass(frozen=True)
class DeviceMemory:
    """One device over the run."""

    device: str  # e.g. 'cpu:0', 'cuda:1'
    limit_bytes: int | None  # what the device reports (memory_stats bytes_limit); None on CPU
    peak_live_bytes: int  # most bytes of live arrays seen at a call boundary
    peak_bytes: int  # the estimate: live at a call's start + what that call adds, at most
    measured_peak_bytes: int | None = None  # memory_stats peak_bytes_in_use (GPU, TPU)
    final_live_bytes: int = 0


@dataclass(frozen=True)
class LiveGroup:
    """Live arrays that one producer made: a jitted function called from one line (or 'outside jitted calls')."""

    producer: str  # function name, or 'outside jitted calls'
    source: SourceLocation | None  # the line that called it
    arrays: int
    bytes: int  # on the device of the peak
    calls: int  # distinct calls whose outputs these are
    shapes: str  # e.g. 'f32[1024,256] x3, f32[] x3'


@dataclass(frozen=True)
class RunPeak:
    """The run's peak: on which device, during which call, and what was live."""

    bytes: int
    device: str
    function: str | None
    call_index: int | None
    source: SourceLocation | None  # the line that made the call
    live_bytes: int  # live arrays when the call started
    program_bytes: int  # what the call added: outputs not aliased + temporaries


@dataclass(frozen=True)
class Leak:
    """Memory that grew step after step: arrays one producer made and something keeps."""

    producer: str
    source: SourceLocation | None  # the line whose call made the arrays
    arrays: int
    bytes: int  # all devices
    per_call_bytes: float
    first_call: int | None
    last_call: int | None
    kept_by: str | None = None  # e.g. "list 'history'"
    kept_at: SourceLocation | None = None  # the line that puts them there, e.g. history.append(...)
    samples: int = 0


@dataclass(frozen=True)
class OutOfMemory:
    """An out-of-memory error (RESOURCE_EXHAUSTED) explained."""

    message: str  # XLA's message, first line
    function: str | None
    call_index: int | None
    source: SourceLocation | None
    requested_bytes: int | None  # what the failed allocation asked for (from the message)
    live_bytes: int | None  # live arrays on the device at that moment
    live: tuple[LiveGroup, ...] = ()
    program: ProgramMemory | None = None
    at_compile: bool = False  # raised while compiling (TPU reports its budget overrun then)
    # raised after the call had returned, by a later operation that used its result (asynchronous dispatch)
    asynchronous: bool = False
    surfaced_at: SourceLocation | None = None  # where it was raised then (None when raised by the call itself)
    explanation: str | None = None  # what XLA's message means, where it does not say it plainly


@dataclass(frozen=True)
class Hint:
    """A change to try, with the bytes it saves per device when that can be computed."""

    kind: HintKind
    text: str
    saves_bytes: int | None = None
    function: str | None = None
    source: SourceLocation | None = None


@dataclass(frozen=True)
class Budget:
    """The device memory budget and ``--budget`` rules."""

    device_memory_bytes: int | None
    origin: BudgetOrigin
    misfits: tuple[str, ...] = ()  # functions that would not fit
    ok: bool = True
    violations: tuple[str, ...] = ()
    checked: tuple[str, ...] = ()


@dataclass(frozen=True)
class ProcessMemory:
    """One process of a multi-process job (process 0's report)."""

    index: int
    peak_bytes: int | None
    peak_device: str | None
    leaks: int
    out_of_memory: bool
    misfits: int
    note: str | None = None
    failed: str = ""  # the error its program raised (`Type: message at file:line`), empty where it finished


@dataclass(frozen=True)
class MemoryResult:
    found: bool = False
    functions: tuple[ProgramMemory, ...] = ()
    devices: tuple[DeviceMemory, ...] = ()
    peak: RunPeak | None = None
    live_at_peak: tuple[LiveGroup, ...] = ()
    leaks: tuple[Leak, ...] = ()
    out_of_memory: OutOfMemory | None = None
    budget: Budget = Budget(None, "none")
    hints: tuple[Hint, ...] = ()
    notes: tuple[str, ...] = ()
    samples: int = 0
    processes: tuple[ProcessMemory, ...] = ()
    error: str | None = None
    error_source: SourceLocation | None = None

    def essential_line(self) -> str | None:
        """What it found in one line: the OOM, a function that does not fit, a leak, a broken budget."""
        from jaxdbg.report import to_jsonable

        return finding_line(to_jsonable(self))


def finding_line(result: dict) -> str | None:
    """The one-line finding of a memory ``result`` as JSON (``essential_line``, and ``jaxdbg check`` reading a
    report back).

    Example:
        >>> finding_line({"out_of_memory": {"function": "step", "requested_bytes": 2**34}, "functions": [],
        ...               "leaks": [], "budget": {"ok": True}})
        'out of memory in step asking for 16.0 GiB'
    """
    parts = []
    oom = result.get("out_of_memory")
    if oom:
        asked = f" asking for {format_bytes(oom['requested_bytes'])}" if oom.get("requested_bytes") else ""
        later = ", raised later where its result was used" if oom.get("asynchronous") else ""
        parts.append(f"out of memory in {oom.get('function') or 'an eager operation'}{asked}{later}")
    parts.extend(f"{f['name']} needs {format_bytes(f.get('needs_bytes'))}, {format_bytes(f.get('over_bytes'))} "
                 "over the budget" for f in result.get("functions") or [] if f.get("fits") is False)
    for leak in result.get("leaks") or []:
        where = f" ({leak['kept_by']})" if leak.get("kept_by") else ""
        parts.append(f"leak: {leak['producer']} outputs kept{where}, {format_bytes(leak['bytes'])} over "
                     f"{leak['arrays']} arrays")
    budget = result.get("budget") or {}
    if not budget.get("ok", True):
        parts.append("budget broken: " + "; ".join(budget.get("violations") or []))
    for row in result.get("processes") or []:  # process 0's own findings are the ones above
        found = [f"{row[key]} {word}" for key, word in (("leaks", "leak(s)"), ("misfits", "misfit(s)")) if row.get(key)]
        found += ["out of memory"] if row.get("out_of_memory") else []
        if row.get("index") and found:
            parts.append(f"process {row['index']}: {', '.join(found)} (its own report says where)")
        if row.get("index") and row.get("failed"):
            parts.append(f"process {row['index']} raised {row['failed']}")
    return "; ".join(parts) if parts else result.get("error")
