"""The memory hook of the jit layer (:class:`MemoryRecorder`): per jitted function its compiled memory, and
over the run the live memory at call boundaries, the peak, leaks and out-of-memory errors.

- Every function jitted while it is installed gets ``compiler_options`` that make XLA dump its buffer
  assignment and live ranges (that function's modules only, not the eager operations' ones).
- The first call of a function is compiled ahead (``lower().compile()``; the call itself then finds the
  executable in jax's cache), analysed (:func:`jaxdbg.memory.program.analyse`) and sent before it runs, so a
  program that will not fit is named even if running it kills the process. A later recompile (seen as a
  backend-compile span during a call) is analysed after the call, from jax's cache.
- Each call's output leaves are tagged with the call that made them (weak references,
  :class:`~jaxdbg.memory.live.Producers`); at call boundaries ``jax.live_arrays()`` is summed per device and
  grouped by producer. A snapshot costs time in proportion to the live arrays, so after a function's first
  calls one is taken only while snapshots have cost less than :data:`SAMPLE_SHARE` of the run's time.
- An out-of-memory error raised by a call is explained on the spot: the live arrays and who made them,
  the program's largest buffers, and the leaks seen so far. One raised later, outside any call (dispatch is
  asynchronous: reading a result raises its program's failure), is the most recent call's whose program
  allocates the size asked for (:func:`jaxdbg.memory.oom.asked_by`).

Example:
    >>> import jax, jax.numpy as jnp, tempfile
    >>> from jaxdbg import jit_layer
    >>> sent = []
    >>> recorder = MemoryRecorder(sent.append, tempfile.mkdtemp())
    >>> with compile_spans(recorder), jit_layer.installed(recorder):
    ...     step = jax.jit(lambda x: x * 2.0)
    ...     x = step(jnp.ones((64, 64)))
    ...     recorder.finish([])
    >>> program = next(m.program for m in sent if type(m).__name__ == "ProgramAnalysed")
    >>> program.name, program.argument_bytes, program.output_bytes
    ('<lambda>', 16384, 16384)
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from jaxdbg._source import SourceLocation, caller_user_frame, innermost_user_frame, is_user_file
from jaxdbg.jit_layer import InstrumentedJit, JitCall, JitHook
from jaxdbg.memory import leaks as leak_rules
from jaxdbg.memory.live import Group, Producer, Producers, Snapshot, device_name, take_snapshot
from jaxdbg.memory.messages import (
    FinalLive,
    LeaksFound,
    MemoryNote,
    OutOfMemoryFound,
    ProgramAnalysed,
    SampleRow,
    Samples,
    ThreadedArguments,
)
from jaxdbg.memory.oom import (
    asked_by,
    executable_name,
    explanation,
    first_line,
    is_out_of_memory,
    requested_bytes,
)
from jaxdbg.memory.program import ProgramInfo, analyse, dump_number
from jaxdbg.memory.result import JitKind, Leak, LiveGroup, OutOfMemory, ProgramMemory, RunPeak
from jaxdbg.memory.units import format_bytes
from jaxdbg.protocol import repeating
from jaxdbg.report import relative_or_absolute

if TYPE_CHECKING:
    from jaxdbg.profile.signature import Signature

SAMPLE_SHARE = 0.03  # snapshots after a function's first calls may cost at most this share of the run
ALWAYS_SAMPLED = 3  # the first calls of every function are always sampled
ANALYSED_COMPILES = 3  # compiles of one function whose buffers are read (later ones: sizes only)
REPORTED_COMPILES = 8  # compiles of one function analysed at all (a recompile storm is profile's question)
THREAD_CHECKS = 4  # calls in which arguments are compared with the previous call's outputs
SEND_EVERY_S = 1.0
KEEP_POINTS = 512  # per producer group; older points are thinned out beyond this
LEAK_CHECK_EVERY = 8  # samples between leak checks during the run
TOP_GROUPS = 10
Send = Callable[[Any], None]


class DoesNotFit(Exception):
    """Raised before a function target's call whose program would not fit the budget (it is not run)."""

    def __init__(self, program: ProgramMemory):
        super().__init__(f"{program.name} needs {program.needs_bytes} bytes, over the budget by {program.over_bytes}")
        self.program = program


class FunctionState:
    """What the recorder knows of one jitted function (one jit-layer record)."""

    def __init__(self, function: InstrumentedJit):
        from jaxdbg import frameworks
        from jaxdbg.profile.signature import parameter_names

        self.name = function.name
        self.source = function.record.source
        self.jit: JitKind = "jax.pmap" if function.is_pmap else frameworks.jit_kind(function.fun)
        self.parameters = tuple(parameter_names(function.fun) or ())
        self.calls = 0
        self.compiles = 0
        self.program: ProgramMemory | None = None
        self.extra: dict[str, int] = {}  # what a call adds per device: outputs not aliased + temporaries + code
        self.previous: dict[int, weakref.ref] = {}  # the previous call's output leaves (first calls only)
        self.previous_args: dict[int, weakref.ref] = {}  # and its argument leaves
        self.threaded: set[int] = set()  # argnums fed with the previous call's outputs
        self.reused: set[int] = set()  # argnums passed the same arrays as in the previous call
        self.last_source: SourceLocation | None = None  # the line of its latest call, and when it was made
        self.last_called = 0.0
        self.unanalysed = 0  # compiles past REPORTED_COMPILES
        # The analysed compiles' signatures and callables: a recompile's row says what changed (profile's words)
        self.signatures: list[Signature] = []
        self.callables: list[Any] = []  # strong refs: an id() could be reused by a later lambda


class MemoryRecorder(JitHook):
    """Collects compiled memory per function and live memory over the run; sends it as messages."""

    sees_pmap = True  # a pmap'd function is followed as a function (jit_layer.InstrumentedPmap)

    def __init__(self, send: Send, dump_folder: str | None, *, top: int = 10, min_leak_bytes: int = 1 << 20,
                 device_memory: int | None = None, stop_before_misfit: bool = False):
        self.send = send
        self.device_memory = device_memory  # --device-memory; else each device's own limit (self.limits)
        self.limits: dict[str, int] = {}
        self.stop_before_misfit = stop_before_misfit  # a function target: do not run what would not fit
        self.dump_folder = dump_folder
        self.top = top
        self.min_leak_bytes = min_leak_bytes
        self.functions: dict[int, FunctionState] = {}
        self.producers = Producers()
        self.local = threading.local()
        self.lock = threading.Lock()
        self.started = time.perf_counter()
        self.sample_s = 0.0
        self.samples = 0
        self.rows: list[SampleRow] = []
        self.last_send = self.started
        self.peak: RunPeak | None = None
        self.peak_groups: tuple[LiveGroup, ...] = ()
        self.peak_moved = False
        self.series: dict[tuple, list[leak_rules.GroupPoint]] = {}
        self.keepers: dict[tuple, tuple[str | None, SourceLocation | None]] = {}
        self.ended: int | None = None  # the sample taken after the program returned
        self.dumped: dict[str, int] = {}  # module name -> newest dump number read
        self.oom: OutOfMemory | None = None
        self.on_first_call: Callable[[], Any] | None = None
        self.working = True  # False once the live-memory side failed (see _safely)
        self.current: tuple[str, int] | None = None  # the latest call (a job's heartbeat says so)

    # ---- the jit layer's hooks ---------------------------------------------------------------------------
    def compiler_options(self) -> dict[str, Any] | None:
        if not self.dump_folder:
            return None
        return {"xla_dump_to": self.dump_folder, "xla_dump_hlo_as_text": True}

    def on_jit(self, function: InstrumentedJit) -> None:
        with self.lock:
            if function.record.id not in self.functions:
                self.functions[function.record.id] = FunctionState(function)

    def around(self, call: JitCall, run: Callable[[], Any]) -> Any:
        if self.on_first_call is not None:
            first_call, self.on_first_call = self.on_first_call, None
            first_call()
        state = self.functions.get(call.function.record.id) or self._adopt(call.function)
        first = state.calls == 0
        state.calls += 1
        self.current = (state.name, call.index)
        source = state.last_source = caller_user_frame(1)
        state.last_called = time.perf_counter()
        snapshot = self._safely("sampling live memory", self._before, call, state) if self.working else None
        try:
            if first:
                self._ahead(call, state, snapshot)
        finally:  # recorded once the call's program is known: the estimate adds what it needs
            if snapshot is not None:
                self._safely("sampling live memory", self._record, snapshot, state, call.index, source)
        local = self.local
        local.compiled, local.active = False, True
        try:
            out = run()
        except BaseException as err:
            local.active = False
            if is_out_of_memory(err) and self.oom is None:
                self._safely("explaining the out-of-memory error", self._out_of_memory, err, call, state, source)
            raise
        local.active = False
        if local.compiled and not first:
            self._analyse(call, state, snapshot, ahead=False)
        if self.working:
            self._safely("tagging outputs", self._tag, out, state, call.index, source)
        return out

    def _before(self, call: JitCall, state: FunctionState) -> Snapshot | None:
        if state.calls <= THREAD_CHECKS:
            self._threaded(call, state)
        return self._snapshot(force=state.calls <= ALWAYS_SAMPLED)

    def _safely(self, what: str, action: Callable[..., Any], *args: Any) -> Any:
        """The recorder's own work, never the user's run's undoing: a failure of it is sent as a note and the
        live-memory side stops (the compiled programs' analysis goes on); the run continues as without it."""
        try:
            return action(*args)
        except Exception as err:  # noqa: BLE001 - jaxdbg's failure, not the program's: a note, not an error
            self.working = False
            self.send(MemoryNote(f"jaxdbg memory stopped following live memory ({what} failed: "
                                 f"{type(err).__name__}: {first_line(str(err))}); what it measured until then "
                                 "stands"))
            return None

    def on_compile_span(self) -> None:
        """A backend compile ran on this thread (jax.monitoring): inside a watched call, that call compiled."""
        if getattr(self.local, "active", False) and not getattr(self.local, "introspecting", False):
            self.local.compiled = True

    # ---- compiled programs ---------------------------------------------------------------------------------
    def _adopt(self, function: InstrumentedJit) -> FunctionState:
        self.on_jit(function)
        return self.functions[function.record.id]

    def _ahead(self, call: JitCall, state: FunctionState, snapshot: Snapshot | None) -> None:
        """Compile and analyse the first call's program before it runs (the call then hits jax's cache)."""
        self._analyse(call, state, snapshot, ahead=True)

    def _analyse(self, call: JitCall, state: FunctionState, snapshot: Snapshot | None, ahead: bool) -> None:
        if state.compiles >= REPORTED_COMPILES:
            state.unanalysed += 1
            return
        local = self.local
        local.introspecting = True
        try:
            from jaxdbg import jit_layer

            with jit_layer.internal():
                if call.function.is_compiled:  # jax's Compiled, compiled ahead by the user (with the dump options)
                    compiled = call.function.jitted
                else:
                    lowered = call.function.top_level.lower(*call.args, **call.kwargs)
                    # A pmap takes no compiler options (jax builds its jit): its analysis compiles once more,
                    # dumping its buffer assignment; a jitted function's has them and finds its executable in
                    # jax's cache.
                    pmapped = call.function.is_pmap and self.dump_folder and state.compiles < ANALYSED_COMPILES
                    compiled = lowered.compile(self.compiler_options()) if pmapped else lowered.compile()
        except Exception as err:  # noqa: BLE001 - the call itself will say what is wrong (or run anyway)
            if is_out_of_memory(err) and self.oom is None:
                self._out_of_memory(err, call, state, caller_user_frame(1), at_compile=True)
            elif not ahead:
                self.send(MemoryNote(f"{state.name}: its program could not be analysed: {type(err).__name__}: "
                                     f"{first_line(str(err))}"))
            return
        finally:
            local.introspecting = False
        try:
            program = self._program(compiled, call, state)
            devices = _program_devices(compiled)
        except Exception as err:  # noqa: BLE001 - analysis is best effort; the user's run goes on
            self.send(MemoryNote(f"{state.name}: analysing its program failed: {type(err).__name__}: {err}"))
            return
        state.compiles += 1
        extra = program.peak_bytes - program.argument_bytes
        state.extra = dict.fromkeys(devices, extra)
        live = snapshot.live if snapshot is not None else {}
        before = max((live.get(d, 0) for d in devices), default=0) if live else None
        needs = max(program.peak_bytes, before + extra) if before is not None else program.peak_bytes
        budget = self.budget(devices)
        fits = None if budget is None else needs <= budget
        program = dataclasses.replace(program, needs_bytes=needs, live_before_bytes=before, fits=fits,
                                      over_bytes=needs - budget if budget is not None and not fits else None)
        state.program = program
        self.send(ProgramAnalysed(program, ahead))
        if ahead and fits is False and self.stop_before_misfit:
            raise DoesNotFit(program)

    def budget(self, devices: list[str]) -> int | None:
        """The memory a program on ``devices`` may use: --device-memory, else the smallest device limit."""
        if self.device_memory is not None:
            return self.device_memory
        limits = [self.limits[d] for d in devices if d in self.limits]
        return min(limits) if limits else None

    def _program(self, compiled: Any, call: JitCall, state: FunctionState) -> ProgramMemory:
        signature, because = self._signature(call, state)
        helper = call.function.helper  # a multihost helper's jit: this call of the helper names the program
        info = ProgramInfo(state.name, state.source, call.index, state.compiles, signature, state.parameters,
                           tuple(call.function.static_argnums), len(call.args), frozenset(state.threaded), state.jit,
                           _argument_names(call), because, helper.called_as if helper else None)
        folder = self.dump_folder if state.compiles < ANALYSED_COMPILES else None
        from jaxdbg.profile.hlo import module_name

        module = module_name(compiled.as_text())
        program = analyse(compiled, info, folder, self.dumped.get(module, -1), self.top)
        self.dumped[module] = dump_number(folder, compiled, self.dumped.get(module, -1))
        return program

    def _signature(self, call: JitCall, state: FunctionState) -> tuple[str, str | None]:
        """The call's signature in short, and for a recompile what changed since the closest earlier compile (the
        static value, shape, dtype, pytree structure or callable), in profile's words; None for a first compile."""
        from jaxdbg.profile.signature import call_signature, explain

        fun = call.function.fun
        try:
            signature = call_signature(fun, call.args, call.kwargs, call.function.static_argnums,
                                       call.function.static_argnames, list(state.parameters) or None)
        except Exception:  # noqa: BLE001 - an odd argument: no signature, the analysis stands
            return "", None
        because = None
        if state.signatures:
            same = any(f is fun for f in state.callables)
            because = explain(state.signatures, signature, same_callable=same,
                              callable_site=str(state.source) if state.source else "").reason
        state.signatures.append(signature)
        state.callables.append(fun)
        return signature.short(), because

    def _threaded(self, call: JitCall, state: FunctionState) -> None:
        """Arguments fed with this function's previous outputs (a loop that carries its state through it: they
        could be donated), and arguments passed again as they were (the caller keeps them: they cannot)."""
        import jax

        from jaxdbg import frameworks

        before = (set(state.threaded), set(state.reused))
        arguments: dict[int, weakref.ref] = {}
        users = frameworks.user_arguments(call.function.fun, call.args, call.kwargs)  # filter_jit: the user's view
        values = [a.value for a in users] if users is not None else list(call.args)
        names = tuple(a.name for a in users) if users is not None else state.parameters
        for argnum, value in enumerate(values):
            for leaf in jax.tree_util.tree_leaves(value):
                for refs, found in ((state.previous, state.threaded), (state.previous_args, state.reused)):
                    ref = refs.get(id(leaf))
                    if ref is not None and ref() is leaf:
                        found.add(argnum)
                with contextlib.suppress(TypeError):
                    arguments[id(leaf)] = weakref.ref(leaf)
        state.previous_args = arguments if state.calls < THREAD_CHECKS else {}
        if (state.threaded, state.reused) != before:
            self.send(ThreadedArguments(state.name, tuple(sorted(state.threaded)), tuple(sorted(state.reused)),
                                        names))

    def _tag(self, out: Any, state: FunctionState, index: int, source: SourceLocation | None) -> None:
        import jax

        leaves = jax.tree_util.tree_leaves(out)
        self.producers.tag(leaves, Producer(state.name, index, source))
        if state.calls <= THREAD_CHECKS:
            refs = {}
            for leaf in leaves:
                with contextlib.suppress(TypeError):
                    refs[id(leaf)] = weakref.ref(leaf)
            state.previous = refs
        else:
            state.previous = {}

    # ---- live memory ---------------------------------------------------------------------------------------
    def _snapshot(self, force: bool = False) -> Snapshot | None:
        """Live memory now, if it is due: always when forced, else while snapshots stay under their share."""
        if not force and self.sample_s > SAMPLE_SHARE * (time.perf_counter() - self.started):
            return None
        snapshot = take_snapshot(self.producers)
        self.sample_s += snapshot.seconds
        return snapshot

    def _record(self, snapshot: Snapshot, state: FunctionState | None, index: int | None,
                source: SourceLocation | None) -> None:
        """One sample: its row, the peak if it moved, the producer groups' points."""
        self.samples += 1
        extra = state.extra if state is not None else {}
        estimate = {device: live + extra.get(device, 0) for device, live in snapshot.live.items()}
        for device, added in extra.items():
            estimate.setdefault(device, added)
        row = SampleRow(snapshot.t - self.started, state.name if state else None, index, snapshot.live, estimate,
                        snapshot.in_use, snapshot.peak_in_use)
        with self.lock:
            self.rows.append(row)
            self._peak(snapshot, estimate, state, index, source)
        self._follow_groups(snapshot)
        if len(self.rows) >= 64 or time.perf_counter() - self.last_send >= SEND_EVERY_S:
            self.flush()

    def _peak(self, snapshot: Snapshot, estimate: dict[str, int], state: FunctionState | None, index: int | None,
              source: SourceLocation | None) -> None:
        if not estimate:
            return
        device = max(estimate, key=lambda d: estimate[d])
        if self.peak is not None and estimate[device] <= self.peak.bytes:
            return
        live = snapshot.live.get(device, 0)
        self.peak = RunPeak(estimate[device], device, state.name if state else None, index, source, live,
                            estimate[device] - live)
        self.peak_groups = live_groups(snapshot.groups.values(), device)
        self.peak_moved = True

    def _follow_groups(self, snapshot: Snapshot) -> None:
        """One point per producer group (zero for a group that has none left), and leak checks now and then."""
        number = self.samples
        for key, group in snapshot.groups.items():
            calls = sorted(group.calls)
            point = leak_rules.GroupPoint(number, group.arrays, group.bytes, len(calls),
                                          calls[0] if calls else None, calls[-1] if calls else None,
                                          group.latest_arrays, group.latest_bytes)
            series = self.series.setdefault(key, [])
            series.append(point)
            if len(series) > KEEP_POINTS:
                self.series[key] = series[::2]
        for key, series in self.series.items():
            if key not in snapshot.groups and series[-1].arrays:
                series.append(leak_rules.GroupPoint(number, 0, 0, 0))
        if number % LEAK_CHECK_EVERY == 0:
            self._name_keepers(snapshot, _stack_namespaces())

    def _name_keepers(self, snapshot: Snapshot, namespaces: list[dict]) -> None:
        """For each group that looks like a leak and has no keeper yet: who keeps its newest array."""
        for key, series in self.series.items():
            if key in self.keepers or not leak_rules.is_leak(self._judged(series), self.min_leak_bytes):
                continue
            group = snapshot.groups.get(key)
            array = group.oldest() if group is not None and group.oldest is not None else None
            if array is None:
                continue
            found = leak_rules.find_keeper(array, namespaces)
            kept_by, name = found if found else (None, "")
            files = [group.source.file] if group is not None and group.source else []
            files += [str(ns["__file__"]) for ns in namespaces if isinstance(ns.get("__file__"), str)]
            line = next((loc for loc in (leak_rules.filling_line(f, name) for f in files) if loc), None)
            self.keepers[key] = (kept_by, line)

    def leaks(self) -> tuple[Leak, ...]:
        found = []
        for key, whole in self.series.items():
            series = self._judged(whole)
            if not leak_rules.is_leak(series, self.min_leak_bytes):
                continue
            last = next(p for p in reversed(series) if p.arrays)
            kept_by, kept_at = self.keepers.get(key, (None, None))
            arrays, size = last.arrays - last.latest_arrays, last.bytes - last.latest_bytes  # the latest: state
            held = (last.calls - 1) if last.calls else arrays
            found.append(Leak(key[0], key[1], arrays, size, size / max(held, 1), last.first_call, last.last_call,
                              kept_by, kept_at, len(series)))
        return tuple(sorted(found, key=lambda leak: -leak.bytes))

    def growing_states(self) -> list[str]:
        """A line for each producer whose latest outputs (the loop's state) grew call after call: no leak (the
        old ones are freed), but memory that grows without bound, and a new shape (a recompile) every call."""
        lines = []
        for (name, source), series in self.series.items():
            grew = leak_rules.growing_state(series, self.min_leak_bytes)
            if grew is None:
                continue
            first, last, per_call = grew
            at = f" (called at {relative_or_absolute(source.file)}:{source.line})" if source else ""
            lines.append(f"{name}{at}: its latest outputs, the state the loop carries, grew in nearly every call, "
                         f"from {format_bytes(first)} to {format_bytes(last)} ({format_bytes(int(per_call))} a call): "
                         "a state that grows each step (a cache built with jnp.concatenate) grows without bound and "
                         "compiles again for every new shape; allocate it at its largest size once and write into it "
                         "(x.at[i].set(...), lax.dynamic_update_slice)")
        return lines

    def _judged(self, series: list[leak_rules.GroupPoint]) -> list[leak_rules.GroupPoint]:
        """The points a leak is judged on: not a drop at the sample taken after the program returned. What a
        function's locals (a trainer's history) held is freed when it returns: that ends the run, not the leak."""
        if self.ended is not None and len(series) > 1 and series[-1].sample == self.ended and (
                series[-1].bytes < series[-2].bytes):
            return series[:-1]
        return series

    # ---- out of memory -------------------------------------------------------------------------------------
    def _out_of_memory(self, err: BaseException, call: JitCall | None, state: FunctionState | None,
                       source: SourceLocation | None, at_compile: bool = False, index: int | None = None,
                       late: bool = False, surfaced_at: SourceLocation | None = None,
                       surfaced_in: str | None = None) -> None:
        """Explain the error as ``state``'s (call ``index``), or an eager operation's; ``late``: raised after that
        call had returned, at ``surfaced_at`` by the operation ``surfaced_in`` (asynchronous dispatch)."""
        message = str(err)
        snapshot = take_snapshot(self.producers)
        program = state.program if state is not None else None
        if call is not None and state is not None and not at_compile and (
                program is None or program.call_index != call.index):
            with contextlib.suppress(Exception):
                self._analyse(call, state, snapshot, ahead=False)
                program = state.program
        device = max(snapshot.live, key=lambda d: snapshot.live[d]) if snapshot.live else None
        groups = live_groups(snapshot.groups.values(), device) if device else ()
        index = call.index if call is not None else index
        asked = requested_bytes(message)
        name = state.name if state else None
        said = explanation(message, asked, name, call_index=index, asynchronous=late, surfaced_at=surfaced_at,
                           surfaced_in=surfaced_in)
        self.oom = OutOfMemory(first_line(message), name, index, source, asked,
                               snapshot.live.get(device) if device else None, groups, program, at_compile, late,
                               surfaced_at if late else None, said)
        self.send(OutOfMemoryFound(self.oom))
        self._name_keepers(snapshot, _stack_namespaces())
        self.send(LeaksFound(self.leaks()))

    def eager_out_of_memory(self, err: BaseException) -> None:
        """An out-of-memory error raised outside any watched call: a call's own failure reported late (jax
        dispatches asynchronously, so reading an output is where its allocation error surfaces), named by the
        size asked for, or an eager operation's."""
        if self.oom is None and is_out_of_memory(err):
            self._safely("explaining the out-of-memory error", self._eager_out_of_memory, err)

    def _eager_out_of_memory(self, err: BaseException) -> None:
        message = str(err)
        raised_at = innermost_user_frame(err.__traceback__)
        state = self._asked_by(requested_bytes(message), self.functions.values())
        if state is None:
            self._out_of_memory(err, None, None, raised_at)
            return
        self._out_of_memory(err, None, state, state.last_source, index=state.calls - 1, late=True,
                            surfaced_at=raised_at, surfaced_in=executable_name(message))

    @staticmethod
    def _asked_by(asked: int | None, states: Iterable[FunctionState]) -> FunctionState | None:
        """Of ``states``, the most recently called whose program needs ``asked`` bytes (:func:`oom.asked_by`)."""
        called = sorted(((s, s.program) for s in states if s.calls and s.program is not None),
                        key=lambda pair: -pair[0].last_called)
        program = asked_by(asked, (program for _, program in called))
        return next((s for s, p in called if p is program), None) if program is not None else None

    # ---- the end -------------------------------------------------------------------------------------------
    def finish(self, namespaces: list[dict]) -> None:
        """The last sample (what the run still holds), leaks with what keeps them, everything sent."""
        snapshot = self._snapshot(force=True)
        if snapshot is not None:
            self.ended = self.samples + 1  # the number _record gives it
            self._record(snapshot, None, None, None)
            self._name_keepers(snapshot, namespaces + _stack_namespaces())
            self.send(FinalLive(live_groups(snapshot.groups.values(), None)))
        if self.oom is None:
            self.send(LeaksFound(self.leaks()))
        for line in self.growing_states():
            self.send(MemoryNote(line))
        for state in self.functions.values():
            if state.unanalysed:
                self.send(MemoryNote(f"{state.name} compiled {state.unanalysed} more time(s) after its first "
                                     f"{REPORTED_COMPILES} compiles, which alone are analysed (jaxdbg profile says why "
                                     "it recompiles)"))
        self.flush()

    def flush(self) -> None:
        """Send the samples taken since the last flush, and the peak if it moved (main thread or flusher)."""
        with self.lock:
            rows, self.rows = tuple(self.rows), []
            moved, self.peak_moved = self.peak_moved, False
            peak, groups = self.peak, self.peak_groups
            self.last_send = time.perf_counter()
        if rows or moved:
            self.send(Samples(rows, peak if moved else None, groups if moved else ()))

    def flushing(self) -> contextlib.AbstractContextManager[None]:
        """Flush every SEND_EVERY_S from a daemon thread, so a run that hangs or is killed keeps its samples."""
        return repeating(self.flush, SEND_EVERY_S, "jaxdbg-memory-flush")


def live_groups(groups: Any, device: str | None, limit: int = TOP_GROUPS) -> tuple[LiveGroup, ...]:
    """The largest producer groups on ``device`` (every device when None), as the report shows them."""
    rows = []
    for group in groups:
        size = group.device_bytes.get(device, 0) if device else group.bytes
        if size > 0:
            rows.append(_live_group(group, size))
    return tuple(sorted(rows, key=lambda g: -g.bytes)[:limit])


def _live_group(group: Group, size: int) -> LiveGroup:
    return LiveGroup(group.producer, group.source, group.arrays, size, len(group.calls), group.shape_text())


def _program_devices(compiled: Any) -> list[str]:
    import jax

    names: set[str] = set()
    with contextlib.suppress(Exception):
        for sharding in jax.tree_util.tree_leaves((compiled.input_shardings, compiled.output_shardings)):
            names.update(device_name(d) for d in sharding.device_set)
    if not names:
        names.add(device_name(jax.devices()[0]))
    return sorted(names)


def _stack_namespaces() -> list[dict]:
    """The locals and globals of the user frames on this thread's stack, innermost first (where a list that
    keeps arrays would be named)."""
    found: list[dict] = []
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            for namespace in (frame.f_locals, frame.f_globals):
                if not any(namespace is seen for seen in found):
                    found.append(namespace)
        frame = frame.f_back
    return found


@contextlib.contextmanager
def compile_spans(recorder: MemoryRecorder) -> Iterator[None]:
    """Tell ``recorder`` of backend compiles (jax.monitoring spans) while the block runs."""
    import jax.monitoring as monitoring

    def on_span(event: str, start_time: float, end_time: float, **kwargs: Any) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            recorder.on_compile_span()

    monitoring.register_event_time_span_listener(on_span)
    try:
        yield
    finally:
        monitoring.unregister_event_time_span_listener(on_span)


def _argument_names(call: JitCall) -> tuple[tuple[str, str], ...]:
    """(jax's name, the user's) of each argument jax names after a wrapper's: a pmap's flat arguments
    (``flat_args[i]``: the leaves of its dynamic arguments in the order pmap flattens them), a framework inner
    function's leaves (filter_jit's ``dynamic_nodonate['rest'][13]`` is ``model.layers[1].weight``)."""
    from jaxdbg.nan.calls import Call  # imports jax: the child's side only

    function = call.function
    try:
        replay = Call(function.name, function.fun, tuple(call.args), dict(call.kwargs), function.static_argnums)
        users = replay.leaf_names()
        if function.is_pmap:
            return tuple((f"flat_args[{i}]", name) for i, name in enumerate(users))
        return tuple((jax, user) for jax, user in zip(replay.jax_names(), users) if jax != user)
    except Exception:  # noqa: BLE001 - naming only: the buffers keep jax's names
        return ()
