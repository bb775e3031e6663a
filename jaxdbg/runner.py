"""Contained runs: execute a job in a child process with a timeout and get a structured outcome back.

jaxdbg must survive whatever a target does (raise, segfault, abort, hang, exit), so every command runs
user code through :func:`run_contained`. The job is a ``"module:function"`` taking ``(payload, channel)``;
it sends results back with ``channel.send(topic, value)`` (plain data: dicts, lists, numpy arrays), and
what it sent before a crash or a timeout is still returned.

Example:
    >>> outcome = run_contained("jaxdbg.runner:echo_job", {"say": "hi"}, timeout=60)  # doctest: +SKIP
    >>> outcome.status, outcome.last("echo")                                          # doctest: +SKIP
    ('ok', {'say': 'hi'})
"""

from __future__ import annotations

import os
import pickle
import re
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Mapping

from jaxdbg._source import SourceLocation, innermost_user_frame, is_user_file

_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class ExceptionInfo:
    """An exception raised in the child: its type, message and where in user code it was raised."""

    type: str
    qualname: str
    message: str
    traceback: str
    user_frame: SourceLocation | None


@dataclass(frozen=True)
class Outcome:
    """What happened to a contained run.

    ``status`` is one of ``ok``, ``exception`` (the job raised), ``crash`` (killed by a fatal signal),
    ``timeout`` (stopped after ``timeout`` seconds) or ``exit`` (nonzero exit with no exception reported).
    """

    status: str
    returncode: int | None
    signal: str | None
    exception: ExceptionInfo | None
    stdout: str
    stderr: str
    elapsed_s: float
    messages: tuple[tuple[str, Any], ...] = field(default=())
    crash_frame: SourceLocation | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def all(self, topic: str) -> list[Any]:
        """Every value the child sent under ``topic``, in order."""
        return [value for name, value in self.messages if name == topic]

    def last(self, topic: str, default: Any = None) -> Any:
        values = self.all(topic)
        return values[-1] if values else default

    def describe(self) -> str:
        """One line for a human: 'raised ValueError: ... at train.py:12', 'crashed with SIGSEGV', ..."""
        if self.status == "exception" and self.exception:
            where = f" at {self.exception.user_frame}" if self.exception.user_frame else ""
            if self.exception.type == "TargetFailedError":  # jaxdbg's own words about the target (an import failed)
                return f"failed: {first_line(self.exception.message)}{where}"
            return f"raised {self.exception.type}: {first_line(self.exception.message)}{where}"
        if self.status == "crash":
            where = f" at {self.crash_frame}" if self.crash_frame else ""
            return f"crashed with {self.signal}{where}"
        if self.status == "timeout":
            where = f" (last seen at {self.crash_frame})" if self.crash_frame else ""
            return f"timed out after {self.elapsed_s:.1f}s{where}"
        if self.status == "exit":  # sys.exit("message") prints the message as the last line of stderr
            lines = [line for line in self.stderr.strip().splitlines() if line.strip()]
            said = f" (last on stderr: {first_line(lines[-1], 200)})" if lines else ""
            return f"exited with status {self.returncode}{said}"
        return "finished"


def first_line(text: str, limit: int = 300) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


class Channel:
    """Append-only record file from child to parent: length-prefixed pickles, flushed per message."""

    def __init__(self, path: str):
        self._handle = open(path, "ab", buffering=0)

    def send(self, topic: str, value: Any) -> None:
        blob = pickle.dumps((topic, value), protocol=pickle.HIGHEST_PROTOCOL)
        self._handle.write(struct.pack("<Q", len(blob)) + blob)

    def close(self) -> None:
        self._handle.close()


def read_channel(path: str) -> list[tuple[str, Any]]:
    """All complete records of a channel file (a record cut short by a kill is dropped)."""
    records = []
    if not os.path.exists(path):
        return records
    with open(path, "rb") as handle:
        data = handle.read()
    offset = 0
    while offset + 8 <= len(data):
        (size,) = struct.unpack_from("<Q", data, offset)
        if offset + 8 + size > len(data):
            break
        try:
            records.append(pickle.loads(data[offset + 8 : offset + 8 + size]))
        except Exception:  # noqa: BLE001 - a value the parent cannot import is skipped, not fatal
            pass
        offset += 8 + size
    return records


def describe_exception(err: BaseException) -> ExceptionInfo:
    cls = type(err)
    message = str(err) if not isinstance(err, SystemExit) else f"exit status {err.code}"
    return ExceptionInfo(
        type=cls.__name__,
        qualname=f"{cls.__module__}.{cls.__qualname__}",
        message=message,
        traceback="".join(traceback.format_exception(cls, err, err.__traceback__)),
        user_frame=innermost_user_frame(err.__traceback__),
    )


_FAULT_FRAME = re.compile(r'File "([^"]+)", line (\d+) in (\S+)')


def faulthandler_user_frame(stderr: str) -> SourceLocation | None:
    """Innermost user frame of the last faulthandler dump in stderr (crash or SIGUSR1 on a hang).

    faulthandler writes frames as ``File "x.py", line 3 in f`` (no comma, unlike a Python traceback), each
    thread innermost first; the first user frame after the last fatal error (or of the only dump) wins.
    """
    fatal = stderr.rfind("Fatal Python error")
    for match in _FAULT_FRAME.finditer(stderr[max(fatal, 0) :]):
        if is_user_file(match.group(1)):
            return SourceLocation(match.group(1), int(match.group(2)), match.group(3))
    return None


def child_env(extra: Mapping[str, str] | None = None, device_count: int | None = None) -> dict[str, str]:
    """Environment of a contained run: ours, plus jaxdbg importable, unbuffered output, and overrides."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_PARENT, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    if device_count:
        flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", env.get("XLA_FLAGS", ""))
        env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={device_count}".strip()
    env.update(extra or {})
    return env


def run_contained(
    job: str,
    payload: Any = None,
    *,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    device_count: int | None = None,
    cwd: str | None = None,
) -> Outcome:
    """Run ``job(payload, channel)`` in a fresh Python process and report what happened.

    Args:
        job: ``"module:function"``, importable in the child (jaxdbg's own jobs, or the user's).
        payload: picklable argument for the job.
        timeout: seconds before the child (and everything it started) is stopped; None waits forever.
        env: extra environment variables for the child.
        device_count: number of host-platform (CPU) devices the child's jax should see.
        cwd: working folder of the child (default: ours).
    """
    with tempfile.TemporaryDirectory(prefix="jaxdbg-run-") as workdir:
        with open(os.path.join(workdir, "job.pkl"), "wb") as handle:
            pickle.dump((job, payload), handle)
        # -P: no current folder on sys.path, so the child imports the same jaxdbg as this process even
        # when run from a source checkout (targets get their own folder on sys.path from target.py).
        command = [sys.executable, "-P", "-X", "faulthandler", "-m", "jaxdbg._child", workdir]
        started = time.perf_counter()
        # Output goes to files, not pipes: a process the target leaves running in the background inherits
        # them, and a pipe would then stay open (and jaxdbg wait) long after the target itself exited.
        out_path, err_path = os.path.join(workdir, "stdout"), os.path.join(workdir, "stderr")
        with open(out_path, "wb") as out_file, open(err_path, "wb") as err_file:
            proc = subprocess.Popen(
                command, stdout=out_file, stderr=err_file, stdin=subprocess.DEVNULL,
                env=child_env(env, device_count), cwd=cwd, start_new_session=True,
            )
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _stop_hung(proc)
        except BaseException:  # Ctrl-C, or SIGTERM turned into SystemExit: the child has its own session,
            _kill_group(proc)  # so nothing else would stop it (or what it started) from outliving jaxdbg
            raise
        elapsed = time.perf_counter() - started
        _kill_group(proc)  # what the target left running in its session ends with it
        messages = read_channel(os.path.join(workdir, "channel.bin"))
        stdout, stderr = (_read_text(path) for path in (out_path, err_path))
    return outcome_of(proc.returncode, timed_out, messages, stdout, stderr, elapsed)


def outcome_of(returncode: int | None, timed_out: bool, messages: list[tuple[str, Any]], stdout: str, stderr: str,
               elapsed: float) -> Outcome:
    """Classify an ended child (a fresh process here, or a fork of the repro fork server).

    ``returncode`` as :class:`subprocess.Popen` gives it: negative for a fatal signal. The child reports an
    escaping exception as the ``__exception__`` message; a Python stack dump on stderr places a crash or hang.
    """
    exception = next((value for name, value in messages if name == "__exception__"), None)
    messages = [(name, value) for name, value in messages if name != "__exception__"]
    if timed_out:
        status, sig = "timeout", None
    elif returncode is not None and returncode < 0:
        status, sig = "crash", _signal_name(-returncode)
    elif exception is not None:
        status, sig = "exception", None
    elif returncode:
        status, sig = "exit", None
    else:
        status, sig = "ok", None
    frame = faulthandler_user_frame(stderr) if status in ("crash", "timeout") else None
    return Outcome(status, returncode, sig, exception, stdout, stderr, elapsed, tuple(messages), frame)


def _stop_hung(proc: subprocess.Popen) -> None:
    """Ask the hung child for its Python stacks (SIGUSR1 -> faulthandler), then kill its process group."""
    try:
        os.killpg(proc.pid, signal.SIGUSR1)
        proc.wait(timeout=1.0)
        return
    except (subprocess.TimeoutExpired, ProcessLookupError, PermissionError):
        pass
    _kill_group(proc)
    proc.wait()


def _read_text(path: str) -> str:
    with open(path, "rb") as handle:
        return handle.read().decode(errors="replace")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def echo_job(payload: Any, channel: Channel) -> None:
    """A trivial job (used by tests and ``doctor``): sends its payload back under the topic 'echo'."""
    channel.send("echo", payload)
