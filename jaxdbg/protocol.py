"""The typed protocol between a contained child (:mod:`jaxdbg._child`) and jaxdbg (:mod:`jaxdbg.runner`).

What a child runs is a :class:`Request`: a picklable value whose type picks its handler. A command defines
its request type (next to its messages) and registers one handler for it with :func:`handles`; the child
unpickles the request and dispatches on its type (:func:`handler_for`), importing the module the request
type names as its handler's home when the handler is not registered yet (the parent need not import it).

A child sends :class:`Message` s, frozen dataclasses, over a :class:`Channel`: an append-only file of
length-prefixed pickles, flushed per message, so what was sent before a crash or a kill is still read.
Each command defines its own messages next to its code (``jaxdbg.profile.messages``, ``jaxdbg.nan.messages``,
``jaxdbg.repro.messages``); the ones every job may send are here. The parent picks them by class
(``outcome.all(CallBatch)``), so a field is named once, where the message is defined.

An exception that escapes the job arrives as :class:`ChildFailed`; one of jaxdbg's own errors (a
:class:`~jaxdbg._errors.JaxdbgError`) crosses as itself (``ExceptionInfo.error``, with its exit code), and
:meth:`ExceptionInfo.reraise` raises it again in the parent.

Example:
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "channel.bin")
    >>> channel = Channel(path)
    >>> channel.send(Echo({"say": "hi"})); channel.close()
    >>> read_channel(path)
    [Echo(value={'say': 'hi'})]
    >>> handler_for(EchoRequest).__name__   # registered in jaxdbg.runner, imported on demand
    'echo_job'
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import struct
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from jaxdbg._errors import JaxdbgError, error_for_exit_code
from jaxdbg._source import SourceLocation, innermost_user_frame


@dataclass(frozen=True)
class Message:
    """Base class of everything a child sends."""


class Request:
    """Base class of what a contained run executes; its type picks the handler (:func:`handles`).

    A subclass names the module that registers its handler, ``class HuntJob(Request,
    handler_module="jaxdbg.nan.session")``, so the parent can build a request without importing the
    handler's (heavy) module; the default is the request type's own module.
    """

    handler_module: ClassVar[str]

    def __init_subclass__(cls, handler_module: str | None = None, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        cls.handler_module = handler_module or cls.__module__


R = TypeVar("R", bound=Request)
_HANDLERS: dict[type[Request], Callable[[Any, Any], None]] = {}


def handles(kind: type[R]) -> Callable[[Callable[[R, Channel], None]], Callable[[R, Channel], None]]:
    """Register the decorated function as the handler of requests of type ``kind`` (exactly that type).

    Example:
        >>> @dataclass(frozen=True)
        ... class Ping(Request):
        ...     text: str
        >>> @handles(Ping)
        ... def ping_job(request: Ping, channel: Channel) -> None:
        ...     channel.send(Echo(request.text))
        >>> handler_for(Ping) is ping_job
        True
    """

    def register(handler: Callable[[R, Channel], None]) -> Callable[[R, Channel], None]:
        known = _HANDLERS.get(kind)
        if known is not None and _name(known) != _name(handler):
            raise TypeError(f"{kind.__qualname__} already has a handler, {_name(known)}; one type, one handler")
        _HANDLERS[kind] = handler
        return handler

    return register


def handler_for(kind: type[Request]) -> Callable[[Any, Channel], None]:
    """The handler registered for requests of type ``kind``, importing its home module first if need be."""
    if kind not in _HANDLERS:
        importlib.import_module(kind.handler_module)
    handler = _HANDLERS.get(kind)
    if handler is None:
        raise TypeError(f"{kind.handler_module} registers no handler for {kind.__qualname__} "
                        f"(decorate one with @handles({kind.__name__}))")
    return handler


def _name(function: Callable[..., Any]) -> str:
    return f"{function.__module__}:{function.__qualname__}"


@dataclass(frozen=True)
class ExceptionInfo:
    """An exception raised in the child: its type, message, where in user code it was raised, and, for
    jaxdbg's own errors, the exit code it maps to and the error itself (None for anything else)."""

    type: str
    qualname: str
    message: str
    traceback: str
    user_frame: SourceLocation | None
    exit_code: int | None = None
    error: JaxdbgError | None = None  # jaxdbg's own error, as raised (its class and fields intact)

    def own_error(self) -> JaxdbgError | None:
        """jaxdbg's own error, as raised in the child (one that could not be pickled: the same kind, the same
        message); None for any other exception."""
        if self.error is not None or self.exit_code is None:
            return self.error
        return error_for_exit_code(self.exit_code)(self.message, exit_code=self.exit_code)

    def reraise(self) -> None:
        """Raise jaxdbg's own error again in this process; else do nothing."""
        own = self.own_error()
        if own is not None:
            raise own from None


@dataclass(frozen=True)
class ChildFailed(Message):
    """The job raised (sent by :mod:`jaxdbg._child`, read by the runner into ``Outcome.exception``)."""

    info: ExceptionInfo


@dataclass(frozen=True)
class Echo(Message):
    """Sent back by :func:`jaxdbg.runner.echo_job` (tests, doctor)."""

    value: Any


@dataclass(frozen=True)
class EchoRequest(Request, handler_module="jaxdbg.runner"):
    """Ask :func:`jaxdbg.runner.echo_job` to send ``value`` back as an :class:`Echo` (tests, doctor)."""

    value: Any = None


@dataclass(frozen=True)
class Environment(Message):
    """The child's jax environment (the report's ``environment``)."""

    info: dict


@dataclass(frozen=True)
class Done(Message):
    """The job reached its end."""


class Channel:
    """Append-only record file from child to parent: length-prefixed pickles, flushed per message."""

    def __init__(self, path: str):
        self._handle = open(path, "ab", buffering=0)  # noqa: SIM115 - held open until close()

    def send(self, message: Message) -> None:
        if not isinstance(message, Message):
            raise TypeError(f"a channel carries jaxdbg.protocol.Message objects, not {type(message).__name__}")
        blob = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        self._handle.write(struct.pack("<Q", len(blob)) + blob)

    def close(self) -> None:
        self._handle.close()


class MessageLog(list):
    """The messages a job sent, kept while ``keeping`` (a multi-process job shares figures made from them)."""

    keeping = True

    def stop(self) -> None:
        self.keeping = False
        self.clear()


def locked_sender(channel: Any, log: MessageLog | None = None) -> Callable[[Message], None]:
    """``channel.send`` made safe for the monitor thread and the main thread at once; with ``log``, every
    message is also kept there while the log keeps them."""
    lock = threading.Lock()

    def send(message: Message) -> None:
        with lock:
            channel.send(message)
            if log is not None and log.keeping:
                log.append(message)

    return send


def read_channel(path: str) -> list[Message]:
    """All complete messages of a channel file (a record cut short by a kill is dropped)."""
    return ChannelTail(path).read_new()


class ChannelTail:
    """Reads a channel file as it grows: each :meth:`read_new` returns the messages completed since the last
    (a parent that acts on a child's messages while the child still runs, e.g. live metrics).

    Example:
        >>> import tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "channel.bin")
        >>> channel, tail = Channel(path), ChannelTail(path)
        >>> channel.send(Done()); [type(m).__name__ for m in tail.read_new()]
        ['Done']
        >>> channel.send(Echo("x")); channel.close(); [m.value for m in tail.read_new()]
        ['x']
    """

    def __init__(self, path: str):
        self.path = path
        self._offset = 0

    def read_new(self) -> list[Message]:
        records: list[Message] = []
        if not os.path.exists(self.path):
            return records
        with open(self.path, "rb") as handle:
            handle.seek(self._offset)
            data = handle.read()
        offset = 0
        while offset + 8 <= len(data):
            (size,) = struct.unpack_from("<Q", data, offset)
            if offset + 8 + size > len(data):
                break  # not complete yet (or cut short by a kill)
            with contextlib.suppress(Exception):  # a value the parent cannot import is skipped, not fatal
                records.append(pickle.loads(data[offset + 8 : offset + 8 + size]))
            offset += 8 + size
        self._offset += offset
        return records


@contextlib.contextmanager
def repeating(action: Callable[[], Any], every_s: float, name: str) -> Iterator[None]:
    """Call ``action`` every ``every_s`` seconds from a daemon thread while the block runs: a child that sends
    what it gathered in batches keeps it even when it hangs and is killed (profile's call timings, memory's
    samples).

    Example:
        >>> import time
        >>> ticks = []
        >>> with repeating(lambda: ticks.append(1), 0.01, "tick"):
        ...     time.sleep(0.1)
        >>> len(ticks) > 0
        True
    """
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every_s):
            action()

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def describe_exception(err: BaseException) -> ExceptionInfo:
    """What the parent needs of an exception (it cannot unpickle arbitrary user exception classes)."""
    cls = type(err)
    message = str(err) if not isinstance(err, SystemExit) else f"exit status {err.code}"
    return ExceptionInfo(
        type=cls.__name__,
        qualname=f"{cls.__module__}.{cls.__qualname__}",
        message=message,
        traceback="".join(traceback.format_exception(cls, err, err.__traceback__)),
        user_frame=innermost_user_frame(err.__traceback__),
        exit_code=err.exit_code if isinstance(err, JaxdbgError) else None,
        error=_portable(err) if isinstance(err, JaxdbgError) else None,
    )


def failure_summary(err: BaseException | None) -> str:
    """``Type: message at file:line`` of a target's error, for the other processes of its job (empty for none,
    and for a clean ``sys.exit``).

    Example:
        >>> failure_summary(ValueError("corrupt record\\nmore")), failure_summary(SystemExit(0))
        ('ValueError: corrupt record', '')
    """
    if err is None or (isinstance(err, SystemExit) and err.code in (0, None)):
        return ""
    info = describe_exception(err)
    frame = info.user_frame
    where = f" at {os.path.basename(frame.file)}:{frame.line}" if frame is not None else ""
    lines = info.message.strip().splitlines()
    return f"{info.type}: {lines[0][:300] if lines else ''}{where}"


def _portable(err: JaxdbgError) -> JaxdbgError | None:
    """``err`` when it survives a pickle round trip (a field of a subclass may not), else None."""
    try:
        pickle.loads(pickle.dumps(err, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:  # noqa: BLE001 - then it crosses as its kind and message only
        return None
    return err
