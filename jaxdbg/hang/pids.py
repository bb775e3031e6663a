"""``hang-hunt --pid PID[,PID...]``: a job already stuck that was not started under jaxdbg.

py-spy reads each process's threads from outside (Python frames, and native frames where it can unwind
them), twice, a few seconds apart: a process whose stacks did not move and that used almost no CPU meanwhile
is idle. Each process becomes a record like those of the flight recorder, without its past calls: the
jitted call a thread is in is told by jax's frames (Python, or native: XLA, PjRt, gloo, NCCL) below the
user's line, and named by the function that line calls; a host callback by jax's callback frames; a lock by
the ``with``/``acquire`` of the line, matched between threads by name (the objects cannot be read from
outside). The processes are left running: jaxdbg did not start them.

Example:
    >>> parse_pids(f"{os.getpid()}, {os.getppid()}") == [os.getpid(), os.getppid()]
    True
"""

from __future__ import annotations

import ast
import os
import time
from typing import Any

from jaxdbg._errors import TargetFailedError, UsageError
from jaxdbg._source import SourceLocation, is_user_file
from jaxdbg.hang import locks
from jaxdbg.hang.result import HangResult
from jaxdbg.hang.stacks import ThreadStack, in_jax, py_spy, py_spy_dump
from jaxdbg.hang.verdict import JobFacts, judge
from jaxdbg.hang.watchdog import BUSY_FRACTION

WINDOW_S = 3.0  # between the two looks
_CALLBACK_FRAMES = {"pure_callback_impl": "jax.pure_callback", "io_callback_impl": "io_callback",
                    "debug_callback_impl": "jax.debug.callback"}


def parse_pids(text: str) -> list[int]:
    pids = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit():
            raise UsageError(f"--pid '{text}': give process ids separated by commas, e.g. --pid 4121,4122")
        pids.append(int(part))
    for pid in pids:
        if not os.path.exists(f"/proc/{pid}") and not _alive(pid):
            raise UsageError(f"--pid {pid}: no such process (is it running on this host?)")
    return pids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def hunt_pids(pids: list[int], native: bool = True, out_dir: str | None = None,
              window_s: float = WINDOW_S) -> tuple[HangResult, dict[str, str]]:
    """The verdict for running processes (in the order given: process 0, 1, ...), and the artifacts."""
    if py_spy() is None:
        raise UsageError("--pid needs py-spy to read a running process's stacks: pip install 'jaxdbg[stacks]' "
                         "(or pip install py-spy)")
    first = {pid: _look(pid, native) for pid in pids}
    cpu = {pid: _cpu_s(pid) for pid in pids}
    time.sleep(window_s)
    records = {}
    for index, pid in enumerate(pids):
        again = _look(pid, native)
        moved = _signature(again) != _signature(first[pid])
        before, after = cpu[pid], _cpu_s(pid)
        used = (after - before) / window_s if before is not None and after is not None else 0.0
        idle = 0.0 if moved or used >= BUSY_FRACTION else window_s
        records[index] = to_record(index, pid, again, idle, used)
    said = f"processes {', '.join(map(str, pids))} read with py-spy {window_s:g} s apart; left running"
    facts = JobFacts(len(pids), "signal", window_s, records, notes=[said])
    result = judge(facts)
    artifacts: dict[str, str] = {}
    if out_dir:
        import json

        from jaxdbg.hang.verdict import facts_json

        path = os.path.join(out_dir, "hang-facts.json")
        with open(path, "w") as handle:
            json.dump(facts_json(facts), handle)
        artifacts["facts"] = path
    return result, artifacts


def _look(pid: int, native: bool) -> list[dict]:
    threads, why = py_spy_dump(pid, native=native)
    if not threads:
        raise TargetFailedError(f"could not read the stacks of process {pid}: {why}")
    return threads


def _signature(threads: list[dict]) -> tuple:
    return tuple(sorted((t.get("thread_id"), tuple((f.get("filename"), f.get("line")) for f in t.get("frames") or ()))
                        for t in threads))


def _cpu_s(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def to_record(index: int, pid: int, threads: list[dict], idle_s: float, busy: float) -> dict:
    """A flight-recorder-like record of a foreign process from py-spy's threads."""
    found, calls = [], []
    for thread in threads:
        frames = thread.get("frames") or ()
        python = [f for f in frames if str(f.get("filename", "")).endswith(".py")]
        native = [str(f.get("name")) for f in frames if not str(f.get("filename", "")).endswith(".py")]
        stack = tuple(SourceLocation(str(f["filename"]), int(f.get("line") or 0), str(f.get("name"))) for f in python)
        user = next((f for f in stack if is_user_file(f.file)), None)
        main = thread.get("os_thread_id") == pid or thread.get("thread_name") == "MainThread"
        name = str(thread.get("thread_name") or thread.get("thread_id"))
        tid = thread.get("os_thread_id")
        state = ThreadStack(name, int(thread.get("thread_id") or 0), tid, main, False, stack, user,
                            kernel_state_of(pid, tid), tuple(native[:24]))
        row = state.as_dict()
        row["in_jax"] = in_jax(stack, native)
        row["callback"] = _callback(stack, user)
        row["call"] = None
        if main and row["in_jax"] and user is not None and row["callback"] is None:
            name = locks.called_name(user.file, user.line) or "a jitted function"
            calls.append({"kind": "call", "seq": 0, "function": name, "index": None, "site": user.as_dict(),
                          "start": time.time(), "returned": None, "ready": None, "program": None, "step": None})
            row["call"] = 0
        row["waits_for"], row["holds"] = _waits_and_holds(stack, user, state.kernel)
        found.append(row)
    found.sort(key=lambda t: not t["main"])
    return {"index": index, "pid": pid, "reason": "signal", "taken": time.time(), "idle_s": idle_s, "busy": busy,
            "calls": calls, "programs": {}, "threads": found, "steps": 0,
            "foreign": True}  # no flight recorder: its past calls are unknown, not absent


def kernel_state_of(pid: int, tid: Any) -> str:
    """The kernel's word on a thread of another process (same host): its state and kernel function."""
    return "" if tid is None else _task_state(pid, int(tid))


def _task_state(pid: int, tid: int) -> str:
    parts = []
    for name in ("stat", "wchan"):
        try:
            with open(f"/proc/{pid}/task/{tid}/{name}") as handle:
                text = handle.read().strip()
        except OSError:
            continue
        if name == "stat":
            parts.append(text.rsplit(")", 1)[1].split()[0])
        elif text and text != "0":
            parts.append(text)
    return " ".join(parts)


def _callback(stack: tuple[SourceLocation, ...], user: SourceLocation | None) -> dict | None:
    kind = next((_CALLBACK_FRAMES[f.function] for f in stack if f.function in _CALLBACK_FRAMES), None)
    if kind is None:
        return None
    return {"function": user.function if user else "?", "seq": 0, "kind": kind,
            "source": user.as_dict() if user else None}


def _waits_and_holds(stack: tuple[SourceLocation, ...], user: SourceLocation | None, kernel: str) -> tuple:
    """What the thread waits for and holds, by the names its lines use (a lock is matched by name)."""
    waits = None
    if user is not None and not kernel.startswith("R"):
        candidates = [(k, e) for k, e in locks.wait_expressions(user.file, user.line) if _named(e)]
        if candidates:
            kind, expression = candidates[0]
            name = ast.unparse(expression)
            waits = {"kind": kind, "name": name, "object": _key(user.file, name), "at": user.as_dict(),
                     "type": "by name", "owner": None}
    holds = []
    for location in stack:
        if not is_user_file(location.file):
            continue
        for expression, line in locks.held_expressions(location.file, location.line):
            if not _named(expression):
                continue  # `with open(...)`: a call made the object; only named objects can be locks here
            name = ast.unparse(expression)
            holds.append({"name": name, "object": _key(location.file, name),
                          "since": SourceLocation(location.file, line, location.function).as_dict()})
    return waits, holds


def _named(expression: ast.expr) -> bool:
    return isinstance(expression, (ast.Name, ast.Attribute, ast.Subscript))


def _key(filename: str, name: str) -> int:
    """A lock's identity across threads when only its name is known: the module and the name."""
    return hash((os.path.realpath(filename), name.removeprefix("self.")))
