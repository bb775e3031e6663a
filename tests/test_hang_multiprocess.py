"""hang-hunt on jobs of 4 and 2 local processes (gloo collectives on CPU devices): a process stuck outside JAX
before a collective (4 processes), processes that ran different programs at the same step and went on, a
process that died, and a slow peer that is not stuck (2 processes each). The jobs mostly wait (a stall is
seconds of nothing), so they run side by side, started together by one module fixture; each test reads its own
job's reports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import jsonschema
import pytest

from jaxdbg.hang.api import job_facts_of_process_0
from jaxdbg.hang.verdict import judge
from jaxdbg.launch import stop
from jaxdbg.schema import schema

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
HANGS = os.path.join(CORPUS, "multihost_hangs", "train.py")
MARK = "JAXDBG_HANG_TEST_JOB"  # set in each job's environment: what is left of it afterwards is found by it

# job -> (program and its arguments, processes, hang-hunt options)
JOBS = {
    "stuck4": ([HANGS], 4, ["--stall", "3"]),
    "diverged": ([os.path.join(CORPUS, "hang_divergent", "train.py")], 2, ["--stall", "3"]),
    "dies": ([os.path.join(CORPUS, "multihost_dies", "train.py")], 2, ["--stall", "3"]),
    "slow_peer": ([os.path.join(CORPUS, "hang_slow_peer", "train.py"), "--", "5"], 2, ["--stall", "1.5"]),
    "barrier": ([os.path.join(CORPUS, "multihost_barrier_skipped", "train.py")], 2, ["--stall", "2"]),
}


def _line(path: str, marker: str) -> int:
    return next(i for i, text in enumerate(open(path), start=1) if marker in text)


def _left_behind(name: str) -> list[int]:
    """Processes still alive whose environment carries this job's mark."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                if f"{MARK}={name}".encode() in handle.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Every job started at once; each test collects its own: (exit code, stderr, process 0's report, the
    reports of every process)."""
    folders = {name: tmp_path_factory.mktemp(name) for name in JOBS}
    procs = {}
    for name, (program, count, options) in JOBS.items():
        env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1", MARK: name}
        argv = [sys.executable, "-m", "jaxdbg", "--processes", str(count), "hang-hunt", program[0], *options,
                "--out", str(folders[name] / "out"), "-q", "--json", str(folders[name] / "job.json"), *program[1:]]
        procs[name] = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    done: dict[str, tuple] = {}

    def collect(name: str) -> tuple:
        if name not in done:
            try:
                _, err = procs[name].communicate(timeout=300)
            except subprocess.TimeoutExpired:
                procs[name].kill()
                raise
            out = folders[name] / "out"
            count = JOBS[name][1]
            reports = [json.loads((out / f"process-{i}" / "report.json").read_text()) for i in range(count)]
            done[name] = (procs[name].returncode, err, json.loads((folders[name] / "job.json").read_text()), reports)
        return done[name]

    yield collect
    stop(list(procs.values()))  # a job not collected: SIGTERM stops its processes and their programs
    for name in procs:
        for pid in _left_behind(name):
            os.kill(pid, signal.SIGKILL)


def _valid(report: dict) -> None:
    jsonschema.Draft202012Validator(schema()).validate(report)


def test_a_process_stuck_outside_jax_is_named_with_its_line_and_what_the_others_wait_in(jobs):
    """4 processes: process 1 sleeps in host code before step 1; the others wait for it in step's all-reduce.
    The verdict names process 1, outside JAX, at the stuck read, and what processes 0, 2, 3 wait in: step call
    1, its all-reduce over the 4 processes, the line that called it."""
    code, err, job, reports = jobs("stuck4")
    assert code == 1 and job["exit_code"] == 1, err[-3000:]
    result = job["result"]
    stuck_line, step_line = _line(HANGS, "the stuck read"), _line(HANGS, "w, loss = step(w, x)")
    assert result["stalled"] and result["kind"] == "stall" and result["stuck"] == [1]
    assert [p["state"] for p in result["processes"]] == ["running", "host", "running", "running"]
    stuck = result["processes"][1]
    assert stuck["source"]["line"] == stuck_line and stuck["source"]["function"] == "read_batch"
    assert "sleep" in stuck["waiting_in"] and (stuck["function"], stuck["call_index"]) == ("step", 0)
    for index in (0, 2, 3):
        waiter = result["processes"][index]
        assert (waiter["function"], waiter["call_index"], waiter["step"]) == ("step", 1, 1)
        assert waiter["collective"].startswith("all-reduce (sum) over processes 0, 1, 2, 3 at train.py:")
    assert result["verdict"].startswith(f"process 1 is stuck outside JAX at train.py:{stuck_line} (read_batch)")
    assert "; processes 0, 2, 3 wait in step call 1 (all-reduce (sum) over processes 0, 1, 2, 3" in result["verdict"]
    assert f"called at train.py:{step_line}" in result["verdict"]
    # Every process's report holds the job's verdict, also one whose program gloo aborted before the verdict
    # reached it (it reads process 0's facts from the shared --out); the Perfetto timeline has every process's calls.
    assert [r["result"]["verdict"] for r in reports] == [result["verdict"]] * 4
    out = os.path.dirname(os.path.dirname(job["artifacts"]["facts"]))
    assert judge(job_facts_of_process_0(out, since=0.0)).verdict == result["verdict"]
    with open(job["artifacts"]["timeline"]) as handle:
        timeline = json.load(handle)["traceEvents"]
    assert {e["pid"] for e in timeline if e["ph"] == "X" and e["name"].startswith("step #")} == {0, 1, 2, 3}
    assert os.path.exists(job["artifacts"]["timeline_png"])
    for report in reports:
        _valid(report)
    assert _left_behind("stuck4") == []  # every process of the job stopped after the verdict


def test_a_divergent_branch_that_completes_is_reported_at_its_step(jobs):
    """At step 2 process 1 evaluates while process 0 trains: gloo pairs the two all-reduces, the job finishes
    with wrong values, and only the comparison of the processes' programs, step by step, finds it (exit 1)."""
    program = JOBS["diverged"][0][0]
    code, err, job, _ = jobs("diverged")
    assert code == 1 and job["exit_code"] == 1, err[-3000:]
    result = job["result"]
    assert result["kind"] == "divergence" and not result["stalled"]
    divergence = result["divergence"]
    assert divergence["step"] == 2 and not divergence["hung"]
    sides = {tuple(side["processes"]): side for side in divergence["sides"]}
    train, evaluate = sides[(0,)], sides[(1,)]
    assert (train["function"], train["call_index"], train["source"]["line"]) == (
        "train_step", 2, _line(program, "the training branch"))
    assert (evaluate["function"], evaluate["call_index"], evaluate["source"]["line"]) == (
        "eval_step", 0, _line(program, "the evaluation branch"))
    assert "[all-reduce:sum]" in train["program"] and "[all-reduce:max]" in evaluate["program"]
    assert [p["state"] for p in result["processes"]] == ["finished", "finished"]
    assert result["verdict"].startswith("the processes diverged at step 2: process 0 called train_step #2 at train.py:")
    _valid(job)


def test_a_dead_process_is_named_with_its_signal_and_last_place(jobs):
    """Process 1 aborts at step 3: process 0's all-reduce fails. Process 0's report names process 1 as dead,
    with the signal its own jaxdbg saw (read from its report in the shared --out) and where it last stood."""
    program = JOBS["dies"][0][0]
    code, err, job, reports = jobs("dies")
    assert code == 1, err[-3000:]
    result = job["result"]
    assert result["kind"] == "dead" and result["stuck"] == [1]
    dead, survivor = result["processes"][1], result["processes"][0]
    assert (dead["state"], dead["signal"]) == ("dead", "SIGABRT")
    assert dead["source"]["line"] == _line(program, "os.abort()")
    assert survivor["state"] == "failed" and "Gloo" in survivor["detail"]
    assert result["verdict"].startswith(f"process 1 died (SIGABRT) at train.py:{_line(program, 'os.abort()')}")
    assert reports[1]["result"]["processes"][1]["signal"] == "SIGABRT"
    assert _left_behind("dies") == []


def test_a_slow_peer_is_not_a_stall(jobs):
    """Process 1 works on the CPU for 5 s while process 0 waits for it in the all-reduce, past --stall 1.5:
    a process that works is slow, not stuck; the job finishes (exit 0)."""
    code, err, job, _ = jobs("slow_peer")
    assert code == 0 and job["exit_code"] == 0, err[-3000:]
    result = job["result"]
    assert result["kind"] == "finished" and not result["stalled"] and result["divergence"] is None
    assert [p["state"] for p in result["processes"]] == ["finished", "finished"]


def test_a_barrier_only_one_process_reaches_is_named_as_the_user_called_it(jobs):
    """Process 0 waits in multihost_utils.sync_global_devices, which jax runs as a jitted all-gather of its own
    (_identity_fn), while process 1 has finished: what process 0 waits in is the barrier with its name (was
    `_identity_fn`), at the user's line; the hint points at the `if` around it. (With one device per process the
    call itself blocks, so its program's collectives are not read: a stuck call's never are; its collective is
    the barrier by its name, not blank.)"""
    program = JOBS["barrier"][0][0]
    code, err, job, _ = jobs("barrier")
    assert code == 1, err[-3000:]
    result = job["result"]
    waiter = result["processes"][0]
    assert (waiter["state"], waiter["function"]) == ("running", "sync_global_devices('checkpoint saved')")
    # its program is never read (the call has not returned), so the barrier by its name says what it waits in
    assert waiter["collective"] == "barrier 'checkpoint saved' over every process"
    assert waiter["source"]["line"] == _line(program, "# <- the barrier only process 0 reaches")
    assert result["processes"][1]["state"] == "finished"
    assert "process 0 waits inside sync_global_devices('checkpoint saved') call 0, called at train.py:" in (
        result["verdict"])
    assert f"if jax.process_index() == 0` at train.py:{_line(program, '# <- the chief')}" in " ".join(result["hints"])
    assert _left_behind("barrier") == []
