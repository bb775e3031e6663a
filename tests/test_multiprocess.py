"""Multi-process jobs (jax.distributed, gloo collectives on CPU devices): jaxdbg in front of every process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(argv: list[str], processes: int, devices: int = 2, timeout: float = 240) -> list[subprocess.CompletedProcess]:
    """Run ``python -m jaxdbg ARGV`` once per process, as a job's launcher would (same command line)."""
    port = free_port()
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
           "COORD": f"127.0.0.1:{port}", "NPROC": str(processes)}
    procs = [subprocess.Popen([sys.executable, "-m", "jaxdbg", *argv], env={**env, "PID": str(i)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(processes)]
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


def test_profile_runs_in_every_process_of_a_two_process_job(tmp_path):
    out = tmp_path / "prof"
    done = launch(["profile", os.path.join(CORPUS, "multihost_dp", "train.py"), "--out", str(out), "-q"], 2)
    assert [d.returncode for d in done] == [0, 0], [d.stderr[-2000:] for d in done]
    for index in (0, 1):
        report = json.loads((out / f"process-{index}" / "report.json").read_text())
        env = report["environment"]
        assert (env["process_index"], env["process_count"]) == (index, 2)
        assert {d["process_index"] for d in env["devices"]} == {0, 1}  # the job's 4 devices, 2 per process
        step = next(f for f in report["result"]["functions"] if f["name"] == "step")
        assert step["execute"]["calls"] == 5
        # The gradient's all-reduce across processes shows in the per-op table, at the user's line.
        ops = {op["category"]: op for op in step["ops"]}
        assert "collective" in ops and ops["collective"]["source"]["file"].endswith("train.py")
        assert os.path.isdir(out / f"process-{index}" / "trace")
