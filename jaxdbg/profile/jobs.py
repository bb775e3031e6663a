"""The contained jobs of ``jaxdbg profile`` (run in a child by :func:`jaxdbg.runner.run_contained`).

- :func:`script_job` runs a script as ``__main__`` with the instrumentation of
  :mod:`jaxdbg.profile.instrument` installed around it.
- :func:`function_job` profiles one function ahead of time: trace, lower and compile split apart, then
  warm-up and timed runs, then a short traced pass for the per-op table.

Both take a :class:`~jaxdbg.profile.messages.ProfileJob` and send typed messages as they go
(:mod:`jaxdbg.profile.messages`), and read the capture in the child once the profiler has stopped
(:class:`~jaxdbg.profile.messages.CaptureOps`), so the parent never needs to import jax.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from jaxdbg import multihost
from jaxdbg.launch import PEER_FAILED_MARK, launched_place
from jaxdbg.profile.messages import (
    CallBatch,
    CallTiming,
    CaptureOps,
    CompileRecord,
    DeviceInfo,
    FunctionDefined,
    JobFigures,
    PeakMeasured,
    ProfileJob,
    ProfileNote,
    RunFinished,
)
from jaxdbg.protocol import Done, Environment, Message, MessageLog, failure_summary, handles, locked_sender
from jaxdbg.target import check_arity

Send = Callable[[Message], None]
GATHER_WAIT_S = 60.0  # how long process 0 waits for the other processes' figures at the end of the run


def start(channel: Any) -> tuple[Send, DeviceInfo]:
    """The sender, and the device and environment (sent first: the report's envelope comes from here)."""
    send = locked_sender(channel)
    return send, send_device_info(send)


def send_device_info(send: Send) -> DeviceInfo:
    """The default backend and the environment (the report's envelope comes from here); starts the backend."""
    import jax

    from jaxdbg.report import environment_info

    devices = jax.devices()
    info = DeviceInfo(jax.default_backend(), getattr(devices[0], "device_kind", ""), len(devices))
    send(info)
    send(Environment(environment_info()))
    return info


class BackendStart:
    """What needs jax's backend (the device, the environment, the profiler capture) waits for the script's
    first jitted call, or its end: a multi-process program must call ``jax.distributed.initialize()`` before
    anything starts the backend, and a script does so before its first jitted call. In a multi-process job
    each process keeps its artifacts in ``process-<index>/`` of the output folder (one machine may run them
    all, and the profiler names its files by host)."""

    def __init__(self, send: Send, stack: contextlib.ExitStack, window: Any, recorder: Any, log: MessageLog,
                 timeout: float | None = None):
        self.send, self.stack, self.window, self.recorder, self.log = send, stack, window, recorder, log
        self.timeout = timeout
        self.info: DeviceInfo | None = None
        self.started = time.perf_counter()
        self.heartbeat: multihost.Heartbeat | None = None  # runs until the job's figures are shared
        self.ended: str | None = None  # how the program ended ("finished", "raised ..."): it waits for nobody now
        self.job_out = recorder.out_dir  # the job's --out (this process's part is process-<index>/ in it)

    def __call__(self) -> DeviceInfo:
        if self.info is None:
            import jax

            self.info = send_device_info(self.send)
            # A process its launcher started as one of several keeps its own folder even if the program never
            # joined the job (it is then refused at the end): the others write the same file names beside it.
            place = (jax.process_index(), jax.process_count()) if jax.process_count() > 1 else launched_place(
                os.environ)
            if place is not None:
                self.recorder.out_dir = os.path.join(self.recorder.out_dir, f"process-{place[0]}")
                if self.window is not None:
                    self.window.logdir = os.path.join(self.recorder.out_dir, "trace")
            if jax.process_count() > 1:
                self.heartbeat = multihost.Heartbeat("profile", self.where, self.peer_lost,
                                                     hung_s=multihost.hung_wait(self.timeout))
                self.heartbeat.start()
                self.recorder.on_new_function = self.heartbeat.beat
            else:
                self.log.stop()  # kept only to share this process's figures with the job
            if self.window is not None:
                self.stack.enter_context(self.window)
        return self.info

    def peer_lost(self, index: int, line: str) -> None:
        """The heartbeat's line about process ``index`` (lost, or the one the job hangs on), and where the job
        shares --out, how that process failed in its own report's words: this process may never get further
        (it waits in a collective for it until --timeout), so it is said now."""
        self.send(ProfileNote(line))
        failed = peer_failure(self.job_out, index, time.time() - (time.perf_counter() - self.started))
        if failed:
            self.send(ProfileNote(failed))

    def where(self) -> dict:
        """Where this process stands, for the job's other processes should it stop answering or hang."""
        from jaxdbg import jit_layer

        # The latest call is known from the sampling question asked of every call; whether the main thread is
        # inside one, from its stack (a call that runs ahead unseen sets nothing).
        current = self.recorder.current
        inside = self.ended is None and (self.recorder.in_call or jit_layer.main_thread_calls()[0] is not None)
        at = (f"{'in' if inside else 'after'} {current[0]} call {current[1]}" if current
              else "before its first jitted call")
        if self.ended is not None:  # (the main thread now shares the figures: no frame of the program's)
            return {"text": f"its program {self.ended}, {at}", "progress": current, "in_call": False, "ended": True}
        return {"text": f"{at}, {time.perf_counter() - self.started:.1f} s into the run", "progress": current,
                "in_call": inside}


def send_capture_ops(send: Send, window: Any, backend: str, first_runs: bool = False) -> None:
    """Per-op totals from the capture: xprof's hlo_stats off CPU, the XLA:CPU thunk events otherwise.
    ``first_runs``: the capture opened at the run's first call (a script's), so it holds its programs' first runs."""
    from jaxdbg.profile.ops import read_xplane, xprof_hlo_stats

    trace = getattr(window, "files", None)
    if trace is None or trace.xplane is None:
        return
    try:
        # xprof's per-op tools are empty on CPU (checked), so it is asked only off CPU; the raw events are
        # always read, as the fallback for a function xprof's table does not name.
        by_prefix = xprof_hlo_stats(trace.xplane) if backend != "cpu" else {}
        events = read_xplane(trace.xplane, first_runs)
        send(CaptureOps(by_prefix, events.ops, events.per_device))
        if events.first_runs_left_out:
            send(ProfileNote(f"the per-op tables leave out {events.first_runs_left_out} first run(s) of a program, "
                             "its function having run again in the capture: a first run pays one-time setup (XLA:CPU "
                             "prepares its kernels), which is not what a step costs"))
    except Exception as err:  # noqa: BLE001 - the profile stands without its op table
        send(ProfileNote(f"reading the capture failed: {type(err).__name__}: {err}"))


def send_peak(send: Send, info: DeviceInfo, calibrate: bool) -> None:
    """The device peak: measured on CPU (after the target, undisturbed); GPU/TPU peaks come from a table."""
    from jaxdbg.profile.peaks import calibrate_cpu

    if info.backend == "cpu" and calibrate:
        try:
            send(PeakMeasured(calibrate_cpu()))
        except Exception as err:  # noqa: BLE001 - rates are optional
            send(ProfileNote(f"{type(err).__name__}: {err}"))


def _window(job: ProfileJob, send: Send) -> Any:
    from jaxdbg.profile.trace import TraceWindow

    if job.options.trace_calls <= 0:
        return None
    return TraceWindow(os.path.join(job.out_dir, "trace"), job.options.trace_calls, send, job.options.python_tracer)


@handles(ProfileJob)
def profile_job(job: ProfileJob, channel: Any) -> None:
    """The contained job: a script TARGET runs under instrumentation, a function TARGET ahead of time."""
    (script_job if job.spec.is_script else function_job)(job, channel)


def script_job(job: ProfileJob, channel: Any) -> None:
    """Run a script TARGET under instrumentation."""
    from jaxdbg.profile.instrument import Recorder, compile_listener, tracking_jit
    from jaxdbg.profile.monitor import Sampler
    from jaxdbg.profile.transfers import timed_transfers
    from jaxdbg.target import run_script

    log = MessageLog()
    send = locked_sender(channel, log)
    options = job.options
    window = _window(job, send)
    recorder = Recorder(send, job.out_dir, window=window, sync_every=options.sync_every)
    backend: BackendStart | None = None
    try:
        with contextlib.ExitStack() as stack:
            backend = recorder.on_first_call = BackendStart(send, stack, window, recorder, log, options.timeout)
            if options.monitor:
                stack.enter_context(Sampler(send, options.monitor_interval))
            stack.enter_context(recorder.flushing())
            stack.enter_context(compile_listener(recorder))
            stack.enter_context(tracking_jit(recorder))
            stack.enter_context(timed_transfers(recorder))
            started = time.perf_counter()
            try:
                run_script(job.spec)
            finally:
                send(RunFinished(time.perf_counter() - started, recorder.overhead_s))
    finally:
        raised = sys.exc_info()[1]  # the target's error, in flight: the job's report names it
        if backend is not None:
            said = failure_summary(raised)
            backend.ended = f"raised {said}" if said else "finished"
        info = backend() if backend is not None else send_device_info(send)
        send_capture_ops(send, window, info.backend, first_runs=True)
        files = window.files if window is not None else None
        share_with_the_job(send, log, options.timeout, backend.started if backend else time.perf_counter(),
                           files.xplane if files is not None else None, job.out_dir, failure_summary(raised))
        if backend is not None and backend.heartbeat is not None:
            backend.heartbeat.stop()
    send_peak(send, info, options.calibrate)
    send(Done())


def share_with_the_job(send: Send, log: MessageLog, timeout: float | None, started: float,
                       xplane: str | None = None, out_dir: str = "", failed: str = "") -> None:
    """In a multi-process job: publish this process's figures; process 0 gathers everyone's (waiting no
    longer than its own --timeout allows) and sends them on, naming any process that never reported. The
    captures (``xplane``) go the same way, into one xprof session in process 0's ``out_dir``."""
    from jaxdbg.profile.assemble import Gathered
    from jaxdbg.profile.job_capture import share_capture
    from jaxdbg.profile.processes import ProcessFigures, figures_of
    from jaxdbg.profile.run import attach_ops

    place = multihost.job()
    if place is None:
        return
    gathered = Gathered.from_messages(list(log))
    functions = gathered.functions("script")
    if gathered.ops is not None:
        functions = attach_ops(functions, gathered.ops, top=1_000_000)
    totals = gathered.totals_for(functions, time.perf_counter() - started, "script")
    wait = (GATHER_WAIT_S if timeout is None
            else max(min(GATHER_WAIT_S, timeout - (time.perf_counter() - started) - 10), 1.0))
    if place.index != 0:  # the capture first: once process 0 has the figures, the capture is there too
        share_capture(send, xplane, out_dir, wait)
    figures = multihost.Topic("profile", "figures", ProcessFigures)
    multihost.publish(figures, dataclasses.replace(figures_of(place.index, functions, totals), failed=failed))
    if place.index != 0:
        return
    got = multihost.gather(figures, wait)
    since = time.time() - (time.perf_counter() - started)
    rows = []
    for i in range(place.count):
        if i in got:
            rows.append(got[i])
            continue
        note = multihost.missing_line("profile", i, place.count, wait)
        failed = peer_failure(out_dir, i, since)
        if failed:  # its own jaxdbg saw how it ended (the job shares --out: one machine, or a shared filesystem)
            note = f"{note}; {failed}"
            if not any(isinstance(m, ProfileNote) and m.text == failed for m in log):  # (the heartbeat's, already)
                send(ProfileNote(failed))
        rows.append(ProcessFigures.missing(i, note))
    send(JobFigures(tuple(rows)))
    share_capture(send, xplane, out_dir, 5.0)


def peer_failure(out_dir: str, index: int, since: float) -> str:
    """How process ``index`` failed, in the words of its own report (``process-<index>/report.json`` in a shared
    ``--out``, written by its jaxdbg since ``since``: after its program died, often before the others know);
    "" where there is none, or it did not fail.

    Example:
        >>> peer_failure("/no/such/folder", 1, 0.0)
        ''
    """
    path = os.path.join(out_dir, f"process-{index}", "report.json")
    try:
        if os.path.getmtime(path) < since:
            return ""
        with open(path) as handle:
            error = (json.load(handle).get("result") or {}).get("error")
    except (OSError, ValueError, AttributeError):
        return ""
    return f"process {index}{PEER_FAILED_MARK}{error}" if isinstance(error, str) and error else ""


def function_job(job: ProfileJob, channel: Any) -> None:
    """Profile one function: AOT split, warm-up + timed runs, a traced pass."""
    import jax

    from jaxdbg import _compat
    from jaxdbg.jit_layer import function_identity
    from jaxdbg.profile.hlo import module_name
    from jaxdbg.profile.hlo_files import write_hlo
    from jaxdbg.profile.instrument import Recorder, compile_listener
    from jaxdbg.profile.monitor import Sampler
    from jaxdbg.profile.signature import compiled_dtype
    from jaxdbg.target import load_function, load_inputs

    send, info = start(channel)
    options = job.options
    fn = load_function(job.spec)
    host_args = load_inputs(options.inputs, options.args, options.seed)
    name, source = function_identity(fn)
    send(FunctionDefined(0, name, source))
    recorder = Recorder(send, job.out_dir)
    window = _window(job, send)
    try:
        with contextlib.ExitStack() as stack:
            if options.monitor:
                stack.enter_context(Sampler(send, options.monitor_interval))
            stack.enter_context(compile_listener(recorder))
            started = time.perf_counter()
            args, put_s = _to_device(host_args)
            leaves = jax.tree_util.tree_leaves(host_args)
            recorder.add_transfer("device_put", put_s, sum(int(getattr(a, "nbytes", 0)) for a in leaves))
            jitted = fn if hasattr(fn, "trace") and hasattr(fn, "lower") else jax.jit(fn)
            check_arity(fn, args, name)
            # The compiled executable takes only the non-static arguments (static ones are baked in).
            static = _compat.jit_static_argnums(jitted, len(args))
            dynamic_host = tuple(a for i, a in enumerate(host_args) if i not in static)
            t0 = time.perf_counter()
            traced = jitted.trace(*args)
            t1 = time.perf_counter()
            lowered = traced.lower()
            t2 = time.perf_counter()
            compiled = lowered.compile()
            t3 = time.perf_counter()
            text = compiled.as_text()
            send(CompileRecord(
                0, 0, trace_s=t1 - t0, lower_s=t2 - t1, compile_s=t3 - t2, total_s=t3 - t0,
                signature=_signature_text(args),
                dtypes=tuple(compiled_dtype(a.dtype) for a in args if hasattr(a, "dtype")),  # PRNG keys too
                hlo=write_hlo(job.out_dir, name, 0, lowered.as_text(), text, compiled), module=module_name(text),
                cost=_compat.compiled_cost(compiled), memory=_compat.compiled_memory(compiled),
            ))
            recorder.eager_spans.clear()  # the AOT compile above, already counted stage by stage
            live = [a for i, a in enumerate(args) if i not in static]
            warmup, runs = options.warmup, options.runs
            times = [_call(compiled, live, dynamic_host) for _ in range(warmup + runs)]
            send(CallBatch({0: [CallTiming(i, t, t) for i, t in enumerate(times)]}))
            wall = time.perf_counter() - started
            if window is not None:
                with window:  # after the timed runs (the capture does not disturb them), as many as they were
                    for index in range(min(window.max_calls, runs)):
                        with window.annotation(name, index):
                            _call(compiled, live, dynamic_host)
                        window.calls += 1
            recorder.flush()
            send(RunFinished(wall, 0.0, warmup))
    finally:
        send_capture_ops(send, window, info.backend)
    send_peak(send, info, options.calibrate)
    send(Done())


def _to_device(host_args: tuple) -> tuple[tuple, float]:
    """Device arrays for every array leaf (pytree arguments too), always fresh buffers: a jax array handed back
    as is would be deleted by a donating function, and with it the inputs kept to put back."""
    import jax

    def put(leaf: Any) -> Any:
        return jax.device_put(leaf, may_alias=False) if hasattr(leaf, "shape") else leaf

    started = time.perf_counter()
    args = tuple(jax.tree_util.tree_map(put, a) for a in host_args)
    jax.block_until_ready(args)
    return args, time.perf_counter() - started


def _call(compiled: Any, args: list, host_args: tuple) -> float:
    """One blocking call; donated (deleted) arguments are put back first, outside the timing."""
    import jax

    if any(getattr(a, "is_deleted", lambda: False)() for a in jax.tree_util.tree_leaves(args)):
        args[:] = list(_to_device(host_args)[0])
    started = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    return time.perf_counter() - started


def _signature_text(args: tuple) -> str:
    from jaxdbg.profile.signature import leaf_signature

    return ", ".join(f"arg{i}: {leaf_signature(a).describe()}" for i, a in enumerate(args))
