"""hang-hunt on one process: a host callback deadlocked on a lock its caller holds, a program that is merely
slow (long steps, but working: no stall), a stuck read found at SIGUSR1 and at --timeout (left running with
--keep-running), the same deadlock in a process not started under jaxdbg (--pid, py-spy), and
jaxdbg.watch(stall_after=..., stall_action="exit"). The runs mostly wait, so one module fixture starts them
all at once; each test reads its own."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import jsonschema
import pytest

from jaxdbg.hang.stacks import py_spy, py_spy_dump
from jaxdbg.launch import stop
from jaxdbg.schema import schema

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
LOCK = os.path.join(CORPUS, "hang_callback_lock", "train.py")
SLOW = os.path.join(CORPUS, "hang_slow", "train.py")
READ = os.path.join(CORPUS, "hang_stuck_read", "train.py")
WATCH = os.path.join(CORPUS, "hang_watch_exit", "train.py")
EXIT = os.path.join(CORPUS, "hang_exit_thread", "train.py")
SPIN = os.path.join(CORPUS, "hang_busy_wait", "train.py")
ENV = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}


def _line(path: str, marker: str) -> int:
    return next(i for i, text in enumerate(open(path), start=1) if marker in text)


def _hang_hunt(folder, *argv: str, script_args: tuple[str, ...] = ()) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "jaxdbg", "hang-hunt", *argv, "--out", str(folder / "out"),
                             "-q", "--json", str(folder / "report.json"), *script_args], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _children(pid: int) -> list[int]:
    """Every process whose ancestry leads to ``pid`` (what a run left behind)."""
    parents = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as handle:
                parents[int(entry)] = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        kids = [p for p, pp in parents.items() if pp == parent]
        found.extend(kids)
        frontier.extend(kids)
    return found


def _wait_for(predicate, timeout: float = 240.0, every: float = 0.5) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, "gave up waiting"
        time.sleep(every)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folders = {name: tmp_path_factory.mktemp(name) for name in ("lock", "slow", "signal", "timeout", "pid", "watch",
                                                               "exit", "spin")}
    procs = {
        "lock": _hang_hunt(folders["lock"], LOCK, "--stall", "2"),
        "exit": _hang_hunt(folders["exit"], EXIT, "--stall", "2"),
        "spin": _hang_hunt(folders["spin"], SPIN, "--stall", "2", "--timeout", "120"),
        "slow": _hang_hunt(folders["slow"], SLOW, "--stall", "1.5", "--no-native", script_args=("--", "3")),
        "signal": _hang_hunt(folders["signal"], READ, "--stall", "600"),
        # --timeout 30: more than twice what the read takes to get stuck while these runs start beside a second
        # test worker (the tests before it collect their runs within about 12 s); the test waits out the rest.
        "timeout": _hang_hunt(folders["timeout"], READ, "--stall", "600", "--timeout", "30", "--keep-running"),
        # The same deadlock, run plainly: hang-hunt --pid reads it from outside.
        "pid": subprocess.Popen([sys.executable, LOCK], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        "watch": subprocess.Popen([sys.executable, WATCH, str(folders["watch"] / "out")], env=ENV,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
    }
    done: dict[str, tuple] = {}

    def collect(name: str) -> tuple:
        if name not in done:
            out, err = procs[name].communicate(timeout=300)
            report = folders[name] / "report.json"
            done[name] = (procs[name].returncode, out, err, json.loads(report.read_text()) if report.exists() else None,
                          folders[name])
        return done[name]

    collect.procs, collect.folders = procs, folders  # type: ignore[attr-defined]
    yield collect
    # A run not collected (its test deselected) is stopped as a user would: SIGTERM, which jaxdbg turns into
    # stopping its program (SIGKILL to jaxdbg alone would orphan it); what is left is killed.
    left = [pid for proc in procs.values() for pid in _children(proc.pid)]
    stop(list(procs.values()))
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _valid(report: dict) -> None:
    jsonschema.Draft202012Validator(schema()).validate(report)


def test_a_callback_waiting_for_a_lock_its_caller_holds_is_a_deadlock(runs):
    code, _, err, report, _ = runs("lock")
    assert code == 1 and report["exit_code"] == 1, err[-3000:]
    result = report["result"]
    waits, holds = _line(LOCK, "the callback waits here"), _line(LOCK, "the loop holds the lock")
    assert result["kind"] == "deadlock" and result["stalled"] and result["stuck"] == [0]
    assert result["verdict"] == (
        f"deadlock: MainThread waits for lock `metrics_lock` at train.py:{waits} (log_metrics) (in the host callback "
        f"log_metrics), which itself holds since train.py:{holds} (<module>) (in train_step call 3)")
    process = result["processes"][0]
    assert (process["state"], process["function"], process["call_index"]) == ("callback", "train_step", 3)
    main = process["threads"][0]
    assert main["main"] and main["source"]["line"] == waits and main["holds"] == [
        f"lock `metrics_lock` since train.py:{holds} (<module>)"]
    assert "futex" in main["waiting_in"]  # the kernel's word for a lock wait
    calls = process["last_calls"]
    assert [c["call_index"] for c in calls if c["kind"] == "call"] == [0, 1, 2, 3]
    assert [c["function"] for c in calls if c["kind"] == "callback"] == ["log_metrics"] * 4
    assert calls[-1]["kind"] == "callback" and calls[-1]["returned_s_ago"] is None  # the one that never returned
    _valid(report)


def test_a_non_daemon_thread_that_never_ends_keeps_the_finished_program_from_exiting(runs):
    code, _, _, report, _ = runs("exit")
    _valid(report)
    result = report["result"]
    assert (code, result["kind"], result["stalled"]) == (1, "stall", True)
    line = _line(EXIT, "# <- waits for the sentinel")
    assert result["verdict"].startswith("the process is stuck at exit: its main code returned, but Python waits for "
                                        f"its non-daemon thread ckpt-writer, stuck at train.py:{line} (writer)")
    assert result["processes"][0]["source"]["line"] == line and "daemon=True" in result["hints"][0]


def test_a_busy_wait_loop_is_a_stall_spinning_at_its_line_not_progress(runs):
    """The process uses a CPU, but only going round `while not done: pass` with nothing changing: a stall."""
    code, _, err, report, _ = runs("spin")
    _valid(report)
    result = report["result"]
    assert (code, result["kind"], result["stalled"], result["trigger"]) == (1, "stall", True, "stall"), err[-3000:]
    line = _line(SPIN, "# <- spins")
    assert result["verdict"].startswith(f"the process is stuck spinning in a busy-wait loop at train.py:{line} "
                                        "(<module>)"), result["verdict"]
    process = result["processes"][0]
    assert process["source"]["line"] == line and process["waiting_in"].startswith("a busy-wait loop")
    assert "busy, but stuck" in result["explanation"] and f"train.py:{line}" in result["hints"][1]
    # what it spins for was the writer thread's to set: its death is named first, with its error and line
    died = _line(SPIN, "raise OSError")
    assert (f"; thread `Thread-1 (write_checkpoint)` died earlier with OSError: disk quota exceeded at "
            f"train.py:{died} (write_checkpoint)") in result["verdict"], result["verdict"]
    assert result["hints"][0].startswith("fix the error that killed thread `Thread-1 (write_checkpoint)`")


def test_no_process_is_left_behind_after_the_verdict(runs):
    runs("lock")
    assert _children(runs.procs["lock"].pid) == []


def test_a_merely_slow_program_is_not_a_stall(runs):
    """Steps of about 3 s (a long computation, and a slow pure-Python decoder), --stall 1.5: it works all the
    time, so it finishes and nothing is reported."""
    code, _, err, report, _ = runs("slow")
    assert code == 0, err[-3000:]
    result = report["result"]
    assert result["kind"] == "finished" and not result["stalled"] and result["trigger"] is None
    assert [c["function"] for c in result["processes"][0]["last_calls"]] == ["step"] * 3


def test_sigusr1_asks_for_the_verdict_now(runs):
    """--stall 600, but SIGUSR1 to jaxdbg (passed on to the program) once it is stuck: the verdict at once."""
    proc, folder = runs.procs["signal"], runs.folders["signal"]
    _wait_for(lambda: (folder / "out" / "flight-record.json").exists() or proc.poll() is not None)
    time.sleep(3)  # stuck for a while: idle past the 2 s a request needs
    proc.send_signal(signal.SIGUSR1)
    code, _, err, report, _ = runs("signal")
    assert code == 1, err[-3000:]
    result = report["result"]
    assert (result["trigger"], result["kind"]) == ("signal", "stall")
    process = result["processes"][0]
    assert process["state"] == "host" and process["source"]["line"] == _line(READ, "the stuck read")
    assert process["function"] == "train_step" and process["call_index"] == 1 and "sleep" in process["waiting_in"]


def test_timeout_draws_the_verdict_and_keep_running_leaves_the_program(runs):
    code, _, err, report, _ = runs("timeout")
    assert code == 1, err[-3000:]
    assert (report["result"]["trigger"], report["result"]["kind"]) == ("timeout", "stall")
    pid = int(re.search(r"left the program running \(pid (\d+)", err).group(1))
    try:
        assert os.path.exists(f"/proc/{pid}")  # still there, stuck where it was
    finally:
        os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(py_spy() is None, reason="py-spy is not installed")
def test_pid_reads_a_process_not_started_under_jaxdbg(runs, tmp_path):
    """The deadlock program run plainly; hang-hunt --pid reads its stacks with py-spy (twice, 3 s apart) and
    names the same deadlock, with the lock matched by name."""
    program = runs.procs["pid"]
    threads, why = py_spy_dump(program.pid, native=False)
    if not threads and "not permitted" in why:
        pytest.skip(f"ptrace is not allowed here: {why}")

    def stuck() -> bool:
        found, _ = py_spy_dump(program.pid, native=False)
        return any(f.get("name") == "log_metrics" for t in found for f in t.get("frames") or ())

    _wait_for(stuck)
    done = subprocess.run([sys.executable, "-m", "jaxdbg", "hang-hunt", "--pid", str(program.pid), "--out",
                           str(tmp_path / "out"), "--json", str(tmp_path / "pid.json"), "-q"], env=ENV,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr[-3000:]
    report = json.loads((tmp_path / "pid.json").read_text())
    result = report["result"]
    waits, holds = _line(LOCK, "the callback waits here"), _line(LOCK, "the loop holds the lock")
    assert result["kind"] == "deadlock" and result["trigger"] == "signal"
    assert f"waits for lock `metrics_lock` at train.py:{waits} (log_metrics)" in result["verdict"]
    assert f"which itself holds since train.py:{holds}" in result["verdict"]
    assert program.poll() is None  # left running: jaxdbg did not start it
    _valid(report)


@pytest.mark.parametrize("argv, says", [
    (["--pid", "12x"], "--pid '12x'"),
    ([LOCK, "--args", "f32[3]"], "--args/--inputs are for a function target"),
    ([], "give a TARGET to run"),
])
def test_bad_input_is_one_line_and_exit_2_and_writes_nothing(argv, says, tmp_path):
    done = subprocess.run([sys.executable, "-m", "jaxdbg", "hang-hunt", *argv], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path, env=ENV)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and says in done.stderr, done.stderr
    assert os.listdir(tmp_path) == []  # no default output folder for a command refused up front


def test_watch_stall_after_writes_the_verdict_and_exits_for_a_restart(runs):
    code, _, err, _, folder = runs("watch")
    assert code == 75, err[-3000:]
    report = json.loads((folder / "out" / "report.json").read_text())
    assert report["command"] == "watch" and report["exit_code"] == 1
    result = report["result"]
    assert result["kind"] == "stall" and result["processes"][0]["source"]["line"] == _line(WATCH, "the stuck read")
    assert "exiting with status 75 so the job restarts" in err
    _valid(report)
