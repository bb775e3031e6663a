"""``jaxdbg.watch(stall_after=SECONDS)``: hang-hunt's flight recorder and watchdog inside a running program.

The same recorder and watchdog as ``jaxdbg hang-hunt`` (and, in a multi-process job, the same protocol
through JAX's coordination service), without a parent process: when the program stalls, this process draws
the verdict itself, writes it as a report (``"command": "watch"``, hang-hunt's ``result``), and then acts:

- ``"raise"``: :class:`StallError` in the main thread. A thread waiting in Python (a sleep, a lock, a queue)
  is interrupted for it (by ``SIGUSR2``, whose handler the watch holds while it runs, on the main thread);
  one stuck in native code (a collective that never completes) cannot be, and stays where it is;
- ``"exit"``: the process exits at once with :data:`STALL_EXIT_CODE` (75, EX_TEMPFAIL), so that the job's
  scheduler restarts the job (from its last checkpoint) instead of letting it hang for hours;
- ``"log"``: one line on the ``jaxdbg`` logger, and the program is left as it is.

A divergence between processes found while the job runs (the programs of one step differ) is written and
logged once; it does not stop the program.

Example:
    >>> import jax, jax.numpy as jnp, tempfile, time
    >>> folder = tempfile.mkdtemp()
    >>> try:
    ...     with StallWatch(stall_after=1.0, action="raise", write=write_to(folder), native=False):
    ...         step = jax.jit(lambda x: x + 1)
    ...         x = step(jnp.ones(2))
    ...         time.sleep(60)    # a data loader that never answers
    ... except StallError as err:
    ...     print(err.report["kind"], err.report["processes"][0]["state"], err.path.endswith("report.json"))
    stall host True
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from jaxdbg._errors import UsageError
from jaxdbg.live.errors import WatchError

log = logging.getLogger("jaxdbg")
ACTIONS = ("raise", "exit", "log")
STALL_EXIT_CODE = 75  # EX_TEMPFAIL: a temporary failure, worth a restart


class StallError(WatchError):
    """The watched program stalled (or its processes diverged); ``report`` is hang-hunt's ``result``."""


Writer = Callable[[Any, dict], str]  # (result, artifacts) -> the report's path


def write_to(folder: str) -> Writer:
    """A writer of ``report.json`` in ``folder`` (this process's ``process-<i>/`` in a job)."""

    def write(result: Any, artifacts: dict) -> str:
        from jaxdbg import multihost
        from jaxdbg.report import Report

        target = multihost.process_folder(folder)
        os.makedirs(target, exist_ok=True)
        path = os.path.join(target, "report.json")
        with open(path, "w") as handle:
            json.dump(Report("watch", None, result, 1, {**artifacts, "report": path}).to_dict(), handle, indent=2)
        return path

    return write


class StallWatch(contextlib.ContextDecorator):
    """The recorder and watchdog in this process while the block runs (see the module docstring)."""

    def __init__(self, stall_after: float, action: str = "raise", write: Writer | None = None, native: bool = True,
                 out: str | None = None):
        if not isinstance(stall_after, (int, float)) or stall_after <= 0:
            raise UsageError(f"jaxdbg.watch(stall_after={stall_after!r}): give a number of seconds above 0")
        if action not in ACTIONS:
            raise UsageError(f"jaxdbg.watch(stall_action={action!r}): unknown action; use 'raise', 'exit' or 'log'")
        self.stall_after, self.action, self.native = float(stall_after), action, native
        self.out = out
        self.write = write or write_to(out or "jaxdbg-out/watch")
        self.error: StallError | None = None
        self._stack: contextlib.ExitStack | None = None
        self._main = threading.main_thread().ident
        self._reported_divergence = False

    def __enter__(self) -> StallWatch:
        from jaxdbg import jit_layer
        from jaxdbg.hang.recorder import Recorder
        from jaxdbg.hang.watchdog import Settings, Watchdog

        stack = contextlib.ExitStack()
        recorder = Recorder()
        stack.enter_context(jit_layer.installed(recorder))
        stack.enter_context(jit_layer.adopted())
        stack.enter_context(recorder.listening())
        if self.action == "raise" and threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGUSR2, self._interrupt)
            stack.callback(signal.signal, signal.SIGUSR2, previous if previous is not None else signal.SIG_DFL)
        watchdog = Watchdog(recorder, Settings(self.stall_after, None, self.native, self.out), self._verdict)
        watchdog.on_divergence = self._diverged
        watchdog.start()
        stack.callback(watchdog.stop)
        self._stack = stack
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._stack is not None:
            self._stack.close()
            self._stack = None

    # -- the verdict ---------------------------------------------------------------------------------------

    def _verdict(self, facts: Any) -> None:
        from jaxdbg.hang.verdict import judge
        from jaxdbg.report import to_jsonable

        result = judge(facts)
        path = self.write(result, {})
        error = StallError(f"jaxdbg.watch: {result.verdict} (report: {path})", to_jsonable(result), path)
        if self.action == "exit":
            log.error("%s; exiting with status %d so the job restarts", error, STALL_EXIT_CODE)
            for handler in logging.getLogger().handlers + log.handlers:
                with contextlib.suppress(Exception):
                    handler.flush()
            os._exit(STALL_EXIT_CODE)
        log.warning("%s", error)
        if self.action == "raise" and self._main is not None:
            self.error = error
            with contextlib.suppress(Exception):
                signal.pthread_kill(self._main, signal.SIGUSR2)

    def _interrupt(self, signum: int, frame: Any) -> None:
        error, self.error = self.error, None
        if error is not None:
            raise error

    def _diverged(self, divergence: dict) -> None:
        """Write and log a divergence found while the job runs (once); the program goes on."""
        if self._reported_divergence:
            return
        self._reported_divergence = True
        from jaxdbg import multihost
        from jaxdbg.hang.verdict import JobFacts, judge

        place = multihost.job()
        result = judge(JobFacts(place.count if place else 2, None, self.stall_after, divergence=divergence))
        path = self.write(result, {})
        log.warning("jaxdbg.watch: %s (report: %s)", result.verdict, path)
