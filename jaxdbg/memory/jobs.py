"""The contained jobs of ``jaxdbg memory`` (run in a child by :func:`jaxdbg.runner.run_contained`).

- :func:`script_job` runs a script as ``__main__`` with the :class:`~jaxdbg.memory.recorder.MemoryRecorder`
  installed in the jit layer.
- :func:`function_job` compiles one function for its inputs, analyses it, and runs it once when it fits the
  budget (a program that would not fit is not run: that is the question it answers ahead of a run).

Both send typed messages as they go (:mod:`jaxdbg.memory.messages`), so a target that crashes or runs out of
memory still leaves what was found until then.
"""

from __future__ import annotations

import contextlib
import glob
import os
import sys
import time
import types
from typing import Any

from jaxdbg import multihost
from jaxdbg.launch import launched_place
from jaxdbg.memory.messages import Devices, JobMemory, MemoryJob, MemoryNote
from jaxdbg.memory.recorder import DoesNotFit, MemoryRecorder, compile_spans
from jaxdbg.protocol import Done, Environment, failure_summary, handles, locked_sender

GATHER_WAIT_S = 60.0


def _recorder(job: MemoryJob, send: Any, stop_before_misfit: bool) -> MemoryRecorder:
    options = job.options
    return MemoryRecorder(send, dump_folder(job.dump_folder), top=options.top, min_leak_bytes=options.leak_bytes,
                          device_memory=options.device_memory, stop_before_misfit=stop_before_misfit)


def dump_folder(base: str) -> str:
    """This process's dump folder: processes of one job may share an output folder, and XLA numbers its
    modules per process."""
    place = launched_place(os.environ)
    folder = os.path.join(base, f"process-{place[0]}" if place is not None else "")
    os.makedirs(folder, exist_ok=True)
    # An earlier run into the same --out left its modules here: XLA numbers them afresh, and a newer-numbered
    # module of the same name from that run would be read as this run's program
    for path in glob.glob(os.path.join(glob.escape(folder), "module_*")):
        with contextlib.suppress(OSError):
            os.remove(path)
    return folder.rstrip(os.sep)


class BackendStart:
    """At the first jitted call (after a multi-process program's ``jax.distributed.initialize()``): the
    environment, the devices and their limits."""

    def __init__(self, send: Any, recorder: MemoryRecorder):
        self.send, self.recorder, self.done = send, recorder, False

    def __call__(self) -> None:
        if self.done:
            return
        self.done = True
        import jax

        from jaxdbg.memory.live import device_limits, device_name
        from jaxdbg.report import environment_info

        self.send(Environment(environment_info()))
        limits = device_limits()
        self.recorder.limits = limits
        self.send(Devices(tuple(device_name(d) for d in jax.local_devices()), limits, jax.default_backend()))


@handles(MemoryJob)
def memory_job(job: MemoryJob, channel: Any) -> None:
    """The contained job: a script TARGET runs under instrumentation, a function TARGET ahead of time."""
    (script_job if job.spec.is_script else function_job)(job, channel)


def script_job(job: MemoryJob, channel: Any) -> None:
    """Run a script TARGET with the memory recorder installed."""
    from jaxdbg import jit_layer
    from jaxdbg.target import run_script

    send = locked_sender(channel)
    recorder = _recorder(job, send, stop_before_misfit=False)
    start = BackendStart(send, recorder)
    recorder.on_first_call = start
    namespaces: list[dict] = []
    try:
        with recorder.flushing(), compile_spans(recorder), jit_layer.installed(recorder):
            try:
                namespaces = [run_script(job.spec)]
            except BaseException as err:
                namespaces = _script_namespaces(err.__traceback__, job.spec.path)
                recorder.eager_out_of_memory(err)
                raise
            finally:
                start()
                recorder.finish(namespaces)
                _tidy(recorder.dump_folder)
    finally:
        share_with_the_job(send, recorder, job.options.timeout, failure_summary(sys.exc_info()[1]))
    send(Done())


def function_job(job: MemoryJob, channel: Any) -> None:
    """Compile one function for its inputs, analyse it, and run it once if it fits."""
    import jax

    from jaxdbg import jit_layer
    from jaxdbg.jit_layer import InstrumentedJit
    from jaxdbg.target import check_arity, load_function, load_inputs

    send = locked_sender(channel)
    recorder = _recorder(job, send, stop_before_misfit=True)
    start = BackendStart(send, recorder)
    with compile_spans(recorder), jit_layer.installed(recorder):
        fn = load_function(job.spec)  # imported here: a module-level jax.jit gets the recorder's options
        inputs = load_inputs(job.options.inputs, job.options.args, job.options.seed)
        check_arity(fn, inputs)
        start()
        args = tuple(jax.tree_util.tree_map(lambda a: jax.device_put(a) if hasattr(a, "shape") else a, x)
                     for x in inputs)
        jitted = fn if isinstance(fn, InstrumentedJit) else jax.jit(fn)
        try:
            jax.block_until_ready(jitted(*args))
        except DoesNotFit as err:
            send(MemoryNote(f"{err.program.name} was compiled and analysed but not run: it would not fit"))
        except BaseException as err:
            recorder.eager_out_of_memory(err)
            raise
        finally:
            recorder.finish([])
            _tidy(recorder.dump_folder)
    send(Done())


def _script_namespaces(tb: types.TracebackType | None, path: str | None) -> list[dict]:
    """The globals and locals of the script's frames in a traceback (alive while it is held)."""
    found: list[dict] = []
    while tb is not None:
        code = tb.tb_frame.f_code
        if path and os.path.abspath(code.co_filename) == os.path.abspath(path):
            found.extend([tb.tb_frame.f_locals, tb.tb_frame.f_globals])
        tb = tb.tb_next
    return found


def _tidy(folder: str | None) -> None:
    """Drop the LLVM IR and object files XLA:CPU dumps beside the HLO text (large, and not read)."""
    if not folder:
        return
    for pattern in ("*.ll", "*.o"):
        for path in glob.glob(os.path.join(glob.escape(folder), pattern)):
            with contextlib.suppress(OSError):
                os.remove(path)


def share_with_the_job(send: Any, recorder: MemoryRecorder, timeout: float | None, failed: str = "") -> None:
    """In a multi-process job: publish this process's summary; process 0 gathers everyone's."""
    from jaxdbg.memory.result import ProcessMemory

    place = multihost.job()
    if place is None:
        return
    peak = recorder.peak
    misfits = sum(1 for s in recorder.functions.values() if s.program is not None and s.program.fits is False)
    summaries = multihost.Topic("memory", "summary", ProcessMemory)
    multihost.publish(summaries, ProcessMemory(place.index, peak.bytes if peak else None, peak.device if peak else None,
                                               len(recorder.leaks()), recorder.oom is not None, misfits,
                                               failed=failed))
    if place.index != 0:
        return
    spent = time.perf_counter() - recorder.started
    wait = GATHER_WAIT_S if timeout is None else max(min(GATHER_WAIT_S, timeout - spent - 10), 1.0)
    got = multihost.gather(summaries, wait)
    rows = tuple(got[i] if i in got else
                 ProcessMemory(i, None, None, 0, False, 0, multihost.missing_line("memory", i, place.count, wait))
                 for i in range(place.count))
    send(JobMemory(rows))
