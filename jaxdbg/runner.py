"""Contained runs: execute a job in a child process with a timeout and get a structured outcome back.

jaxdbg must survive whatever a target does (raise, segfault, abort, hang, exit), so every command runs
user code through :func:`run_contained`. What the child runs is a :class:`~jaxdbg.protocol.Request`, whose
type picks its handler (``handler(request, channel)``, registered with :func:`~jaxdbg.protocol.handles`); the
handler sends typed messages back with ``channel.send(message)`` (see :mod:`jaxdbg.protocol`), and what it
sent before a crash or a timeout is still returned.

Example:
    >>> outcome = run_contained(EchoRequest({"say": "hi"}), timeout=60)   # doctest: +SKIP
    >>> outcome.status, outcome.last(Echo).value                         # doctest: +SKIP
    ('ok', {'say': 'hi'})
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeVar, overload

from jaxdbg._errors import EXIT_TARGET_FAILED, JaxdbgError, JobMismatchError, TargetFailedError
from jaxdbg._source import SourceLocation, is_user_file
from jaxdbg._tracebacks import without_tracebacks
from jaxdbg.protocol import Channel as Channel
from jaxdbg.protocol import (
    ChannelTail,
    ChildFailed,
    Echo,
    EchoRequest,
    ExceptionInfo,
    Message,
    Request,
    handles,
    read_channel,
)
from jaxdbg.protocol import describe_exception as describe_exception

M = TypeVar("M", bound=Message)

_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


OutcomeStatus = Literal["ok", "exception", "crash", "timeout", "exit", "stopped"]


@dataclass(frozen=True)
class Outcome:
    """What happened to a contained run.

    ``status`` is one of ``ok``, ``exception`` (the job raised), ``crash`` (killed by a fatal signal),
    ``timeout`` (stopped after ``timeout`` seconds), ``exit`` (nonzero exit with no exception reported) or
    ``stopped`` (jaxdbg stopped it, or left it running, once the job sent what ``until`` waited for).
    """

    status: OutcomeStatus
    returncode: int | None
    signal: str | None
    exception: ExceptionInfo | None
    stdout: str
    stderr: str
    elapsed_s: float
    messages: tuple[Message, ...] = field(default=())
    crash_frame: SourceLocation | None = None
    terminated: bool = False  # a ``timeout`` that SIGTERM to jaxdbg brought forward (see end_runs_at_sigterm)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def all(self, kind: type[M]) -> list[M]:
        """Every message of class ``kind`` the child sent, in order."""
        return [m for m in self.messages if isinstance(m, kind)]

    @overload
    def last(self, kind: type[M]) -> M | None: ...

    @overload
    def last(self, kind: type[M], default: M) -> M: ...

    def last(self, kind: type[M], default: M | None = None) -> M | None:
        """The latest message of class ``kind``, or ``default``."""
        found = self.all(kind)
        return found[-1] if found else default

    @property
    def error(self) -> JaxdbgError | None:
        """The error jaxdbg raised on purpose in the child (bad input found while loading the target, a target
        that failed before any JAX work), as itself; None when the run did not end in one."""
        return self.exception.own_error() if self.status == "exception" and self.exception is not None else None

    def reraise_expected(self) -> None:
        """Raise again the error jaxdbg raised on purpose in the child, if the run ended in one."""
        if self.status == "exception" and self.exception is not None:
            self.exception.reraise()

    def failure(self, message: str, bug: str | None = None) -> Exception:
        """The error the user sees for this failed run (the one way every command turns a failed contained run
        into an error): jaxdbg's own error raised in the child, as itself; with ``bug``, an exception of
        anything else as a bug of jaxdbg's (a RuntimeError naming it, with the child's traceback: the command
        line's internal error), for a job whose child catches the target's own exceptions; else a
        :class:`~jaxdbg._errors.TargetFailedError` saying ``message``.

        Example:
            >>> ran = outcome_of(None, True, [], "", "", 5.0)
            >>> ran.failure(f"the target {ran.describe()}; raise --timeout")
            TargetFailedError('the target timed out after 5.0s; raise --timeout')
        """
        own, exc = self.error, self.exception if self.status == "exception" else None
        if own is not None:
            return own
        if exc is not None and bug is not None:
            return RuntimeError(f"{bug}: {exc.type}: {first_line(exc.message)}\n{exc.traceback}")
        return TargetFailedError(message)

    def describe(self) -> str:
        """One line for a human: 'raised ValueError: ... at train.py:12', 'crashed with SIGSEGV', ..."""
        if self.status == "exception" and self.exception:
            where = f" at {self.exception.user_frame}" if self.exception.user_frame else ""
            if self.exception.exit_code == EXIT_TARGET_FAILED:  # jaxdbg's own words about the target (an import failed)
                return f"failed: {first_line(self.exception.message)}{where}"
            # (a host callback's exception: the one its embedded traceback ends with)
            return f"raised {self.exception.type}: {first_line(without_tracebacks(self.exception.message))}{where}"
        if self.status == "crash":
            where = f" at {self.crash_frame}" if self.crash_frame else ""
            said = native_fatal_message(self.stderr)  # (gloo's collective mismatch, a failed CHECK: the why)
            return f"crashed with {self.signal}{where}" + (f" ({first_line(said, 240)})" if said else "")
        if self.status == "timeout":
            where = f" (last seen at {self.crash_frame})" if self.crash_frame else ""
            if waited_to_join(self.stderr):
                where += (" waiting in jax.distributed.initialize() for the job's other processes: one never "
                          "started or cannot reach the coordinator")
            if self.terminated:
                return f"was stopped after {self.elapsed_s:.1f}s (jaxdbg received SIGTERM){where}"
            return f"timed out after {self.elapsed_s:.1f}s{where}"
        if self.status == "exit":  # sys.exit("message") prints the message as the last line of stderr
            lines = [line for line in self.stderr.strip().splitlines() if line.strip()]
            if not lines:
                return f"exited with status {self.returncode}"
            # absl (and others) print the error, then a pointer to --help: the error is the line to quote
            errors = [line for line in lines if not _HELP_POINTER.search(line)]
            quoted = errors[-1] if errors else lines[-1]
            label = "last on stderr" if quoted is lines[-1] else "on stderr"
            return f"exited with status {self.returncode} ({label}: {first_line(quoted, 200)})"
        return "finished"


# "Pass --helpshort or --helpfull to see help on flags." (absl), "Try 'train.py --help' for help." (click)
_HELP_POINTER = re.compile(r"--help")


def first_line(text: str, limit: int = 300) -> str:
    """The first line of a message, with a printed array that goes on over the next lines joined into it.

    Example:
        >>> first_line("produced NaN: [[nan 1.]\\n [2. 3.]]\\nTraceback ...")
        'produced NaN: [[nan 1.] [2. 3.]]'
    """
    lines = (text or "").strip().splitlines()
    line = lines[0] if lines else ""
    for more in lines[1:]:  # numpy prints a 2-D array a row per line: "[[nan 1.]" alone misquotes it
        if line.count("[") <= line.count("]") or len(line) > limit:
            break
        line = f"{line} {more.strip()}"
    return line if len(line) <= limit else line[: limit - 3] + "..."


_FAULT_FRAME = re.compile(r'File "([^"]+)", line (\d+) in (\S+)')


def waited_to_join(stderr: str) -> bool:
    r"""Whether the program's main thread stood in ``jax.distributed.initialize()`` when a hung child was
    stopped (the last faulthandler dump: its current thread), i.e. the job's other processes never came.

    Example:
        >>> waited_to_join('Current thread 0x1 (most recent call first):\n  File "/x/jax/_src/distributed.py", '
        ...                'line 173 in initialize\n  File "train.py", line 7 in <module>\n')
        True
    """
    current = stderr.rfind("Current thread")
    if current < 0:
        return False
    dump = stderr[current:].split("\n\n", 1)[0]
    return re.search(r"distributed\.py\", line \d+ in initialize", dump) is not None


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


_CXX_ABORT = re.compile(r"terminate called after throwing an instance of '([^']+)'\s*\n\s*what\(\):\s*(.+)")
_ABSL_FATAL = re.compile(r"^F\d{4} [\d:.]+\s+\d+ [^\]]+\] (.+)$", re.MULTILINE)
_ENFORCE_AT = re.compile(r"^\[enforce fail at [^\]]+\]\s*")


def native_fatal_message(stderr: str) -> str | None:
    r"""What the native runtime said as it aborted the process (an uncaught C++ exception's ``what()``, an absl
    ``F`` log line such as a failed ``CHECK``), the last one before Python's fatal-error dump; None if none.

    Example:
        >>> native_fatal_message("terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
        ...                      "  what():  [enforce fail at pair.cc:459] Received data size doesn't match.\n"
        ...                      "Fatal Python error: Aborted\n")
        "gloo::EnforceNotMet: Received data size doesn't match."
    """
    fatal = stderr.rfind("Fatal Python error")
    text = stderr[:fatal] if fatal >= 0 else stderr
    found = [(m.start(), f"{m.group(1)}: {_ENFORCE_AT.sub('', m.group(2).strip())}") for m in _CXX_ABORT.finditer(text)]
    found += [(m.start(), m.group(1).strip()) for m in _ABSL_FATAL.finditer(text)]
    return max(found)[1][:400] if found else None


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
    request: Request,
    *,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    device_count: int | None = None,
    cwd: str | None = None,
    on_message: Callable[[Message], None] | None = None,
    until: Callable[[Message], bool] | None = None,
    keep_running: bool = False,
    sigterm_as_timeout: bool = False,
) -> Outcome:
    """Run ``request``'s handler, ``handler(request, channel)``, in a fresh Python process and report what happened.

    Args:
        request: what to run; its type picks the handler (:func:`~jaxdbg.protocol.handles`), which the child
            imports from ``type(request).handler_module``; picklable.
        timeout: seconds before the child (and everything it started) is stopped; None waits forever.
        env: extra environment variables for the child.
        device_count: number of host-platform (CPU) devices the child's jax should see.
        cwd: working folder of the child (default: ours).
        on_message: hears each message while the child still runs (read every 0.2 s; live figures).
        until: a message for which it returns True ends the run: the child (and its session) is stopped then
            (hang-hunt's verdict on a program that will not end), or with ``keep_running`` left running.
        sigterm_as_timeout: a SIGTERM to jaxdbg ends this run as ``timeout`` would (:func:`end_runs_at_sigterm`):
            for a command's run of its target, whose timeout the command reports with what the run sent so far.
    """
    if not isinstance(request, Request):
        raise TypeError(f"run_contained runs a jaxdbg.protocol.Request, not {type(request).__qualname__}")
    with tempfile.TemporaryDirectory(prefix="jaxdbg-run-") as workdir:
        with open(os.path.join(workdir, "job.pkl"), "wb") as handle:
            pickle.dump(request, handle)
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
        timed_out = stopped = False
        _RUNNING.add(proc)
        if sigterm_as_timeout:
            _SIGTERM_ENDS.set()
        try:
            stopped = _wait(proc, timeout, os.path.join(workdir, "channel.bin"), on_message, until,
                            _SIGTERM_CAME if sigterm_as_timeout else None)
        except subprocess.TimeoutExpired:
            timed_out = True
            _stop_hung(proc)
        except BaseException:  # Ctrl-C, or SIGTERM turned into SystemExit: the child has its own session,
            _kill_group(proc)  # so nothing else would stop it (or what it started) from outliving jaxdbg
            raise
        finally:
            _RUNNING.discard(proc)
        elapsed = time.perf_counter() - started
        if not (stopped and keep_running):
            _kill_group(proc)  # what the target left running in its session ends with it
            if stopped:
                proc.wait()
        messages = read_channel(os.path.join(workdir, "channel.bin"))
        stdout, stderr = (_read_text(path) for path in (out_path, err_path))
    outcome = outcome_of(proc.returncode, timed_out, messages, stdout, stderr, elapsed, stopped)
    if timed_out and sigterm_as_timeout and _SIGTERM_CAME.is_set():
        outcome = dataclasses.replace(outcome, terminated=True)
    mismatch = outcome.exception.own_error() if outcome.exception is not None else None
    if isinstance(mismatch, JobMismatchError):
        raise mismatch  # the job's processes disagree: no run stands, whatever the command
    return outcome


def _wait(proc: subprocess.Popen, timeout: float | None, channel: str, on_message: Callable[[Message], None] | None,
          until: Callable[[Message], bool] | None = None, ends: threading.Event | None = None) -> bool:
    """``proc.wait(timeout)``, passing the child's messages to ``on_message`` as they come when it is given;
    True when a message satisfied ``until`` first (the child may still run). ``ends`` set raises TimeoutExpired
    as the timeout would."""
    if on_message is None and until is None and ends is None:
        proc.wait(timeout=timeout)
        return False
    # (only a caller that hears the messages while the child runs has them read here)
    tail = ChannelTail(channel) if on_message is not None or until is not None else None
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        try:
            proc.wait(timeout=0.2 if left is None else max(0.0, min(0.2, left)))
        except subprocess.TimeoutExpired:
            if tail is not None and _pass_on(tail, on_message, until):
                return True
            if (left is not None and left <= 0.2) or (ends is not None and ends.is_set()):
                raise
            continue
        if tail is not None:
            _pass_on(tail, on_message, None)
        return False


def _pass_on(tail: ChannelTail, on_message: Callable[[Message], None] | None,
             until: Callable[[Message], bool] | None) -> bool:
    """Hand the new messages to ``on_message``; True once one satisfies ``until``."""
    for message in tail.read_new():
        if on_message is not None:
            on_message(message)
        if until is not None and until(message):
            return True
    return False


def outcome_of(returncode: int | None, timed_out: bool, messages: list[Message], stdout: str, stderr: str,
               elapsed: float, stopped: bool = False) -> Outcome:
    """Classify an ended child (a fresh process here, or a fork of the repro fork server).

    ``returncode`` as :class:`subprocess.Popen` gives it: negative for a fatal signal. The child reports an
    escaping exception as a :class:`~jaxdbg.protocol.ChildFailed` message; a Python stack dump on stderr
    places a crash or hang.
    """
    exception = next((m.info for m in messages if isinstance(m, ChildFailed)), None)
    kept = tuple(m for m in messages if not isinstance(m, ChildFailed))
    status: OutcomeStatus
    if timed_out:
        status, sig = "timeout", None
    elif stopped:
        status, sig = "stopped", None
    elif exception is not None:
        # Reported first, so it ended the run, even if a signal killed the child while leaving: a job's
        # runtime aborts the survivors of a lost peer (its heartbeat timeout) while they wait to leave together.
        status, sig = "exception", None
    elif returncode is not None and returncode < 0:
        status, sig = "crash", signal_name(-returncode)
    elif returncode:
        status, sig = "exit", None
    else:
        status, sig = "ok", None
    frame = faulthandler_user_frame(stderr) if status in ("crash", "timeout") else None
    return Outcome(status, returncode, sig, exception, stdout, stderr, elapsed, kept, frame)


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


# The contained children being waited for now, on any thread: a command run in a daemon thread (repro's progress
# display) is not unwound when the main thread exits, and its child, in a session of its own, would outlive jaxdbg.
_RUNNING: set[subprocess.Popen] = set()


# SIGTERM to jaxdbg (a scheduler's time limit, `kill`, the launcher stopping the processes of a job one of whose
# processes failed) is the user's deadline come early: a command's run of its target ends as at its --timeout, and
# the command reports what the run gathered so far (its usual report and exit code of a timeout).
_SIGTERM_ENDS = threading.Event()  # a run that SIGTERM ends as its timeout has started (set once, for good)
_SIGTERM_CAME = threading.Event()


def end_runs_at_sigterm() -> bool:
    """SIGTERM came (the command line's handler): end the run waited for now, and any later one, as at its
    timeout. False where this process has started no such run (nothing gathered: jaxdbg exits at once, as on
    Ctrl-C), True where the command goes on to its report."""
    if not _SIGTERM_ENDS.is_set():
        return False
    _SIGTERM_CAME.set()
    return True


def sigterm_came() -> bool:
    """Whether SIGTERM ended the runs (:func:`end_runs_at_sigterm`): waits of a command's own cut short."""
    return _SIGTERM_CAME.is_set()


def stop_contained() -> None:
    """Stop every contained child still being waited for (jaxdbg is exiting: Ctrl-C, SIGTERM)."""
    for proc in list(_RUNNING):
        _kill_group(proc)


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@handles(EchoRequest)
def echo_job(request: EchoRequest, channel: Channel) -> None:
    """A trivial job (used by tests and ``doctor``): sends its value back as an :class:`~jaxdbg.protocol.Echo`."""
    channel.send(Echo(request.value))
