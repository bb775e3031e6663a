"""One process's record at a stall (or at its end): what the job's processes exchange and the verdict reads.

A record is plain JSON (it travels through the coordination service's key-value store and into files): the
process's place, why it was taken, how long nothing moved, its flight record (the last calls and callbacks,
with the programs they ran), and every thread with its stack, what it waits in, the lock it waits for and
the locks it holds (:mod:`jaxdbg.hang.locks`), the jitted call it is in and the host callback it runs.

Example:
    >>> import jax.numpy as jnp, jax
    >>> from jaxdbg import jit_layer
    >>> from jaxdbg.hang.recorder import Recorder
    >>> recorder = Recorder()
    >>> with jit_layer.installed(recorder), recorder.listening():
    ...     _ = jax.jit(lambda x: x + 1)(jnp.ones(2))
    >>> record = take_record(recorder, reason="end", idle_s=0.0, native=False)
    >>> [c["function"] for c in record["calls"]], record["threads"][0]["main"]
    (['<lambda>'], True)
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from typing import Any

from jaxdbg._source import SourceLocation, is_user_file
from jaxdbg.hang import locks
from jaxdbg.hang.recorder import Recorder
from jaxdbg.hang.spin import Spin
from jaxdbg.hang.stacks import ThreadStack, snapshot

RECORD_CALLS = 64  # calls of the flight record that travel in a record


def take_record(recorder: Recorder, reason: str, idle_s: float, native: bool = True, index: int = 0,
                count: int = 1, busy: float = 0.0, extra: dict | None = None,
                spinning: dict[int, Spin] | None = None) -> dict:
    """This process's record now (see the module docstring); ``reason``: stall, signal, timeout or end;
    ``spinning``: the threads the watchdog saw going round a busy-wait loop (by thread ident)."""
    frames = sys._current_frames()
    threads = snapshot(native=native, frames=frames)
    entries = recorder.entries()[-RECORD_CALLS:]
    inflight = dict(list(recorder.inflight.items()))
    stuck_programs = {entry.seq: recorder.program_of_stuck_call(entry) for entry in inflight.values()}
    calls = []
    for entry in entries:
        row = entry.as_dict()
        if entry.seq in stuck_programs and entry.kind == "call" and entry.returned is None:
            row["program"] = stuck_programs[entry.seq]
        calls.append(row)
    used = {c["program"] for c in calls if c.get("program") is not None}
    from jaxdbg.hang.stacks import NATIVE_NOTES
    from jaxdbg.hang.tasks import loop_tasks

    tasks = None
    with contextlib.suppress(Exception):  # the event loop's tasks are a courtesy: the record stands without them
        tasks = loop_tasks(frames.get(threading.main_thread().ident or -1))

    return {
        "notes": list(NATIVE_NOTES),
        "index": index, "count": count, "pid": os.getpid(), "host": socket.gethostname(), "reason": reason,
        "taken": time.time(), "idle_s": round(idle_s, 3), "busy": round(busy, 3),
        "progress": dict(zip(("calls", "returned", "callbacks", "callbacks_done"), recorder.progress())),
        "steps": len(recorder.steps_program),
        "exiting": recorder.exiting,
        "thread_deaths": [*recorder.thread_deaths, *((tasks or {}).get("failed") or ())],
        "event_loop": tasks,
        "calls": calls,
        "programs": {str(i): _program_dict(recorder.programs[i]) for i in sorted(used) if i in recorder.programs},
        "threads": [_thread_dict(thread, frames.get(thread.ident), recorder, inflight, (spinning or {}).get(
            thread.ident)) for thread in threads],
        **(extra or {}),
    }


def _program_dict(program: Any) -> dict:
    return {"key": program.key, "function": program.function, "signature": program.signature,
            "processes": list(program.processes), "note": program.note,
            "collectives": [{"op": c.op, "reduce": c.reduce, "processes": list(c.processes),
                             "groups": [list(g) for g in c.groups], "source": c.source.as_dict() if c.source else None,
                             "text": c.describe()} for c in program.collectives]}


def _thread_dict(thread: ThreadStack, frame: Any, recorder: Recorder, inflight: dict, spin: Spin | None) -> dict:
    found = thread.as_dict()
    if spin is not None:  # what it "waits in" is its own loop: say so, and stand at the loop's first line
        found["waiting_in"] = spin.words()
        found["spinning"] = {"lines": list(spin.lines), "since": spin.since}
        found["user"] = SourceLocation(spin.location.file, spin.lines[0], spin.location.function).as_dict()
    entry = inflight.get(thread.ident)
    found["call"] = entry.seq if entry is not None else None
    callback = recorder.in_callback.get(thread.ident)
    found["callback"] = ({"function": callback.function, "seq": callback.seq, "kind": callback.via,
                          "source": callback.site.as_dict() if callback.site else None}
                         if callback is not None else None)
    found["waits_for"], found["holds"] = None, []
    if frame is None:
        return found
    user = locks.user_frames(frame)
    if user and not thread.kernel.startswith("R"):
        found["waits_for"] = _waits_for(user[0])
    for held_frame in user:
        for name, obj, line in locks.holds(held_frame):
            found["holds"].append({"name": name, "object": id(obj), "since": _at(held_frame, line)})
    found["queues"] = [{"op": op, "object": id(obj), "at": _at(used_frame, line)}
                       for used_frame in user for op, obj, line in locks.queue_uses(used_frame)]
    return found


def _waits_for(frame: Any) -> dict | None:
    waited = locks.waited_object(frame)
    if waited is None:
        return None
    kind, name, obj = waited
    said: dict[str, Any] = {"kind": kind, "name": name, "object": id(obj), "at": _at(frame, frame.f_lineno),
                            "type": type(obj).__name__}
    if kind == "lock":
        said["locked"] = bool(getattr(obj, "locked", lambda: True)()) if hasattr(obj, "locked") else None
        said["owner"] = locks.rlock_owner(obj)
    if kind == "thread":
        said["thread"] = getattr(obj, "ident", None)
    if kind == "queue" and locks.is_queue(obj):
        with contextlib.suppress(Exception):  # queue.Queue's own fields, read without its lock (a snapshot)
            said["size"], said["maxsize"] = len(obj.queue), obj.maxsize
    return said


def _at(frame: Any, line: int) -> dict:
    return SourceLocation(frame.f_code.co_filename, line, frame.f_code.co_name).as_dict()


def light_record(recorder: Recorder) -> dict:
    """A record without threads (cheap, taken every few seconds): what a process that dies leaves behind. It
    holds the whole flight record (it stays in this process's folder; a record that travels holds its last
    :data:`RECORD_CALLS`)."""
    entries = recorder.entries()
    calls = [entry.as_dict() for entry in entries]
    used = {c["program"] for c in calls if c.get("program") is not None}
    return {"taken": time.time(), "pid": os.getpid(), "steps": len(recorder.steps_program), "calls": calls,
            "progress": dict(zip(("calls", "returned", "callbacks", "callbacks_done"), recorder.progress())),
            "programs": {str(i): _program_dict(recorder.programs[i]) for i in sorted(used) if i in recorder.programs},
            "user": main_thread_user_frame(), "threads": []}


def main_thread_user_frame() -> dict | None:
    """The innermost user frame of the program's main thread, read from another thread."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    while frame is not None and not is_user_file(frame.f_code.co_filename):
        frame = frame.f_back
    return None if frame is None else _at(frame, frame.f_lineno)


def main_user_line(record: dict) -> dict | None:
    """The user line the record's main thread stands at (None where it is in no user code)."""
    main = next((t for t in record.get("threads") or () if t.get("main")), None)
    return main.get("user") if main else None


def is_user_location(location: dict | None) -> bool:
    return location is not None and is_user_file(location.get("file"))
