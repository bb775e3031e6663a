"""``hang-hunt`` in the process that runs the target: the flight recorder and the watchdog around the program.

:func:`hang_job` is the contained child's job (see :func:`jaxdbg.hang.api.hunt`): it installs the recorder
(a jit-layer hook that also hears the calls into host callbacks), starts the watchdog, runs the script (or
calls the function target once) and sends :class:`~jaxdbg.hang.messages.HangVerdict` when the watchdog has
drawn the verdict, from its own thread when the program is stuck, or when the program has ended.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any

from jaxdbg.hang.messages import ChildStarted, HangJob, HangVerdict
from jaxdbg.protocol import handles


@handles(HangJob)
def hang_job(job: HangJob, channel: Any) -> None:
    """Contained-run job: run the target under the recorder and watchdog; send the verdict's facts."""
    from jaxdbg import jit_layer
    from jaxdbg.hang.recorder import Recorder
    from jaxdbg.hang.verdict import facts_json
    from jaxdbg.hang.watchdog import Settings, SignalListener, Watchdog

    lock = threading.Lock()
    with lock:
        channel.send(ChildStarted(os.getpid()))
    options = job.options

    def on_verdict(facts: Any) -> None:
        with lock:
            channel.send(HangVerdict(facts_json(facts), environment(), stopping=facts.trigger is not None))

    recorder = Recorder()
    signals = SignalListener()
    signals.install()
    watchdog = Watchdog(recorder, Settings(options.stall, options.timeout, options.native, options.out_dir),
                        on_verdict, signals)
    try:
        with jit_layer.installed(recorder), recorder.listening():
            watchdog.start()
            outcome = run_target(job)
            join_program_threads(recorder)
            watchdog.finish(outcome, wait_s=_finish_wait(options))
    finally:
        watchdog.stop()
        signals.remove()


def join_program_threads(recorder: Any) -> None:
    """Wait for the program's non-daemon threads, as Python does before it exits: a program whose main code
    returned while such a thread waits forever (a writer on a queue nobody closes) never exits, and the
    watchdog, still running, says so."""
    recorder.exiting = True
    current = threading.current_thread()
    for thread in threading.enumerate():
        target = getattr(thread, "_target", None)
        pooled = getattr(target, "__module__", "") == "concurrent.futures.thread"  # Python tells those to stop first
        if thread is not current and not thread.daemon and thread is not threading.main_thread() and not pooled:
            thread.join()


def _finish_wait(options: Any) -> float:
    """How long a process whose program ended waits for the job's verdict (the others may still run)."""
    return 10 ** 6 if options.timeout is None else options.timeout + 60.0


def run_target(job: HangJob) -> dict:
    """Run the script (or call the function once); how it ended: ``status`` finished or raised, ``error``."""
    from jaxdbg._errors import UsageError
    from jaxdbg.runner import describe_exception, first_line

    try:
        if job.spec.is_script:
            from jaxdbg.target import run_script

            run_script(job.spec)
        else:
            _call_function(job)
    except (KeyboardInterrupt, UsageError):
        raise
    except BaseException as err:  # noqa: BLE001 - whatever the program raised is the outcome, reported
        info = describe_exception(err)
        where = f" at {info.user_frame}" if info.user_frame else ""
        return {"status": "raised", "error": f"{info.type}: {first_line(info.message)}{where}",
                **({"user": info.user_frame.as_dict()} if info.user_frame else {})}
    return {"status": "finished"}


def _call_function(job: HangJob) -> None:
    import jax

    from jaxdbg.target import check_arity, load_function, load_inputs

    fn = load_function(job.spec)
    inputs = load_inputs(job.options.inputs, job.options.args, job.options.seed)
    check_arity(fn, inputs, getattr(fn, "__name__", None))
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    jax.block_until_ready(jitted(*inputs))


def environment() -> dict | None:
    """The report's environment, where the program started jax's backend (asking would start it: not before
    ``jax.distributed.initialize()``, and not for a program stuck before any JAX work)."""
    from jaxdbg import _compat

    if not _compat.backend_started():
        return None
    from jaxdbg.report import environment_info

    with contextlib.suppress(Exception):  # the environment is a courtesy: the verdict stands without it
        return environment_info()
    return None
