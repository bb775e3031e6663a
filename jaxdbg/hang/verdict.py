"""The verdict: from every process's record, which process the job stopped on, where, and why.

:func:`judge` is a pure function of :class:`JobFacts` (records as JSON, what is known of the processes
that sent none, what made the snapshot), so process 0 of a job, a parent process reading files, and a
test all reach the same verdict from the same facts.

Kinds, in the order they explain a stop: ``dead`` (a process died: the others fail or wait for it),
``deadlock`` (threads of one process wait for each other), ``divergence`` with the job hung (processes wait
in different programs), ``stall`` (no progress: the processes outside JAX are the ones the others wait for),
``divergence`` (the job went on, with wrong values), ``running`` (asked at a signal or --timeout, and it was
still making progress: not a stall), ``failed`` (the program raised or crashed on its own), ``finished``.

Example:
    >>> main = {"name": "MainThread", "main": True, "call": None, "in_jax": False, "callback": None,
    ...         "user": {"file": "train.py", "line": 31, "function": "read_batch"}, "frames": [],
    ...         "waiting_in": "a sleep (clock_nanosleep)", "waits_for": None, "holds": []}
    >>> result = judge(JobFacts(count=1, trigger="stall", stall_s=5.0,
    ...                         records={0: {"index": 0, "idle_s": 6.0, "calls": [], "threads": [main]}}))
    >>> result.kind, result.stuck
    ('stall', (0,))
    >>> result.verdict.partition(", waiting")[0]
    'the process is stuck outside JAX at train.py:31 (read_batch)'

"""

from __future__ import annotations

import re
from collections.abc import Iterable, Set
from dataclasses import dataclass, field
from typing import Any

from jaxdbg.hang.result import Divergence, DivergenceSide, HangResult, ProcessState
from jaxdbg.hang.skips import skip_points
from jaxdbg.hang.spin import SPIN_WORDS
from jaxdbg.hang.states import (
    call_name,
    find_deadlock,
    location,
    lone_queue,
    process_state,
    program_of,
    short,
    step_of,
    wait_hint,
)

IDLE_ON_REQUEST_S = 2.0  # at a signal or --timeout, processes idle this long count as stalled
_IDLE_FOR = re.compile(r" for \d+ s\b")
_VERBS = {"running": "waits", "callback": "waits", "host": "is"}  # what the other processes do, by state
_PLURAL = {"waits": "wait", "is": "are"}


@dataclass
class JobFacts:
    """What the verdict is drawn from. ``outcomes``: per process, how its program ended where it did
    (``status`` finished / raised / dead, ``error``, ``exit_code``, ``signal``, ``user``: where it raised or
    died); ``silent``: per process that sent no record, a line saying where it was last seen; ``divergence``:
    found while the job ran
    (``{"step", "rows": {index: {"key", "function", "index", "site"}}}``)."""

    count: int
    trigger: str | None
    stall_s: float
    records: dict[int, dict] = field(default_factory=dict)
    outcomes: dict[int, dict] = field(default_factory=dict)
    silent: dict[int, dict] = field(default_factory=dict)
    divergence: dict | None = None
    notes: list[str] = field(default_factory=list)


# A SIGTERM to jaxdbg stops the program as --timeout would (runner.end_runs_at_sigterm): the verdict is drawn so.
SIGTERM_NOTE = "jaxdbg received SIGTERM (a time limit, or the job's launcher): the verdict is drawn as at --timeout"


def facts_json(facts: JobFacts) -> dict:
    """JobFacts as JSON (process indices as text keys)."""
    return {"count": facts.count, "trigger": facts.trigger, "stall_s": facts.stall_s,
            "records": {str(i): r for i, r in facts.records.items()},
            "outcomes": {str(i): o for i, o in facts.outcomes.items()},
            "silent": {str(i): s for i, s in facts.silent.items()}, "divergence": facts.divergence,
            "notes": list(facts.notes)}


def facts_from_json(data: dict) -> JobFacts:
    """The JobFacts of :func:`facts_json`."""
    return JobFacts(int(data["count"]), data.get("trigger"), float(data["stall_s"]),
                    {int(i): r for i, r in (data.get("records") or {}).items()},
                    {int(i): o for i, o in (data.get("outcomes") or {}).items()},
                    {int(i): s for i, s in (data.get("silent") or {}).items()}, data.get("divergence"),
                    list(data.get("notes") or ()))


def judge(facts: JobFacts) -> HangResult:
    """The :class:`HangResult` of a job (or of one process: ``count`` 1)."""
    states = {index: _state(facts, index) for index in range(facts.count)}
    divergence = _divergence(facts, states)
    deadlocks = [d for d in (find_deadlock(r) for r in facts.records.values()) if d is not None]
    dead = [i for i, s in states.items() if s.state == "dead"]
    idle = [i for i, s in states.items() if s.state in ("running", "host", "callback")]
    still = max((states[i].idle_s or 0.0 for i in idle), default=None)
    stalled = bool(idle) and (facts.trigger == "stall" or (
        facts.trigger in ("signal", "timeout") and all((states[i].idle_s or 0.0) >= IDLE_ON_REQUEST_S for i in idle)))
    ordered = tuple(states[i] for i in range(facts.count))
    said = {f"process {i}: {note}" if facts.count > 1 else note: None
            for i, record in sorted(facts.records.items()) for note in record.get("notes") or ()}
    notes = [*facts.notes, *(note for note in said if note not in facts.notes)]
    common: dict[str, Any] = {"stall_s": facts.stall_s, "trigger": facts.trigger, "still_s": still,
                              "processes": ordered, "divergence": divergence, "notes": tuple(notes)}
    if dead and facts.count > 1:
        return _dead(states, dead, common)
    if deadlocks and (stalled or facts.trigger):
        return _deadlock(states, deadlocks[0], common, facts.records.get(deadlocks[0].process))
    if divergence is not None and stalled and divergence.hung:
        return HangResult(True, f"the processes diverged at step {divergence.step}: {divergence.detail}", "divergence",
                          stuck=tuple(sorted({p for side in divergence.sides for p in side.processes})),
                          explanation=_DIVERGED_HUNG, hints=(_DIVERGENCE_HINT,), **common)
    if stalled:
        return _stall(states, idle, facts, common)
    if divergence is not None:
        return HangResult(False, f"the processes diverged at step {divergence.step}: {divergence.detail}; the job did "
                          "not hang: collectives paired up across different programs, so values from that step on "
                          "are wrong", "divergence", explanation=_DIVERGED, hints=(_DIVERGENCE_HINT,), **common)
    return _ended(states, facts, common)


def _state(facts: JobFacts, index: int) -> ProcessState:
    outcome = facts.outcomes.get(index) or {}
    record = facts.records.get(index)
    if outcome.get("status") == "dead" or (record is None and index in facts.silent):
        return _dead_state(index, record, outcome, facts.silent.get(index) or {})
    if record is None:
        return ProcessState(index, "unknown", "sent no record", note="its record never came")
    state = process_state(record)
    status = outcome.get("status")
    if status in ("finished", "raised"):
        error = brief_error(outcome.get("error"))
        detail = "finished" if status == "finished" else f"failed: {error}"
        if status == "raised" and state.function is not None:
            detail += f" (in or after {state.function} call {state.call_index})"
        # a process that raised stands where it raised (its record's line is its last call's)
        source = (location(outcome.get("user")) or state.source) if status == "raised" else state.source
        return ProcessState(index, "finished" if status == "finished" else "failed", detail, source=source,
                            function=state.function, call_index=state.call_index, step=state.step,
                            last_calls=state.last_calls, steps=state.steps, note=error or "")
    return state


def brief_error(text: str | None, limit: int = 240) -> str | None:
    """An error message without XLA's repeated prefixes, cut to ``limit`` characters.

        >>> brief_error("JaxRuntimeError: INTERNAL: Error dispatching computation: Error dispatching computation: "
        ...             "Gloo all-reduce failed: Connection closed by peer")
        'JaxRuntimeError: INTERNAL: Gloo all-reduce failed: Connection closed by peer'
    """
    if not text:
        return text
    text = text.replace("Error dispatching computation: ", "")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _dead_state(index: int, record: dict | None, outcome: dict, seen: dict) -> ProcessState:
    """A process that died (its parent saw the exit) or stopped answering (its heartbeat stopped)."""
    how = (f"died ({outcome['signal']})" if outcome.get("signal") else
           f"died (exit status {outcome['exit_code']})" if outcome.get("exit_code") is not None else
           "stopped answering (it died, or froze with its Python threads blocked)")
    last = _latest(seen.get("last"), ((record or {}).get("calls") or [None])[-1])
    where = outcome.get("user") or seen.get("user") or (record or {}).get("user")
    at = f" at {short(where)}" if where else ""
    said = f": {brief_error(outcome['error'])}" if outcome.get("signal") and outcome.get("error") else ""
    inside = last.get("kind") == "call" and last.get("returned") is None  # it died inside that call
    after = (f"; last seen {'in' if inside else 'after'} {last['function']} call {last['index']}"
             if last.get("function") else "")
    detail = f"{how}{at}{said}{after}"
    state = process_state(record) if record else None
    return ProcessState(index, "dead", detail, source=location(where), function=last.get("function"),
                        call_index=last.get("index"), step=last.get("step"), exit_code=outcome.get("exit_code"),
                        signal=outcome.get("signal"), last_calls=state.last_calls if state else (),
                        steps=(record or {}).get("steps"), note=outcome.get("error") or "")


def _latest(*calls: dict | None) -> dict:
    """The latest of the calls known of a process (its last heartbeat's, its flight-record file's)."""
    known = [c for c in calls if c and c.get("function")]
    return max(known, key=lambda c: c.get("seq") or 0) if known else {}


def _dead(states: dict[int, ProcessState], dead: list[int], common: dict[str, Any]) -> HangResult:
    lines = [f"process {i} {states[i].detail}" for i in dead]
    others = _group_others(states, set(dead))
    diverged = common.get("divergence")
    said = [f"the processes diverged at step {diverged.step}: {diverged.detail}"] if diverged is not None else []
    verdict = "; ".join(lines + others + said)
    explanation = ("A process of the job died: every collective needs all of them, so the others failed in (or wait "
                   "forever in) the next collective that needed it. Its exit status and its last calls say where it "
                   "stopped.")
    hints: tuple[str, ...] = (
        "look at the dead process's own log (its exit status: a signal such as SIGKILL is often the out-of-memory "
        "killer, SIGABRT a runtime check) and make the job restart from a checkpoint",)
    if any(_MISMATCHED.search(states[i].note or "") for i in dead):  # the runtime saw the divergence: it is the cause
        explanation = _DIED_OF_MISMATCH + explanation
        hints = (_DIVERGENCE_HINT, *hints)
    return HangResult(True, verdict, "dead", stuck=tuple(dead), explanation=explanation, hints=hints, **common)


# how collective runtimes say that the peers' collectives did not match (gloo: "Received data size doesn't match
# expected size. Is there a distributed collective mismatch in your code?")
_MISMATCHED = re.compile(r"collective mismatch|size doesn't match|mismatched collective", re.IGNORECASE)
_DIED_OF_MISMATCH = ("The runtime aborted it because the collectives of the processes did not match (its words are in "
                     "the verdict): the processes ran different collectives at the same point, i.e. different "
                     "programs or a call that one process made and another did not. ")


def _deadlock(states: dict[int, ProcessState], deadlock: object, common: dict[str, Any],
              record: dict | None = None) -> HangResult:
    from jaxdbg.hang.result import Deadlock

    assert isinstance(deadlock, Deadlock)
    prefix = f"deadlock in process {deadlock.process}: " if len(states) > 1 else "deadlock: "
    state = states[deadlock.process]
    verdict = prefix + "; ".join(deadlock.cycle)
    if state.function is not None:
        named = call_name({"function": state.function, "index": state.call_index})
        verdict += f" ({'in' if state.state != 'host' else 'after'} {named})"
    if deadlock.queues_only and not deadlock.callback:  # each waits on a queue only the other fills: no lock
        return HangResult(True, verdict, "deadlock", stuck=(deadlock.process,), deadlock=deadlock, explanation=(
            "Threads of one process wait for each other: nothing can move. Each blocks on a queue (full when it "
            "puts, empty when it takes) that only the other thread of the cycle can free, while that thread blocks "
            "on another queue the first one would fill: what one side expects of the other (how many items, when "
            "an acknowledgement comes) does not match what the other does."),
            hints=("make the two sides agree on when each puts (an acknowledgement every N items on both sides), "
                   "or let one side not wait for the other: a get/put with a timeout that raises shows the "
                   "mismatch instead of hanging",), **common)
    if deadlock.queue and not deadlock.callback:  # a producer/consumer pair, one of them blocked in a lock or join
        joined = wait_hint(record) if record is not None else None
        return HangResult(True, verdict, "deadlock", stuck=(deadlock.process,), deadlock=deadlock, explanation=(
            "Threads of one process wait for each other: nothing can move. A thread blocks on a bounded queue (full "
            "when it puts, empty when it takes) that only another thread of the cycle can free, and that thread "
            "waits for the first one (joins it, or waits for a lock it took around the queue call)."),
            hints=(joined or "never block on a queue while holding a lock the other side needs: call "
                   "q.put(...)/q.get() outside the `with lock:` block (update the shared state under the lock, then "
                   "put), or give it a timeout and retry",), **common)
    if not deadlock.callback:  # threads of the program's own, each holding a lock the other needs
        return HangResult(True, verdict, "deadlock", stuck=(deadlock.process,), deadlock=deadlock, explanation=(
            "Threads of one process wait for each other: nothing can move. Each holds a lock (or waits for a "
            "thread) that another of the cycle needs before it lets go of its own."),
            hints=("take the locks in one order everywhere (or hold one at a time), and never join a thread while "
                   "holding a lock it needs",), **common)
    return HangResult(True, verdict, "deadlock", stuck=(deadlock.process,), deadlock=deadlock, explanation=(
        "Threads of one process wait for each other: nothing can move. A host callback runs while the jitted call "
        "that made it waits for it (on CPU on the calling thread itself), so a callback that takes a lock the "
        "caller holds around the call can never get it."),
        hints=("release the lock before calling the jitted function (or take it only inside the callback); a "
               "callback must never wait for the thread that called the function it runs in",), **common)


def _stall(states: dict[int, ProcessState], idle: list[int], facts: JobFacts, common: dict[str, Any]) -> HangResult:
    host = [i for i in idle if states[i].state == "host"]
    callback = [i for i in idle if states[i].state == "callback"]
    running = [i for i in idle if states[i].state == "running"]
    if facts.count == 1:
        state = states[0]
        stuck_words = {"host": "is stuck", "callback": "is stuck", "running": "is stuck"}[state.state]
        verdict = f"the process {stuck_words} {state.detail}"
        queue_hint = wait_hint(facts.records.get(0) or {})
        hints = (queue_hint,) if queue_hint else _single_hints(state)
        explanation = _single_explanation(state)
        awaiting = loop_waits(facts.records.get(0))
        if awaiting:  # the thread stands in asyncio's select: what waits is a task, at its own await
            verdict += f"; {awaiting[0]}"
            hints = (awaiting[1], *hints[1:]) if state.state == "host" else hints
        alone = lone_queue(facts.records.get(0) or {})
        if alone and not queue_hint:  # no thread left that could end the wait: that is the cause
            verdict += f"; {alone[0]}"
            hints = (alone[1], *hints)
        died = thread_deaths(facts.records.get(0))
        if died:  # what it waits for was that thread's to give: its error is the cause, the wait the symptom
            verdict += f"; {died[0]}"
            explanation = _THREAD_DIED.format(who="An asyncio task" if died[0].startswith("task") else "A thread",
                                              kind=died[0].split()[0]) + explanation
            hints = (died[1], *hints)
        return HangResult(True, verdict, "stall", stuck=(0,), explanation=explanation, hints=hints, **common)
    if host or callback:
        stuck = callback + [i for i in host if i not in callback] if (host and running) or callback else host
    else:
        steps = {i: -1 if states[i].step is None else int(states[i].step or 0) for i in running}
        lowest = min(steps.values())
        stuck = [i for i in running if steps[i] == lowest]
        ended = [i for i, s in states.items() if s.state in ("finished", "failed")]
        if len(stuck) == len(running) and ended:  # the ones that ended can never join: they are the missing ones
            return _ended_early(states, ended, running, common)
        if len(stuck) == len(running):
            verdict = (f"every process waits inside {_call_words(states[running[0]])}: no process is missing from "
                       "the collective, yet it did not complete (a runtime or network hang, or a computation "
                       f"longer than --stall {facts.stall_s:g} s)")
            return HangResult(True, verdict, "stall", stuck=tuple(running), explanation=_ALL_INSIDE, **common)
    lines = [f"process {i} is stuck {states[i].detail}" for i in stuck]
    verdict = "; ".join(lines + _group_others(states, set(stuck)))
    inside = all(states[i].state != "host" for i in stuck)
    return HangResult(True, verdict, "stall", stuck=tuple(stuck), explanation=(
        _STUCK_INSIDE if inside else _STUCK_OUTSIDE), hints=tuple(_stuck_hints(states, stuck, facts.records)), **common)


def _ended_early(states: dict[int, ProcessState], ended: list[int], waiting: list[int],
                 common: dict[str, Any]) -> HangResult:
    """Some processes ended (finished or failed) while the others wait inside a collective that needs them."""
    def last(state: ProcessState) -> str:
        return f"after {_call_words(state)}" if state.function is not None else "before any jitted call"

    lines = [f"process {i} {states[i].detail} {last(states[i])}" if states[i].state == "finished" else
             f"process {i} {states[i].detail}" for i in ended]
    verdict = "; ".join(lines + _group_others(states, set(ended)))
    site = states[waiting[0]].source
    points = skip_points(site.file, site.line) if site is not None else []
    if points and site is not None:
        exits = ", ".join(p.words(site.file) for p in points)
        what = "the loop" if points[0].in_loop else "the program"
        where = f": {what} can go past {short(site)} at {exits}; make that condition the same on every process"
    else:
        where = (" (a call under a condition that differs between processes: process_index, local data, an early "
                 "break) and make every process run it")
    hints = [f"process {i}'s last call was {_call_words(states[i])} while process {waiting[0]} waits in "
             f"{_call_words(states[waiting[0]])}: find the call process {i} skipped{where}"
             for i in ended if states[i].state == "finished" and states[i].function is not None]
    failed = [i for i in ended if states[i].state == "failed"]
    hints += [f"process {i} raised: fix that error first (its message is above); the others only wait for it"
              for i in failed]
    # every process that ended raised: "it skipped a call, or left its loop earlier" would send the user looking
    # for a condition in the loop; the error is what ended it
    explanation = (_FAILED_EARLY + _WAIT_FOR_FAILED if failed and len(failed) == len(ended)
                   else (_FAILED_EARLY if failed else "") + _ENDED_EARLY)
    return HangResult(True, verdict, "stall", stuck=tuple(ended), explanation=explanation, hints=tuple(hints),
                      **common)


def _ended(states: dict[int, ProcessState], facts: JobFacts, common: dict[str, Any]) -> HangResult:
    failed = [i for i, s in states.items() if s.state == "failed"]
    if failed:
        first = states[failed[0]]
        who = "the program" if facts.count == 1 else f"process {failed[0]}"
        # several processes raised: each one's error and line (a barrier reached from different lines says where
        # their paths parted), the first in full, the others' where they differ
        others = [f"process {i} {states[i].detail}" for i in failed[1:] if states[i].source != first.source]
        return HangResult(False, "; ".join([f"{who} {first.detail}", *others]), "failed",
                          error=first.note or first.detail,
                          explanation="The program failed on its own; it did not stall.", **common)
    if facts.trigger in ("signal", "timeout"):
        busy = [f"process {i} {s.detail}" if facts.count > 1 else s.detail for i, s in states.items()
                if s.state in ("running", "host", "callback")]
        asked = "at SIGUSR1" if facts.trigger == "signal" else "at SIGTERM" if SIGTERM_NOTE in facts.notes else (
            "at --timeout")
        long_calls = [hint for s in states.values() if (hint := _long_call_hint(s, facts.stall_s))]
        return HangResult(False, f"not stalled {asked}: the program was still making progress ({'; '.join(busy)})",
                          "running", explanation=(
                              "When it was asked, the program had moved (a call, a result, or its host code using the "
                              "CPU) within the last seconds: it is slow, not stuck."), hints=tuple(long_calls),
                          **common)
    if any(s.state == "unknown" for s in states.values()):
        missing = [f"process {i}" for i, s in states.items() if s.state == "unknown"]
        return HangResult(False, f"the job ended, but {', '.join(missing)} sent no record", "failed", **common)
    steps = max((s.steps or 0) for s in states.values())
    calls = sum(len(s.last_calls) for s in states.values())
    said = f", {steps} steps across {facts.count} processes" if facts.count > 1 else ""
    return HangResult(False, f"the program finished{said}; no stall, no divergence", "finished",
                      explanation=f"Every process finished; the flight record holds their last {calls} calls.",
                      **common)


def _long_call_hint(state: ProcessState, stall_s: float) -> str | None:
    """A jitted call in flight for --stall seconds and more while the device works (the CPU busy on CPU devices,
    so no stall): a loop in its program that never ends (a ``lax.while_loop`` whose condition stays true) looks
    just like this, and the user is told so, with what the function's earlier calls took."""
    if state.state != "running" or state.function is None:
        return None
    current = next((row for row in reversed(state.last_calls) if row.kind == "call" and row.returned_s_ago is None
                    and (row.function, row.call_index) == (state.function, state.call_index)), None)
    if current is None or current.started_s_ago < stall_s:
        return None
    earlier = [row.started_s_ago - row.returned_s_ago for row in state.last_calls if row.kind == "call"
               and row.function == state.function and row.returned_s_ago is not None]
    before = (f"its {len(earlier)} earlier call(s) shown took at most {max(earlier):.1f} s" if earlier
              else "its first call, compile included")
    return (f"{call_name({'function': state.function, 'index': state.call_index})} had run for "
            f"{current.started_s_ago:.0f} s without returning ({before}): if that is longer than it should take, a "
            "loop inside it may never end, e.g. a lax.while_loop whose condition stays true (a tolerance below "
            "float32's resolution, an iteration that oscillates or diverges): bound its iterations in the "
            "condition; if the call is merely long, give --timeout more")


def _call_words(state: ProcessState) -> str:
    over = f" ({state.collective})" if state.collective else ""
    return f"{call_name({'function': state.function, 'index': state.call_index})}{over}"


def _group_others(states: dict[int, ProcessState], excluded: set[int]) -> list[str]:
    """'processes 0, 2 wait inside step call 1 (...)' for the processes not named, grouped by what they do."""
    groups: dict[tuple[str, str], list[ProcessState]] = {}
    for index, state in states.items():
        if index in excluded:
            continue
        # The table says how long each was idle, and the native frame a waiter was sampled in differs between
        # processes waiting in the same collective: neither splits a group.
        groups.setdefault((_VERBS.get(state.state, ""), _without_native_wait(state)), []).append(state)
    lines = []
    for (verb, detail), members in groups.items():
        details = {_IDLE_FOR.sub("", m.detail) for m in members}
        said = details.pop() if len(details) == 1 else detail
        who, verb = ("process", verb) if len(members) == 1 else ("processes", _PLURAL.get(verb, verb))
        indices = ", ".join(str(m.index) for m in members)
        lines.append(" ".join(word for word in (who, indices, verb, said.strip()) if word))
    return lines


def _without_native_wait(state: ProcessState) -> str:
    """A process's line without its idle time and, for one inside a call, without the native frame it waits in."""
    detail = _IDLE_FOR.sub("", state.detail)
    if state.state in ("running", "callback") and state.waiting_in:
        for said in (f", waiting in {state.waiting_in}", f", {state.waiting_in}"):
            if said in detail:
                return detail.replace(said, "", 1)
    return detail


def _stuck_hints(states: dict[int, ProcessState], stuck: Iterable[int], records: dict[int, dict]) -> list[str]:
    hints = []
    for index in stuck:
        state = states[index]
        died = thread_deaths(records.get(index))
        if died:
            hints.append(f"process {index}: {died[1]}")
        queue_hint = wait_hint(records.get(index) or {}) if state.state == "host" else None
        if queue_hint:  # its main thread joins a thread stuck on a queue: that says more than "see the line"
            hints.append(_others_wait(f"process {index}: {queue_hint}"))
        elif state.state == "host":
            hints.append(_others_wait(f"process {index} never reached the next collective: see what "
                                      f"{short(state.source)} waits for ({state.waiting_in or 'its stack below'})"))
        elif state.state == "callback":
            hints.append(f"process {index}'s host callback does not return: see its thread's stack below")
    return hints


def _others_wait(hint: str) -> str:
    """A hint about one stuck process of a job, saying that it holds up the rest."""
    return f"{hint}; every other process waits for it"


def thread_deaths(record: dict | None) -> tuple[str, str] | None:
    """``(words, hint)`` for the threads of a stuck process that died by an uncaught exception (Python prints
    it and goes on; a consumer waiting for the dead producer's next item, event or result waits forever), or None.

    Example:
        >>> words, hint = thread_deaths({"thread_deaths": [{"thread": "loader", "error": "OSError: gone",
        ...                              "source": {"file": "/w/io.py", "line": 9, "function": "read"}}]})
        >>> words
        'thread `loader` died earlier with OSError: gone at io.py:9 (read)'
    """
    deaths = (record or {}).get("thread_deaths") or []
    if not deaths:
        return None
    first = deaths[0]
    kind = first.get("kind") or "thread"
    at = f" at {short(first['source'])}" if first.get("source") else ""
    more = f" ({len(deaths)} {kind}s died so)" if len(deaths) > 1 else ""
    words = f"{kind} `{first.get('thread')}` died earlier with {first.get('error')}{at}{more}"
    handing = ("await it (`asyncio.gather(*tasks)` raises its error) or give it a done callback that stops the "
               "consumer" if kind == "task" else
               "put it on the queue and raise it there, or run the work with concurrent.futures, whose result() "
               "raises it")
    return words, (f"fix the error that killed {kind} `{first.get('thread')}`{at}: what the stuck line waits for "
                   f"(the next item on a queue, an event, a result) was that {kind}'s to give; and hand a worker's "
                   f"exception to its consumer ({handing}), so a failure ends the program, not hangs it")


def loop_waits(record: dict | None) -> tuple[str, str] | None:
    """``(words, hint)`` for a main thread idle in an asyncio event loop: the tasks it waits on, each at the user
    line its coroutine awaits at; None where it runs no event loop (or no task waits at a user line).

    Example:
        >>> loop_waits({"event_loop": {"pending": [{"name": "Task-1", "awaits": {"file": "/w/rl.py", "line": 34,
        ...                                          "function": "learner"}}], "more": 0, "failed": []}})[0]
        'its asyncio event loop waits on task `Task-1` at rl.py:34 (learner)'
    """
    loop = (record or {}).get("event_loop") or {}
    pending = [t for t in loop.get("pending") or () if t.get("awaits")]
    if not pending:
        return None
    more = len(loop.get("pending") or ()) - len(pending) + int(loop.get("more") or 0)
    tasks = ", ".join(f"task `{t['name']}` at {short(t['awaits'])}" for t in pending)
    words = f"its asyncio event loop waits on {tasks}" + (f" (and {more} more)" if more else "")
    first = pending[0]
    return words, (f"see what {short(first['awaits'])} awaits (in task `{first['name']}`) and why it never comes; "
                   "an `await` with a deadline (`asyncio.wait_for(..., timeout)`) turns the wait into an error")


_THREAD_DIED = ("{who} of the program ended by an uncaught exception (Python went on without it); what the stuck "
                "line waits for was most likely that {kind}'s to give. ")


def _single_explanation(state: ProcessState) -> str:
    if state.exiting:
        return ("The program's main code returned, but Python exits only when every non-daemon thread has ended, "
                "and one of its threads waits for something that never comes.")
    if state.tracing:
        return ("jax is tracing the function: its Python body runs once to build the computation, and it waits in "
                "the user's own code there, not on the device; nothing has moved since and the process used almost "
                "no CPU.")
    if state.state == "host" and state.waiting_in.startswith(SPIN_WORDS):
        return ("The program's main thread goes round the same loop in its own code at full speed, and nothing in "
                "it changes: its variables and the globals it reads keep their values, and no JAX call starts or "
                "finishes. It waits for something (a flag, a file, another thread) that does not come, using a CPU "
                "while it waits: busy, but stuck.")
    if state.state == "host":
        return ("The program's main thread stands in its own code, outside any JAX call, and nothing has moved "
                "since: no call started or finished, and the process used almost no CPU.")
    if state.state == "callback":
        return "A host callback does not return, so the jitted call that made it cannot finish."
    return ("The program waits inside a jitted call (or for its results) and nothing has moved: no other call, "
            "and almost no CPU. On CPU a computation uses the CPU, so this is a wait, not work.")


def _single_hints(state: ProcessState) -> tuple[str, ...]:
    if state.exiting:
        return (f"end the thread at {short(state.source)} when the program is done (put a sentinel on its queue, set "
                "the event it waits for) or make it a daemon thread (threading.Thread(..., daemon=True))",)
    if state.state == "host" and state.waiting_in.startswith(SPIN_WORDS):
        return (f"the loop at {short(state.source)} never ends: see what its condition waits for (a flag another "
                "thread should set, a file another job should write) and why it never comes; wait on a "
                "threading.Event or queue.get(timeout=...) with a deadline instead of spinning",)
    if state.state == "host" and state.waiting_in.startswith("a sleep"):  # a polling loop: its condition never held
        return (f"{short(state.source)} sleeps: where a loop polls there, see what it waits to become true (a file, "
                "a flag, another process) and why it never does, and give the loop a deadline",)
    if state.state == "host" and state.waiting_in:
        return (f"see what {short(state.source)} waits for: {state.waiting_in}",)
    return ()


def _divergence(facts: JobFacts, states: dict[int, ProcessState]) -> Divergence | None:
    """The first step at which the processes ran different programs: found while the job ran, or in the
    records' flight records (calls of global programs, compared step by step)."""
    if facts.count < 2:
        return None
    dead = {i for i, state in states.items() if state.state == "dead"}
    ended = {i for i, state in states.items() if state.state in ("dead", "failed")}
    rows = _rows_online(facts.divergence) if facts.divergence else _rows_from_records(facts.records, ended)
    if rows is None:
        return None
    step, by_process = rows
    sides: dict[str, list[int]] = {}
    for index, row in sorted(by_process.items()):
        sides.setdefault(row["key"] or f"{row['function']} (program unread)", []).append(index)
    made = []
    for members in sides.values():
        row = by_process[members[0]]
        made.append(DivergenceSide(tuple(members), row.get("function"), row.get("index"), location(row.get("site")),
                                   row.get("key")))
    words = [f"{_who(side.processes)} called {side.function} #{side.call_index} at {short(side.source)}"
             + (" (and died in it)" if side.program is None and set(side.processes) <= dead else "")
             for side in made]
    hung = any(states[i].state in ("running", "callback") and states[i].step == step for i in states)
    return Divergence(step, tuple(made), hung, " while ".join(words))


def _who(processes: tuple[int, ...]) -> str:
    return f"process {processes[0]}" if len(processes) == 1 else f"processes {', '.join(map(str, processes))}"


def _rows_online(found: dict) -> tuple[int, dict[int, dict]] | None:
    rows = {int(i): row for i, row in (found.get("rows") or {}).items()}
    return (int(found["step"]), rows) if len(rows) > 1 else None


def _rows_from_records(records: dict[int, dict], ended: Set[int] = frozenset()) -> tuple[int, dict[int, dict]] | None:
    """The first step whose calls differ between processes, from their flight records. The last call of a process
    that died or failed in it before its program was read (aborted in a function's first call by collectives that
    did not match; a collective that lost its peer raised) stands at the process's next step, with its function's
    one program if the process ran it before, else with its function only: it differs from the others' there
    when its function does."""
    by_step: dict[int, dict[int, dict]] = {}
    for index, record in records.items():
        for call in record.get("calls") or ():
            step = step_of(record, call) if call.get("kind") == "call" else None
            program = program_of(record, call)
            if step is None or program is None:
                continue
            by_step.setdefault(step, {})[index] = {"key": program["key"], "function": call["function"],
                                                   "index": call["index"], "site": call.get("site")}
    unread: dict[int, tuple[int, dict]] = {}
    for index in ended & set(records):
        record = records[index]
        last = next((c for c in reversed(record.get("calls") or ()) if c.get("kind") == "call"), None)
        if last is None or program_of(record, last) is not None or not (last.get("returned") is None or
                                                                         last.get("error")):
            continue
        known = {p["key"] for p in (record.get("programs") or {}).values() if p.get("function") == last.get("function")}
        unread[index] = (int(record.get("steps") or 0), {
            "key": known.pop() if len(known) == 1 else None, "function": last.get("function"),
            "index": last.get("index"), "site": last.get("site")})
    for step in sorted({*by_step, *(step for step, _ in unread.values())}):
        rows = dict(by_step.get(step, {}))
        for index, (at, row) in sorted(unread.items()):
            if at == step and (row["key"] is not None or row["function"] not in {r["function"] for r in rows.values()}):
                rows[index] = row
        if len(rows) > 1 and len({row["key"] or row["function"] for row in rows.values()}) > 1:
            return step, rows
    return None


_DIVERGED = ("At the same step (the same count of calls of programs that span several processes) the processes "
             "ran different programs. Their collectives paired up anyway (same devices, compatible shapes), so the "
             "job went on with values mixed across programs: wrong from that step on, silently.")
_DIVERGED_HUNG = ("At the same step the processes entered different programs, whose collectives do not match: "
                  "each waits for a peer that is in another program.")
_DIVERGENCE_HINT = ("make every process call the same jitted functions in the same order: a branch on "
                    "jax.process_index(), on per-process data or on a per-process counter diverges")
_STUCK_OUTSIDE = ("A collective needs every process of the job. The processes named as stuck stand outside JAX, "
                  "in their own code, and never entered it; the others wait for them inside the collective.")
_STUCK_INSIDE = "The processes named as stuck have not finished their part; the others wait for them."
_FAILED_EARLY = "A process raised an error and left the job. "
_ENDED_EARLY = ("A process ended while the others wait inside a collective that needs every process: it ran fewer "
                "collective calls than they did (it skipped one, or left its loop earlier), so the collective they "
                "wait in can never complete.")
_WAIT_FOR_FAILED = ("The others wait inside a collective that needs every process, which cannot complete without "
                    "it: they wait until a timeout, or fail in that collective once its connection closes.")
_ALL_INSIDE = ("Every process is inside the same program at the same step: none is missing, yet the collective "
               "never completed.")
