"""What an asyncio event loop waits for, read from another thread: a thread idle in its loop's ``select`` stands
in asyncio's own code, so its stack says nothing of the program; the loop's tasks do. Each pending task is named
with the user line its coroutine awaits at (followed down the chain of coroutines it awaits), and each task that
ended by an exception nobody retrieved (an actor whose environment raised: its consumer now awaits forever) is
named with its error and line, like a thread that died.

Reading the loop's tasks from the watchdog thread takes no lock of the loop's: a snapshot, as the stacks are.

Example:
    >>> import sys, threading
    >>> loop_tasks(sys._current_frames()[threading.get_ident()]) is None   # this thread runs no event loop
    True
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from jaxdbg._source import SourceLocation, innermost_user_frame, is_user_file

SHOWN_TASKS = 8  # pending tasks named per loop


def loop_tasks(frame: Any) -> dict | None:
    """The pending and failed tasks of the asyncio event loop running in the thread whose innermost frame is
    ``frame``; None where that thread runs no event loop."""
    loop = _running_loop(frame)
    if loop is None:
        return None
    try:
        pending = list(asyncio.all_tasks(loop))
    except RuntimeError:  # the set changed while read, every retry: no tasks to show this time
        pending = []
    named = [{"name": task.get_name(), "awaits": where.as_dict() if where else None}
             for task in pending[:SHOWN_TASKS] for where in (_awaits_at(task),)]
    return {"pending": named, "more": max(0, len(pending) - SHOWN_TASKS), "failed": _failed(loop)}


def _running_loop(frame: Any) -> Any:
    while frame is not None:
        code = frame.f_code
        if code.co_name in ("_run_once", "run_forever") and code.co_filename.endswith(
                os.path.join("asyncio", "base_events.py")):
            loop = frame.f_locals.get("self")
            return loop if isinstance(loop, asyncio.AbstractEventLoop) else None
        frame = frame.f_back
    return None


def _awaits_at(task: Any) -> SourceLocation | None:
    """The innermost user line of the task's chain of awaited coroutines (where it is suspended)."""
    found = None
    awaited = task.get_coro()
    for _ in range(64):  # (a chain of awaits is short; a cycle is not followed for ever)
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
        if frame is None:
            break
        if is_user_file(frame.f_code.co_filename):
            found = SourceLocation(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    return found


def _failed(loop: Any) -> list[dict]:
    """Tasks of ``loop`` that ended by an exception nobody has retrieved (asyncio logs it only once the task is
    garbage collected). Read from asyncio's registry of tasks, which keeps a task until it is collected."""
    registry = getattr(asyncio.tasks, "_scheduled_tasks", None) or getattr(asyncio.tasks, "_all_tasks", None)
    failed = []
    for task in list(registry or ()):
        try:
            if task.get_loop() is not loop or not task.done() or task.cancelled():
                continue
            # (its private field, not exception(), which would mark it retrieved and silence asyncio's own warning)
            error = getattr(task, "_exception", None)
        except Exception:  # noqa: BLE001 - a task that cannot be read is left out
            continue
        if error is None:
            continue
        where = innermost_user_frame(error.__traceback__)
        message = str(error).strip().splitlines()
        failed.append({"thread": task.get_name(), "kind": "task",
                       "error": f"{type(error).__name__}: {message[0] if message else ''}"[:300],
                       "source": where.as_dict() if where else None})
    return failed
