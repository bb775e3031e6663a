"""Real pipeline mode across the processes of a jax.distributed job (2 local processes, CPU devices): each
process runs its own stages, messages between processes go by jax.experimental.transfer, and every
process's merged runs keep every dependency, message delay, fixed order and memory cap, with gradients equal
to the single-device reference. Only the order of events is checked, never wall time."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from jaxdbg.launch import free_port, task_environment
from jaxdbg.pipeline.arbiter import RunRecord
from jaxdbg.pipeline.metrics import timeline_problems
from jaxdbg.pipeline.policies import memory_caps
from jaxdbg.pipeline.schedules import build_schedule, shape_for
from jaxdbg.pipeline.variability import Costs, parse_variability, realise

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FAST = Costs(forward_s=0.002, backward_s=0.004, comm_s=0.0002)


def _two_processes(argv: list[str], devices: int, timeout: float = 240) -> list[subprocess.CompletedProcess]:
    """The processes of one local job (the environment ``jaxdbg --processes 2`` gives each)."""
    port = free_port()
    base = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
            "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
    procs = [subprocess.Popen([sys.executable, *argv], env=task_environment(i, 2, port, base), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
    try:
        for proc in procs:
            proc.wait(timeout)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return [subprocess.CompletedProcess(p.args, p.returncode, p.stdout.read() if p.stdout else "") for p in procs]


def test_stages_in_two_processes_match_the_reference_and_keep_the_timeline(tmp_path):
    done = _two_processes([os.path.join(HERE, "data", "pipeline_real_process.py"), str(tmp_path)], devices=2)
    assert all(p.returncode == 0 for p in done), [p.stdout[-3000:] for p in done]
    parts = [json.loads((tmp_path / f"process-{i}.json").read_text()) for i in range(2)]
    assert [p["count"] for p in parts] == [2, 2]
    assert parts[0]["owner"] == [0, 0, 1, 1] and parts[0]["stage_processes"] == [0, 0, 1, 1]
    assert parts[0]["runs"] == parts[1]["runs"]  # every process holds the whole job's runs
    shape = shape_for("1f1b", 4, 4, 1)
    durations = realise(parse_variability("jitter:cv=0.3+comm:cv=0.5", 4), shape, FAST, 0)
    graph, owner = shape.graph(), parts[0]["owner"]
    sent = np.asarray(graph.remote) >= 0
    crossing = np.array([sent[t] and owner[graph.worker[t]] != owner[graph.worker[graph.remote[t]]]
                         for t in range(shape.num_tasks)])
    assert crossing.sum() == 2 * 4  # 2F and 3B hand over between processes
    for run in parts[0]["runs"]:
        assert run["grad_max"] > 0 and run["grad_diff"] <= 1e-6 + 1e-4 * run["grad_max"], run["policy"]
        record = RunRecord(shape, np.asarray(run["start"]), np.asarray(run["end"]), tuple(run["blocked"]),
                           tuple(run["memory_wait"]), tuple(run["peak"]), run["decisions"], run["decision_ns"])
        orders = build_schedule("1f1b", shape).orders if run["policy"] == "fixed" else None
        caps = memory_caps(shape, run["cap"]) if run["policy"] == "ready" else None
        assert timeline_problems(record, durations, orders, caps, tolerance=1e-6) == [], run["policy"]
        assert np.all(record.end > record.start) and run["decisions"] > 0
        delay = np.asarray(run["delay"])
        # A message within a process is held as drawn; one between processes at least that (its transfer).
        np.testing.assert_allclose(delay[sent & ~crossing], durations.comm[sent & ~crossing])
        assert np.all(delay[crossing] >= durations.comm[crossing] - 1e-9) and np.all(delay[~sent] == 0)
    assert parts[0]["runs"][1]["comm"] == "sync" and sum(parts[0]["runs"][1]["blocked"]) > 0
    # A third run, where process 0's first note is altered in the coordination service (an earlier arrival,
    # its HMAC left alone): process 1 refuses it and names it, process 0 hears why the run stopped.
    refused = "refused a message from process 0 (run 2: process 0 -> 1 #0): its HMAC does not verify"
    assert parts[1]["tampered"].startswith("MessageRefused: " + refused), parts[1]["tampered"]
    assert refused in parts[0]["tampered"] and "MessageRefused" in parts[0]["tampered"], parts[0]["tampered"]


def test_cli_real_mode_across_two_processes(tmp_path):
    """``jaxdbg --processes 2 pipeline-bench --mode real``: stages of two devices each (split backward) in two
    processes; process 0's report speaks for the job, each process writes its own."""
    out = tmp_path / "out"
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    done = subprocess.run(
        [sys.executable, "-m", "jaxdbg", "--processes", "2", "pipeline-bench", "--mode", "real", "--stages", "2",
         "--microbatches", "4", "--schedule", "zb-h1", "--hint", "bfw", "--memory-cap", "2", "--devices-per-stage",
         "2", "--variability", "jitter:cv=0.3", "--task-ms", "2", "--out", str(out), "--json",
         str(tmp_path / "job.json"), "-q"], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    job = json.loads((tmp_path / "job.json").read_text())
    assert (job["environment"]["process_index"], job["environment"]["process_count"]) == (0, 2)
    result = job["result"]
    assert result["correctness"]["ok"] and result["correctness"]["runs_checked"] == 2
    assert [(r["policy"], r["max_abs_grad_diff"] <= result["correctness"]["tolerance"]) for r in result["runs"]] == [
        ("fixed", True), ("ready", True)]
    # Stage 0 on process 0's two devices, stage 1 on process 1's.
    processes = {d["id"]: d["process_index"] for d in job["environment"]["devices"]}
    assert len(result["devices"]) == 4 and len({processes[int(d.split(":")[1])] for d in result["devices"]}) == 2
    other = json.loads((out / "process-1" / "report.json").read_text())
    assert other["environment"]["process_index"] == 1
    differ = [(i, key, mine, theirs) for i, (row, peer) in enumerate(zip(result["runs"], other["result"]["runs"]))
              for key in sorted(set(row) | set(peer)) if (mine := row.get(key)) != (theirs := peer.get(key))]
    assert len(other["result"]["runs"]) == len(result["runs"]) and not differ, differ  # (row, field, p0, p1)
    assert (out / "process-0" / "durations.json").is_file()

