"""The watchdog: a daemon thread per process that notices a stall and draws the verdict.

Every :data:`TICK_S` it asks the recorder which calls' results became ready (a cheap ``is_ready()``), and
measures progress: calls started or finished, results ready, host callbacks entered or left. A process that
uses the CPU (``time.process_time``: at least :data:`BUSY_FRACTION` of a core) is working even when no call
moves (a long computation on CPU devices, slow host code), so it is not idle, unless that CPU goes to a thread
spinning in a busy-wait loop (:mod:`jaxdbg.hang.spin`: the same frame going round with nothing changing).
A stall is ``stall_s`` seconds idle: no progress and no work. (On GPU/TPU a single computation longer than
``stall_s`` leaves the host idle too; give ``--stall`` above the longest step.) ``SIGUSR1`` and the deadline
(``--timeout``) ask for the verdict at once.

In a job of several processes the watchdog also speaks for its process (:mod:`jaxdbg.hang.job`): it
publishes where it stands every second, and the lowest process still answering (process 0, normally) calls
the job stalled when every unfinished process has been idle for ``stall_s``, gathers everyone's record
and draws one verdict for all. The watchdog reads other threads' stacks as data; it never interrupts them.

Example:
    >>> activity = Activity()
    >>> activity.update((1, 1, 0, 0, 0), now=10.0, cpu=0.0)
    >>> activity.update((1, 1, 0, 0, 0), now=14.0, cpu=0.01), activity.idle_s(14.0)
    (None, 4.0)
    >>> activity.update((1, 1, 0, 0, 0), now=16.0, cpu=1.5), activity.idle_s(16.0)  # 75% of a core: working
    (None, 0.0)
    >>> activity.update((1, 1, 0, 0, 0), now=20.0, cpu=1.5), activity.idle_s(20.0)
    (None, 4.0)
    >>> activity.update((1, 1, 0, 0, 0), now=22.0, cpu=1.5, faults=300), activity.idle_s(22.0)  # paging in: working
    (None, 0.0)
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import resource
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jaxdbg.hang.spin import SpinWatch

if TYPE_CHECKING:
    from jaxdbg.hang.recorder import Recorder

TICK_S = 0.2
RUNNABLE_TICKS = 5
BUSY_FRACTION = 0.1  # of one core: a process using more CPU than this is working, not stuck (a stuck one: ~0.3%)
RECORD_FILE = "flight-record.json"  # the latest flight record, rewritten every few seconds (a dead process's last)
RECORD_EVERY_S = 2.0
DEFAULT_STALL_S = 30.0


class Activity:
    """How long a process has been idle: no progress mark moved and the CPU mostly unused."""

    def __init__(self) -> None:
        self._mark: tuple | None = None
        self._runnable: deque[bool] = deque(maxlen=RUNNABLE_TICKS)
        self._cpu = 0.0
        self._at: float | None = None
        self.active_at: float | None = None
        self.busy = 0.0  # the latest CPU use, in cores
        self._faults = 0  # major page faults so far

    def update(self, mark: tuple, now: float, cpu: float, runnable: Callable[[], int] | None = None,
               faults: int = 0) -> None:
        """One tick: the progress ``mark``, the process's CPU seconds so far, and (asked only when the CPU was
        mostly unused) how many of its threads want a CPU: on a loaded machine a working process gets little.
        ``faults``: the process's major page faults so far. A process paging its code in from disk (jaxlib's
        libraries at the first jax operation, on a busy disk) waits in the kernel, neither running nor runnable,
        yet it is working; a read stuck on a file or a socket takes no page faults."""
        paging = faults > self._faults
        self._faults = faults
        if self._at is not None and now > self._at:
            self.busy = (cpu - self._cpu) / (now - self._at)
        self._runnable.append(runnable is not None and self.busy < BUSY_FRACTION and mark == self._mark
                              and runnable() > 0)
        # A thread that wants a CPU at most ticks of the last second (a computation starved by other processes),
        # not at one: the runtime's background threads (heartbeats, gRPC pollers) wake up now and then.
        working = self.busy >= BUSY_FRACTION or sum(self._runnable) > RUNNABLE_TICKS // 2 or paging
        if mark != self._mark or working or self.active_at is None:
            self.active_at = now
        self._mark, self._cpu, self._at = mark, cpu, now

    def idle_s(self, now: float) -> float:
        return 0.0 if self.active_at is None else max(0.0, now - self.active_at)


class SignalListener:
    """SIGUSR1 asks for the verdict now. A signal reaches Python's handler only when the main thread runs
    bytecode, which a thread stuck in a collective never does; the wakeup fd is written by the C-level
    handler at once, so the watchdog reads it. faulthandler's dump (the contained child's) is chained."""

    def __init__(self) -> None:
        self.asked = threading.Event()
        self._reader: int | None = None
        self._previous: Any = None
        self._previous_fd = -1

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGUSR1"):
            return
        reader, writer = os.pipe()
        os.set_blocking(reader, False)
        os.set_blocking(writer, False)
        self._previous = signal.signal(signal.SIGUSR1, lambda *_: self.asked.set())
        self._previous_fd = signal.set_wakeup_fd(writer, warn_on_full_buffer=False)
        self._reader, self._writer = reader, writer
        if faulthandler.is_enabled():
            faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True, chain=True)

    def poll(self) -> bool:
        if self._reader is not None:
            with contextlib.suppress(BlockingIOError, OSError):
                if signal.SIGUSR1 in os.read(self._reader, 512):
                    self.asked.set()
        return self.asked.is_set()

    def remove(self) -> None:
        if self._reader is None:
            return
        with contextlib.suppress(ValueError, OSError):
            faulthandler.unregister(signal.SIGUSR1)
            signal.set_wakeup_fd(self._previous_fd)
            signal.signal(signal.SIGUSR1, self._previous if self._previous is not None else signal.SIG_DFL)
        for fd in (self._reader, self._writer):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._reader = None


@dataclass(frozen=True)
class Settings:
    """What the watchdog is asked: the stall length, the deadline (seconds from start; None: none), whether
    to ask py-spy for native frames, and the folder of this process's flight-record file (None: no file)."""

    stall_s: float = DEFAULT_STALL_S
    timeout_s: float | None = None
    native: bool = True
    folder: str | None = None
    collect_s: float = 30.0  # how long the job's records are waited for


class Watchdog:
    """The watchdog thread (see the module docstring). ``on_verdict(facts)`` is called once, from this
    thread (a stall, a signal, the deadline) or from :meth:`finish`'s caller (the program ended)."""

    def __init__(self, recorder: Recorder, settings: Settings, on_verdict: Callable[[Any], None],
                 signals: SignalListener | None = None):
        self.recorder, self.settings, self.on_verdict = recorder, settings, on_verdict
        self.signals = signals
        self.activity = Activity()
        self.started = time.time()
        self.job: Any = None  # a JobLink once the program joined a job of several processes
        self.on_divergence: Callable[[dict], None] | None = None  # (the merger) a divergence found while running
        self._stop = threading.Event()
        self._done = threading.Event()
        self._verdict_lock = threading.Lock()
        self._delivered = False
        self._written_at = 0.0
        self._written_mark: tuple | None = None
        self._record_lock = threading.Lock()
        self._ready_total = 0
        self._last_mark: tuple | None = None
        self.spins = SpinWatch()
        self._notes: list[str] = []
        self._thread = threading.Thread(target=self._run, name="jaxdbg-hang-watchdog", daemon=True)
        if settings.folder is not None:
            recorder.on_first_call = lambda: self._write_record_file(time.time(), None, force=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    # -- the loop ------------------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(TICK_S) and not self._delivered:
            try:
                self.tick()
            except Exception as err:  # noqa: BLE001 - the watchdog must outlive its own bugs: said once, then on
                self.recorder_note(f"the watchdog failed: {type(err).__name__}: {err}")

    def tick(self) -> None:
        now = time.time()
        ready = self.recorder.check_ready()
        self._ready_total += ready
        mark = (*self.recorder.progress(), self._ready_total)
        if mark != self._last_mark:
            self.spins.clear()
        else:  # nothing moved: a thread going round a loop that changes nothing is no work (hang.spin)
            self.spins.update(time.monotonic())
        self._last_mark = mark
        self.activity.update(mark, now, time.process_time() - self.spins.cpu_s(), self._runnable,
                             resource.getrusage(resource.RUSAGE_SELF).ru_majflt)
        self._write_record_file(now, mark)
        reason = self._asked(now)
        if self.job is None:
            self.job = self._joined()
        if self.job is not None:
            self.job.tick(now, reason)
            return
        if reason is None and self.activity.idle_s(now) >= self.settings.stall_s and not self._joining():
            reason = "stall"
        if reason is not None:
            self.deliver_single(reason)

    def _joining(self) -> bool:
        """Whether this process is one of a job that has not formed yet: launched as one of several (its
        launcher says so), or waiting in ``jax.distributed.initialize()``. Waiting for the others to start is
        not a stall of this process; the job's verdict comes once it has joined (or at a signal, the deadline)."""
        from jaxdbg.launch import launched_place

        if launched_place(os.environ) is not None:
            return True
        frame = sys._current_frames().get(threading.main_thread().ident or -1)
        while frame is not None:
            if frame.f_code.co_name == "initialize" and frame.f_code.co_filename.endswith("distributed.py"):
                return True
            frame = frame.f_back
        return False

    def _runnable(self) -> int:
        from jaxdbg.hang.stacks import runnable_threads

        return runnable_threads(exclude={threading.get_native_id(), *self.spins.native_ids()})

    def _asked(self, now: float) -> str | None:
        if self.signals is not None and self.signals.poll():
            return "signal"
        timeout = self.settings.timeout_s
        if timeout is not None and now - self.started >= timeout:
            return "timeout"
        return None

    def _joined(self) -> Any:
        from jaxdbg import multihost

        place = multihost.job()
        if place is None:
            return None
        from jaxdbg.hang.job import JobLink

        return JobLink(self, place.index, place.count)

    # -- the verdict ---------------------------------------------------------------------------------------

    def record(self, reason: str, native: bool | None = None, index: int = 0, count: int = 1,
               extra: dict | None = None) -> dict:
        from jaxdbg.hang.record import take_record

        now = time.time()
        return take_record(self.recorder, reason, self.activity.idle_s(now),
                           self.settings.native if native is None else native, index, count,
                           self.activity.busy, extra, self.spins.spinning())

    def deliver_single(self, reason: str, outcome: dict | None = None) -> None:
        from jaxdbg.hang.verdict import JobFacts

        record = self.record(reason)
        facts = JobFacts(1, reason if reason != "end" else None, self.settings.stall_s, {0: record},
                         {0: outcome} if outcome else {}, notes=list(self._notes))
        self.deliver(facts)

    def deliver(self, facts: Any) -> None:
        """Hand the verdict's facts over, once."""
        with self._verdict_lock:
            if self._delivered:
                return
            self._delivered = True
        try:
            self.on_verdict(facts)
        finally:
            self._done.set()

    def finish(self, outcome: dict, wait_s: float = 120.0) -> None:
        """The program ended here (``outcome``: status finished / raised, error): the verdict of a single
        process now; in a job, once every process ended or the job stalled (waiting at most ``wait_s``)."""
        self.recorder.check_ready()  # (not waited for: what is ready by now)
        self._write_record_file(time.time(), None, force=True)  # its last calls: those of the last seconds too
        if self.job is None:
            self.job = self._joined()
        if self.job is None:
            self.deliver_single("end", outcome)
            return
        self.job.finish(outcome)
        self._done.wait(wait_s)

    # -- notes and the flight-record file --------------------------------------------------------------------

    def recorder_note(self, line: str) -> None:
        if line not in self._notes:
            self._notes = [*self._notes, line]

    def _write_record_file(self, now: float, mark: tuple | None, force: bool = False) -> None:
        """Rewrite this process's flight-record file when something moved (at most every few seconds; ``force``:
        now, as the program ends): what a process that dies leaves behind for its report."""
        folder = self.settings.folder
        if folder is None or (not force and (mark == self._written_mark or now - self._written_at < RECORD_EVERY_S)):
            return
        from jaxdbg import multihost
        from jaxdbg.hang.record import light_record

        self._written_at, self._written_mark = now, mark
        folder = multihost.process_folder(folder)
        path = os.path.join(folder, RECORD_FILE)
        with self._record_lock, contextlib.suppress(OSError):  # the watchdog's and the program's end's, one by one
            os.makedirs(folder, exist_ok=True)
            with open(path + ".tmp", "w") as handle:
                json.dump(light_record(self.recorder), handle)
            os.replace(path + ".tmp", path)
