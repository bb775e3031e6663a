"""``jaxdbg repro`` in a process of a multi-process job (``jax.distributed``: every process runs the command).

The job's program runs only as a job, so every contained run here is one run of the whole job: each process
runs it once, in lockstep, as its launcher placed it. What the runs record is a single-process program
wherever the failure does not need several processes (the usual case):

- an exception raised by one JAX operation (a shape or dtype error) is traced with the job's global shapes
  in every process, and the detection run already writes that operation alone (:mod:`jaxdbg.repro.operation`);
- a NaN/Inf in a jitted call: a second job run captures the call, its sharded inputs gathered whole in every
  process (:func:`jaxdbg.multihost.global_value`, a collective), and process 0 alone cuts that computation
  on one device while the others wait in the job.

Each is verified by process 0 alone in an empty folder, as ``python repro.py`` would run. Otherwise (the
failure needs the job: a process that dies, a collective that never completes, a cut that does not fail
alone) process 0 writes the program as ``repro.py`` with its launch line for N local processes,
``jaxdbg --processes N python repro.py``, and verifies it that way; its verification names the processes
that ended otherwise (the launcher's exit codes) or that JAX's coordination service found lost (a stopped
heartbeat). The other processes write no reproducer: process 0's report speaks for the job.

Example (the end-to-end runs: tests/test_multiprocess.py::test_repro_of_a_nan_in_one_shard_gathers_the_global_inputs):
    >>> launch_line(4)   # how a reproducer that needs the job runs on one machine
    'jaxdbg --processes 4 python repro.py'
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from typing import Any

from jaxdbg.launch import WORKER_VARIABLE
from jaxdbg.repro.failures import Failure
from jaxdbg.repro.program import REPRO_FILE, count_lines
from jaxdbg.repro.result import ReproResult, Size
from jaxdbg.runner import signal_name


def launch_line(count: int) -> str:
    """How to run a multi-process reproducer on one machine.

    Example:
        >>> launch_line(2)
        'jaxdbg --processes 2 python repro.py'
    """
    return f"jaxdbg --processes {count} python {REPRO_FILE}"


def run_in_job(rep: Any) -> tuple[ReproResult, dict[str, str]]:
    """Detect, record and verify as process ``rep.place[0]`` of ``rep.place[1]`` (see the module docstring)."""
    index, count = rep.place
    target, flaky, runs, outcomes = rep.detect()
    kind = target.signature.kind
    done = None
    if kind == "nonfinite":
        done = rep.cut(target, flaky, runs)  # a job run in every process; process 0's child cuts
    elif kind == "exception" and target.raised_in_jax and index == 0:
        done = rep.cut_operation(target, flaky, runs, outcomes)
    lines = rep.subject.original_lines
    if index != 0:
        return ReproResult(
            signature=target.signature, original=Size(lines), minimized=Size(lines), checks=rep.checks,
            elapsed_s=round(rep.clock.elapsed(), 2), verified=False, strategy="source", flaky=flaky, runs=runs,
            verification=f"process {index} of {count} took part in the job's runs; process 0's report and "
                         "reproducer speak for the job", notes=rep.notes), {}
    if done is not None:
        result, artifacts = done
        recorded = "global shapes and values" if kind == "nonfinite" else "global shapes"
        rep.notes.append(f"reproduced in one process: the failure of this {count}-process job does not need "
                         f"several (recorded with the job's {recorded})")
        return _with_notes(result, rep.notes), artifacts
    return job_program(rep, target, flaky, runs, count, "".join(o.stderr for o in outcomes))


def job_program(rep: Any, target: Failure, flaky: bool, runs: list[str], count: int,
                detection_log: str = "") -> tuple[ReproResult, dict[str, str]]:
    """The program itself as ``repro.py``, with the launch line of ``count`` local processes, verified so."""
    path = os.path.join(rep.out_dir, REPRO_FILE)
    text = (f"# jaxdbg repro: {target.signature.describe()}\n"
            f"# the failure needs a {count}-process job: run {launch_line(count)}\n"
            f"# (or your cluster's launch line, {count} processes)\n" + rep.subject.source)
    with open(path, "w") as handle:
        handle.write(text)
    verified, said, log = verify_in_job(path, target, count, rep.detect_timeout, rep.work,
                                        rep.subject.request.argv)
    rep.checks += 1
    lost = lost_processes(detection_log + log)
    if lost:
        said += "; " + ", ".join(f"process {index} {how}" for index, how in sorted(lost.items()))
    rep.notes.append(f"the failure needs several processes: {REPRO_FILE} is the program, run as a "
                     f"{count}-process job ({launch_line(count)}); it was not reduced")
    result = ReproResult(
        signature=target.signature, original=Size(rep.subject.original_lines), minimized=Size(count_lines(text)),
        checks=rep.checks, elapsed_s=round(rep.clock.elapsed(), 2), verified=verified, strategy="source",
        flaky=flaky, runs=runs, verification=f"`{launch_line(count)}` alone in an empty folder {said}",
        notes=rep.notes)
    return result, {"repro": path}


def verify_in_job(path: str, target: Failure, count: int, timeout: float, work: str,
                  argv: tuple[str, ...] = ()) -> tuple[bool, str, str]:
    """Run ``path`` copied alone into an empty folder as a job of ``count`` local processes; did it fail as
    ``target`` did (the exception's type and message in process 0's output, a crash, a hang)? Also what it
    said on stderr (the launcher's and the job's runtime's words on the other processes)."""
    folder = tempfile.mkdtemp(prefix="alone-job-", dir=work)
    try:
        shutil.copyfile(path, os.path.join(folder, REPRO_FILE))
        env = {k: v for k, v in os.environ.items() if k != WORKER_VARIABLE}  # a job of its own, not ours
        command = [sys.executable, "-m", "jaxdbg", "--processes", str(count), "python", REPRO_FILE, *argv]
        try:
            done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True,
                                  timeout=timeout * 2 + 30, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return target.signature.kind == "timeout", "hung (stopped after the timeout)", ""
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    signature = target.signature
    if done.returncode == 0:
        return False, "ran to completion without failing (expected it to fail)", done.stderr
    if signature.kind == "exception":
        # The same exception type: a job's runtime words a lost peer differently from run to run ("connection
        # reset", "closed by peer"), so the message is compared, and reported, but not required.
        raised = re.findall(rf"^(?:\S+\.)?{re.escape(signature.type or '')}: (.*)$", done.stderr, re.M)
        same = any(signature.same_exception(signature.type or "", message) for message in raised)
        words = "" if same else " (in other words)"
        return bool(raised), (f"raised {signature.type}{words}" if raised
                              else f"failed otherwise (exit {done.returncode})"), done.stderr
    return signature.kind in ("crash", "timeout", "nonfinite"), f"failed (exit {done.returncode})", done.stderr


def lost_processes(log: str) -> dict[int, str]:
    """The processes of a local job that ended otherwise than process 0, as the launcher
    (:func:`jaxdbg.launch.launch`) names them, or that JAX's coordination service found lost (their
    heartbeat stopped): index -> how, in words.

    Example:
        >>> lost_processes("jaxdbg: process 1 of 2 exited with -9: ... (log: /tmp/x)\\n"
        ...                "UNAVAILABLE: Task 3 heartbeat timeout. This indicates ...")
        {1: 'was killed (SIGKILL)', 3: 'stopped answering (its heartbeat timed out)'}
    """
    lost: dict[int, str] = {}
    for index, code in re.findall(r"^jaxdbg: process (\d+) of \d+ exited with (-?\d+)", log, re.M):
        number = int(code)
        lost[int(index)] = f"was killed ({signal_name(-number)})" if number < 0 else f"exited with {number}"
    for index in re.findall(r"\bTask (\d+) heartbeat timeout", log):
        lost.setdefault(int(index), "stopped answering (its heartbeat timed out)")
    return lost



def _with_notes(result: ReproResult, notes: list[str]) -> ReproResult:
    return replace(result, notes=list(notes))
