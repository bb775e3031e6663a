"""Contained runs without the start-up cost: a pre-warmed process that forks one child per candidate.

A reduction runs hundreds of small candidates; a fresh interpreter spends ~0.5 s importing jax before the
candidate's own ~0.1 s of work. The fork server imports jax, numpy and jaxdbg's job code once (and the
Flax/Optax/Equinox the program imports, see :data:`jaxdbg.repro.failures.PRELOADABLE`; no backend is started, so
no XLA threads exist yet) and forks a child per request. Each child gets its own session
(so a timeout kills everything it started), its own stdout/stderr files, faulthandler, and runs the job
exactly as :mod:`jaxdbg._child` does; the parent turns what happened into the same
:class:`~jaxdbg.runner.Outcome` as :func:`~jaxdbg.runner.run_contained`: exception, crash (signal), timeout
(after a SIGUSR1 stack dump), messages sent before the end.

Every child shares the server's environment (jax reads it at import), so the detection runs and the final
verification use :func:`run_contained` (a truly fresh process) instead.

Example:
    >>> with ForkServer(env={}) as server:                                                  # doctest: +SKIP
    ...     outcome = server.run(EchoRequest({"say": "hi"}), timeout=30)
    >>> outcome.last(Echo).value                                                            # doctest: +SKIP
    {'say': 'hi'}
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import json
import os
import pickle
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

from jaxdbg._child import main as child_main
from jaxdbg.protocol import Request, read_channel
from jaxdbg.runner import Outcome, child_env, outcome_of

PRELOAD = ("numpy", "jax", "jax.numpy", "jaxdbg._child", "jaxdbg.target", "jaxdbg.repro.jobs", "jaxdbg.repro.watch")


class ForkServer:
    """Parent side: start the server, send requests, wait for exits; thread-safe."""

    def __init__(self, env: Mapping[str, str] | None = None, preload: Sequence[str] = ()):
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "jaxdbg.repro.forkserver", *preload], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, env=child_env(env), start_new_session=True)
        assert self._proc.stdin is not None and self._proc.stdout is not None  # both are pipes
        self._stdin, self._stdout = self._proc.stdin, self._proc.stdout
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._pids: dict[int, int] = {}
        self._status: dict[int, int] = {}
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def close(self) -> None:
        try:
            self._stdin.close()
            self._proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self._proc.kill()
            self._proc.wait()

    def _read(self) -> None:
        for line in self._stdout:
            message = json.loads(line)
            with self._changed:
                if "pid" in message:
                    self._pids[message["id"]] = message["pid"]
                else:
                    self._status[message["id"]] = message["status"]
                self._changed.notify_all()
        with self._changed:  # the server is gone: wake every waiter
            self._changed.notify_all()

    def _wait(self, table: dict, key: int, timeout: float | None) -> Any:
        end = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while key not in table:
                if not self.alive and key not in table:
                    raise RuntimeError("the fork server stopped")
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._changed.wait(0.5 if left is None else min(left, 0.5))
            return table.pop(key)

    def run(self, request: Request, *, timeout: float | None = None, cwd: str | None = None) -> Outcome:
        """Like :func:`run_contained` (same Outcome), in a forked child of the warm server."""
        with tempfile.TemporaryDirectory(prefix="jaxdbg-fork-") as workdir:
            with open(os.path.join(workdir, "job.pkl"), "wb") as handle:
                pickle.dump(request, handle)
            request_id = next(self._ids)
            started = time.perf_counter()
            with self._lock:
                self._stdin.write((json.dumps({"id": request_id, "workdir": workdir, "cwd": cwd or os.getcwd()})
                                        + "\n").encode())
                self._stdin.flush()
            pid = self._wait(self._pids, request_id, 30)
            if pid is None:
                raise RuntimeError("the fork server did not start the run")
            status = self._wait(self._status, request_id, timeout)
            timed_out = status is None
            if timed_out:
                status = self._stop(pid, request_id)
            elapsed = time.perf_counter() - started
            messages = read_channel(os.path.join(workdir, "channel.bin"))
            stdout, stderr = (_read_text(os.path.join(workdir, name)) for name in ("stdout", "stderr"))
        # Our marker for "killed and never reaped" is already a negative (signal) return code.
        returncode = status if status < 0 else os.waitstatus_to_exitcode(status)
        return outcome_of(returncode, timed_out, messages, stdout, stderr, elapsed)

    def _stop(self, pid: int, request_id: int) -> int:
        """Stack dump (SIGUSR1 -> faulthandler), then kill the child's whole session."""
        for sig, grace in ((signal.SIGUSR1, 0.3), (signal.SIGKILL, 10.0)):  # the dump takes milliseconds
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)
            status = self._wait(self._status, request_id, grace)
            if status is not None:
                return status
        return -signal.SIGKILL


def _read_text(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


# ----------------------------------------------------------------------------------------------------------
# Server side (python -m jaxdbg.repro.forkserver)
# ----------------------------------------------------------------------------------------------------------


def _serve(extra: Sequence[str] = ()) -> None:
    for name in PRELOAD:
        importlib.import_module(name)
    for name in extra:  # the program's own libraries (see failures.PRELOADABLE); a missing one is the run's business
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    children: dict[int, int] = {}
    pending = b""
    stdin_open = True
    while stdin_open or children:
        ready = select.select([0], [], [], 0.02)[0] if stdin_open else []
        if ready:
            data = os.read(0, 65536)
            if not data:
                stdin_open = False
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _child(request)  # never returns
                children[pid] = request["id"]
                _send({"id": request["id"], "pid": pid})
        elif not stdin_open:
            time.sleep(0.02)
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                children.clear()
                break
            if pid == 0:
                break
            _send({"id": children.pop(pid), "status": status})


def _send(message: dict) -> None:
    os.write(1, (json.dumps(message) + "\n").encode())


def _child(request: dict) -> None:
    """In the forked child: own session, own output files, then run the job as jaxdbg._child does."""
    code = 1
    try:
        os.setsid()
        workdir = request["workdir"]
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(os.path.join(workdir, "stdout"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        err = os.open(os.path.join(workdir, "stderr"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        for source, target in ((null, 0), (out, 1), (err, 2)):
            os.dup2(source, target)
            os.close(source)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.chdir(request["cwd"])
        code = child_main(workdir)
    except BaseException:  # noqa: BLE001 - the child must end with os._exit, whatever happens
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code if isinstance(code, int) else 1)


if __name__ == "__main__":
    _serve(sys.argv[1:])
