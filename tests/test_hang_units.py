"""hang-hunt's pieces in this process (no child, about a second each): the recorder on a sharded program of 4
CPU devices (its collectives and their devices), pmap'd and ahead-of-time compiled calls, host callbacks and
ready times in the flight record, a
lock-order deadlock between two real threads read from their stacks, and verdicts drawn from records."""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxdbg import jit_layer
from jaxdbg.hang.record import take_record
from jaxdbg.hang.recorder import Recorder
from jaxdbg.hang.states import find_deadlock, lone_queue
from jaxdbg.hang.verdict import JobFacts, judge


def _line(marker: str) -> int:
    return next(i for i, text in enumerate(open(__file__), start=1) if marker in text)


def test_the_recorder_names_a_programs_collectives_with_their_devices_and_line():
    mesh = Mesh(np.array(jax.devices("cpu")[:4]), ("data",))  # tests/conftest.py gives 4 CPU devices
    x = jax.device_put(jnp.arange(32.0).reshape(8, 4), NamedSharding(mesh, P("data")))
    recorder = Recorder()
    with jit_layer.installed(recorder), recorder.listening():
        total = jax.jit(lambda x: jnp.sum(x, axis=0))  # the reduction over the sharded rows
        out = total(x)
        out.block_until_ready()
    (entry,) = recorder.entries()
    program = recorder.programs[entry.program]
    (collective,) = program.collectives
    assert (collective.op, collective.reduce) == ("all-reduce", "sum")
    assert sorted(i for group in collective.groups for i in group) == sorted(d.id for d in jax.devices("cpu")[:4])
    assert collective.source is not None and collective.source.line == _line("the reduction over the sharded rows")
    assert program.processes == (0,) and not program.is_global  # one process: no step to compare with others
    assert program.key == "<lambda>(x: f32[8, 4]) [all-reduce:sum]"
    assert entry.site.line == _line("out = total(x)") and recorder.check_ready() == 1 and entry.ready is not None


def test_pmapped_and_ahead_of_time_compiled_calls_are_in_the_flight_record_with_their_programs():
    recorder = Recorder()
    with jit_layer.installed(recorder), recorder.listening():
        host = jax.devices("cpu")[:4]  # the 4 CPU devices, whatever jax's default backend
        mean = jax.pmap(lambda x: jax.lax.pmean(x, "i"), axis_name="i", devices=host)  # the pmap's all-reduce
        double = jax.jit(lambda x: 2 * x).lower(jnp.ones(3)).compile()
        for _ in range(2):
            mean(jnp.ones((len(host), 3))).block_until_ready()
            double(jnp.ones(3)).block_until_ready()
    entries = recorder.entries()
    assert [(e.function, e.index) for e in entries] == [("<lambda>", 0), ("<lambda>", 0), ("<lambda>", 1),
                                                       ("<lambda>", 1)]
    pmapped, compiled = (recorder.programs[e.program] for e in entries[:2])
    assert [(c.op, c.source.line if c.source else None) for c in pmapped.collectives] == [
        ("all-reduce", _line("the pmap's all-reduce"))]
    assert compiled.note == "" and compiled.collectives == () and entries[3].program == entries[1].program


def test_host_callbacks_are_entries_of_the_call_that_ran_them():
    seen = []
    recorder = Recorder()
    with jit_layer.installed(recorder), recorder.listening():
        step = jax.jit(lambda x: (jax.debug.callback(seen.append, x), x * 2)[1])
        for i in range(3):
            step(jnp.float32(i)).block_until_ready()
    calls = [(e.kind, e.function, e.index, e.seq) for e in recorder.entries()]
    assert calls == [("call", "<lambda>", 0, 0), ("callback", "list.append", 0, 0), ("call", "<lambda>", 1, 1),
                     ("callback", "list.append", 1, 1), ("call", "<lambda>", 2, 2), ("callback", "list.append", 2, 2)]
    assert recorder.progress() == (3, 3, 3, 3) and len(seen) == 3


def test_a_lock_order_deadlock_between_two_threads_is_a_cycle():
    first, second = threading.Lock(), threading.Lock()
    both_hold = threading.Barrier(2)

    def one():
        with first:  # one holds first
            both_hold.wait()
            second.acquire(timeout=6)  # one waits for second

    def two():
        with second:  # two holds second
            both_hold.wait()
            first.acquire(timeout=6)  # two waits for first

    threads = [threading.Thread(target=f, name=f.__name__, daemon=True) for f in (one, two)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    record = take_record(Recorder(), "signal", idle_s=1.0, native=False)
    deadlock = find_deadlock(record)
    assert deadlock is not None and len(deadlock.cycle) == 2
    said = " | ".join(deadlock.cycle)
    assert f"one waits for lock `second` at test_hang_units.py:{_line('one waits for second')} (one)" in said
    assert f"which two holds since test_hang_units.py:{_line('two holds second')} (two)" in said
    assert f"two waits for lock `first` at test_hang_units.py:{_line('two waits for first')} (two)" in said
    result = judge(JobFacts(1, "signal", 30.0, {0: record}))
    assert result.kind == "deadlock" and result.exit_code == 1
    # no host callback takes part: the explanation and the hint speak of the locks' order, not of callbacks
    assert "callback" not in result.explanation + " ".join(result.hints)
    assert "one order" in result.hints[0]
    for thread in threads:  # gone before the next test: a later stack read (hang.watch's example) would see them
        thread.join()


def _record(index: int, function: str, key: str, step_line: int, returned: float | None) -> dict:
    """A process inside (or after) its call of ``function`` at step 5 of a global program."""
    main = {"name": "MainThread", "main": True, "call": None if returned else 9, "in_jax": True, "callback": None,
            "frames": [], "user": {"file": "train.py", "line": step_line, "function": "<module>"},
            "waiting_in": "", "waits_for": None, "holds": []}
    call = {"kind": "call", "seq": 9, "function": function, "index": 5 if function == "train_step" else 0,
            "program": 0, "step": 5 if returned else None, "start": 0.0, "returned": returned, "ready": None,
            "site": {"file": "train.py", "line": step_line, "function": "<module>"}}
    return {"index": index, "idle_s": 40.0, "steps": 5, "calls": [call], "threads": [main],
            "programs": {"0": {"key": key, "function": function, "processes": [0, 1], "collectives": []}}}


def test_processes_stuck_in_different_programs_at_one_step_are_a_hung_divergence():
    records = {0: _record(0, "train_step", "train_step(x: f32[4]) [all-reduce:sum]", 40, None),
               1: _record(1, "eval_step", "eval_step(x: f32[4]) [all-gather]", 42, None)}
    result = judge(JobFacts(2, "stall", 30.0, records))
    assert (result.kind, result.stalled, result.exit_code) == ("divergence", True, 1)
    assert result.divergence.step == 5 and result.divergence.hung
    assert result.verdict == ("the processes diverged at step 5: process 0 called train_step #5 at train.py:40 "
                              "(<module>) while process 1 called eval_step #0 at train.py:42 (<module>)")


def test_a_signal_on_a_working_program_is_not_a_stall():
    record = _record(0, "train_step", "train_step(x: f32[4])", 40, None)
    record["idle_s"] = 0.2  # it moved a moment ago
    result = judge(JobFacts(1, "signal", 30.0, {0: record}))
    assert (result.kind, result.stalled, result.exit_code) == ("running", False, 3)
    assert result.verdict.startswith("not stalled at SIGUSR1: the program was still making progress")


def test_a_call_running_longer_than_the_stall_threshold_is_named_as_a_loop_that_may_never_end():
    """On CPU devices a lax.while_loop that never ends keeps the CPU busy: no stall, but the call has been in flight
    for 45 s while its earlier call took 2 s, and the hint says so (not for a call only 10 s in)."""
    record = _record(0, "implicit_step", "implicit_step(y: f32[32])", 41, None)
    record["idle_s"], record["taken"] = 0.0, 50.0
    record["calls"].insert(0, {**record["calls"][0], "seq": 8, "index": 4, "start": 1.0, "returned": 3.0})
    record["calls"][1].update(index=5, start=5.0)
    result = judge(JobFacts(1, "timeout", 30.0, {0: record}))
    assert (result.kind, result.exit_code) == ("running", 3)
    (hint,) = result.hints
    assert hint.startswith("implicit_step call 5 had run for 45 s without returning (its 1 earlier call(s) shown "
                           "took at most 2.0 s)") and "lax.while_loop" in hint
    record["calls"][1]["start"] = 40.0
    assert judge(JobFacts(1, "timeout", 30.0, {0: record})).hints == ()


def test_a_process_that_finished_while_the_others_wait_in_a_collective_is_the_one_missing():
    """Process 1 skipped one call of train_step (a condition on process_index) and ended; process 0 waits in its
    last call, whose all-reduce needs process 1: not 'every process waits inside', but process 1 is missing."""
    waiting = _record(0, "train_step", "train_step(x: f32[4]) [all-reduce:sum]", 40, None)
    ended = _record(1, "train_step", "train_step(x: f32[4]) [all-reduce:sum]", 40, 1.0)
    ended["calls"][0]["index"] = 4
    result = judge(JobFacts(2, "stall", 30.0, {0: waiting, 1: ended}, outcomes={1: {"status": "finished"}}))
    assert (result.kind, result.stalled, result.exit_code, result.stuck) == ("stall", True, 1, (1,))
    assert result.verdict.startswith("process 1 finished after train_step call 4; process 0 waits inside "
                                     "train_step call 5")
    assert "process 1's last call was train_step call 4" in result.hints[0]


def test_processes_waiting_in_one_collective_are_one_group_whatever_native_frame_each_was_read_in():
    """Processes 0, 2, 3 wait in the same call; the native frame each was sampled in differs (a futex for one, the
    runtime's wait for the others): the verdict groups them, the frame they share said, the one they don't left out."""
    records = {i: _record(i, "train_step", "train_step(x: f32[4]) [all-reduce:sum]", 40, None) for i in (0, 2, 3)}
    records[0]["threads"][0]["waiting_in"] = "a lock, condition or event (futex): BlockUntilReady"
    for i in (2, 3):
        records[i]["threads"][0]["waiting_in"] = "a lock, condition or event (futex)"
    ended = _record(1, "train_step", "train_step(x: f32[4]) [all-reduce:sum]", 40, 1.0)
    ended["calls"][0]["index"] = 4
    records[1] = ended
    result = judge(JobFacts(4, "stall", 30.0, records, outcomes={1: {"status": "finished"}}))
    assert result.stuck == (1,)
    assert "; processes 0, 2, 3 wait inside train_step call 5, called at train.py:40 (<module>)" in result.verdict
    assert "BlockUntilReady" not in result.verdict
    for i in (2, 3):
        records[i]["threads"][0]["waiting_in"] = records[0]["threads"][0]["waiting_in"]
    result = judge(JobFacts(4, "stall", 30.0, records, outcomes={1: {"status": "finished"}}))
    shared = ("processes 0, 2, 3 wait inside train_step call 5, called at train.py:40 (<module>), waiting in a lock, "
              "condition or event (futex): BlockUntilReady")
    assert shared in result.verdict


def test_the_others_are_one_line_in_the_plural_and_the_stuck_ones_hint_says_they_wait_for_it():
    """Process 1 sleeps outside JAX while 0 and 2 wait in the collective; then process 1 is dead while 0 and 2
    sleep: the others read as one group ('wait', 'are'), and the stuck one's hint says it holds up the rest."""
    records = {i: _record(i, "train_step", "train_step(x: f32[4]) [all-reduce:sum]", 40, None) for i in (0, 2)}
    records[1] = _record(1, "train_step", "train_step(x: f32[4]) [all-reduce:sum]", 41, 1.0)
    records[1]["threads"][0].update(in_jax=False, waiting_in="a sleep (clock_nanosleep)")
    result = judge(JobFacts(3, "stall", 30.0, records))
    assert result.stuck == (1,)
    assert result.verdict.endswith("; processes 0, 2 wait inside train_step call 5, called at train.py:40 (<module>)")
    assert result.hints == ("process 1 never reached the next collective: see what train.py:41 (<module>) waits for "
                            "(a sleep (clock_nanosleep)); every other process waits for it",)
    for i in (0, 2):
        records[i] = records[1] | {"index": i}
    del records[1]
    result = judge(JobFacts(3, "stall", 30.0, records, outcomes={1: {"status": "dead", "exit_code": 137}}))
    assert result.verdict == ("process 1 died (exit status 137); processes 0, 2 are outside JAX at train.py:41 "
                              "(<module>), waiting in a sleep (clock_nanosleep), after train_step call 5")


def test_the_process_that_skipped_a_call_is_pointed_at_the_continue_that_skipped_it(tmp_path):
    """Process 1 ran one train_step fewer (a `continue` under a per-process condition) and finished; process 0
    waits in its last call. The hint names the loop's `continue` and its condition, read from the source."""
    source = tmp_path / "train.py"
    source.write_text("import jax\n"
                      "for step in range(6):\n"
                      "    batch = load(step)\n"
                      "    if batch is None and jax.process_index() == 1:\n"
                      "        continue\n"
                      "    for retry in range(2):\n"
                      "        continue\n"
                      "    loss = train_step(batch)\n")
    waiting = _record(0, "train_step", "train_step(x: f32[4]) [all-reduce:sum]", 8, None)
    ended = _record(1, "train_step", "train_step(x: f32[4]) [all-reduce:sum]", 8, 1.0)
    ended["calls"][0]["index"] = 4
    for record in (waiting, ended):
        record["threads"][0]["user"]["file"] = str(source)
    result = judge(JobFacts(2, "stall", 30.0, {0: waiting, 1: ended}, outcomes={1: {"status": "finished"}}))
    assert result.stuck == (1,)
    assert ("find the call process 1 skipped: the loop can go past train.py:8 (<module>) at the `continue` at "
            "train.py:5 (under `if batch is None and jax.process_index() == 1`); make that condition the same on "
            "every process") in result.hints[0], result.hints[0]


def test_a_function_whose_traced_body_waits_is_stuck_in_its_own_code_not_on_the_device():
    """Inside train_step call 5 with no frame of jax's inside the user's: jax traces it and its Python body
    sleeps (a polling loop in the traced code). Not 'waits inside a jitted call' on the device."""
    record = _record(0, "train_step", "train_step(x: f32[4])", 40, None)
    record["threads"][0].update(in_jax=False, waiting_in="a sleep: clock_nanosleep")
    result = judge(JobFacts(1, "stall", 30.0, {0: record}))
    assert (result.kind, result.exit_code, result.processes[0].state) == ("stall", 1, "host")
    assert result.verdict.startswith("the process is stuck in its own Python code at train.py:40 (<module>) "
                                     "while jax traces train_step call 5")
    assert result.explanation.startswith("jax is tracing the function")
    assert result.hints[0].startswith("train.py:40 (<module>) sleeps: where a loop polls there")


def test_a_process_that_raised_while_the_others_wait_in_a_collective_is_named_with_its_error():
    waiting = _record(0, "train_step", "train_step(x: f32[4]) [all-reduce:sum]", 40, None)
    failed = _record(1, "train_step", "train_step(x: f32[4]) [all-reduce:sum]", 40, 1.0)
    outcomes = {1: {"status": "raised", "error": "ValueError: bad batch at train.py:38 (<module>)",
                    "user": {"file": "train.py", "line": 38, "function": "<module>"}}}
    result = judge(JobFacts(2, "stall", 30.0, {0: waiting, 1: failed}, outcomes=outcomes))
    assert (result.kind, result.stuck) == ("stall", (1,))
    assert result.processes[1].source.line == 38  # where it raised, not its last call's line
    assert result.verdict.startswith("process 1 failed: ValueError: bad batch at train.py:38 (<module>)")
    assert "process 0 waits inside train_step call 5" in result.verdict
    assert result.explanation.startswith("A process raised an error") and "process 1 raised" in result.hints[0]
    assert "skipped" not in result.explanation  # the error ended it, not a condition around a call


def test_processes_that_raised_at_different_lines_are_each_named():
    """A barrier (multihost_utils.sync_global_devices) reached from two lines: both processes raise jax's name
    mismatch, each at its own line; the verdict names both."""
    records = {i: _record(i, "_identity_fn", "_identity_fn(x: u32[2]) [all-gather]", 20, 1.0) for i in (0, 1)}
    outcomes = {i: {"status": "raised", "error": f"AssertionError: sync_global_devices name mismatch at "
                    f"train.py:{line} (<module>)", "user": {"file": "train.py", "line": line, "function": "<module>"}}
                for i, line in ((0, 20), (1, 24))}
    result = judge(JobFacts(2, None, 30.0, records, outcomes=outcomes))
    assert result.kind == "failed" and "train.py:20" in result.verdict
    assert "; process 1 failed: AssertionError" in result.verdict and "train.py:24" in result.verdict


def test_an_event_no_thread_alive_can_set_names_the_lines_that_set_it(tmp_path):
    """A host callback waits for a threading.Event whose watcher thread is started only after the loop: with no
    other thread alive, the verdict says nothing can set it and the hint names where it is set."""
    source = tmp_path / "rl.py"
    source.write_text("import threading\nready = threading.Event()\n\ndef watcher():\n    ready.set()\n\n"
                      "def read_scale(_):\n    ready.wait()\n")
    waits = {"kind": "event", "name": "ready", "at": {"file": str(source), "line": 8, "function": "read_scale"}}
    words, hint = lone_queue({"threads": [{"main": True, "waits_for": waits}]})
    assert words == "no other thread is alive to set event `ready`"
    assert "it is set at rl.py:5 (watcher), which no thread runs now" in hint


def test_a_process_read_with_pid_is_not_said_to_be_before_its_first_call(tmp_path):
    """py-spy sees a process's stacks, not its past: no call known is not 'before its first jitted call'."""
    from jaxdbg.hang.pids import to_record

    program = tmp_path / "train.py"
    program.write_text("import time\nwhile True:\n    time.sleep(1)\n")
    main = {"thread_id": 1, "os_thread_id": None, "thread_name": "MainThread",
            "frames": [{"filename": str(program), "line": 3, "name": "<module>"}]}
    result = judge(JobFacts(1, "signal", 30.0, {0: to_record(0, os.getpid(), [main], idle_s=5.0, busy=0.0)}))
    assert result.kind == "stall" and result.verdict.startswith("the process is stuck outside JAX at train.py:3")
    assert "before its first jitted call" not in result.verdict


def test_spin_watch_names_the_busy_wait_not_the_counting_loop_or_the_sleeper():
    """Four threads for 1.5 s: one spins on a flag, one counts (its variable moves), one sleeps, one updates a
    large numpy array in place (its values move, nothing else): only the first spins, at its loop's line."""
    import threading
    import time

    from jaxdbg.hang.spin import SpinWatch

    stop = threading.Event()
    flags = {"done": False}

    def spin():
        while not flags["done"]:  # <- the spin
            if stop.is_set():
                return

    def count():
        total = 0
        while not stop.is_set():
            total += 1

    def sleep():
        while not stop.is_set():
            time.sleep(0.05)

    def relax():
        grid = np.zeros(1_000_000)
        while not stop.is_set():
            grid += 1.0  # in place: only the array's values move

    threads = [threading.Thread(target=f, daemon=True) for f in (spin, count, sleep, relax)]
    for thread in threads:
        thread.start()
    watch = SpinWatch(confirm_s=0.8)
    try:
        for _ in range(15):
            time.sleep(0.1)
            watch.update(time.monotonic())
        found = watch.spinning()
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert set(found) == {threads[0].ident}
    assert found[threads[0].ident].location.function == "spin"
    from pathlib import Path

    line = next(i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1) if "# <- the spin" in text)
    assert found[threads[0].ident].lines[0] == line


def test_joining_a_producer_stuck_on_a_full_queue_names_the_queue_and_says_how_to_stop_it():
    """A loader blocked putting into a full bounded queue (the trainer stopped taking) while the main thread
    joins it: the verdict follows the join to the queue, and the hint says to stop the loader first."""
    import queue

    full: queue.Queue = queue.Queue(maxsize=2)
    full.put(1)
    full.put(2)
    loader = threading.Thread(target=lambda: full.put(3, timeout=5), name="loader", daemon=True)  # <- put
    loader.start()
    time.sleep(0.5)
    record = take_record(Recorder(), "stall", idle_s=6.0, native=False)
    put = next(t for t in record["threads"] if t["name"] == "loader")
    assert (put["waits_for"]["kind"], put["waits_for"]["size"], put["waits_for"]["maxsize"]) == ("queue", 2, 2)
    main = next(t for t in record["threads"] if t["main"])
    main.update(waits_for={"kind": "thread", "name": "loader", "thread": loader.ident, "at": main["user"]},
                call=None, in_jax=False)
    result = judge(JobFacts(1, "stall", 5.0, {0: record}))
    line = _line("# <- put")
    # the main thread takes from the queue after the join (below): the loader waits for it, a cycle
    said = f"loader waits to put into queue `full` (full: 2 of 2) at test_hang_units.py:{line}"
    assert result.kind == "deadlock" and said in result.verdict, result.verdict
    assert result.hints[0].startswith(f"thread `loader` waits at test_hang_units.py:{line} (<lambda>) to put into "
                                      "the full queue `full`")
    # The same process as process 1 of a job whose process 0 waits for it in an all-reduce, its main thread not
    # taking from the queue after the join (no cycle): a stall of process 1, with the same hint, named.
    waiting = _record(0, "train_step", "train_step(x: f32[4]) [all-reduce:sum]", 40, None)
    main["queues"] = []
    job = judge(JobFacts(2, "stall", 5.0, {0: waiting, 1: {**record, "index": 1}}))
    assert (job.kind, job.stuck) == ("stall", (1,))
    assert job.hints[0].startswith(f"process 1: thread `loader` waits at test_hang_units.py:{line} (<lambda>) to put "
                                   "into the full queue `full`")
    full.get()  # room: the loader's put ends
    loader.join()


def _take(q):
    return q.get()


def test_a_lock_held_around_a_put_into_a_full_queue_its_taker_waits_for_is_a_deadlock():
    """The loader puts into a full queue inside `with lock:`; the trainer, the queue's only taker, waits for that
    lock before it takes: a cycle through the queue, told as a deadlock with the line that takes."""
    import queue

    lock, batches = threading.Lock(), queue.Queue(maxsize=1)
    batches.put(0)

    def loader():
        with lock:  # <- loader holds
            batches.put(1, timeout=5)  # <- loader puts

    def trainer():
        with lock:  # <- trainer waits
            pass
        batches.get(timeout=5)  # <- trainer takes

    threads = [threading.Thread(target=loader, name="loader", daemon=True)]
    threads[0].start()
    time.sleep(0.2)
    threads.append(threading.Thread(target=trainer, name="trainer", daemon=True))
    threads[1].start()
    time.sleep(0.5)
    record = take_record(Recorder(), "stall", idle_s=6.0, native=False)
    result = judge(JobFacts(1, "stall", 5.0, {0: record}))
    assert result.kind == "deadlock", result.verdict
    put, takes = _line("# <- loader puts"), _line("# <- trainer takes")
    said = (f"loader waits to put into queue `batches` (full: 1 of 1) at test_hang_units.py:{put} (loader), and "
            f"trainer is the only thread that takes from it (at test_hang_units.py:{takes} (trainer))")
    assert said in result.verdict, result.verdict
    assert "trainer waits for lock `lock`" in result.verdict and "outside the `with lock:`" in result.hints[0]
    _take(batches)  # room: the loader's put ends, then the trainer takes (not here: this function takes nothing)
    for thread in threads:
        thread.join()


def test_two_threads_each_waiting_on_a_queue_only_the_other_fills_are_told_their_protocols_disagree():
    """A loader waits for an acknowledgement every 3 batches; the trainer sends one every 4 and waits for the next
    batch: each blocks taking from a queue only the other puts into. No lock takes part, so the hint is not the
    lock one: the two sides' protocols disagree."""
    import queue

    batches, acks = queue.Queue(maxsize=2), queue.Queue()

    def loader():
        acks.get(timeout=5)  # <- loader waits for an ack
        batches.put(1)

    def trainer():
        batches.get(timeout=5)  # <- trainer waits for a batch
        acks.put(0)

    threads = [threading.Thread(target=f, name=f.__name__, daemon=True) for f in (loader, trainer)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(30):  # until both block in their get (a loaded machine starts threads late)
            time.sleep(0.1)
            result = judge(JobFacts(1, "stall", 5.0, {0: take_record(Recorder(), "stall", idle_s=6.0, native=False)}))
            if result.kind == "deadlock":
                break
        assert result.kind == "deadlock", result.verdict
        assert "loader waits to take from queue `acks` (empty)" in result.verdict, result.verdict
        assert "trainer waits to take from queue `batches` (empty)" in result.verdict
        assert "lock" not in result.hints[0] and "agree" in result.hints[0]
    finally:
        _give(acks)  # the loader puts, the trainer takes and acknowledges (not here: then two threads would put)
        for thread in threads:
            thread.join(timeout=6)


def _give(channel) -> None:
    channel.put(0)


def _decode(record):
    raise ValueError(f"corrupt record {record}")  # <- the producer dies


def test_a_producer_thread_that_died_by_an_exception_is_named_as_what_the_stuck_main_thread_waits_for():
    """A prefetch thread dies on a corrupt record (Python prints it and goes on) while the main thread waits on
    the Event it would have set: the verdict names the dead thread, its error and line, and the first hint says
    to fix it and hand worker exceptions to the consumer. The program's own excepthook still runs, and is back."""
    ready, printed = threading.Event(), []
    before = threading.excepthook

    def own_hook(args):
        printed.append(args.thread.name)

    threading.excepthook = own_hook
    recorder = Recorder()
    try:
        with recorder.listening():
            worker = threading.Thread(target=lambda: (_decode(7), ready.set()), name="prefetch")
            worker.start()
            worker.join()
            quits = threading.Thread(target=lambda: sys.exit(0), name="quits")  # a normal end: not a death
            quits.start()
            quits.join()
        assert threading.excepthook is own_hook
    finally:
        threading.excepthook = before
    assert printed == ["prefetch", "quits"]
    assert [d["thread"] for d in recorder.thread_deaths] == ["prefetch"]
    record = take_record(recorder, "stall", idle_s=6.0, native=False)
    main = next(t for t in record["threads"] if t["main"])
    main.update(call=None, in_jax=False)
    result = judge(JobFacts(1, "stall", 5.0, {0: record}))
    line = _line("# <- the producer dies")
    said = f"thread `prefetch` died earlier with ValueError: corrupt record 7 at test_hang_units.py:{line} (_decode)"
    assert result.stalled and said in result.verdict, result.verdict
    assert result.hints[0].startswith("fix the error that killed thread `prefetch`"), result.hints


def test_a_process_aborted_by_mismatched_collectives_is_named_with_the_runtimes_words_and_the_call_it_died_in(
        tmp_path):
    """gloo aborts a process whose peer ran another collective (process 1 reached its end-of-epoch reduction while
    process 0 still trains): its fatal message, read from its stderr, and the call it died in (the flight record
    is saved before a function's first call runs) make the verdict, and the divergence hint comes first."""
    from jaxdbg.hang.watchdog import RECORD_FILE, Settings, Watchdog
    from jaxdbg.runner import native_fatal_message

    recorder = Recorder()
    Watchdog(recorder, Settings(folder=str(tmp_path)), on_verdict=lambda facts: None)  # (not started)
    saved = []

    def epoch_mean(x):
        saved.append(json.loads((tmp_path / RECORD_FILE).read_text()))  # traced inside the call: already saved
        return x.mean()

    with jit_layer.installed(recorder):
        jax.jit(epoch_mean)(jnp.ones(4))
    assert [(c["function"], c["index"], c["returned"]) for c in saved[0]["calls"]] == [("epoch_mean", 0, None)]
    stderr = ("terminate called after throwing an instance of 'gloo::EnforceNotMet'\n  what():  [enforce fail at "
              "pair.cc:459] op.preamble.length <= op.nbytes. 8 vs 4. Received data size doesn't match expected "
              "size. Is there a distributed collective mismatch in your code?\nFatal Python error: Aborted\n")
    said = native_fatal_message(stderr)
    assert said.startswith("gloo::EnforceNotMet: op.preamble") and said.endswith("collective mismatch in your code?")
    waiting = _record(0, "train_step", "train_step(x: f32[4]) [all-reduce:sum]", 40, None)
    outcomes = {1: {"status": "dead", "signal": "SIGABRT", "error": said,
                    "user": {"file": "train.py", "line": 48, "function": "<module>"}}}
    result = judge(JobFacts(2, "stall", 30.0, {0: waiting, 1: {**saved[0], "index": 1}}, outcomes=outcomes))
    assert (result.kind, result.stuck) == ("dead", (1,))
    assert result.verdict.startswith("process 1 died (SIGABRT) at train.py:48 (<module>): gloo::EnforceNotMet: "), \
        result.verdict
    assert "; last seen in epoch_mean call 0; process 0 waits inside train_step call 5" in result.verdict
    assert result.hints[0].startswith("make every process call the same jitted functions in the same order")


def test_a_process_that_died_in_another_function_than_the_one_its_peer_waits_in_is_where_the_job_diverged():
    """Process 1 ran 5 global steps, then died (SIGABRT: gloo's mismatch) entering epoch_mean, whose program was
    never read; process 0 waits inside train_step at step 5. The divergence is still found from the dead
    process's flight record: its step-5 call is another function than its peer's."""
    waiting = _record(0, "train_step", "train_step(x: f32[4]) [all-reduce:sum]", 40, None)
    dead = _record(1, "train_step", "train_step(x: f32[4]) [all-reduce:sum]", 40, 1.0)
    dead["calls"][0]["step"] = 4
    dead["calls"].append({"kind": "call", "seq": 10, "function": "epoch_mean", "index": 0, "program": None,
                          "step": None, "start": 0.0, "returned": None, "ready": None,
                          "site": {"file": "train.py", "line": 48, "function": "<module>"}})
    outcomes = {1: {"status": "dead", "signal": "SIGABRT", "user": {"file": "train.py", "line": 48,
                                                                    "function": "<module>"}}}
    result = judge(JobFacts(2, "stall", 30.0, {0: waiting, 1: dead}, outcomes=outcomes))
    assert (result.kind, result.stuck) == ("dead", (1,))
    assert result.divergence is not None and result.divergence.step == 5 and result.divergence.hung
    assert [(s.processes, s.function) for s in result.divergence.sides] == [((0,), "train_step"), ((1,), "epoch_mean")]
    assert result.verdict.startswith("process 1 died (SIGABRT) at train.py:48 (<module>); last seen in epoch_mean "
                                     "call 0; process 0 waits inside train_step call 5"), result.verdict
    assert result.verdict.endswith("; the processes diverged at step 5: process 0 called train_step #5 at train.py:40 "
                                   "(<module>) while process 1 called epoch_mean #0 at train.py:48 (<module>) (and "
                                   "died in it)"), result.verdict
    # The survivor's collective failed instead (its peer left): its failed call, whose program was not read either,
    # stands at its step 5 with train_step's one program.
    failed = _record(0, "train_step", "train_step(x: f32[4]) [all-reduce:sum]", 40, 1.0)
    failed["calls"][0].update(step=4, index=4)
    failed["calls"].append({**failed["calls"][0], "seq": 10, "index": 5, "program": None, "step": None,
                            "error": "ValueError: Gloo all-reduce failed: Connection reset by peer"})
    raised = {0: {"status": "raised", "error": "ValueError: Gloo all-reduce failed: Connection reset by peer"}}
    result = judge(JobFacts(2, "stall", 30.0, {0: failed, 1: dead}, outcomes={**outcomes, **raised}))
    assert result.kind == "dead" and result.divergence is not None and result.divergence.step == 5
    assert "; the processes diverged at step 5: process 0 called train_step #5 at train.py:40" in result.verdict
    # a dead process whose last call is the same function as its peer's is not a divergence (its program unknown)
    dead["calls"][-1]["function"] = "train_step"
    assert judge(JobFacts(2, "stall", 30.0, {0: waiting, 1: dead}, outcomes=outcomes)).divergence is None


def _reset_env(seed):
    raise RuntimeError(f"env {seed}: simulator crashed on reset")  # <- the actor dies


def test_an_event_loop_idle_in_select_is_named_by_its_tasks_await_and_the_task_that_died():
    """An async learner awaits an asyncio.Queue that its one actor task should fill; the actor's environment
    raised and nobody awaits the task. The main thread stands in asyncio's select: the verdict names the task
    that waits at its own await line and the task that died, with its error and line."""
    import asyncio

    records = []

    async def actor(queue):
        await queue.put(_reset_env(2))

    async def learner():
        queue, release = asyncio.Queue(), asyncio.Event()
        task = asyncio.create_task(actor(queue))
        loop = asyncio.get_running_loop()

        def watchdog():  # another thread reads the idle loop, as hang-hunt's watchdog does, then lets it go
            time.sleep(0.3)
            records.append(take_record(Recorder(), "stall", idle_s=6.0, native=False))
            loop.call_soon_threadsafe(release.set)

        threading.Thread(target=watchdog, name="reader").start()
        await release.wait()  # <- the learner awaits
        return task

    task = asyncio.run(learner())
    assert task.exception() is not None  # (retrieved here: the test leaves no warning behind)
    main = next(t for t in records[0]["threads"] if t["main"])
    main.update(call=None, in_jax=False)
    result = judge(JobFacts(1, "stall", 5.0, {0: records[0]}))
    awaits, dies = _line("# <- the learner awaits"), _line("# <- the actor dies")
    assert "its asyncio event loop waits on task `Task-" in result.verdict, result.verdict
    assert f"at test_hang_units.py:{awaits} (learner)" in result.verdict
    assert (f"died earlier with RuntimeError: env 2: simulator crashed on reset at test_hang_units.py:{dies} "
            "(_reset_env)") in result.verdict
    assert result.explanation.startswith("An asyncio task of the program ended")
    assert result.hints[0].startswith("fix the error that killed task `Task-") and "asyncio.gather" in result.hints[0]


def test_a_main_thread_taking_from_an_empty_queue_no_thread_is_left_to_fill_is_told_so():
    """An io_callback (or a loop) takes from a queue whose producer thread has ended: nothing can ever fill it.
    With another thread alive, it may still come: no such claim."""
    record = take_record(Recorder(), "stall", idle_s=6.0, native=False)
    main = next(t for t in record["threads"] if t["main"])
    main.update(waits_for={"kind": "queue", "name": "obs_queue", "size": 0, "maxsize": 4, "at": main["user"]},
                call=None, in_jax=False)
    others = [t for t in record["threads"] if not t["main"]]
    record["threads"] = [main]
    result = judge(JobFacts(1, "stall", 5.0, {0: record}))
    assert result.verdict.endswith("; no other thread is alive to put into queue `obs_queue`"), result.verdict
    assert result.hints[0].startswith("nothing can ever fill the empty queue `obs_queue`")
    record["threads"] = [main, *(others or [{**main, "main": False, "name": "loader", "waits_for": None}])]
    assert "no other thread" not in judge(JobFacts(1, "stall", 5.0, {0: record})).verdict
