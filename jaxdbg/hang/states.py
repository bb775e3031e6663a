"""What one process was doing at its snapshot, from its record (:mod:`jaxdbg.hang.record`): the state, the
call it is in or waits for, the user line, and threads that wait for each other in a cycle (a deadlock).

Pure functions of records (JSON), so a record read back from a file or from another process gives the same
answer.

Example:
    >>> record = {"index": 0, "idle_s": 12.0, "steps": 1, "programs": {"0": {"key": "step(..)", "function": "step",
    ...           "processes": [0, 1], "collectives": [{"text": "all-reduce (sum) over processes 0, 1"}]}},
    ...           "calls": [{"kind": "call", "seq": 1, "function": "step", "index": 1, "program": 0, "step": None,
    ...                      "site": {"file": "train.py", "line": 40, "function": "<module>"}, "start": 0.0,
    ...                      "returned": None, "ready": None}],
    ...           "threads": [{"name": "MainThread", "main": True, "call": 1, "in_jax": True, "callback": None,
    ...                        "user": {"file": "train.py", "line": 40, "function": "<module>"}, "frames": [],
    ...                        "waiting_in": "a socket receive", "waits_for": None, "holds": []}]}
    >>> state = process_state(record, taken=20.0)
    >>> state.state, state.function, state.call_index, state.step, state.collective
    ('running', 'step', 1, 1, 'all-reduce (sum) over processes 0, 1')
"""

from __future__ import annotations

import os
from typing import Any, get_args

from jaxdbg._choices import choice
from jaxdbg._source import SourceLocation
from jaxdbg.hang.result import CallKind, CallRow, Deadlock, ProcessState, ThreadReport, ThreadState

CALL_KINDS: tuple[CallKind, ...] = get_args(CallKind)

SHOWN_CALLS = 12  # the last calls each process's report lists (the timeline has them all)


def location(value: dict | None) -> SourceLocation | None:
    if not value:
        return None
    return SourceLocation(str(value.get("file")), int(value.get("line") or 0), str(value.get("function") or ""))


def short(value: dict | SourceLocation | None) -> str:
    """``train.py:12 (read_batch)``."""
    loc = location(value) if isinstance(value, dict) else value
    return f"{os.path.basename(loc.file)}:{loc.line} ({loc.function})" if loc else "an unknown line"


def program_of(record: dict, call: dict | None) -> dict | None:
    if not call or call.get("program") is None:
        return None
    return (record.get("programs") or {}).get(str(call["program"]))


def is_global(program: dict | None) -> bool:
    return program is not None and len(program.get("processes") or ()) > 1


def step_of(record: dict, call: dict) -> int | None:
    """The step of a call: its place among the process's calls of global programs (a call in flight, which
    has none yet, is the next one)."""
    if call.get("step") is not None:
        return int(call["step"])
    if call.get("kind") == "call" and call.get("returned") is None and is_global(program_of(record, call)):
        return int(record.get("steps") or 0)
    return None


def collective_text(program: dict | None) -> str | None:
    """The collectives of a program in words (the first, and how many more)."""
    found = (program or {}).get("collectives") or []
    if not found:
        return None
    more = f" (+{len(found) - 1} more collectives)" if len(found) > 1 else ""
    return str(found[0].get("text") or found[0].get("op")) + more


def _main(record: dict) -> dict:
    return next((t for t in record.get("threads") or () if t.get("main")), {})


def _call(record: dict, seq: int | None) -> dict | None:
    if seq is None:
        return None
    return next((c for c in reversed(record.get("calls") or ()) if c.get("kind") == "call" and c.get("seq") == seq),
                None)


def pending_call(record: dict) -> dict | None:
    """The oldest call that returned to Python but whose results were not ready (the device still ran it)."""
    return next((c for c in record.get("calls") or () if c.get("kind") == "call" and c.get("returned") is not None
                 and c.get("ready") is None and not c.get("error")), None)


def last_call(record: dict) -> dict | None:
    return next((c for c in reversed(record.get("calls") or ()) if c.get("kind") == "call"), None)


def process_state(record: dict, taken: float | None = None) -> ProcessState:
    """The :class:`ProcessState` of one process's snapshot record."""
    main = _main(record)
    callback_thread = next((t for t in record.get("threads") or () if t.get("callback")), None)
    current = _call(record, main.get("call"))
    pending = pending_call(record) if current is None and main.get("in_jax") else None
    call = current or pending or (_call(record, callback_thread["callback"]["seq"]) if callback_thread else None)
    # inside a call yet no frame of jax's inside the user's: jax is tracing the function and its Python body is
    # what waits (a queue, a lock, a sleep in the traced code), not the device
    tracing = current is not None and not main.get("in_jax")
    state: ThreadState
    if callback_thread is not None:
        state = "callback"
    elif call is not None and not tracing:
        state = "running"
    else:
        state = "host"
    shown = call or last_call(record)
    program = program_of(record, shown)
    holding = _holding_open(record) if state == "host" else []
    source = location((holding[0] if holding else main).get("user"))
    threads = tuple(_thread_report(t) for t in record.get("threads") or ())
    taken = taken if taken is not None else float(record.get("taken") or 0.0)
    return ProcessState(
        index=int(record.get("index", 0)), state=state, detail=describe(record, state, shown, callback_thread),
        source=source, function=shown.get("function") if shown else None,
        call_index=shown.get("index") if shown else None, step=step_of(record, shown) if shown else None,
        collective=(collective_text(program) or shown.get("collective")) if state != "host" and shown else None,
        waiting_in=str(main.get("waiting_in") or ""), idle_s=record.get("idle_s"), threads=threads,
        last_calls=tuple(call_rows(record, taken)[-SHOWN_CALLS:]), steps=record.get("steps"),
        tracing=tracing and callback_thread is None, exiting=bool(holding))


def _holding_open(record: dict) -> list[dict]:
    """The non-daemon threads a process whose main code returned still waits for (Python joins them at exit)."""
    if not record.get("exiting"):
        return []
    return [t for t in record.get("threads") or () if not t.get("main") and not t.get("daemon") and t.get("user")]


def describe(record: dict, state: str, call: dict | None, callback_thread: dict | None) -> str:
    """One line for a process: where it stands and in what."""
    main = _main(record)
    holding = _holding_open(record) if state == "host" else []
    if holding:
        still = f" for {record['idle_s']:.0f} s" if record.get("idle_s") else ""
        threads = "; ".join(f"{t['name']}, stuck at {short(t.get('user'))}" + (
            f" waiting for {t['waits_for']['kind']} `{t['waits_for']['name']}`" if t.get("waits_for") else
            f" waiting in {t['waiting_in']}" if t.get("waiting_in") else "") for t in holding)
        return f"at exit: its main code returned, but Python waits for its non-daemon thread {threads}{still}"
    at = short(main.get("user"))
    below = str(main.get("waiting_in") or "")
    waiting = f", {below}" if below.startswith("running") else f", waiting in {below}" if below else ""
    if state == "host" and main.get("waits_for"):  # the object it waits for says more than the kernel's futex
        waiting = f", waiting for {wait_chain(record, main)}"
    still = f" for {record['idle_s']:.0f} s" if record.get("idle_s") else ""
    named = call_name(call) if call else None
    if state == "callback" and callback_thread is not None:
        callback = callback_thread["callback"]
        thread_at = short(callback_thread.get("user"))
        waits = callback_thread.get("waits_for")
        what = f", waiting for {waits['kind']} `{waits['name']}`" if waits else ""
        return (f"in the host callback {callback['function']} ({callback.get('kind') or 'callback'}) of "
                f"{named or 'a jitted call'} at {thread_at}{what}{still}")
    if state == "running" and call is not None:
        collective = collective_text(program_of(record, call))
        over = f" ({collective})" if collective else ""
        where = f"inside {named}{over}" if call.get("returned") is None else f"in {named}{over}, its results not ready"
        return f"{where}, called at {short(call.get('site'))}{waiting}{still}"
    if named and main.get("call") is not None and call is not None and call.get("seq") == main.get("call"):
        return f"in its own Python code at {at} while jax traces {named}{waiting}{still}"
    after = f", after {named}" if named else "" if record.get("foreign") else ", before its first jitted call"
    others = "".join(f"; its thread `{t['name']}` spins in a busy-wait loop at {short(t.get('user'))}"
                     for t in record.get("threads") or () if t.get("spinning") and not t.get("main"))
    if main.get("spinning"):
        return f"spinning in a busy-wait loop at {at} ({_lines(main['spinning'])}){still}{after}{others}"
    return f"outside JAX at {at}{waiting}{still}{after}{others}"


def wait_words(waits: dict) -> str:
    """``queue `q` (full: 2 of 2) at train.py:17 (loader)``: what a thread waits for, in words."""
    fill = ""
    if waits.get("maxsize") is not None and waits.get("size") is not None:
        full = waits["maxsize"] > 0 and waits["size"] >= waits["maxsize"]
        fill = (f" (full: {waits['size']} of {waits['maxsize']})" if full else " (empty)" if waits["size"] == 0
                else f" ({waits['size']} of {waits['maxsize'] or 'unbounded'})")
    return f"{waits['kind']} `{waits['name']}`{fill} at {short(waits.get('at'))}"


def wait_chain(record: dict, thread: dict, hops: int = 3) -> str:
    """What a thread waits for, followed through the threads it joins: ``thread `t` at train.py:32 (<module>),
    which waits for queue `q` (full: 2 of 2) at train.py:17 (loader)``.

    Example:
        >>> loader = {"ident": 2, "name": "loader", "waits_for": {"kind": "queue", "name": "q", "size": 2,
        ...           "maxsize": 2, "at": {"file": "t.py", "line": 17, "function": "loader"}}}
        >>> main = {"ident": 1, "waits_for": {"kind": "thread", "name": "t", "thread": 2,
        ...         "at": {"file": "t.py", "line": 32, "function": "<module>"}}}
        >>> wait_chain({"threads": [main, loader]}, main)
        'thread `t` at t.py:32 (<module>), which waits for queue `q` (full: 2 of 2) at t.py:17 (loader)'
    """
    waits = thread["waits_for"]
    words = wait_words(waits)
    joined = next((t for t in record.get("threads") or () if waits.get("kind") == "thread"
                   and t.get("ident") is not None and t.get("ident") == waits.get("thread")), None)
    if joined is not None and hops > 1:
        if joined.get("waits_for"):
            return f"{words}, which waits for {wait_chain(record, joined, hops - 1)}"
        if joined.get("spinning"):
            return f"{words}, which spins in a busy-wait loop at {short(joined.get('user'))}"
    return words


def wait_hint(record: dict) -> str | None:
    """A hint for a main thread that joins a thread stuck on a full (or empty) queue: the classic end of a
    producer/consumer pipeline whose consumer stopped taking."""
    main = _main(record)
    waits = main.get("waits_for") or {}
    if waits.get("kind") != "thread":
        return None
    joined: dict = next((t for t in record.get("threads") or () if t.get("ident") == waits.get("thread")), {})
    inner = joined.get("waits_for") or {}
    if inner.get("kind") != "queue" or inner.get("size") is None:
        return None
    at = short(inner.get("at"))
    if inner.get("maxsize") and inner["size"] >= inner["maxsize"]:
        return (f"thread `{joined.get('name')}` waits at {at} to put into the full queue `{inner['name']}`, which "
                f"nothing takes from any more, while {short(main.get('user'))} joins it: before joining, tell it to "
                "stop (a threading.Event it checks, with q.put(item, timeout=...) in a loop), or drain the queue, "
                "or make it a daemon thread")
    if inner["size"] == 0:
        return (f"thread `{joined.get('name')}` waits at {at} to take from the empty queue `{inner['name']}`, which "
                f"nothing fills any more, while {short(main.get('user'))} joins it: put a sentinel (None) on the "
                "queue for it to stop at, or use q.get(timeout=...)")
    return None


def lone_queue(record: dict) -> tuple[str, str] | None:
    """``(words, hint)`` for a main thread that takes from an empty queue (or puts into a full one) while no other
    thread of the process is alive to answer it: the producer ended (or was never started for this queue), so the
    wait can never end. None otherwise (another thread may still fill it).

    Example:
        >>> waits = {"kind": "queue", "name": "q", "size": 0, "maxsize": 4,
        ...          "at": {"file": "/w/rl.py", "line": 22, "function": "next_obs"}}
        >>> lone_queue({"threads": [{"main": True, "waits_for": waits}]})[0]
        'no other thread is alive to put into queue `q`'
    """
    threads = record.get("threads") or ()
    main = _main(record)
    waits = main.get("waits_for") or {}
    if waits.get("kind") == "event" and len(threads) == 1:
        return _lone_event(waits)
    if waits.get("kind") != "queue" or waits.get("size") is None or len(threads) != 1:
        return None
    at = short(waits.get("at"))
    if waits["size"] == 0:
        return (f"no other thread is alive to put into queue `{waits['name']}`",
                f"nothing can ever fill the empty queue `{waits['name']}` that {at} takes from: the thread that "
                "put into it has ended (or was never started for it); start its producer before this wait, and "
                "take with q.get(timeout=...) that raises when nothing comes, so a missing producer fails fast")
    if waits.get("maxsize") and waits["size"] >= waits["maxsize"]:
        return (f"no other thread is alive to take from queue `{waits['name']}`",
                f"nothing can ever take from the full queue `{waits['name']}` that {at} puts into: the thread that "
                "took from it has ended; start its consumer before this wait, or put with a timeout")
    return None


def _lone_event(waits: dict) -> tuple[str, str]:
    """``(words, hint)`` for an event waited for with no other thread alive: the lines that set it (read from the
    waiting line's file) belong to a thread that ended or was never started."""
    from jaxdbg.hang.locks import set_sites

    at, name = waits.get("at") or {}, waits["name"]
    sites = set_sites(at.get("file") or "", name)
    where = ", ".join(f"{os.path.basename(at.get('file') or '')}:{line} ({function})" for line, function in sites[:3])
    setters = f"it is set at {where}, which no thread runs now" if sites else "nothing in that file sets it"
    return (f"no other thread is alive to set event `{name}`",
            f"nothing can ever set the event `{name}` that {short(at)} waits for: {setters}; start the thread that "
            "sets it before the wait (or set it on every path, errors included), and wait with a timeout that "
            "raises, so a missing setter fails fast")


def _lines(spinning: dict) -> str:
    """``lines 29-30`` of a spinning thread's loop."""
    lines = spinning.get("lines") or [0]
    return f"line {lines[0]}" if lines[0] == lines[-1] else f"lines {lines[0]}-{lines[-1]}"


def call_name(call: dict) -> str:
    """``step call 3``; ``a call of step`` where the index is unknown (a process looked at with --pid)."""
    if call.get("index") is None:
        return f"a call of {call['function']}"
    return f"{call['function']} call {call['index']}"


def _thread_report(thread: dict) -> ThreadReport:
    state: ThreadState = "callback" if thread.get("callback") else ("running" if thread.get("in_jax") else "host")
    waits = thread.get("waits_for")
    waits_text = wait_words(waits) if waits else None
    holds = tuple(f"lock `{h['name']}` since {short(h.get('since'))}" for h in thread.get("holds") or ())
    stack = tuple(loc for loc in (location(f) for f in thread.get("frames") or ()) if loc is not None)
    return ThreadReport(str(thread.get("name")), bool(thread.get("main")), location(thread.get("user")), state,
                        str(thread.get("waiting_in") or ""), waits_text, holds, stack)


def call_rows(record: dict, taken: float) -> list[CallRow]:
    rows = []
    for call in record.get("calls") or ():
        program = program_of(record, call)

        def ago(key: str, call: dict = call) -> float | None:
            return round(taken - call[key], 3) if call.get(key) is not None else None

        kind = choice(call.get("kind"), CALL_KINDS) or "call"
        rows.append(CallRow(int(call.get("seq", -1)), kind, str(call.get("function")),
                            call.get("index"), location(call.get("site")), step_of(record, call),
                            program.get("key") if program else None, ago("start") or 0.0, ago("returned"),
                            ago("ready"), call.get("error")))
    return rows


def find_deadlock(record: dict) -> Deadlock | None:
    """Threads of the process that wait for each other in a cycle: a thread waiting for a lock waits for the
    threads that hold it; a thread joining another waits for it; a thread inside a jitted call (or waiting for
    its results) waits for the threads running that call's host callbacks. A thread waiting for a lock it holds
    itself (a host callback run inline, on the thread whose ``with lock:`` made the call) is a cycle of one."""
    threads = list(record.get("threads") or ())
    edges: dict[int, list[tuple[int, str]]] = {}
    holders: dict[int, list[dict]] = {}
    for thread in threads:
        for held in thread.get("holds") or ():
            holders.setdefault(held["object"], []).append({**held, "thread": thread})
    callbacks = [t for t in threads if t.get("callback")]
    through_callback: set[str] = set()  # the words of waits a host callback takes part in
    for thread in threads:
        ident, waits = thread.get("ident"), thread.get("waits_for")
        found = edges.setdefault(ident, [])
        if waits and waits.get("kind") == "lock":
            owner = waits.get("owner")
            for held in holders.get(waits["object"], ()):
                found.append((held["thread"]["ident"], _lock_words(thread, waits, held)))
                if thread.get("callback"):
                    through_callback.add(found[-1][1])
            if owner is not None and not holders.get(waits["object"]):
                found.append((owner, f"{thread['name']} waits for lock `{waits['name']}` at {short(waits.get('at'))}"))
        elif waits and waits.get("kind") == "thread" and waits.get("thread") is not None:
            joined = f"{thread['name']} joins thread `{waits['name']}` at {short(waits.get('at'))}"
            found.append((waits["thread"], joined))
        elif waits and waits.get("kind") == "queue":
            found.extend(_queue_edge(thread, waits, threads))
        if thread.get("call") is not None or thread.get("in_jax"):
            for runner in callbacks:
                if runner.get("ident") != ident:
                    callback = runner["callback"]
                    found.append((runner["ident"], f"{thread['name']} waits inside a jitted call for its host callback "
                                                   f"{callback['function']}, run by {runner['name']}"))
                    through_callback.add(found[-1][1])
    cycle = _cycle(edges)
    if not cycle:
        return None
    return Deadlock(int(record.get("index", 0)), tuple(cycle), any(words in through_callback for words in cycle),
                    any(QUEUE_WORDS in words for words in cycle), all(QUEUE_WORDS in words for words in cycle))


QUEUE_WORDS = "the only thread that "


def _queue_edge(thread: dict, waits: dict, threads: list[dict]) -> list[tuple[int, str]]:
    """A thread blocked putting into a full queue waits for the thread that takes from it (blocked taking from an
    empty one, for the thread that puts): an edge only where exactly one other thread's code does, since any one
    of several could free it. ``[]`` where the queue's fill or its other side is not known."""
    size, maxsize = waits.get("size"), waits.get("maxsize")
    if size is None or maxsize is None:
        return []
    if maxsize > 0 and size >= maxsize:
        wanted, verb, does = "get", "put into", "takes from"
    elif size == 0:
        wanted, verb, does = "put", "take from", "puts into"
    else:
        return []
    others = [(t, use) for t in threads if t.get("ident") != thread.get("ident")
              for use in t.get("queues") or () if use["object"] == waits["object"] and use["op"] == wanted]
    if len({t.get("ident") for t, _ in others}) != 1:
        return []
    other, use = others[0]
    return [(other["ident"], f"{thread['name']} waits to {verb} {wait_words(waits)}, and {other['name']} is "
                             f"{QUEUE_WORDS}{does} it (at {short(use.get('at'))})")]


def _lock_words(thread: dict, waits: dict, held: dict) -> str:
    holder = held["thread"]
    who = "itself" if holder.get("ident") == thread.get("ident") else holder["name"]
    inside = ""
    if thread.get("callback"):
        inside = f" (in the host callback {thread['callback']['function']})"
    return (f"{thread['name']} waits for lock `{waits['name']}` at {short(waits.get('at'))}{inside}, which {who} "
            f"holds since {short(held.get('since'))}")


def _cycle(edges: dict[Any, list[tuple[Any, str]]]) -> list[str]:
    """The words of the first cycle in a wait-for graph ([] when it has none).

        >>> _cycle({1: [(2, "a waits for b")], 2: [(1, "b waits for a")], 3: [(1, "c waits for a")]})
        ['a waits for b', 'b waits for a']
        >>> _cycle({1: [(1, "a waits for itself")]}), _cycle({1: [(2, "a waits for b")]})
        (['a waits for itself'], [])
    """
    done: set[Any] = set()

    def visit(node: Any, path: list[tuple[Any, str]]) -> list[str]:
        for target, words in edges.get(node, ()):
            step = [*path, (node, words)]
            starts = [i for i, (n, _) in enumerate(step) if n == target]
            if starts:
                return [w for _, w in step[starts[0]:]]
            if target not in done:
                found = visit(target, step)
                if found:
                    return found
        done.add(node)
        return []

    for start in list(edges):
        if start not in done:
            found = visit(start, [])
            if found:
                return found
    return []
