"""In-child instrumentation of a script: every ``jax.jit`` function's calls, compiles and transfers.

Installed before the script imports jax and removed afterwards, each piece by a context manager that
restores what it replaced in ``finally``:

- :func:`tracking_jit` installs the :class:`Recorder` as a hook of :mod:`jaxdbg.jit_layer` (the one place
  that patches ``jax.jit``). A timed call is measured from dispatch until its outputs are ready
  (``block_until_ready``) and split into compile and execute with the compile spans jax reported while the
  call ran (the layer's ``call.spans``); see :meth:`Recorder.sampled` for which calls are timed. The
  others are not seen at all (they stay on jax's C++ dispatch; the layer counts them), unless they compile.
- :func:`compile_listener` receives ``jax.monitoring``'s compile spans outside the jitted calls (eager
  operations, jaxdbg's own introspection) and persistent-cache hits.
- :func:`jaxdbg.profile.transfers.timed_transfers` times copies between host and device (``jax.device_put``,
  ``jnp.asarray``, reading an array on the host) and the forced synchronisations, at the user's line. Host (numpy)
  arguments of a tracked call are copied to the device just before it, and that copy is timed as a transfer too.
- :class:`~jaxdbg.profile.host_bound.StepClock` follows every call the profile sees, transfer and sync on the main
  thread (the calls it let run unseen by their start, noted as they are made): whether the device waits for the host
  between steps.

Results leave as messages (:mod:`jaxdbg.profile.messages`) through ``send(message)`` as they happen (compiles at
once, call timings in batches every half second from a background thread), so a script that raises, hangs or
is killed midway still leaves its profile.

Example:
    >>> rec = Recorder(send=lambda message: None, out_dir="/tmp/p")        # doctest: +SKIP
    >>> with compile_listener(rec), tracking_jit(rec):                      # doctest: +SKIP
    ...     run_script(spec)
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from jaxdbg import _compat, jit_layer
from jaxdbg._source import SourceLocation, caller_user_frame
from jaxdbg.jit_layer import CACHE_HIT_EVENT, COMPILE_EVENTS, InstrumentedJit, JitCall, JitHook
from jaxdbg.profile.hlo import module_name
from jaxdbg.profile.hlo_files import write_hlo
from jaxdbg.profile.host_bound import StepClock, SyncSite
from jaxdbg.profile.messages import CallBatch, CallTiming, CompileRecord, FunctionDefined, RunTotals
from jaxdbg.profile.signature import Signature, call_signature, explain, parameter_names
from jaxdbg.profile.spans import span_times
from jaxdbg.protocol import Message, repeating

FLUSH_EVERY_S = 0.5
TIMED_FIRST = 3  # the first calls of a function are all timed (first call, and a steady median early)
# The call after a timed one is seen, not waited for, to measure its dispatch for the step clock; after the first
# calls, only after one timed call in this many: a function's dispatch time barely moves between steps, and each
# seen call costs ~6 us more than one run ahead unseen (bench_layer.py, profile).
DISPATCH_EVERY = 4
# After a function's first MIN_SAMPLES calls timed by --sync-every, a timed call comes no sooner than its own
# execution over TIMED_SHARE later: waiting for a call empties the device's queue (the device then idles while the
# host dispatches again), so a sample costs about one step, and sampling stays near 1% of the run whatever the step
# (on an H200, one tiny call in 8 timed cost +31 us a call, 1.17x a 0.19 ms step; a 3.25 ms step 1.08x).
MIN_SAMPLES = 8
TIMED_SHARE = 0.01
# The main thread's CPU clock is read on a seen call at most this often (the step clock needs two readings per
# run of steady steps, and a step's CPU share over their span: see host_bound.STEP_FIELDS).
CPU_READ_EVERY_S = 0.001
_KEEP_SIGNATURES = 32


class TrackedFunction:
    """What the profile knows about one jitted function (one name + definition site, across re-jits)."""

    def __init__(self, ident: int, name: str, source: SourceLocation | None, fun: Any, record: Any = None):
        self.id = ident
        self.name = name
        self.source = source
        self.names = parameter_names(fun)
        self.compiles = 0
        self.pending: list[CallTiming] = []
        self.signatures: list[Signature] = []
        self.callables: list[Any] = []  # strong refs: an id() could be reused by a later lambda
        self.introspect = True
        self.record = record  # the jit layer's: its count includes the calls that ran ahead unseen
        self.host_args = False  # it was given host (numpy) arguments: every call is seen, its copy timed
        self.called_as: str | None = None  # a multihost helper's jit: as sent (FunctionDefined)
        self.samples = 0  # calls timed by --sync-every (see Recorder.wants)
        self.timing = -1  # the index of the call --sync-every times now
        self.dispatch_at = -1  # the index of the next call seen only to measure its dispatch
        self.sample_after = 0.0  # no call is sampled before this time (time.perf_counter(); TIMED_SHARE)


class Recorder(JitHook):
    """Collects tracked functions, their calls and compiles, eager compiles and transfers; sends them out."""

    sees_pmap = True  # a pmap'd function is profiled as a function (jit_layer.InstrumentedPmap)

    def __init__(self, send: Callable[[Message], None], out_dir: str, *, hlo_limit: int = 3,
                 window: Any = None, convert_host_args: bool = True, sync_every: int = 1):
        self._send = send
        self.sync_every = max(1, sync_every)  # see sampled
        self._in_flight: Any = None  # outputs of the latest call that ran ahead untimed
        self.out_dir = out_dir
        self.hlo_limit = hlo_limit
        self.window = window
        self.convert_host_args = convert_host_args
        self.functions: dict[int, TrackedFunction] = {}
        self._local = threading.local()
        self._lock = threading.Lock()
        self.eager_spans: list[tuple[str, float, float, str]] = []
        self.introspection_spans: list[tuple[str, float, float]] = []
        # Per (kind, user line): [count, seconds, bytes]; per (kind, user line) of a forced synchronisation.
        self.transfers: dict[tuple[str, SourceLocation | None], list] = defaultdict(lambda: [0, 0.0, 0])
        self.syncs: dict[tuple[str, SourceLocation | None], SyncSite] = {}
        self.clock = StepClock()
        self._pmap_shardings: dict[tuple, Any] = {}
        self._main = threading.main_thread().ident
        self.wait: Callable[[Any], Any] = _block_until_ready  # transfers.timed_transfers sets the unpatched one
        self.cache_hits = 0
        self.overhead_s = 0.0
        self.on_first_call: Callable[[], Any] | None = None  # once, before the first tracked call runs
        self.latest: InstrumentedJit | None = None  # the function called last (its record counts the calls)
        self.in_call = False  # the main thread is inside a tracked call (a multi-process job's heartbeat says so)
        self._cpu_read_at = -math.inf  # when the main thread's CPU clock was last read (time.perf_counter())
        # Before the first call of each function: a multi-process job's heartbeat beats at once (see around).
        self.on_new_function: Callable[[], Any] | None = None

    # ---- functions (hooks of the jit layer) ----------------------------------------------------------------
    def on_jit(self, function: InstrumentedJit) -> None:
        record = function.record
        with self._lock:
            tracked = self.functions.get(record.id)
            if tracked is None:
                tracked = self.functions[record.id] = TrackedFunction(record.id, record.name, record.source,
                                                                      function.fun, record)
            elif tracked.called_as == record.called_as:
                return
            tracked.called_as = record.called_as  # a multihost helper's: a barrier called by another name
            self._send(FunctionDefined(record.id, record.name, record.source, "pmap" if function.is_pmap else "jit",
                                       record.called_as))

    @property
    def current(self) -> tuple[str, int] | None:
        """The latest call: (function, call index)."""
        latest = self.latest
        return None if latest is None else (latest.name, latest.record.calls - 1)

    def wants(self, function: InstrumentedJit, index: int) -> bool:
        """The calls this profile sees: the timed ones (:meth:`sampled`), the one after each (not waited for:
        its dispatch time, for the step clock; after one timed call in DISPATCH_EVERY), those in the capture
        window, and every call of a function given host arguments (their copy is timed). The others run ahead
        unseen (a call among them that compiles is still filed: :meth:`on_unwanted_compile`; the step clock notes
        their start). Asked on every call."""
        self.latest = function
        if index < TIMED_FIRST or self.on_first_call is not None:
            return True
        ident = function.record.id
        tracked = self.functions[ident]
        if (index % self.sync_every == 0 and self.sampled(tracked, index)) or index == tracked.dispatch_at:
            return True
        window = self.window
        if (window is not None and window.active) or tracked.host_args:
            return True
        if threading.get_ident() == self._main:  # its start, for the step clock (see StepClock.catch_up)
            clock = self.clock
            clock.unseen_functions.append(ident)
            clock.unseen_starts.append(time.perf_counter())
        return False

    def around(self, call: JitCall, run: Callable[[], Any]) -> Any:
        if self.on_first_call is not None:
            first, self.on_first_call = self.on_first_call, None
            first()
        record = self.functions[call.function.record.id]
        self.latest = call.function
        self.in_call = True
        if call.index == 0 and self.on_new_function is not None:
            # A new function is where a process of a job that dies in it (aborted by mismatched collectives) is
            # last seen, often within the second its heartbeat thread waits: say so now, once per function.
            with contextlib.suppress(Exception):
                self.on_new_function()
        try:
            return self._around(call, record, run)
        finally:
            self.in_call = False

    def _around(self, call: JitCall, record: TrackedFunction, run: Callable[[], Any]) -> Any:
        started, cpu = time.perf_counter(), math.nan
        if started - self._cpu_read_at >= CPU_READ_EVERY_S:  # (a read is a system call: ~0.5 us)
            self._cpu_read_at, cpu = started, time.thread_time()
        index = call.index
        put_s = 0.0
        if self.convert_host_args:
            call.args, put_s = self._put_host_args(call.function, call.args)
            record.host_args = record.host_args or put_s > 0.0
        window = self.window
        annotation = window.annotation(record.name, index) if window is not None and window.active else None
        sampled = record.timing == index
        timed = index < TIMED_FIRST or sampled or annotation is not None
        if timed:
            self._drain()  # a timed call must not also wait for the calls queued ahead of it
        t0 = time.perf_counter()
        try:
            if annotation is not None:
                with annotation:
                    out = run()
                    self.wait(out)
            else:
                out = run()
                if timed or call.spans:  # a call that compiled is timed too: its compile/execute split
                    timed = True
                    self.wait(out)
            t1 = time.perf_counter()
        except BaseException:
            if call.spans:
                self._compiled(record, call, call.spans, failed=True)
            raise
        compile_s = self._compiled(record, call, call.spans) if call.spans else 0.0
        wall = t1 - t0
        self._in_flight = None if timed else out
        execute_s = max(wall - compile_s, 0.0)
        if sampled:
            record.sample_after = t1 + execute_s / TIMED_SHARE
        with self._lock:
            record.pending.append(CallTiming(index, wall, execute_s, compile_s, put_s, annotation is not None, timed))
        if annotation is not None:
            self._timed(window.after_call)
        self._clocked(record, index, started, put_s, compile_s, execute_s, timed, not call.spans,
                      annotation is not None, cpu)
        return out

    def _clocked(self, record: TrackedFunction, index: int, started: float, put_s: float, compile_s: float,
                 execute_s: float, waited: bool, steady: bool, captured: bool = False, cpu: float = math.nan) -> None:
        """A call seen on the main thread, to the step clock (``cpu``: the thread's CPU clock at ``started``)."""
        if threading.get_ident() != self._main:
            return
        self.clock.call(record.id, started, time.perf_counter(), put_s=put_s, compile_s=compile_s,
                        execute_s=execute_s, waited=waited, steady=steady, captured=captured, cpu=cpu)

    def on_unwanted_compile(self, call: JitCall, out: Any) -> None:
        """A call that ran ahead unseen compiled: timed from its start to its outputs, like a seen call that
        compiles (the calls queued before it are in its execute time, as they are for a seen one)."""
        record = self.functions[call.function.record.id]
        clock = self.clock
        if threading.get_ident() == self._main and clock.unseen_starts:  # this call: clocked as seen, below
            clock.unseen_functions.pop()
            clock.unseen_starts.pop()
        with contextlib.suppress(Exception):  # e.g. outputs donated to a later call since
            self.wait(out)
        wall = time.perf_counter() - call.started
        compile_s = self._compiled(record, call, call.spans)
        execute_s = max(wall - compile_s, 0.0)
        with self._lock:
            record.pending.append(CallTiming(call.index, wall, execute_s, compile_s))
        self._clocked(record, call.index, call.started, 0.0, compile_s, execute_s, True, False)

    def on_compile_ahead(self, call: JitCall) -> None:
        """``jax.jit(f).lower(...).compile()``: filed as the function's compile (introspected from jax's own
        Lowered and Compiled); the Compiled's calls come as the function's calls."""
        record = self.functions.get(call.function.record.id)
        if record is not None:
            self._compiled(record, call, call.spans)
            if threading.get_ident() == self._main:
                self.clock.eager_compile()

    def sampled(self, tracked: TrackedFunction, index: int) -> bool:
        """Whether call ``index`` (one in ``sync_every``) waits for its outputs to be timed. Waiting on every call
        would take away the dispatch-ahead a GPU/TPU loop of short steps relies on (2x slower on an H200 at 0.2 ms
        a step), so after the first TIMED_FIRST calls only one in ``sync_every`` is timed, and after MIN_SAMPLES of
        those no sooner than TIMED_SHARE allows (``sync_every`` 1: every call); the others run ahead as in a plain
        run. Calls that compile or fall in the capture window are always timed."""
        if (tracked.samples >= MIN_SAMPLES and self.sync_every > 1
                and time.perf_counter() < tracked.sample_after):
            return False
        tracked.samples += 1
        tracked.timing = index
        if tracked.samples % DISPATCH_EVERY == 1:
            tracked.dispatch_at = index + 1
        return True

    def _drain(self) -> None:
        """Wait (untimed: it is the user's computation) for the outputs of calls that ran ahead."""
        for out in (self._in_flight, jit_layer.take_ran_ahead()):
            if out is not None:
                with contextlib.suppress(Exception):  # e.g. outputs donated to a later call since
                    self.wait(out)
        self._in_flight = None

    def _put_host_args(self, function: InstrumentedJit, args: tuple) -> tuple[tuple, float]:
        """Copy numpy arguments (top level, or one level into a tuple/list/dict) to the device, timed. A pmap'd
        function's go where pmap puts them (:meth:`_pmap_placements`), or are left to it."""
        found = False
        for value in args:
            if isinstance(value, np.ndarray) or (
                isinstance(value, (tuple, list)) and any(isinstance(v, np.ndarray) for v in value)) or (
                isinstance(value, dict) and any(isinstance(v, np.ndarray) for v in value.values())):
                found = True
                break
        if not found:
            return args, 0.0
        nbytes = 0
        places = self._pmap_placements(function, args) if function.is_pmap else None
        if function.is_pmap and places is None:
            return args, 0.0

        copies: list[Any] = []

        def put(value: Any, place: Any = None) -> Any:
            nonlocal nbytes
            if isinstance(value, np.ndarray):
                nbytes += value.nbytes
                copies.append(jax.device_put(value, place))
                return copies[-1]
            return value

        start = time.perf_counter()
        with self.no_transfer_timing():
            if places is not None:
                moved = tuple(put(v, p) if p is not None else v for v, p in zip(args, places))
            else:
                moved = tuple(
                    put(v) if isinstance(v, np.ndarray) else
                    type(v)(put(x) for x in v) if isinstance(v, (tuple, list)) and type(v) in (tuple, list) else
                    {k: put(x) for k, x in v.items()} if type(v) is dict else v
                    for v in args
                )
            self.wait(copies)  # the copies alone: the other arguments may be a call's outputs still being computed
        seconds = time.perf_counter() - start
        self.add_transfer("implicit_args", seconds, nbytes, caller_user_frame(1))
        return moved, seconds

    def _pmap_placements(self, function: InstrumentedJit, args: tuple) -> list | None:
        """Per argument of a pmap'd call, the sharding pmap gives a numpy array there (None: not a numpy array),
        for top-level numpy arguments mapped over axis 0 (pmap's default); None for any other layout (pmap copies
        those itself, inside the call)."""
        in_axes = function.options.get("in_axes", 0)
        axes = [in_axes] * len(args) if isinstance(in_axes, int) else list(in_axes) if isinstance(
            in_axes, (tuple, list)) and len(in_axes) == len(args) else None
        if axes is None or any(isinstance(v, np.ndarray) and a != 0 for v, a in zip(args, axes)):
            return None
        shape = next((v.shape for v in args if isinstance(v, np.ndarray)), ())
        key = (id(function), shape[:1])
        sharding = self._pmap_shardings.get(key, False)
        if sharding is False:  # a mesh built once per function and device count, not per call
            sharding = self._pmap_shardings[key] = _compat.pmap_input_sharding(function.options, shape)
        if sharding is None:
            return None
        return [sharding if isinstance(v, np.ndarray) else None for v in args]

    # ---- compiles ------------------------------------------------------------------------------------------
    def on_span(self, event: str, start: float, end: float, fun_name: str = "") -> None:
        stage = COMPILE_EVENTS.get(event)
        if stage is None:
            return
        local = self._local
        if getattr(local, "introspecting", False):
            self.introspection_spans.append((stage, start, end))
        elif not jit_layer.in_user_call():  # a jitted call's own spans: the layer files them in call.spans
            self.eager_spans.append((stage, start, end, str(fun_name)))
            # compiling inside a transfer (jnp.asarray's first jit(stage)) is not copying
            local.eager_compile_s = getattr(local, "eager_compile_s", 0.0) + end - start
            if stage == "compile" and threading.get_ident() == self._main:
                self.clock.eager_compile()

    def eager_compile_s(self) -> float:
        """Seconds of eager operations' compile spans (trace, lower, backend) on this thread so far."""
        return getattr(self._local, "eager_compile_s", 0.0)

    def on_cache_hit(self) -> None:
        """The persistent compilation cache answered a backend compile."""
        self.cache_hits += 1

    def _compiled(self, record: TrackedFunction, call: JitCall, spans: list, failed: bool = False) -> float:
        """File one compile: its stage times, why it happened, and (first few) its HLO, cost and memory."""
        started = time.perf_counter()
        function, index, args, kwargs = call.function, call.index, call.args, call.kwargs
        times = span_times(spans)
        info: dict[str, Any] = {"id": record.id, "call_index": index, **times, "failed": failed,
                                "cache_hit": any(kind == "cache_hit" for kind, _, _ in spans)}
        try:
            signature = call_signature(function.fun, args, kwargs, function.static_argnums,
                                       function.static_argnames, record.names)
        except Exception as err:  # noqa: BLE001 - an odd argument must not break the user's run
            signature = Signature((("<arguments>", _other(f"unreadable: {err}")),))
        if record.signatures:
            same = any(f is function.fun for f in record.callables)
            site = str(record.source) if record.source else ""
            recompile = explain(record.signatures, signature, same_callable=same, call_index=index,
                                callable_site=site)
            info["recompile"] = dataclasses.replace(recompile, source=caller_user_frame(1))
        record.signatures = [*record.signatures, signature][-_KEEP_SIGNATURES:]
        record.callables = [*record.callables, function.fun][-_KEEP_SIGNATURES:]
        info["signature"] = signature.short()
        info["dtypes"] = tuple(leaf.dtype for _, leaf in signature.leaves if leaf.kind == "array")
        if not failed and record.introspect and record.compiles < self.hlo_limit:
            info.update(self._introspect(record, function, args, kwargs, call.notes.get("compiled"),
                                         call.notes.get("lowered")))
        record.compiles += 1
        self._send(CompileRecord(**info))
        self.overhead_s += time.perf_counter() - started
        return times["total_s"]

    def _introspect(self, record: TrackedFunction, function: InstrumentedJit, args: tuple, kwargs: dict,
                    compiled: Any = None, lowered: Any = None) -> dict:
        """HLO texts, cost and memory of the executable the call just built (jax's caches answer: no recompile),
        or of the one compiled ahead of time (``compiled`` and its ``lowered``)."""
        local = self._local
        before = len(self.introspection_spans)
        local.introspecting = True
        try:
            if compiled is None or lowered is None:
                lowered = function.jitted.lower(*args, **kwargs)
                compiled = lowered.compile()
            text = compiled.as_text()
            paths = write_hlo(self.out_dir, record.name, record.compiles, lowered.as_text(), text, compiled)
            found: dict[str, Any] = {"hlo": paths, "module": module_name(text), "cost": _compat.compiled_cost(compiled),
                     "memory": _compat.compiled_memory(compiled)}
        except Exception as err:  # noqa: BLE001 - analysis is best effort; the user's run goes on
            record.introspect = False
            return {"introspection_error": f"{type(err).__name__}: {err}"[:300]}
        finally:
            local.introspecting = False
        if len(self.introspection_spans) > before:
            # jax compiled again to answer: stop asking for this function (it would double compile time).
            record.introspect = False
            found["introspection_recompiled"] = True
        return found

    # ---- transfers -------------------------------------------------------------------------------------------
    def add_transfer(self, kind: str, seconds: float, nbytes: int, source: SourceLocation | None = None, *,
                     outside_call: bool = False) -> None:
        """One copy; ``outside_call``: made between jitted calls (the step clock counts it as the host's)."""
        entry = self.transfers[(kind, source)]
        entry[0] += 1
        entry[1] += seconds
        entry[2] += nbytes
        if outside_call and threading.get_ident() == self._main:
            self.clock.transferred(seconds)

    def add_sync(self, kind: str, started: float, waited: float, ended: float, nbytes: int) -> None:
        """A forced synchronisation at the user's line: it waited for the device until ``waited``, then copied
        ``nbytes`` to the host until ``ended`` (a ``to_host`` transfer)."""
        source = caller_user_frame(2)
        site = self.syncs.get((kind, source))
        if site is None:
            site = self.syncs[(kind, source)] = SyncSite()
        if threading.get_ident() == self._main:
            self.clock.sync(site, started, waited, ended)
        else:
            site.count += 1
            site.wait_s += waited - started
        site.bytes += nbytes
        if nbytes:
            self.add_transfer("to_host", ended - waited, nbytes, source)

    @contextlib.contextmanager
    def no_transfer_timing(self) -> Iterator[None]:
        previous = self.enter_transfer()
        try:
            yield
        finally:
            self.leave_transfer(previous)

    def enter_transfer(self) -> bool:
        """Mark this thread as inside a timed transfer or sync (what it calls is not timed again); returns the
        mark before, for :meth:`leave_transfer`. The per-sync path's spelling of :meth:`no_transfer_timing`."""
        local = self._local
        previous = getattr(local, "in_transfer", False)
        local.in_transfer = True
        return previous

    def leave_transfer(self, previous: bool) -> None:
        self._local.in_transfer = previous

    def timing_transfers(self) -> bool:
        return not getattr(self._local, "in_transfer", False)

    # ---- sending -------------------------------------------------------------------------------------------
    def _timed(self, action: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        try:
            return action()
        finally:
            self.overhead_s += time.perf_counter() - started

    @contextlib.contextmanager
    def flushing(self) -> Iterator[None]:
        """Flush every FLUSH_EVERY_S from a daemon thread (so a run killed while it hangs keeps its calls),
        and once more at the end."""
        try:
            with repeating(self.flush, FLUSH_EVERY_S, "jaxdbg-flush"):
                yield
        finally:
            self.flush()

    def flush(self) -> None:
        """Send the call timings gathered since the last flush, and the running totals."""
        batch = {}
        with self._lock:
            for record in list(self.functions.values()):
                if record.pending:
                    batch[record.id], record.pending = record.pending, []
        if batch:
            self._send(CallBatch(batch))
        if threading.get_ident() == self._main and self.clock.unseen_starts:  # the calls since its last event
            self.clock.catch_up()
        self._send(RunTotals(
            list(self.eager_spans), [(kind, source, *entry) for (kind, source), entry in list(self.transfers.items())],
            self.cache_hits, span_times([(k, s, e) for k, s, e in self.introspection_spans])["total_s"],
            syncs=[(kind, source, site.count, site.wait_s, site.idle_s, site.bytes)
                   for (kind, source), site in list(self.syncs.items())],
            steps={ident: list(sums) for ident, sums in list(self.clock.steps.items())},
            calls={ident: f.record.calls for ident, f in list(self.functions.items()) if f.record is not None},
            late=dict(self.clock.late)))


_ARRAY = _compat.array_class()
_ARRAY_BLOCK = _ARRAY.__dict__["block_until_ready"]  # jax's own, captured before transfers.py patches it
_JAX_BLOCK = jax.block_until_ready


def _block_until_ready(x: Any) -> Any:
    """``jax.block_until_ready(x)``; one array by its own method: ~0.3 us against ~1.1 us for the pytree walk,
    on each call the profile times (twice: the calls queued ahead, then its own outputs)."""
    return _ARRAY_BLOCK(x) if type(x) is _ARRAY else _JAX_BLOCK(x)


def _other(text: str) -> Any:
    from jaxdbg.profile.signature import LeafSig

    return LeafSig("other", value=text)


# ---- context managers that install and remove the hooks ----------------------------------------------------


@contextlib.contextmanager
def compile_listener(recorder: Recorder) -> Iterator[None]:
    """Route jax.monitoring compile spans (and cache hits) to ``recorder`` while the block runs."""
    import jax.monitoring as monitoring

    def on_span(event: str, start_time: float, end_time: float, **kwargs: Any) -> None:
        recorder.on_span(event, start_time, end_time, str(kwargs.get("fun_name", "")))

    def on_event(event: str, **kwargs: Any) -> None:
        if event == CACHE_HIT_EVENT:
            recorder.on_cache_hit()

    monitoring.register_event_time_span_listener(on_span)
    monitoring.register_event_listener(on_event)
    try:
        yield
    finally:
        monitoring.unregister_event_time_span_listener(on_span)
        monitoring.unregister_event_listener(on_event)


@contextlib.contextmanager
def tracking_jit(recorder: Recorder) -> Iterator[None]:
    """Track every function jitted inside the block (``recorder`` as a hook of the jit layer)."""
    with jit_layer.installed(recorder):
        yield
