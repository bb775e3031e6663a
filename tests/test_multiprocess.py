"""Multi-process jobs (jax.distributed, gloo collectives on CPU devices): jaxdbg in front of every process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import line_of

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
# --timeout of the hung jobs: a quarter of it is the stillness that names the hung process, the rest is room for
# both processes to start, join and compile on a loaded machine (24 s was too little beside a second test worker).
HANG_TIMEOUT = "40"


def launch(argv: list[str], processes: int, devices: int = 2, timeout: float = 240,
           env: dict | None = None) -> subprocess.CompletedProcess:
    """``jaxdbg --processes N ARGV``: the job's processes on this machine, each with ``devices`` CPU devices."""
    return finish(start(argv, processes, devices, env), timeout)


def start(argv: list[str], processes: int | None, devices: int = 2, env: dict | None = None) -> subprocess.Popen:
    """``jaxdbg [--processes N] ARGV`` started in the background (``finish`` waits for it)."""
    env = env or {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    launcher = ["--processes", str(processes)] if processes else []
    return subprocess.Popen([sys.executable, "-m", "jaxdbg", *launcher, *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float = 240) -> subprocess.CompletedProcess:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


HANGS = os.path.join(CORPUS, "multihost_hangs", "train.py")
DP = os.path.join(CORPUS, "multihost_dp", "train.py")
DIES = os.path.join(CORPUS, "multihost_dies", "train.py")
FAILS_AT_START = os.path.join(CORPUS, "multihost_fails_at_start", "train.py")


@pytest.fixture(scope="module")
def waiting_jobs(tmp_path_factory):
    """The jobs that end only at a timeout (--timeout, the 15 s a lost peer's heartbeat is waited for, or the
    launcher's grace after a process failed), started together: they mostly wait (a process asleep or dead, its
    peer blocked in the all-reduce or in jax.distributed.initialize()), so side by side they cost one wait instead
    of five (about 45 s, not 200).
    Each test collects its own: (the finished run, its folder)."""
    from jaxdbg.launch import free_port, task_environment

    folders = {name: tmp_path_factory.mktemp(name)
               for name in ("dies", "hangs", "nan_hangs", "never_starts", "fails_at_start")}
    lone = task_environment(0, 2, free_port(), {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"})
    procs = {
        "dies": start(["profile", os.path.join(CORPUS, "multihost_dies", "train.py"), "--out",
                       str(folders["dies"] / "p"), "-q", "--json", str(folders["dies"] / "job.json"),
                       "--timeout", "200"], 2, devices=1),
        "hangs": start(["profile", HANGS, "--out", str(folders["hangs"] / "p"), "-q", "--json",
                        str(folders["hangs"] / "job.json"), "--timeout", HANG_TIMEOUT, "--trace-calls", "0"], 2,
                       devices=1),
        "nan_hangs": start(["nan-hunt", HANGS, "--out", str(folders["nan_hangs"] / "n"), "-q", "--timeout",
                            HANG_TIMEOUT], 2, devices=1),
        # --timeout 300: the launcher ends this job, well before gloo's deadline (~100 s) would.
        "fails_at_start": start(["profile", FAILS_AT_START, "--out", str(folders["fails_at_start"] / "p"), "-q",
                                 "--timeout", "300"], 2, devices=1),
        # Process 0 of a 2-process job started alone: its peer never comes.
        "never_starts": start(["nan-hunt", os.path.join(CORPUS, "multihost_dp", "train.py"), "--out",
                               str(folders["never_starts"] / "o"), "-q", "--timeout", "20"], None, env=lone),
    }
    yield {name: (lambda name=name: (finish(procs[name]), folders[name])) for name in procs}
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.fixture(scope="module")
def waiting_runs(tmp_path_factory):
    """Runs that mostly wait too (a lost peer's 10 s heartbeat, a peer's command read from the job's key-value
    store, a coordinator no process joins), started by the NaN hunts below, whose jobs compute and whose answers
    do not depend on time (unlike the stragglers' and the hung jobs'): side by side, the waits cost nothing.
    Each test collects its own: (the finished runs, their folder)."""
    from jaxdbg.launch import free_port, task_environment

    folders = {name: tmp_path_factory.mktemp(name) for name in ("lost_peer", "commands", "doctor", "no_folder")}
    (folders["lost_peer"] / "tmp").mkdir()  # its own TMPDIR: what the launcher leaves there is checked
    procs: dict[str, list[subprocess.Popen]] = {
        "lost_peer": [start(["repro", os.path.join(CORPUS, "multihost_preempted", "train.py"), "--out",
                             str(folders["lost_peer"] / "r"), "-q", "--max-time", "120", "--timeout", "60", "--json",
                             str(folders["lost_peer"] / "job.json")], 2,
                            env={**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
                                 "TMPDIR": str(folders["lost_peer"] / "tmp")})],
    }
    # A launch-line typo: process 0 profiles, process 1 hunts NaNs on the same program.
    port, base = free_port(), {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    procs["commands"] = [subprocess.Popen([sys.executable, "-m", "jaxdbg", command, DP, "--out",
                                           str(folders["commands"] / str(i)), "-q", "--timeout", "120"],
                                          env=task_environment(i, 2, port, base), stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True)
                         for i, command in enumerate(["profile", "nan-hunt"])]
    # doctor --distributed with nothing describing a job; process 0 of 2 whose process 1 is never started.
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "JAX_COORDINATOR"))}
    lone = task_environment(0, 2, free_port(), clean)  # process 0 of 2; process 1 is never started
    lone.pop("JAXDBG_LAUNCHED_PROCESS")
    doctor = folders["doctor"]
    procs["doctor"] = [
        subprocess.Popen([sys.executable, "-m", "jaxdbg", "doctor", "--distributed", "--no-profiler", "-q", "--out",
                          str(doctor / "a")], env=clean, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
        subprocess.Popen([sys.executable, "-m", "jaxdbg", "doctor", "--no-profiler", "-q", "--timeout", "3", "--out",
                          str(doctor / "b"), "--json", str(doctor / "b.json")], env=lone, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True),
    ]
    # Process 1 of a job whose launcher (srun) made no folder in --out fails at its start; process 0, the program
    # alone, is only its coordinator (it fails at gloo's deadline, or is killed below).
    port = free_port()
    coordinator = subprocess.Popen([sys.executable, FAILS_AT_START], env=task_environment(0, 2, port, base),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    env = task_environment(1, 2, port, base)
    env.pop("JAXDBG_LAUNCHED_PROCESS")
    procs["no_folder"] = [start(["profile", FAILS_AT_START, "--out", str(folders["no_folder"] / "p"), "-q",
                                 "--timeout", "120"], None, env=env)]
    yield {name: (lambda name=name: ([finish(proc) for proc in procs[name]], folders[name])) for name in procs}
    for proc in (proc for group in [*procs.values(), [coordinator]] for proc in group):
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_profile_runs_in_every_process_of_a_two_process_job(tmp_path):
    out = tmp_path / "prof"
    done = launch(["profile", os.path.join(CORPUS, "multihost_dp", "train.py"), "--out", str(out), "-q",
                   "--json", str(tmp_path / "job.json")], 2)
    assert done.returncode == 0, done.stderr[-3000:]
    job = json.loads((tmp_path / "job.json").read_text())
    assert job["environment"]["process_index"] == 0
    # Process 0 speaks for the job: every process's figures, gathered through JAX's coordination service.
    rows = job["result"]["processes"]
    assert [r["index"] for r in rows] == [0, 1] and all(r["note"] == "" and r["steps"] == 5 for r in rows)
    assert job["result"]["stragglers"] == []
    for index in (0, 1):
        report = json.loads((out / f"process-{index}" / "report.json").read_text())
        env = report["environment"]
        assert (env["process_index"], env["process_count"]) == (index, 2)
        assert {d["process_index"] for d in env["devices"]} == {0, 1}  # the job's 4 devices, 2 per process
        step = next(f for f in report["result"]["functions"] if f["name"] == "step")
        assert step["execute"]["calls"] == 5
        _the_barrier_is_named_as_called(report["result"]["functions"])
        # The gradient's all-reduce across processes shows in the per-op table, at the user's line.
        ops = {op["category"]: op for op in step["ops"]}
        assert "collective" in ops and ops["collective"]["source"]["file"].endswith("train.py")
        # ... put there by the batch's split over 'data' (the weights are whole on every device): x.T @ y.
        cause = next(op["sharding_cause"] for op in step["ops"] if op["category"] == "collective")
        assert [(a["argument"], a["sharding"]) for a in cause["arguments"]] == [("x", "P('data')")]
        # (XLA combines it with the loss's mean: one all-reduce for "dot_general, reduce_sum".)
        assert cause["axes"] == ["data"] and cause["op"].startswith("dot_general") and cause["devices"]
        assert os.path.isdir(out / f"process-{index}" / "trace")
    # Every process's capture, gathered into process 0's --out through the key-value store: one xprof session
    # (one run folder, a host per process), which xprof's converter opens with both hosts on one timeline.
    from xprof.convert.raw_to_tool_data import xspace_to_tool_data

    assert job["artifacts"]["job_trace_dir"] == str(out / "trace")
    (run,) = os.listdir(out / "trace" / "plugins" / "profile")
    session = out / "trace" / "plugins" / "profile" / run
    assert sorted(os.listdir(session)) == ["process-0.xplane.pb", "process-1.xplane.pb"]
    data, _ = xspace_to_tool_data(sorted(str(p) for p in session.iterdir()), "trace_viewer@",
                                  {"hosts": ["process-0", "process-1"]})
    names = {e["args"]["name"] for e in json.loads(data)["traceEvents"] if e.get("name") == "process_name"}
    assert {name.split(" ")[0] for name in names} == {"process-0", "process-1"}
    assert f"sync_global_devices('weights saved') at train.py:{BARRIER}" in _rendered(job)


BARRIER = line_of(DP, "# <- every process has its weights: the barrier")


def _the_barrier_is_named_as_called(functions: list[dict]) -> None:
    """multihost_utils.sync_global_devices runs jax's own jitted `_identity_fn`: a function entry (profile's or
    memory's) names the helper the user called, the call as made and its line (was `_identity_fn`, defined in jax)."""
    (barrier,) = [f for f in functions if f["called_as"] is not None]
    assert (barrier["name"], barrier["called_as"]) == ("sync_global_devices", "sync_global_devices('weights saved')")
    assert (barrier["source"]["file"], barrier["source"]["line"]) == (DP, BARRIER)
    assert "_identity_fn" not in {f["name"] for f in functions}


def _rendered(report: dict) -> str:
    """The text a report's command prints, from its JSON read back."""
    from rich.console import Console

    from jaxdbg.cli import memory, profile
    from jaxdbg.results import read_report

    console = Console(record=True, width=200)
    (profile.render if report["command"] == "profile" else memory.render)(read_report(report), console)
    return console.export_text()


def test_memory_in_every_process_of_a_two_process_job(tmp_path):
    """Each process measures its own devices; process 0's report lists every process's peak (gathered through
    the coordination service), and the step's program is the per-device one (a quarter of the batch)."""
    out, temporary = tmp_path / "mem", tmp_path / "tmp"
    temporary.mkdir()
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "TMPDIR": str(temporary)}
    done = finish(start(["memory", os.path.join(CORPUS, "multihost_dp", "train.py"), "--out", str(out), "-q",
                         "--no-plot", "--json", str(tmp_path / "job.json")], 2, env=env))
    assert done.returncode == 0, done.stderr[-3000:]
    # Nothing of jaxdbg's is left outside --out: the launcher's logs of processes 1.. went with a job that succeeded.
    assert [name for name in os.listdir(temporary) if name.startswith("jaxdbg-")] == []
    job = json.loads((tmp_path / "job.json").read_text())
    rows = job["result"]["processes"]
    assert [(r["index"], r["note"], r["leaks"], r["out_of_memory"]) for r in rows] == [(0, None, 0, False),
                                                                                         (1, None, 0, False)]
    for index in (0, 1):
        report = json.loads((out / f"process-{index}" / "report.json").read_text())
        result = report["result"]
        devices = [d["device"] for d in result["devices"]]
        mine = [f"cpu:{d['id']}" for d in report["environment"]["devices"] if d["process_index"] == index]
        assert devices == mine and len(devices) == 2  # its own two devices, not the job's four
        assert rows[index]["peak_bytes"] == result["peak"]["bytes"] and rows[index]["peak_device"] in mine
        step = result["functions"][0]
        x = next(b for b in step["largest"] if b["argument"] == "x")
        assert (x["shape"], x["bytes"]) == ("f32[4,8]", 4 * 8 * 4)  # 16 global rows over 4 devices
        _the_barrier_is_named_as_called(result["functions"])
    assert f"sync_global_devices('weights saved') at train.py:{BARRIER}" in _rendered(job)


def test_a_process_waiting_in_a_call_for_one_whose_program_ended_is_named_and_the_ended_one_never_hangs(monkeypatch):
    """The heartbeat's judgement, fed the beats the job's key-value store would hold: process 1 stands still inside
    `total` (one more all-reduce than process 0 runs) while process 0's program has finished. Process 1 is named as
    waiting for process 0, which will never join; process 0, which waits for nothing any more, is not said to hang."""
    import time

    from jaxdbg import multihost

    beats = {0: {"text": "its program finished, after step call 2", "progress": ["step", 2], "in_call": False,
                 "ended": True, "beat": 1},
             1: {"text": "in total call 0, at t.py:28 (<module>)", "progress": ["total", 0], "in_call": True,
                 "frame": "t.py:28 (<module>)", "beat": 1}}
    monkeypatch.setattr(multihost, "peek", lambda topic, index: {**beats[index], "beat": time.monotonic()})
    for me in (1, 0):
        said: list[tuple[int, str]] = []
        monkeypatch.setattr(multihost, "job", lambda me=me: multihost.Job(me, 2))
        heartbeat = multihost.Heartbeat("profile", dict, lambda index, line, said=said: said.append((index, line)),
                                        hung_s=0.2)
        for _ in range(3):
            heartbeat._watch()
            time.sleep(0.15)
        assert [index for index, _ in said] == [1], said
        assert said[0][1].startswith("process 1 hangs: alive (its heartbeat runs) but its program has not moved")
        assert said[0][1].endswith("it stands in total call 0, at t.py:28 (<module>), waiting for process 0, which "
                                   "will never join it (its program finished, after step call 2)"), said[0][1]


@pytest.mark.parametrize("argv, says", [
    (["--processes"], "needs a number"),
    (["--processes", "0", "doctor"], "whole number"),
    (["--processes", "2"], "needs a command"),
])
def test_bad_processes_option_is_one_line_and_exit_2(argv, says):
    done = subprocess.run([sys.executable, "-m", "jaxdbg", *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and says in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_a_failing_job_without_out_says_what_the_process_said_and_leaves_no_log_behind(tmp_path):
    """`jaxdbg --processes 2 python prog.py` where process 1 fails: with no --out to keep its log in, the message
    holds its last lines, and the temporary folder its log went to is gone."""
    program, temporary = tmp_path / "prog.py", tmp_path / "tmp"
    temporary.mkdir()
    program.write_text("import os\nif os.environ['SLURM_PROCID'] == '1':\n    print('reading shard 1')\n"
                       "    raise SystemExit('shard 1 is missing')\n")
    done = finish(start(["python", str(program)], 2, env={**os.environ, "TMPDIR": str(temporary)}), 60)
    assert done.returncode == 1
    assert done.stderr.startswith("jaxdbg: process 1 of 2 exited with 1; the last lines of its output")
    assert "  | reading shard 1\n  | shard 1 is missing\n" in done.stderr
    assert os.listdir(temporary) == []


def test_a_program_that_never_joins_the_job_is_told_so(tmp_path):
    script = tmp_path / "alone.py"
    script.write_text("import jax, jax.numpy as jnp\nprint(jax.jit(jnp.sin)(1.0))\n")
    done = launch(["profile", str(script), "--out", str(tmp_path / "out"), "-q"], 2)
    assert done.returncode == 2 and "never called jax.distributed.initialize()" in done.stderr
    # Each lone process kept its capture in its own folder (one folder for both: a file read half-written).
    assert all((tmp_path / "out" / f"process-{index}" / "trace").is_dir() for index in (0, 1))


def test_profile_names_the_straggler_and_where_its_time_went(tmp_path):
    out = tmp_path / "prof"
    done = launch(["profile", os.path.join(CORPUS, "multihost_straggler", "train.py"), "--out", str(out), "-q",
                   "--json", str(tmp_path / "job.json")], 2)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "job.json").read_text())["result"]
    assert result["stragglers"] == [1]
    slow, other = result["processes"][1], result["processes"][0]
    # the others wait in the all-reduce; the straggler's host time holds at least its 4 sleeps between steps
    # (compared with a bound the program sets, not with the other process's time, which load can inflate too)
    assert other["collective_s"] > slow["collective_s"] and slow["host_s"] >= 4 * 0.3
    hint = next(h for h in result["hints"] if h.startswith("process 1 is the straggler"))
    assert "host-side work between steps" in hint


def test_four_processes_one_straggler(tmp_path):
    done = launch(["profile", os.path.join(CORPUS, "multihost_straggler", "train.py"), "--out", str(tmp_path / "p"),
                   "-q", "--json", str(tmp_path / "job.json"), "--trace-calls", "5"], 4, devices=1)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "job.json").read_text())["result"]
    assert [r["index"] for r in result["processes"]] == [0, 1, 2, 3] and result["stragglers"] == [1]
    # Every process's per-op table names the sharding behind the gradient's all-reduce over the 4 processes.
    for index in range(4):
        step = next(f for f in json.loads((tmp_path / "p" / f"process-{index}" / "report.json").read_text())[
            "result"]["functions"] if f["name"] == "step")
        cause = next(op["sharding_cause"] for op in step["ops"] if op["category"] == "collective")
        assert [a["argument"] for a in cause["arguments"]] == ["x"] and cause["axes"] == ["data"]


@pytest.mark.usefixtures("waiting_runs")  # their waits overlap this job and the next (none of them timed)
def test_nan_hunt_names_the_process_device_and_line_of_a_zero_scale_on_one_process(tmp_path):
    """The replay runs in lockstep in both processes (an SPMD program), checking values on the devices: at step 2
    process 1's part of the batch is all padding, its scale 0, and its rows 0/0. The answer names the division's
    line, process 1 and its first device (global rows 8-11), in the job's one line too."""
    program = os.path.join(CORPUS, "multihost_zero_scale", "train.py")
    done = launch(["nan-hunt", program, "--out", str(tmp_path / "n"), "-q", "--json", str(tmp_path / "job.json")], 2)
    assert done.returncode == 1, done.stderr[-3000:]
    result = json.loads((tmp_path / "job.json").read_text())["result"]
    first = result["first"]
    line = line_of(program, "0/0 where a scale is 0")
    where = (first["kind"], first["primitive"], first["pass"], first["source"]["line"], first["call_index"])
    assert where == ("nan", "div", "forward", line, 2)
    process_1 = json.loads((tmp_path / "n" / "process-1" / "report.json").read_text())
    device = f"cpu:{process_1['environment']['devices'][2]['id']}"  # process 1's first device
    assert (first["process"], first["device"], first["shard"]) == (1, device, [[8, 12], [0, 8]])
    assert [(p["index"], p["found"]) for p in result["processes"]] == [(0, True), (1, True)]
    said = f"jaxdbg nan-hunt: process 0: nan first made by div (forward pass) at train.py:{line} in step, call 2 on "
    assert f"{said}process 1 ({device})" in done.stderr, done.stderr
    assert (tmp_path / "n" / "process-1" / "nan_bundle.json").exists()


def test_nan_hunt_in_four_processes_names_the_process_device_and_shard_of_the_origin(tmp_path):
    """4 processes of 2 devices: process 1's corrupt example, its local row 5, is global row 13, on its second
    device, whose shard holds rows 12-15."""
    program = os.path.join(CORPUS, "multihost_nan", "train.py")
    done = launch(["nan-hunt", program, "--out", str(tmp_path / "n"), "-q", "--json", str(tmp_path / "job.json")], 4)
    assert done.returncode == 1, done.stderr[-3000:]
    result = json.loads((tmp_path / "job.json").read_text())["result"]
    first, devices = result["first"], json.loads((tmp_path / "job.json").read_text())["environment"]["devices"]
    where = (first["primitive"], first["pass"], first["source"]["line"], first["call_index"])
    assert where == ("log", "forward", line_of(program, "log-scaled first feature"), 2)
    assert (first["process"], first["shard"]) == (1, [[12, 16], [0, 1]])
    assert first["device"] == f"cpu:{[d['id'] for d in devices if d['process_index'] == 1][1]}"
    assert [(p["index"], p["found"]) for p in result["processes"]] == [(i, True) for i in range(4)]
    assert (tmp_path / "n" / "process-1" / "nan_bundle.json").exists()


def test_doctor_reports_the_job_and_compares_versions(tmp_path):
    done = launch(["doctor", "--no-profiler", "--out", str(tmp_path / "d"), "-q", "--json", str(tmp_path / "d.json")],
                  2)
    assert done.returncode == 0, done.stderr[-3000:]
    job = json.loads((tmp_path / "d.json").read_text())["result"]["distributed"]
    assert (job["cluster"], job["process_index"], job["process_count"], job["local_devices"], job["devices"]) == (
        "slurm", 0, 2, 2, 4)
    assert set(job["versions_by_process"]) == {"0", "1"}


def test_doctor_distributed_exit_codes_nothing_to_join_missing_process(waiting_runs):
    """--distributed with nothing describing a job is bad usage (2); a job whose other process never comes is a
    failed check (1) with the report written, not JAX's SIGABRT (134) taking the answer with it."""
    (alone, lone), tmp_path = waiting_runs["doctor"]()
    assert alone.returncode == 2 and "cannot tell which job to join" in alone.stderr, alone.stderr[-2000:]
    assert lone.returncode == 1, lone.stderr[-2000:]
    assert "not every process of the job reached the coordinator within 3 s" in lone.stderr
    job = json.loads((tmp_path / "b.json").read_text())["result"]["distributed"]
    assert (job["cluster"], job["joined"]) == ("slurm", False)


def test_version_mismatch_and_silent_processes_fail_the_check():
    from jaxdbg.doctor import _version_checks

    same = {"python": "3.11.7", "jax": "0.10.2", "jaxlib": "0.10.2", "libtpu": "not installed"}
    assert [c.status for c in _version_checks({0: same, 1: dict(same)}, 2)] == ["ok"]
    checks = _version_checks({0: same, 2: {**same, "jax": "0.11.2"}}, 3)
    assert [c.status for c in checks] == ["fail", "fail"]
    assert "process 1 did not report" in checks[0].detail and "jax 0.11.2 (process 0: 0.10.2)" in checks[1].detail


def test_a_process_that_dies_is_named_not_waited_for(waiting_jobs):
    """Process 1 aborts at step 3; process 0's all-reduce fails, and its report names process 1 and where it
    last stood, well before the timeout."""
    done, tmp_path = waiting_jobs["dies"]()
    report = json.loads((tmp_path / "job.json").read_text())
    assert done.returncode == 3 and report["exit_code"] == 3, done.stderr[-3000:]
    rows = report["result"]["processes"]
    assert rows[0]["note"] == "" and rows[1]["note"].startswith("process 1 sent no report (it stopped answering")
    assert "last seen" in rows[1]["note"]
    assert any(note.startswith("process 1 stopped answering") for note in report["result"]["notes"])
    # Its own jaxdbg's words (its report in the shared --out) say how and where it died, in process 0's error line
    # too (process 0's own error, a collective whose peer left, follows from it), which names process 0.
    died = (f"process 1 failed (its own report): the target crashed with SIGABRT at "
            f"{os.path.join(CORPUS, 'multihost_dies', 'train.py')}:{line_of(DIES, 'os.abort()')} (<module>)")
    assert died in rows[1]["note"] and died in report["result"]["error"], report["result"]["error"]
    assert f"jaxdbg profile: process 0: {report['result']['error']}" in done.stderr
    assert "hangs" not in str(report["result"]["notes"])  # no process is said to hang: one died, one failed


def test_a_job_whose_process_fails_at_its_start_is_stopped_not_left_waiting(waiting_jobs):
    """Process 1 raises right after jax.distributed.initialize(); process 0 waits for it in the job's first
    collective. The launcher stops process 0 once its grace after process 1's failure has passed (it used to wait
    for process 0 first: here until gloo's deadline, on a GPU in the backend's start for good): exit 3, process 1
    named with its own error, and the line saying process 0 was stopped. The SIGTERM that stops it ends its run as
    its --timeout would: its own report (exit 3) and its one line say so (it used to leave no report)."""
    from jaxdbg.launch import FAILED_PEER_GRACE_S

    done, tmp_path = waiting_jobs["fails_at_start"]()
    assert done.returncode == 3, done.stderr[-3000:]
    log = tmp_path / "p" / "process-1" / "launch.log"
    said = (f"jaxdbg: process 1 of 2 exited with 3: jaxdbg profile: process 1: the target raised FileNotFoundError: "
            f"no data shard for process 1 at {FAILS_AT_START}:{line_of(FAILS_AT_START, '<- process 1 fails here')} "
            f"(<module>) (log: {log})\n")
    stopped = (f"jaxdbg: process 1 of 2 failed (exit 3) and a job cannot go on without one of its processes: "
               f"process 0 was stopped {FAILED_PEER_GRACE_S:.0f} s after it\n")
    assert done.stderr.endswith(said + stopped), done.stderr[-3000:]
    assert json.loads((tmp_path / "p" / "process-1" / "report.json").read_text())["exit_code"] == 3
    # (process-0/ once its program has told its place in the job, which it may not reach before it waits)
    own = next(path for path in (tmp_path / "p" / "report.json", tmp_path / "p" / "process-0" / "report.json")
               if path.exists())
    report = json.loads(own.read_text())
    error = report["result"]["error"]
    assert report["exit_code"] == 3 and error.startswith("the target was stopped after "), report
    assert "s (jaxdbg received SIGTERM)" in error and f"jaxdbg profile: process 0: {error}\n" in done.stderr


def test_a_process_that_fails_at_its_start_keeps_its_report_where_no_launcher_made_its_folder(waiting_runs):
    """Process 1 fails before any capture made its process-1/ folder (under srun nothing else makes it): its
    report and its program's stderr are written there all the same (exit 3, not jaxdbg's own failure, exit 4)."""
    (done,), tmp_path = waiting_runs["no_folder"]()
    assert done.returncode == 3 and "no data shard for process 1" in done.stderr, done.stderr[-3000:]
    report = json.loads((tmp_path / "p" / "process-1" / "report.json").read_text())
    with open(report["artifacts"]["target_stderr"]) as stderr:
        assert "FileNotFoundError: no data shard for process 1" in stderr.read()


def test_a_process_without_a_gpu_of_its_own_is_told_how_to_run_the_job():
    """What a process of a local job on a machine with fewer GPUs than processes says (JAX gives it the GPU of its
    SLURM_LOCALID): the launcher's line adds what to do; another failure's does not."""
    from jaxdbg.launch import failure_message

    for said in ("RuntimeError: Unable to initialize backend 'cuda': INTERNAL: no supported devices found for "
                 "platform CUDA", "RuntimeError: Unable to initialize backend 'rocm': INTERNAL: ..."):
        line = failure_message(1, 4, 3, ["jaxdbg profile: process 1: the target raised " + said], "o/launch.log")
        assert line.startswith("jaxdbg: process 1 of 4 exited with 3: jaxdbg profile: process 1: the target raised")
        assert "(log: o/launch.log); each process of a local job takes the GPU numbered by its SLURM_LOCALID" in line
        assert "--processes 4 needs 4 GPUs: with fewer, set JAX_PLATFORMS=cpu" in line and "\n" not in line
    assert "GPU" not in failure_message(1, 2, 3, ["FileNotFoundError: no data shard for process 1"], "o/launch.log")


def test_a_process_that_hangs_is_named_with_where_it_stands(waiting_jobs):
    """Process 1 sleeps forever in host code at step 1 (its heartbeat thread alive), process 0 waits for it in
    the all-reduce: --timeout ends the job (exit 3), and process 0's error line names process 1 and the line
    its main thread stands at, read by its heartbeat."""
    line = line_of(HANGS, "the stuck read")
    done, tmp_path = waiting_jobs["hangs"]()
    report = json.loads((tmp_path / "job.json").read_text())
    assert done.returncode == 3 and report["exit_code"] == 3, done.stderr[-3000:]
    error = report["result"]["error"]
    assert error.startswith("the target timed out") and "process 1 hangs: alive (its heartbeat runs)" in error
    assert "it stands after step call 0, " in error and f"train.py:{line} (read_batch)" in error
    assert "(process 0 waits in step call 1" in error and error in done.stderr
    peer = json.loads((tmp_path / "p" / "process-1" / "report.json").read_text())
    # Process 1's own report names itself, not process 0, which waits in a call for it.
    assert peer["exit_code"] == 3 and "process 1 hangs" in peer["result"]["error"] and " 0 hangs" not in str(peer)


def test_processes_that_run_different_commands_stop_with_one_line(waiting_runs):
    """A launch-line typo: process 0 profiles, process 1 hunts NaNs on the same program. Each finds the other's
    command through the job's key-value store at its first jitted call and stops (exit 2), naming both."""
    ends, _ = waiting_runs["commands"]()
    said = (f"process 0 runs 'jaxdbg profile {DP} --timeout 120', "
            f"process 1 runs 'jaxdbg nan-hunt {DP} --timeout")
    for end in ends:
        assert end.returncode == 2 and said in end.stderr, end.stderr[-2000:]
        assert len(end.stderr.strip().splitlines()) == 1, end.stderr[-2000:]


def test_processes_whose_script_arguments_differ_run_as_one_job(tmp_path):
    """A launch script that passes each process its id after `--` (one `jaxdbg` per process): the command and
    target are the same, so the job runs (the contract lets `-- ARGS` differ) and process 0 speaks for both."""
    from jaxdbg.launch import free_port, task_environment

    program = os.path.join(CORPUS, "multihost_dp", "train.py")
    port, base = free_port(), {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    procs = [subprocess.Popen([sys.executable, "-m", "jaxdbg", "nan-hunt", program, "--out", str(tmp_path / "o"),
                               "-q", "--timeout", "120", "--json", str(tmp_path / "job.json"), "--", "--process-id",
                               str(i)], env=task_environment(i, 2, port, base), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    ends = [proc.communicate(timeout=150) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], [err[-2000:] for _, err in ends]
    job = json.loads((tmp_path / "job.json").read_text())
    assert job["environment"]["process_count"] == 2 and [p["found"] for p in job["result"]["processes"]] == [False] * 2


def _repro_job(tmp_path, program: str, devices: int) -> tuple[dict, dict, str]:
    out = tmp_path / "r"
    done = launch(["repro", os.path.join(CORPUS, program, "train.py"), "--out", str(out), "-q", "--max-time", "120",
                   "--timeout", "60", "--json", str(tmp_path / "job.json")], 2, devices=devices)
    assert done.returncode == 0, done.stderr[-3000:]
    job = json.loads((tmp_path / "job.json").read_text())
    peer = json.loads((out / "process-1" / "report.json").read_text())
    assert (job["environment"]["process_index"], job["environment"]["process_count"]) == (0, 2)
    assert peer["environment"]["process_index"] == 1 and "process 0's report" in peer["result"]["verification"]
    assert not (out / "process-1" / "repro.py").exists()
    return job, peer, (out / "repro.py").read_text()


def test_repro_of_a_shape_error_in_a_sharded_step_is_one_process_with_the_global_shapes(tmp_path):
    """Every process traces the step on the global batch (2 processes x 2 devices x 4 rows); the failing
    operation alone, on those global shapes, fails the same way in one process, with no jax.distributed."""
    job, _, text = _repro_job(tmp_path, "multihost_shape", 2)
    result = job["result"]
    assert result["verified"] and result["strategy"] == "computation"
    assert result["failing_primitives"] == ["dot_general"]
    assert "np.zeros((16, 8)" in text and "distributed" not in text
    assert any(note.startswith("reproduced in one process") for note in result["notes"])


def test_repro_of_a_nan_in_one_shard_gathers_the_global_inputs(tmp_path):
    """The NaN comes from process 1's shard; the capture gathers the step's sharded inputs whole, process 0
    cuts them to the log of the negative example, and that runs alone in one process."""
    job, _, text = _repro_job(tmp_path, "multihost_nan", 2)
    result = job["result"]
    assert result["verified"] and result["signature"]["kind"] == "nonfinite"
    assert result["failing_primitives"] == ["log"] and "-1.0" in text and "distributed" not in text


def test_repro_of_a_lost_peer_is_the_job_program_with_its_launch_line(waiting_runs):
    """Process 1 is killed mid-job, so process 0's all-reduce fails: a failure only the job has. Process 0
    writes the program as repro.py with the launch line of 2 local processes, verifies it run that way and
    names the process the job lost (the program's 10 s heartbeat timeout ends the survivors soon after)."""
    (done,), tmp_path = waiting_runs["lost_peer"]()
    out = tmp_path / "r"
    # Its verification ran a failing 2-process job without --out: the launcher's logs went with it.
    assert [name for name in os.listdir(tmp_path / "tmp") if name.startswith("jaxdbg-")] == []
    job = json.loads((tmp_path / "job.json").read_text())
    assert done.returncode == 0 and job["exit_code"] == 0, done.stderr[-3000:]
    result = job["result"]
    # Process 0's own failure: the exception its all-reduce raised (not the runtime's abort that followed).
    signature = result["signature"]
    assert (signature["kind"], signature["type"]) == ("exception", "JaxRuntimeError") and "Gloo" in signature["message"]
    assert result["verified"] and result["strategy"] == "source"
    assert result["verification"].startswith("`jaxdbg --processes 2 python repro.py` alone in an empty folder raised")
    assert result["verification"].endswith("; process 1 was killed (SIGKILL)")  # the one the job lost, named
    assert any(note.startswith("the failure needs several processes") for note in result["notes"])
    text = (out / "repro.py").read_text()
    assert "# the failure needs a 2-process job: run jaxdbg --processes 2 python repro.py" in text
    assert "jax.distributed.initialize(heartbeat_timeout_seconds=10)" in text
    peer = json.loads((out / "process-1" / "report.json").read_text())
    assert (peer["environment"]["process_index"], peer["exit_code"]) == (1, 0)
    assert (peer["result"]["signature"]["kind"], peer["result"]["signature"]["signal"]) == ("crash", "SIGKILL")
    assert "process 0's report" in peer["result"]["verification"] and not (out / "process-1" / "repro.py").exists()


def test_nan_hunt_names_the_process_a_job_hangs_on(waiting_jobs):
    """The same hung job under nan-hunt: its watch has no hook at the program's jax.distributed.initialize(),
    so a heartbeat starts once the program has joined; --timeout's line (exit 3) names process 1 and its line."""
    line = line_of(HANGS, "the stuck read")
    done, _ = waiting_jobs["nan_hangs"]()
    assert done.returncode == 3, done.stderr[-3000:]
    first = done.stderr.strip().splitlines()[0]
    said = f"jaxdbg nan-hunt: process 0: the target ran past --timeout {float(HANG_TIMEOUT)}s (process 1 hangs: alive"
    assert first.startswith(said), first
    assert f"train.py:{line} (read_batch)" in first and "(process 0 waits in a call of step" in first


def test_a_peer_that_never_starts_is_said_at_the_timeout(waiting_jobs):
    """Process 0 of a 2-process job started alone: the program waits in jax.distributed.initialize() for a
    peer that never comes. --timeout stops it (exit 3) with a line that says so, not 'never called
    jax.distributed.initialize()'."""
    done, _ = waiting_jobs["never_starts"]()
    assert done.returncode == 3, done.stderr[-3000:]
    (line,) = done.stderr.strip().splitlines()
    assert "waiting in jax.distributed.initialize() for the job's other processes" in line, line
    assert "start every process of the job" in line
