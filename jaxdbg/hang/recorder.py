"""The flight recorder: a :class:`~jaxdbg.jit_layer.JitHook` that keeps the last calls of this process.

Each top-level jitted call is one :class:`Entry` in a bounded ring buffer: its sequence number, the
function and its call index, the program it ran (:mod:`jaxdbg.hang.programs`: fingerprint, collectives and
their devices), the user's line that called it, when it started, when it returned to Python and when its
results became ready. Calls into host callbacks are entries too (which thread, which function, from which
call). The ready time is not waited for: the call keeps a reference to its last output array, and the
watchdog thread asks ``is_ready()`` of it later (a later ready call means the earlier ones are done too; an
output of more than 16384 elements is held only weakly once a later call came, so no large output lives longer
than it would, and one already freed counts as done).

What the main thread pays per call: the layer's hook chain, the user line (remembered per code line), one
append, and ``tree_leaves`` of the outputs. A new signature (a call that traced or compiled, or a function
with several programs) also computes the call's signature; a new program is compiled-from-cache once to
read its collectives. Calls of *global* programs (devices in several processes) also append their program,
call index and line to compact arrays: the step sequence that processes compare for divergence.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from jaxdbg import jit_layer
    >>> recorder = Recorder(capacity=8)
    >>> with jit_layer.installed(recorder), recorder.listening():
    ...     double = jax.jit(lambda x: 2 * x)
    ...     _ = double(jnp.ones(2)); _ = double(jnp.ones(2)); _ = double(jnp.ones(3))
    >>> [(e.function, e.index, e.program) for e in recorder.entries()]
    [('<lambda>', 0, 0), ('<lambda>', 1, 0), ('<lambda>', 2, 1)]
    >>> recorder.programs[1].key
    '<lambda>(x: f32[3])'
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from array import array
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from jaxdbg._source import SourceLocation, caller_user_frame
from jaxdbg.hang.programs import Program, describe_program, signature_text
from jaxdbg.jit_layer import InstrumentedJit, JitCall, JitHook

CAPACITY = 256  # entries kept per process (calls and callbacks)
SMALL_OUTPUT_ELEMENTS = 16384  # an output this small (a loss) is held until ready; a larger one only weakly
_COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/backend_compile_duration")


class Entry:
    """One call (``kind`` ``call``) or one call into a host callback (``callback``) of this process."""

    __slots__ = ("call", "collective", "error", "function", "index", "kind", "out", "program", "ready", "returned",
                 "seq", "site", "start", "step", "thread", "via")

    def __init__(self, kind: str, seq: int, function: str, index: int, site: SourceLocation | None, thread: str):
        self.kind, self.seq, self.function, self.index = kind, seq, function, index
        self.site, self.thread = site, thread
        self.start = time.time()
        self.returned: float | None = None
        self.ready: float | None = None
        self.program: int | None = None
        self.step: int | None = None  # its place in the sequence of global calls
        self.error: str | None = None
        self.out: Any = None  # its last output array (a weak reference to a large one once a later call came)
        self.call: JitCall | None = None  # while in flight: its arguments, to name its program if it never returns
        self.via: str | None = None  # a callback's kind: jax.pure_callback, io_callback, jax.debug.callback
        # what it waits in where its program's collectives are unknown (a multihost helper's barrier, by its name)
        self.collective: str | None = None

    def as_dict(self) -> dict:
        """JSON-ready (what the job's processes exchange)."""
        return {"kind": self.kind, "seq": self.seq, "function": self.function, "index": self.index,
                "site": self.site.as_dict() if self.site else None, "thread": self.thread, "start": self.start,
                "returned": self.returned, "ready": self.ready, "program": self.program, "step": self.step,
                "error": self.error, "via": self.via, "collective": self.collective}


class Recorder(JitHook):
    """The flight recorder (see the module docstring). ``entries()`` is safe to call from another thread."""

    sees_pmap = True  # a pmap'd call is a top-level call too, with collectives (jit_layer.InstrumentedPmap)

    def __init__(self, capacity: int = CAPACITY):
        _bind_jax()
        self.ring: deque[Entry] = deque(maxlen=capacity)
        self.calls = 0  # jitted calls started (the sequence number of the next one)
        self.returned = 0
        self.callbacks = 0
        self.callbacks_done = 0
        self.inflight: dict[int, Entry] = {}  # thread ident -> its jitted call in flight
        self.in_callback: dict[int, Entry] = {}  # thread ident -> the host callback it runs
        self.exiting = False  # the program's main code returned; Python waits for its non-daemon threads
        self.thread_deaths: list[dict] = []  # threads that ended by an exception (a dead producer: its consumer waits)
        # told before the first call of each function runs (the watchdog saves the flight record then: a new
        # function is where a process that dies in it, e.g. aborted by mismatched collectives, is last seen)
        self.on_first_call: Callable[[], None] | None = None
        self.programs: dict[int, Program] = {}
        self._by_function: dict[int, list[int]] = {}  # function record id -> its programs
        self._by_key: dict[tuple[int, str], int] = {}
        self._introspect: dict[int, bool] = {}  # record id -> reading the compiled program still costs nothing
        self.steps_program, self.steps_index, self.steps_site = array("I"), array("I"), array("I")
        self.sites: list[SourceLocation | None] = []
        self._site_ids: dict[SourceLocation | None, int] = {}
        self._latest: Entry | None = None
        self._local = threading.local()
        self._lock = threading.Lock()
        self._thread_names: dict[int, str] = {}

    # -- jitted calls (the main thread) ------------------------------------------------------------------------

    def around(self, call: JitCall, run: Callable[[], Any]) -> Any:
        local = self._local
        thread = threading.get_ident()
        name = self._thread_names.get(thread)
        if name is None:
            name = self._thread_names[thread] = threading.current_thread().name
        # (skip: this frame, the layer's partial, _Layer.call, InstrumentedJit.__call__: none is user code)
        helper = call.function.helper  # a multihost helper's jit: named as the user called it, the barrier by its name
        entry = Entry("call", self.calls, helper.called_as if helper else call.function.name, call.index,
                      caller_user_frame(3), name)
        entry.collective = helper.collective if helper else None
        self.calls += 1
        entry.call = call
        self.ring.append(entry)
        self.inflight[thread] = entry
        if call.index == 0 and self.on_first_call is not None:
            with contextlib.suppress(Exception):  # saving the record must never break the user's call
                self.on_first_call()
        spans = local.spans = []
        try:
            out = run()
        except BaseException as err:
            entry.error = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:300] if str(err).strip() else ''}"
            raise
        finally:
            entry.returned = time.time()
            self.returned += 1
            self.inflight.pop(thread, None)
            if entry.error is None:
                self._place(entry, call, bool(spans))
            local.spans = None
            entry.call = None
        self._keep_output(entry, out)
        return out

    def _place(self, entry: Entry, call: JitCall, traced: bool) -> None:
        """Which program the call ran; a global one also goes into the step sequence."""
        known = self._by_function.get(call.function.record.id)
        try:
            entry.program = known[0] if known and len(known) == 1 and not traced else self.program_of(call)
        except Exception:  # noqa: BLE001 - an odd argument must not break the user's run
            return
        program = self.programs[entry.program]
        if program.is_global:
            entry.step = len(self.steps_program)
            site = self._site_ids.get(entry.site)
            if site is None:
                site = self._site_ids[entry.site] = len(self.sites)
                self.sites.append(entry.site)
            self.steps_program.append(entry.program)
            self.steps_index.append(entry.index)
            self.steps_site.append(site)

    def program_of(self, call: JitCall) -> int:
        """The program id of ``call`` (its signature; a new one is described once). Also asked by the watchdog
        for a call that never returned (its arguments are still held while it is in flight)."""
        from jaxdbg.profile.signature import call_signature, parameter_names

        function = call.function
        signature = signature_text(call_signature(function.fun, call.args, call.kwargs, function.static_argnums,
                                                  function.static_argnames, parameter_names(function.fun)))
        record = function.record.id
        found = self._by_key.get((record, signature))
        if found is not None:
            return found
        compiled, note = self._compiled(function, call)
        with self._lock:
            found = self._by_key.get((record, signature))
            if found is None:
                found = len(self.programs)
                self.programs[found] = describe_program(found, function.name, signature, compiled, note)
                self._by_key[(record, signature)] = found
                self._by_function.setdefault(record, []).append(found)
        return found

    def _compiled(self, function: InstrumentedJit, call: JitCall) -> tuple[Any, str]:
        """The executable the call ran, from jax's caches; None (and why) where asking would compile again or
        fail, or from another thread than the caller's (a stuck call: its collectives stay unknown)."""
        record = function.record.id
        if function.is_compiled:  # jax's Compiled, called ahead-of-time style: the executable itself
            return function.jitted, ""
        if not self._introspect.get(record, True) or getattr(self._local, "spans", None) is None:
            return None, "not read: asking jax would compile it again" if record in self._introspect else ""
        spans = self._local.spans
        probe = self._local.spans = []  # the lowering below is jaxdbg's, not the program's
        try:
            compiled = function.jitted.lower(*call.args, **call.kwargs).compile()
        except Exception as err:  # noqa: BLE001 - the program is still recorded, without its collectives
            return None, f"not read: {type(err).__name__}"
        finally:
            self._local.spans = spans
        if probe:  # jax's caches did not answer: it compiled again, so later programs are not read
            self._introspect[record] = False
        return compiled, ""

    def _keep_output(self, entry: Entry, out: Any) -> None:
        """Hold one output array for the watchdog's readiness check (the outputs of one execution become ready
        together: the last array leaf will do, found without looking at the others); once a later call came,
        a large one is held only weakly."""
        held = None
        for leaf in reversed(_tree_leaves(out)):
            if isinstance(leaf, _Array):
                held = leaf
                break
        if held is None:
            entry.ready = entry.returned
        entry.out = held
        previous, self._latest = self._latest, entry
        if previous is not None and isinstance(previous.out, _Array) and previous.out.size > SMALL_OUTPUT_ELEMENTS:
            previous.out = weakref.ref(previous.out)  # a large output is not kept alive for the check

    def on_span(self, event: str) -> None:
        spans = getattr(self._local, "spans", None)
        if spans is not None and event in _COMPILE_EVENTS:
            spans.append(event)

    @contextlib.contextmanager
    def listening(self) -> Iterator[None]:
        """Hear ``jax.monitoring``'s trace and compile spans (which calls compiled), the calls into host
        callbacks, and threads that die by an exception (``threading.excepthook``, which still prints it as
        before) while the block runs."""
        import jax.monitoring as monitoring

        from jaxdbg import _compat

        def on_span(event: str, start_time: float, end_time: float, **kwargs: Any) -> None:
            self.on_span(event)

        previous = threading.excepthook

        def on_thread_death(args: Any) -> None:
            self.thread_died(args)
            previous(args)

        monitoring.register_event_time_span_listener(on_span)
        threading.excepthook = on_thread_death
        try:
            with _compat.host_callback_hooks(self.callback_entered, self.callback_left):
                yield
        finally:
            if threading.excepthook is on_thread_death:  # (the program may have set its own since: left alone)
                threading.excepthook = previous
            monitoring.unregister_event_time_span_listener(on_span)

    def thread_died(self, args: Any) -> None:
        """Note a thread that ended by an uncaught exception (Python prints it and goes on): a producer thread
        whose consumer now waits forever for its next item is the classic hang it explains."""
        if args.exc_type is SystemExit:  # a thread's sys.exit() is a normal end (Python prints nothing)
            return
        from jaxdbg._source import innermost_user_frame

        where = innermost_user_frame(args.exc_traceback)
        message = str(args.exc_value).strip().splitlines()
        self.thread_deaths.append({
            "thread": args.thread.name if args.thread is not None else None,
            "error": f"{args.exc_type.__name__}: {message[0] if message else ''}"[:300],
            "source": where.as_dict() if where else None, "time": time.time()})

    # -- host callbacks (whichever thread runs them) -----------------------------------------------------------

    def callback_entered(self, kind: str, function: Any) -> Entry:
        thread = threading.get_ident()
        name = getattr(function, "__qualname__", None) or getattr(function, "__name__", None) or type(function).__name__
        code = getattr(function, "__code__", None)
        site = SourceLocation(code.co_filename, code.co_firstlineno, name) if code is not None else None
        running = self.inflight.get(thread) or self._latest_call()
        with self._lock:
            entry = Entry("callback", running.seq if running else -1, name, self.callbacks, site,
                          threading.current_thread().name)
            self.callbacks += 1
        entry.via = kind
        self.ring.append(entry)
        self.in_callback[thread] = entry
        return entry

    def callback_left(self, entry: Entry, error: BaseException | None) -> None:
        entry.returned = entry.ready = time.time()
        if error is not None:
            entry.error = f"{type(error).__name__}: {error}"[:300]
        self.in_callback.pop(threading.get_ident(), None)
        self.callbacks_done += 1

    def _latest_call(self) -> Entry | None:
        for entry in reversed(tuple(self.ring)):
            if entry.kind == "call":
                return entry
        return None

    # -- read by the watchdog thread ---------------------------------------------------------------------------

    def entries(self) -> list[Entry]:
        return list(self.ring)

    def check_ready(self) -> int:
        """Set the ready time of the calls whose results are ready now (a later ready call means the earlier
        ones are done); returns how many became ready."""
        now, newly, later_ready = time.time(), 0, False
        for entry in reversed(self.entries()):
            if entry.kind != "call" or entry.returned is None:
                continue
            if entry.ready is not None:
                later_ready = True
                continue
            if not later_ready:
                held = entry.out() if isinstance(entry.out, weakref.ref) else entry.out
                if held is not None and not _is_ready(held):
                    continue
                later_ready = True  # ready, or freed (consumed by a later call, or dropped): done by now
            entry.ready, entry.out = now, None
            newly += 1
        return newly

    def program_of_stuck_call(self, entry: Entry) -> int | None:
        """The program of a call that has not returned (named from its arguments, without its collectives)."""
        call = entry.call
        if call is None:
            return entry.program
        try:
            return self.program_of(call)
        except Exception:  # noqa: BLE001 - its arguments cannot be read: the program stays unknown
            return None

    def progress(self) -> tuple[int, int, int, int]:
        """What moves while the program makes progress: calls started and returned, callbacks entered and left."""
        return self.calls, self.returned, self.callbacks, self.callbacks_done


def _tree_leaves(tree: Any) -> list:
    return []


_Array: Any = ()


def _bind_jax() -> None:
    """jax's names the hot path uses, looked up once (the recorder is built before the program imports jax)."""
    global _tree_leaves, _Array
    import jax

    _tree_leaves, _Array = jax.tree_util.tree_leaves, jax.Array


def _is_ready(array: Any) -> bool:
    try:
        return bool(array.is_ready())
    except Exception:  # noqa: BLE001 - deleted (donated to a later call): that call consumed it
        return True
