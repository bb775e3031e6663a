"""What ``hang-hunt`` reports: frozen dataclasses, serialised by :func:`jaxdbg.report.to_jsonable`.

Example:
    >>> result = HangResult(stalled=False, verdict="the program finished; no process diverged", kind="finished")
    >>> result.essential_line() is None, result.exit_code
    (True, 0)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from jaxdbg._errors import EXIT_FOUND, EXIT_OK, EXIT_TARGET_FAILED
from jaxdbg._source import SourceLocation

ThreadState = Literal["running", "callback", "host"]
# A process: a thread's states, or it ended (dead, finished, failed) or sent no record (unknown).
ProcessStateName = Literal["running", "callback", "host", "dead", "finished", "failed", "unknown"]
HangKind = Literal["stall", "deadlock", "divergence", "dead", "finished", "failed", "running"]
Trigger = Literal["stall", "signal", "timeout"]  # what asked for the verdict
CallKind = Literal["call", "callback"]  # a jitted call, or a call into a host callback

# What each kind of verdict means for the exit code: found (1), nothing wrong (0), failed otherwise (3).
FOUND_KINDS = ("stall", "deadlock", "divergence", "dead")


@dataclass(frozen=True)
class ThreadReport:
    """One thread of a process at the snapshot: the user line it stands at, what it waits in below Python,
    what it waits for (a lock and who holds it), and its stack (innermost first)."""

    name: str
    main: bool
    source: SourceLocation | None
    state: ThreadState  # running: a jitted call, callback: a host callback, host: the program's own code
    waiting_in: str = ""
    waits_for: str | None = None
    holds: tuple[str, ...] = ()
    stack: tuple[SourceLocation, ...] = ()


@dataclass(frozen=True)
class CallRow:
    """One entry of a process's flight record (times in seconds before the snapshot; None: not yet)."""

    seq: int
    kind: CallKind
    function: str
    call_index: int | None  # None: unknown (a process looked at with --pid)
    source: SourceLocation | None
    step: int | None
    program: str | None
    started_s_ago: float
    returned_s_ago: float | None
    ready_s_ago: float | None
    error: str | None = None


@dataclass(frozen=True)
class ProcessState:
    """One process of the job: its state (``running`` a jitted call, ``callback``, ``host``, ``dead``,
    ``finished``, ``failed``, ``unknown``), the user line it stands at, the call it is in or waits for (or last
    made, for ``host``), the collective of that call, and how long nothing moved."""

    index: int
    state: ProcessStateName
    detail: str
    source: SourceLocation | None = None
    function: str | None = None
    call_index: int | None = None
    step: int | None = None
    collective: str | None = None
    waiting_in: str = ""
    idle_s: float | None = None
    exit_code: int | None = None
    signal: str | None = None
    threads: tuple[ThreadReport, ...] = ()
    last_calls: tuple[CallRow, ...] = ()
    steps: int | None = None  # global calls made (the job's steps)
    note: str = ""
    tracing: bool = field(default=False, metadata={"json": None})  # its Python code runs while jax traces a call
    exiting: bool = field(default=False, metadata={"json": None})  # its main code returned; threads keep it alive


@dataclass(frozen=True)
class DivergenceSide:
    """What some processes ran at the step where the job diverged."""

    processes: tuple[int, ...]
    function: str | None
    call_index: int | None
    source: SourceLocation | None
    program: str | None


@dataclass(frozen=True)
class Divergence:
    """The first step (0-based index among the calls of programs spanning several processes) at which the
    processes ran different programs, each side's function, call index and line."""

    step: int
    sides: tuple[DivergenceSide, ...]
    hung: bool
    detail: str


@dataclass(frozen=True)
class Deadlock:
    """Threads of one process that wait for each other, in a cycle."""

    process: int
    cycle: tuple[str, ...]
    # a host callback takes part (not only threads and locks of the program's own): the explanation differs
    callback: bool = field(default=False, metadata={"json": None})
    queue: bool = field(default=False, metadata={"json": None})  # a thread of it waits on a queue another drains
    # every thread of it waits on a queue only the next one fills: no lock, the two sides' protocols disagree
    queues_only: bool = field(default=False, metadata={"json": None})


@dataclass(frozen=True)
class HangResult:
    """``result`` of hang-hunt (and of a watch's stall report)."""

    stalled: bool
    verdict: str
    kind: HangKind
    trigger: Trigger | None = None  # None: the program ended
    stall_s: float | None = None
    still_s: float | None = None
    stuck: tuple[int, ...] = ()
    processes: tuple[ProcessState, ...] = ()
    divergence: Divergence | None = None
    deadlock: Deadlock | None = None
    explanation: str = ""
    hints: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    error: str | None = None  # the target's own failure, when it failed

    @property
    def exit_code(self) -> int:
        if self.kind in FOUND_KINDS or self.divergence is not None:
            return EXIT_FOUND
        return EXIT_OK if self.kind == "finished" else EXIT_TARGET_FAILED

    def essential_line(self) -> str | None:
        return self.verdict if self.exit_code != EXIT_OK else None
