"""``hang-hunt`` from the outside: options, and the contained run the command line uses.

This module imports neither jax nor the target: the program runs in a child process
(:func:`jaxdbg.hang.session.hang_job`) under the flight recorder and the watchdog, which send the facts of
the verdict; the verdict itself (:func:`jaxdbg.hang.verdict.judge`) is drawn here. A child that dies without
a word still leaves its flight-record file, and the exit status says how it died. SIGUSR1 sent to jaxdbg is
passed on to the program (the verdict now).

Example:
    >>> from jaxdbg.target import parse_target
    >>> run = hunt(parse_target("tests/corpus/hang_lock/train.py"), HangOptions(stall=3))   # doctest: +SKIP
    >>> run.result.kind, run.exit_code                                                    # doctest: +SKIP
    ('deadlock', 1)
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from jaxdbg._errors import UsageError
from jaxdbg.hang.messages import ACK_WAIT_S, ChildStarted, HangJob, HangVerdict
from jaxdbg.hang.result import HangResult
from jaxdbg.hang.verdict import SIGTERM_NOTE, JobFacts, facts_from_json, judge
from jaxdbg.hang.watchdog import DEFAULT_STALL_S, RECORD_FILE
from jaxdbg.launch import launched_place
from jaxdbg.protocol import Message
from jaxdbg.runner import Outcome, run_contained, sigterm_came
from jaxdbg.target import TargetSpec, check_inputs

GRACE_S = 60.0  # past --timeout, how long the verdict may take before the child is stopped without one
PEER_FILES_WAIT_S = 15.0  # how long process 0 waits for a dead peer's exit.json in a shared --out


@dataclass(frozen=True)
class HangOptions:
    """The command's options (see ``jaxdbg hang-hunt --help``)."""

    stall: float = DEFAULT_STALL_S
    timeout: float | None = None
    keep_running: bool = False
    native: bool = True
    args: str | None = None
    inputs: str | None = None
    seed: int = 0
    out_dir: str | None = None


@dataclass(frozen=True)
class HangRun:
    """A finished hunt: the result, the artifacts written, and the child's jax environment (or None)."""

    result: HangResult
    artifacts: dict[str, str] = field(default_factory=dict)
    environment: dict | None = None
    left_running: int | None = None  # the program's pid, left running (--keep-running)

    @property
    def exit_code(self) -> int:
        return self.result.exit_code


def hunt(spec: TargetSpec, options: HangOptions) -> HangRun:
    """Run the target contained under the recorder and watchdog; the verdict when it stalls or ends."""
    check_options(spec, options)
    started = time.time()
    pid: list[int] = []

    def heard(message: Message) -> None:
        if isinstance(message, ChildStarted):
            pid.append(message.pid)

    with forwarding_sigusr1(pid):
        outcome = run_contained(
            HangJob(spec, options), on_message=heard,
            timeout=None if options.timeout is None else options.timeout + GRACE_S,
            until=lambda m: isinstance(m, HangVerdict) and m.stopping, keep_running=options.keep_running,
            sigterm_as_timeout=True)
    outcome.reraise_expected()
    verdict = outcome.last(HangVerdict)
    place = launched_place(os.environ) or (0, 1)
    folder = options.out_dir
    if folder and place[1] > 1:
        folder = os.path.join(folder, f"process-{place[0]}")
    if verdict is not None:
        facts = facts_from_json(verdict.facts)
        if verdict.environment is not None:
            place = (verdict.environment.get("process_index", 0), verdict.environment.get("process_count", 1))
    else:
        facts = facts_without_verdict(outcome, place, options, folder)
        write_exit_file(folder, facts.outcomes.get(place[0]))
        if place[0] != 0 and place[1] > 1 and options.out_dir:
            facts = job_facts_of_process_0(options.out_dir, started) or facts
    if outcome.terminated:  # (its watchdog may have drawn a verdict at the SIGUSR1 that asks for its stacks)
        facts.trigger = "timeout"
        facts.notes.append(SIGTERM_NOTE)
    if place[0] == 0 and facts.count > 1 and options.out_dir:
        add_peer_files(facts, options.out_dir)
    result = judge(facts)
    artifacts = write_artifacts(facts, result, outcome, folder)
    left = pid[0] if options.keep_running and outcome.status == "stopped" and pid else None
    return HangRun(result, artifacts, verdict.environment if verdict else None, left)


def check_options(spec: TargetSpec, options: HangOptions) -> None:
    """Fail fast (exit 2) on options that cannot work, before anything runs."""
    if options.stall <= 0:
        raise UsageError(f"--stall {options.stall:g}: give a number of seconds above 0, e.g. --stall 30")
    check_inputs(spec, options.inputs, options.args)


@contextlib.contextmanager
def forwarding_sigusr1(pid: list[int]) -> Iterator[None]:
    """While the program runs, SIGUSR1 sent to jaxdbg goes on to the program (whose watchdog draws the verdict)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGUSR1"):
        yield
        return

    def forward(signum: int, _frame: object) -> None:
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid[0], signal.SIGUSR1)

    previous = signal.signal(signal.SIGUSR1, forward)
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR1, previous if previous is not None else signal.SIG_DFL)


def facts_without_verdict(outcome: Outcome, place: tuple[int, int], options: HangOptions,
                          folder: str | None) -> JobFacts:
    """The facts of a program that sent no verdict: it died (its exit status says how), froze past --timeout,
    or was stopped at SIGTERM to jaxdbg (judged as at --timeout); its flight-record file holds its last calls."""
    index, count = place
    record = read_record_file(folder) or {"calls": [], "threads": []}
    record["index"] = index
    ended: dict[str, Any]
    if outcome.status == "crash":
        from jaxdbg.runner import native_fatal_message

        said = native_fatal_message(outcome.stderr)  # (gloo's words for mismatched collectives, a failed CHECK)
        ended = {"status": "dead", "signal": outcome.signal, **({"error": said} if said else {})}
    elif outcome.status == "timeout" and outcome.terminated:  # alive when SIGTERM stopped it: its record says where
        ended = {}
    elif outcome.status == "timeout":
        ended = {"status": "dead", "error": f"it did not answer within --timeout + {GRACE_S:.0f} s (frozen)"}
    elif outcome.status == "exception" and outcome.exception is not None:
        ended = {"status": "raised", "error": f"{outcome.exception.type}: {outcome.exception.message}"[:300]}
        if outcome.exception.user_frame is not None:
            ended["user"] = outcome.exception.user_frame.as_dict()
    else:
        ended = {"status": "dead", "exit_code": outcome.returncode}
    if outcome.crash_frame is not None:  # where faulthandler saw it die: fresher than its last flight record
        record["user"] = ended["user"] = outcome.crash_frame.as_dict()
    trigger = "timeout" if outcome.status == "timeout" else None
    return JobFacts(count, trigger, options.stall, {index: record}, {index: ended} if ended else {},
                    notes=[f"the program sent no verdict: it {outcome.describe()}"])


EXIT_FILE = "exit.json"  # how this process's program ended, written as soon as it is known (a peer reads it)


def write_exit_file(folder: str | None, ended: dict | None) -> None:
    if folder and ended:
        with contextlib.suppress(OSError):
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, EXIT_FILE), "w") as handle:
                json.dump(ended, handle)


def read_record_file(folder: str | None) -> dict | None:
    return _read_json(os.path.join(folder, RECORD_FILE)) if folder else None


def add_peer_files(facts: JobFacts, out_dir: str) -> None:
    """Where the job's processes share ``--out`` (one machine, or a shared filesystem): a process that sent
    no record may have left its flight-record file, and its jaxdbg says how it died (``exit.json``)."""
    missing = [i for i in range(facts.count) if i not in facts.records]
    deadline = time.time() + PEER_FILES_WAIT_S
    for index in missing:
        folder = os.path.join(out_dir, f"process-{index}")
        if not os.path.isdir(folder):
            continue
        record = read_record_file(folder)
        if record is not None:
            facts.records[index] = {**record, "index": index}
        ended = _read_json(os.path.join(folder, EXIT_FILE))
        while ended is None and time.time() < deadline and not sigterm_came():  # (SIGTERM: report now)
            time.sleep(0.2)
            ended = _read_json(os.path.join(folder, EXIT_FILE))
        if ended is not None:
            facts.outcomes[index] = ended
        elif record is not None:
            facts.outcomes.setdefault(index, {"status": "dead"})


def job_facts_of_process_0(out_dir: str, since: float) -> JobFacts | None:
    """The job's facts as process 0 judged them, from its files in a shared ``--out``: a process whose program
    ended before the job's verdict reached it (the coordination service goes down with process 0, and gloo
    aborts its peers) still reports the job's verdict, not only its own end. None when process 0 wrote none
    (since ``since``) in time: it may first wait :data:`ACK_WAIT_S` for this process to take the verdict."""
    path = os.path.join(out_dir, "process-0", "hang-facts.json")
    deadline = time.time() + ACK_WAIT_S + PEER_FILES_WAIT_S
    while True:
        with contextlib.suppress(OSError):
            if os.path.getmtime(path) >= since and (found := _read_json(path)) is not None:
                return facts_from_json(found)
        if time.time() >= deadline or sigterm_came():  # (SIGTERM: this process reports its own facts now)
            return None
        time.sleep(0.2)


def _read_json(path: str) -> dict | None:
    try:
        with open(path) as handle:
            found = json.load(handle)
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def write_artifacts(facts: JobFacts, result: HangResult, outcome: Outcome, folder: str | None) -> dict[str, str]:
    """The timeline (Perfetto trace and a picture), the job's facts, and the program's output."""
    if not folder:
        return {}
    from jaxdbg.hang.timeline import write_timeline
    from jaxdbg.hang.verdict import facts_json

    os.makedirs(folder, exist_ok=True)
    found: dict[str, str] = {}
    with contextlib.suppress(OSError):
        path = os.path.join(folder, "hang-facts.json")
        with open(path, "w") as handle:
            json.dump(facts_json(facts), handle)
        found["facts"] = os.path.abspath(path)
    found.update(write_timeline(facts, result, folder))
    record = os.path.join(folder, RECORD_FILE)
    if os.path.exists(record):
        found["flight_record"] = os.path.abspath(record)
    for stream in ("stdout", "stderr"):
        text = getattr(outcome, stream)
        if text:
            path = os.path.join(folder, f"target.{stream}.txt")
            with open(path, "w") as handle:
                handle.write(text)
            found[f"target_{stream}"] = os.path.abspath(path)
    return found
