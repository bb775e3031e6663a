"""Does the device wait for the host? The profiled run's timeline as a plain run would have gone, and a verdict
drawn from it in the spirit of xprof's input-pipeline analysis (input-bound when the device waits for input 5% /
20% of the step or more: "moderately" / "highly").

In the child, :class:`StepClock` follows the main thread: every jitted call (when its execution could start, how
long it runs), every copy between host and device, and every forced synchronisation (``float(x)``,
``np.asarray(x)``, ``.item()``, ``print``, ``block_until_ready``, ``jax.device_get``). Executions queue on the
device one after another; the device is idle whenever nothing is queued. The profile itself waits for some calls
to time them (``--sync-every``): those waits are taken out (``shift``), so that a loop whose host work overlaps the
device's in a plain run is not called input-bound because jaxdbg made it wait. Between two calls of a function
(a step) the clock sums the device's work and idle time, and the host's time in transfers, syncs, jitted calls'
dispatch and everything else (its own work: building batches, Python, logging).

In the parent, :func:`input_pipeline` takes the function with the most steps, and says how input-bound it is and
what to do: prefetch (double-buffer) the input pipeline, keep data on the device, read values every N steps.

Example:
    >>> clock, site = StepClock(), SyncSite()
    >>> for step in range(4):                               # 10 ms of device work, then 30 ms of host work
    ...     t = step * 0.040
    ...     clock.call(0, t, t + 0.010, put_s=0.0, compile_s=0.0, execute_s=0.010, waited=True, steady=True)
    ...     clock.sync(site, t + 0.010, t + 0.010, t + 0.010)  # np.asarray(loss): nothing left to wait for
    >>> figures = input_pipeline({0: clock.steps[0]}, {0: "step"}, [])
    >>> figures.verdict, round(figures.device_idle_fraction, 2)
    ('highly input-bound', 0.75)
"""

from __future__ import annotations

import math
import threading
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from jaxdbg._source import SourceLocation
from jaxdbg.profile.model import HostSync, InputPipeline, InputVerdict

# eqx.filter_jit waits for every call it makes (on its runtime-error marker): a sync the program did not write.
EQX_WAIT = "eqx.filter_jit's own wait"

MODERATE = 0.05  # xprof's thresholds on the share of the step the device waits for input
HIGH = 0.20
MIN_STEPS = 3
EVERY_STEP = 0.5  # a sync site that runs at least this often per step is "every step" (logging each step)

# Per function: [steps, step_s, device_s, calls_s, transfer_s, sync_wait_s, idle_s, sync_idle_s] summed over its
# steady steps (from one call to the next: neither compiled nor ran in the capture window, and nothing compiled in
# between: another jitted function or an operation outside jit).
# ``cpu_s``: the main thread's CPU time (``time.thread_time()``) from its first reading in the run to its last, and
# ``cpu_span_s`` the plain-run time between those readings: the clock is read on the calls the profile sees (one in
# --sync-every), not on the unseen ones (a read costs more than the rest of an unseen call's bookkeeping), so the
# CPU share of a step is cpu_s / cpu_span_s. A step whose host time the main thread spent blocked (a prefetch
# queue's get) is not one a prefetch fixes.
# ``threaded``: the steps in which the program ran threads of its own beside the main one (a prefetch thread it
# can be waiting for).
STEP_FIELDS = ("steps", "step_s", "device_s", "calls_s", "transfer_s", "sync_wait_s", "idle_s", "sync_idle_s",
               "cpu_s", "cpu_span_s", "threaded")
RECENT = 5  # an unseen call runs the median of its function's latest waited calls' executions
# A sync that waited this much longer than the calls queued before it were estimated to run: they ran longer
LATE_MIN_S = 0.001
BLOCKED = 0.5  # the main thread blocked this share of its host time or more: it waits for its input, not works


@dataclass
class SyncSite:
    """One forced synchronisation site (kind and user line) in the child: how often, how long it waited for the
    device, how long the device then sat idle until the next jitted call, and the bytes it copied."""

    count: int = 0
    wait_s: float = 0.0
    idle_s: float = 0.0
    bytes: int = 0


class StepClock:
    """The main thread's run in plain-run time (jaxdbg's own waits and work taken out), with the device's queue.

    Times given are ``time.perf_counter()`` values of the profiled run; every method is a few float operations
    (one call of :meth:`call` per jitted call)."""

    def __init__(self) -> None:
        self.shift = 0.0  # real time minus plain-run time: what jaxdbg waited for or did itself so far
        self.device_free = 0.0  # plain-run time when the device has run everything queued (estimate)
        self.distorted = False  # jaxdbg waited for the device since the last sync: its real wait is not a plain run's
        self.started = False
        self.device = self.calls = self.transfer = self.sync_wait = self.idle = self.sync_idle = 0.0
        self.compiles = 0  # a compile (jitted or eager): a step holding one is not steady
        self.pending: SyncSite | None = None  # the latest sync until the next call: the idle after it is its doing
        self.pending_end = 0.0
        self.dispatch: dict[int, float] = {}  # per function: the latest un-waited call's wall (its dispatch)
        # per function: the median of its latest waited calls' executions (RECENT of them), what its unseen calls
        # are taken to run: one call slowed by the machine (another process on its core) stands for none after it
        self.execute: dict[int, float] = {}
        # The function of the latest call that ran unseen since jaxdbg last waited for a call (a sync may wait for
        # an earlier call's outputs only, the queue running on behind it), and per function what its unseen calls
        # ran beyond that estimate as the syncs that waited for them saw (a while_loop whose last call iterates
        # longest): its execute total's share that no timed call shows
        self.queued: int | None = None
        self.late: dict[int, float] = {}
        self.recent: dict[int, list[float]] = {}
        self.previous: dict[int, tuple[float, ...] | None] = {}
        # Per function: the sums of its closed runs of consecutive steady steps, and its open run (the snapshot
        # before its first step, and how many steps). A run's sums telescope to (last snapshot - first), so a
        # step costs a count, not a sum per field (see :attr:`steps`).
        self._closed: dict[int, list[float]] = {}
        self._runs: dict[int, list] = {}
        # Calls the profile let run unseen (on jax's own dispatch): their function and start, appended by the
        # profile as each is made, put on the clock at its next event (in order: nothing else happened between).
        self.unseen_functions = array("q")
        self.unseen_starts = array("d")
        self.threads_before = program_threads()  # the threads alive before the program started any
        self.threaded = 0
        self.has_threads = False  # the program ran threads of its own at the latest reading of the CPU clock
        self.cpu = self.cpu_at = math.nan  # the latest reading of the main thread's CPU clock, and its plain time

    def call(self, function: int, start: float, end: float, *, put_s: float, compile_s: float, execute_s: float,
             waited: bool, steady: bool, captured: bool = False, cpu: float = math.nan) -> None:
        """One jitted call: ``start``/``end`` bound the profile's whole handling of it (copying its numpy arguments,
        ``put_s``, included); ``waited``: the profile waited for its outputs, and ``execute_s`` is its execution;
        ``steady``: it did not compile; ``captured``: it ran in the profiler's capture window; ``cpu``: the main
        thread's CPU clock at ``start`` (NaN: not read)."""
        if self.unseen_starts:
            self.catch_up()
        if not steady:  # a compile (of this function or another) makes the step it falls in no steady one
            self.compiles += 1
        if waited:
            self.queued = None  # its outputs ready: every call queued before it ran
            host = compile_s + self.dispatch.get(function, 0.0)  # a plain run returns once it is dispatched
            recent = self.recent.setdefault(function, [])
            recent.append(execute_s)
            del recent[:-RECENT]
            self.execute[function] = sorted(recent)[len(recent) // 2]
            self.distorted = True
        else:
            host = max(end - start - put_s, 0.0)
            self.dispatch[function] = host
            execute_s = self.execute.get(function, 0.0)
        begins = start - self.shift + put_s + compile_s  # its execution can start as its dispatch does
        if cpu == cpu:  # read (not NaN): filed at the call's execution start, as its step is
            self.cpu, self.cpu_at = cpu, begins
            self.has_threads = program_threads() > self.threads_before
        self._step(function, begins, host, execute_s, put_s, steady and not captured, captured)
        self.shift += end - start - put_s - host

    def _step(self, function: int, begins: float, host: float, execute_s: float, put_s: float, steady: bool,
              captured: bool) -> None:
        """The clock's part of one call once its times are known: the device's idle time before ``begins`` (the
        call's execution start, in plain-run time), the call's dispatch and transfer, the steady-step run of its
        function (``steady``: neither compiled nor captured), and its execution on the device's queue."""
        free = self.device_free
        if begins > free:
            if self.started:
                gap = begins - free
                self.idle += gap
                if self.pending is not None:
                    credit = min(gap, max(begins - self.pending_end, 0.0))
                    self.pending.idle_s += credit
                    self.sync_idle += credit
            free = begins
        self.pending = None
        self.transfer += put_s
        self.calls += host
        if self.has_threads:
            self.threaded += 1
        now = (begins, self.device, self.calls, self.transfer, self.sync_wait, self.idle, self.sync_idle, self.cpu,
               self.cpu_at, self.threaded, self.compiles)
        before = self.previous.get(function)
        run = self._runs.get(function)
        if before is not None and steady and now[-1] == before[-1]:
            if run is None:
                self._runs[function] = [before, 1]
            else:
                run[1] += 1
        elif run is not None:  # the run of steady steps ended with the previous call
            del self._runs[function]
            _fold(self._closed.setdefault(function, [0.0] * len(STEP_FIELDS)), run, before)
        self.previous[function] = None if captured else now
        self.device_free = free + execute_s  # max(begins, device_free), without a call of max() per call
        self.device += execute_s
        self.started = True

    @property
    def steps(self) -> dict[int, list[float]]:
        """Per function, ``[steps, step_s, device_s, ...]`` (:data:`STEP_FIELDS`) summed over its steady steps so
        far (from one call to the next: neither compiled nor ran in the capture window, and nothing compiled in
        between)."""
        found = {function: list(sums) for function, sums in self._closed.items()}
        for function, run in list(self._runs.items()):
            _fold(found.setdefault(function, [0.0] * len(STEP_FIELDS)), run, self.previous.get(function))
        return found

    def sync(self, site: SyncSite, start: float, waited: float, end: float) -> None:
        """A forced synchronisation: waited for the device from ``start`` to ``waited``, then copied until ``end``."""
        if self.unseen_starts:
            self.catch_up()
        real = waited - start
        at = start - self.shift
        late = real - max(self.device_free - at, 0.0)  # beyond the queue's estimate
        if self.queued is not None and late > LATE_MIN_S:
            self.late[self.queued] = self.late.get(self.queued, 0.0) + late
        if self.distorted:  # the device's queue as a plain run would have it: the estimate, not what happened
            wait = max(self.device_free - at, 0.0)
            self.shift += real - wait
        else:
            wait = real
            self.device_free = at + real if real > 1e-5 else min(self.device_free, at)
        self.distorted = False
        self.sync_wait += wait
        self.transfer += end - waited
        site.count += 1
        site.wait_s += wait
        self.pending = site
        self.pending_end = end - self.shift

    def catch_up(self) -> None:
        """Put the calls that ran unseen since the clock's last event on it: each dispatched in its function's
        latest measured dispatch time (an un-waited call seen), running the median of its latest waited executions."""
        functions, starts = self.unseen_functions, self.unseen_starts
        if not functions:
            return
        self.unseen_functions, self.unseen_starts = array("q"), array("d")
        self.queued = functions[-1]
        first = functions[0]
        before = self.previous.get(first)
        if (self.pending is None and self.started and before is not None and before[-1] == self.compiles
                and functions.count(first) == len(functions)):
            self._steady_run(first, starts, before)
            return
        dispatch, execute, shift = self.dispatch, self.execute, self.shift
        for function, start in zip(functions, starts):  # as call(), not waited: the shift does not move
            self._step(function, start - shift, dispatch.get(function, 0.0), execute.get(function, 0.0), 0.0, True,
                       False)

    def _steady_run(self, function: int, starts: array, before: tuple[float, ...]) -> None:
        """:meth:`_step` for calls of one function that follow a steady step of its own (``before``, its snapshot)
        with no sync or compile between: its run of steady steps grows by their count, and only the device's queue
        needs each call. A profile of a loop of tiny calls lets 7 calls in 8 run unseen: as seven ``_step`` calls
        they cost ~0.5 us each; this is ~0.1 us a call."""
        host, seconds, shift = self.dispatch.get(function, 0.0), self.execute.get(function, 0.0), self.shift
        free, idle, begins = self.device_free, self.idle, 0.0
        for start in starts:
            begins = start - shift
            if begins > free:
                idle += begins - free
                free = begins
            free += seconds
        count = len(starts)
        run = self._runs.get(function)
        if run is None:
            self._runs[function] = [before, count]
        else:
            run[1] += count
        self.calls += count * host
        self.threaded += count if self.has_threads else 0
        self.idle, self.device_free = idle, free
        # the last call's snapshot, as _step takes it: before its execution is added to the device's total
        self.previous[function] = (begins, self.device + (count - 1) * seconds, self.calls, self.transfer,
                                   self.sync_wait, idle, self.sync_idle, self.cpu, self.cpu_at, self.threaded,
                                   self.compiles)
        self.device += count * seconds

    def eager_compile(self) -> None:
        """An operation run outside jit compiled (its first run): the step it falls in is not a steady one."""
        if self.unseen_starts:
            self.catch_up()
        self.compiles += 1

    def transferred(self, seconds: float) -> None:
        """A copy between host and device made outside a jitted call (``device_put``, ``jnp.asarray``)."""
        if self.unseen_starts:
            self.catch_up()
        self.transfer += seconds


def program_threads() -> int:
    """The live threads that are not jaxdbg's own (named ``jaxdbg-...``: the profile's flush thread, the monitor):
    those the program (or a library it uses) started, such as a prefetch thread its main thread may wait for.

    Example:
        >>> stop = threading.Event()
        >>> own = threading.Thread(target=stop.wait, name="jaxdbg-example", daemon=True)
        >>> before = program_threads(); own.start()
        >>> program_threads() == before
        True
        >>> stop.set(); own.join()
    """
    return sum(1 for thread in threading.enumerate() if not thread.name.startswith("jaxdbg-"))


def _fold(sums: list[float], run: list, last: tuple[float, ...] | None) -> None:
    """Add a run of steady steps (``[snapshot before its first step, steps]``, ending at snapshot ``last``) to
    ``sums``: each field's sum over the run's steps is its last value minus its first."""
    first, count = run
    if last is None:
        return
    sums[0] += count
    for i in range(len(STEP_FIELDS) - 1):
        sums[i + 1] += last[i] - first[i]


def input_pipeline(steps: Mapping[int, Sequence[float]], names: Mapping[int, str],
                   syncs: Sequence[HostSync], calls: Mapping[int, int] | None = None) -> InputPipeline | None:
    """The verdict for the function with the most steady steps (None under MIN_STEPS): per step, the device's work
    and idle time, the host's work, transfers and syncs, and the fixes that fit, largest gain first.
    ``calls``: each function's calls (to tell a sync made every step)."""
    found = [(sums, ident) for ident, sums in steps.items() if sums and sums[0] >= MIN_STEPS and ident in names]
    if not found:
        return None
    sums, ident = max(found, key=lambda pair: pair[0][0])
    count = int(sums[0])
    per = {name: sums[i] / count for i, name in enumerate(STEP_FIELDS) if i}
    if per["step_s"] <= 0:
        return None
    host = max(per["step_s"] - per["calls_s"] - per["transfer_s"] - per["sync_wait_s"], 0.0)
    # The host's step (one call to the next) is shorter than the device's where the device is the slower: calls
    # queue up (a peer that waits in a collective for a straggler), and the loop goes at the device's pace.
    step = max(per["step_s"], per["device_s"] + per["idle_s"])
    idle = min(per["idle_s"], step)
    fraction = idle / step
    verdict: InputVerdict = ("highly input-bound" if fraction >= HIGH
                             else "moderately input-bound" if fraction >= MODERATE else "not input-bound")
    every_step = [s for s in syncs if calls and s.count >= EVERY_STEP * calls.get(ident, 0) > 0]
    # the main thread's time neither on its CPU nor waiting for the device: a queue's get, a read, a lock
    span = per.get("cpu_span_s", math.nan)
    cpu = per.get("cpu_s", math.nan) / span * per["step_s"] if span > 0 else math.nan  # NaN: under two readings
    blocked = None if math.isnan(cpu) else min(max(per["step_s"] - cpu - per["sync_wait_s"], 0.0), host)
    # blocked beside a thread of the program's own: waiting for it (alone: a read or a sleep, which prefetch hides)
    waiting = (blocked or 0.0) if per.get("threaded", 0.0) >= 0.5 else 0.0
    # Without a sync made every step the host would queue steps ahead: the device would idle only where the host's
    # own time per step exceeds the device's (all of the idle after the sync is its doing, not only what followed
    # its copy).
    unhidden = max(host + per["transfer_s"] + per["calls_s"] - per["device_s"], 0.0)
    overlap = max(idle - unhidden, per["sync_idle_s"]) if every_step else per["sync_idle_s"]
    fixes = (_fixes(step, per["device_s"], host, per["transfer_s"], per["calls_s"],
                    min(overlap, idle, per["device_s"]), every_step, waiting, idle)
             if fraction >= MODERATE else ())
    return InputPipeline(names[ident], count, step, per["device_s"], host, per["transfer_s"], per["sync_wait_s"],
                         per["calls_s"], idle, fraction, per["sync_idle_s"], verdict, fixes, blocked)


def _fixes(step: float, device: float, host: float, transfer: float, dispatch: float, overlap: float,
           every_step: Sequence[HostSync], blocked: float = 0.0, idle: float | None = None) -> tuple[str, ...]:
    """What to change, largest gain first (a gain under MODERATE of the step is left out): the host's own work
    moved off the step's path (prefetch), the transfers (data kept on the device), the jitted calls' dispatch
    (fewer calls), and for a sync made every step the device's work the host could overlap with its own without it
    (``overlap``); a prefetch saves at most the device's ``idle`` time. Where the main thread spent most of its
    host time ``blocked`` (off its CPU) while threads of the program's own ran (a prefetch thread's queue), what
    feeds it is too slow, and prefetching does not help.

    Example:
        >>> _fixes(0.008, 0.001, 0.007, 0.0, 0.0, 0.0, (), blocked=0.006)[0].split(":")[0]
        'speed up what feeds the loop'
    """
    found: list[tuple[float, str]] = []
    if every_step and overlap >= MODERATE * step:
        site = max(every_step, key=lambda s: s.device_idle_s)
        if site.kind == EQX_WAIT:  # no read of the program's to thin out
            found.append((overlap, f"let steps queue: eqx.filter_jit waits for every call it makes ({site.count}x at "
                                   f"{_at(site.source)}) and leaves the device idle until the next one is queued; jit "
                                   "the step with jax.jit instead (the model's arrays from eqx.partition as arguments, "
                                   "eqx.combine inside)"))
        else:
            found.append((overlap, f"log every N steps: {site.kind} at {_at(site.source)} waits for every step "
                                   f"({site.count}x) and leaves the device idle until the next one is queued; read "
                                   "values every N steps (or keep running sums on the device)"))
    if host >= MODERATE * step and blocked >= BLOCKED * host:
        found.append((host, f"speed up what feeds the loop: its main thread sat blocked (off the CPU) {_ms(blocked)} "
                            f"of its {_ms(host)} host time per step while the program's other threads ran: it waits "
                            "for them (a prefetch thread's queue), and a deeper queue cannot hide a producer slower "
                            "than the step: vectorise the "
                            "producer's per-example work, run several workers (processes for Python-heavy work: "
                            "threads share the GIL), or move the augmentation into the jitted step"))
    elif host >= MODERATE * step:
        gain = min(host, max(step - device, 0.0) if idle is None else idle)  # no more than the device idles
        found.append((gain, "prefetch: build the next batches while the device runs (double-buffer the input "
                            "pipeline: a background thread or a loader with prefetch, jax.device_put one step "
                            "ahead), or move the preprocessing into the jitted step"))
    if transfer >= MODERATE * step:
        found.append((transfer, "keep data on the device: put the dataset (or large chunks) on the device once and "
                                "slice batches inside the jitted step"))
    if dispatch >= MODERATE * step and dispatch > device:
        found.append((dispatch - device, "dispatch fewer, larger calls: the host takes longer to dispatch each step "
                                         "than the device to run it (run several steps per call with lax.scan; a "
                                         "pmap's wrapper costs more per call than jax.jit with shardings)"))
    return tuple(text for _, text in sorted(found, key=lambda pair: -pair[0]))


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.3g} ms"


def _at(source: SourceLocation | None) -> str:
    return f"{source.file}:{source.line}" if source is not None else "an unknown line"
