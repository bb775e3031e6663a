"""``jaxdbg --processes N <command> ...``: run a multi-process job on this machine, as a cluster would.

Every process of a ``jax.distributed`` job runs the same command line; on a cluster the launcher (srun,
mpirun, a JobSet) starts them and tells JAX which process is which. Here, for tests and for users without a
cluster, jaxdbg starts N copies of the same jaxdbg command and gives each the environment of one task of a
one-node SLURM step (``SLURM_PROCID`` etc.) plus ``JAX_COORDINATOR_ADDRESS`` on a free loopback port, so the
program's own unmodified ``jax.distributed.initialize()`` finds its place by JAX's own cluster detection.
CPU collectives across processes use gloo unless the user chose otherwise.

Process 0's output is shown as it comes (its report speaks for the job); the other processes' output goes
to a log file, ``process-<i>/launch.log`` in the command's ``--out`` (where the process writes its report), and
any that fails is named with its last line and that log. Where no ``--out`` is given the logs go to a temporary
folder, removed when the job ends: a failing process is named with the last lines of its output instead. A job
cannot go on without one of its processes: once one fails, the others still running are stopped a grace period
later (``FAILED_PEER_GRACE_S``), so that one waiting for the lost process (in a collective, in JAX's start) does not
hold the job forever; each stopped jaxdbg command writes its report as at its ``--timeout`` (SIGTERM, see
``runner.end_runs_at_sigterm``).

Example:
    >>> env = task_environment(1, 4, 12345, {"PATH": "/bin"})
    >>> env["SLURM_PROCID"], env["SLURM_NTASKS"], env["JAX_COORDINATOR_ADDRESS"]
    ('1', '4', '127.0.0.1:12345')
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from jaxdbg._errors import UsageError

WORKER_VARIABLE = "JAXDBG_LAUNCHED_PROCESS"  # set in each launched process: it must not launch again
# Set by the command line (jaxdbg.cli.main): the jaxdbg command this process runs, which the processes of a
# job compare (multihost.agree_on_command). Here, not in multihost, so the command line imports no jax.
COMMAND_VARIABLE = "JAXDBG_COMMAND_LINE"
# XLA flags a command adds for its contained run; the child appends them to XLA_FLAGS as the backend starts
# (jaxdbg._compat.add_xla_flags_at_backend_start), after the program has set its own.
XLA_FLAGS_VARIABLE = "JAXDBG_XLA_FLAGS"
INLINE_LOG_LINES = 10  # of a failing process's output, shown in the message when no --out keeps its log
SILENT_S = 15.0  # a peer whose heartbeat has not moved for this long is reported as lost (multihost.Heartbeat)
# Once a process of a job has failed, how long the others may run on before they are stopped (a job cannot go on
# without one of its processes; left alone, they may wait for it forever in a collective or in JAX's start):
# their own jaxdbg needs the lost peer's silence (SILENT_S) and a moment more to write the report that names it.
FAILED_PEER_GRACE_S = 2 * SILENT_S
POLL_S = 0.2  # how often the launcher looks at its processes


# (index, count) variables of the launchers whose place jax's cluster detection reads from the environment.
PLACE_VARIABLES = (("SLURM_PROCID", "SLURM_NTASKS"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                   ("JAX_PROCESS_ID", "JAX_NUM_PROCESSES"))


def launched_place(env: Mapping[str, str]) -> tuple[int, int] | None:
    """``(index, count)`` of this process in a job of several processes, as its launcher's environment says
    (before any JAX: a command whose own process never joins the job, like repro's, learns its place here).

    Example:
        >>> launched_place(task_environment(1, 2, 12345, {}))
        (1, 2)
        >>> launched_place({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) is None
        True
    """
    for index, count in PLACE_VARIABLES:
        if env.get(index, "").isdigit() and env.get(count, "").isdigit() and int(env[count]) > 1:
            return int(env[index]), int(env[count])
    return None


# What a heartbeat's line about a hung process says (multihost.hung_line); the parent finds it among the notes.
HANG_MARK = " hangs: alive"
# What process 0's note about a peer that failed says, quoting the peer's own report (profile.jobs.peer_failure).
PEER_FAILED_MARK = " failed (its own report): "
LOST_MARK = " stopped answering "  # a heartbeat's line about a peer whose heartbeat stopped (multihost.Heartbeat)


def hang_named(notes: Sequence[str], status: str) -> str | None:
    """The note naming the process a job stopped on, for a run that ended because of it: the heartbeat's line
    about a hung process (the run stopped at ``--timeout``, or crashed: the runtime of a process aborts it when
    another process, stopped at its own timeout first, leaves the job), else the line about a peer that failed
    (its own report's words), else about one that stopped answering (dead or frozen): this process then waits
    for it in a collective until ``--timeout``, or the collective fails ('connection reset by peer'); None
    otherwise.

    Example:
        >>> notes = ["process 1 hangs: alive (its heartbeat runs) but its program has not moved for 6 s"]
        >>> hang_named(notes, "crash")[:17], hang_named(notes, "exception")
        ('process 1 hangs: ', None)
        >>> lost = "process 1 stopped answering 15 s ago (it died or froze); last seen in mean call 0"
        >>> hang_named([lost, "process 1 failed (its own report): the target crashed with SIGABRT"], "timeout")[:16]
        'process 1 failed'
        >>> hang_named([lost], "exception")[:27]
        'process 1 stopped answering'
    """
    failed = status in ("timeout", "crash", "exception")
    for mark, when in ((HANG_MARK, status in ("timeout", "crash")), (PEER_FAILED_MARK, failed), (LOST_MARK, failed)):
        found = next((note for note in notes if mark in note), None) if when else None
        if found is not None:
            return found
    return None


def naming_process(line: str, place: tuple[int, int] | None) -> str:
    """A one-line message of one process of a job, prefixed with the process it comes from (the processes of a
    job print the same kinds of lines, often into one log): unchanged outside a job, or where it starts by naming
    the processes it speaks of (a verdict about the job: 'process 1 died ...', 'the processes diverged ...').

    Example:
        >>> naming_process("the target raised ValueError: x at a.py:3", (1, 2))
        'process 1: the target raised ValueError: x at a.py:3'
        >>> naming_process("process 2 sent no report", (0, 4)), naming_process("found", None)
        ('process 2 sent no report', 'found')
    """
    if place is None or _NAMES_PROCESSES.match(line):
        return line
    return f"process {place[0]}: {line}"


_NAMES_PROCESSES = re.compile(r"(the (job's )?)?process(es)? ")


def free_port() -> int:
    """A free TCP port on the loopback interface (for the job's coordinator)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def task_environment(index: int, count: int, port: int, base: Mapping[str, str]) -> dict[str, str]:
    """The environment of process ``index`` of ``count``: one task of a one-node SLURM step."""
    env = dict(base)
    env.update({
        "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
        "SLURM_JOB_ID": str(port), "SLURM_STEP_NODELIST": "localhost", "SLURM_STEP_NUM_NODES": "1",
        "SLURM_NTASKS": str(count), "SLURM_PROCID": str(index), "SLURM_LOCALID": str(index),
        WORKER_VARIABLE: str(index),
    })
    env.setdefault("JAX_CPU_COLLECTIVES_IMPLEMENTATION", "gloo")
    return env


def split_processes_option(argv: Sequence[str]) -> tuple[int | None, list[str]]:
    """``(N, the rest)`` for a command line that starts with ``--processes N`` (or ``--processes=N``).

    Example:
        >>> split_processes_option(["--processes", "2", "profile", "train.py"])
        (2, ['profile', 'train.py'])
        >>> split_processes_option(["profile", "train.py"])
        (None, ['profile', 'train.py'])
    """
    args = list(argv)
    if not args or not args[0].startswith("--processes"):
        return None, args
    if args[0] == "--processes":
        if len(args) < 2:
            raise UsageError("--processes needs a number of processes, e.g. --processes 2 profile train.py")
        value, rest = args[1], args[2:]
    else:
        value, rest = args[0].partition("=")[2], args[1:]
    if not value.isdigit() or int(value) < 1:
        raise UsageError(f"--processes '{value}': give a whole number of processes, 1 or more")
    if not rest:
        raise UsageError("--processes N needs a command after it, e.g. jaxdbg --processes 2 profile train.py")
    return int(value), rest


def launch(argv: Sequence[str], processes: int, timeout: float | None = None) -> int:
    """Run ``jaxdbg ARGV`` as ``processes`` processes of one local job; the job's exit code is process 0's,
    unless process 0 succeeded and another failed (then the first failure's)."""
    if os.environ.get(WORKER_VARIABLE) is not None:
        raise UsageError("--processes inside a launched process: give it once, before the command")
    port = free_port()
    out = out_option(argv)
    # Without --out, jaxdbg may write nowhere but a temporary folder it removes: what a failing process said
    # goes into the message itself.
    logs = tempfile.mkdtemp(prefix="jaxdbg-launch-") if out is None else None
    try:
        end = _run_job(argv, processes, port, out, logs, timeout)
        reported = _report_failures(end, processes, inline=logs is not None)
    finally:
        if logs is not None:
            shutil.rmtree(logs, ignore_errors=True)
    if not reported and logs is None:  # the logs in --out are kept only where a message above points at one
        for log_path in end.paths:
            if log_path is not None:
                with contextlib.suppress(OSError):
                    os.remove(log_path)
    codes = end.codes
    first = [codes[end.first]] if end.first is not None else []  # the failure that ended the job comes first
    failed = first + [code for code in codes[1:] if code != 0]
    return codes[0] if codes[0] != 0 or not failed else failed[0]


class JobEnd(NamedTuple):
    """How a local job ended: each process's exit code (for one the launcher stopped, its own, from the report it
    wrote as at its --timeout, else 3) and log path (None for process 0, whose output is shown); where one failed
    while others ran on, which (``first``), and those stopped ``FAILED_PEER_GRACE_S`` after it."""
    codes: list[int]
    paths: list[str | None]
    first: int | None = None
    stopped: tuple[int, ...] = ()


def _run_job(argv: Sequence[str], processes: int, port: int, out: str | None, logs: str | None,
             timeout: float | None) -> JobEnd:
    """Start the job's processes (process 0's output shown, the others' to a log each) and wait for them all."""
    # `jaxdbg --processes N python repro.py`: the program itself (a multi-process reproducer), without jaxdbg.
    command = [sys.executable, *argv[1:]] if argv[0] == "python" else [sys.executable, "-m", "jaxdbg", *argv]
    procs: list[subprocess.Popen] = []
    paths: list[str | None] = []
    try:
        for index in range(processes):
            env = task_environment(index, processes, port, os.environ)
            if index == 0:
                procs.append(subprocess.Popen(command, env=env))
                paths.append(None)
                continue
            path = (os.path.join(logs, f"launch-process-{index}.log") if logs is not None
                    else os.path.join(_made(os.path.join(out or "", f"process-{index}")), "launch.log"))
            with open(path, "wb") as log:
                procs.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL))
            paths.append(path)
        first = _wait_for_job(procs, timeout)
        stopped = tuple(index for index, proc in enumerate(procs) if proc.poll() is None)
    finally:
        stop(procs)
    # A stopped jaxdbg command reports as at its --timeout and exits with that code (3, or 1 where it had found its
    # answer); one killed before it could (or a plain program that SIGTERM ended) is 3.
    codes = [3 if index in stopped and proc.returncode < 0 else proc.returncode for index, proc in enumerate(procs)]
    return JobEnd(codes, paths, first if stopped else None, stopped)


def _wait_for_job(procs: Sequence[subprocess.Popen], timeout: float | None) -> int | None:
    """Wait until every process has ended, or until ``FAILED_PEER_GRACE_S`` after the first that failed (exit 2 or
    more, or a signal: exit 1 is a command's 'found'): that one's index, or None."""
    started = time.monotonic()
    failed: tuple[int, float] | None = None  # (the first process that failed, when it was seen to)
    while True:
        codes = [proc.poll() for proc in procs]
        if all(code is not None for code in codes):
            return None
        now = time.monotonic()
        if failed is None:
            index = next((i for i, code in enumerate(codes) if code is not None and code not in (0, 1)), None)
            failed = None if index is None else (index, now)
        elif now - failed[1] >= FAILED_PEER_GRACE_S:
            return failed[0]
        if timeout is not None and now - started > timeout:
            raise subprocess.TimeoutExpired(procs[0].args, timeout)
        time.sleep(POLL_S)


def _report_failures(end: JobEnd, processes: int, inline: bool) -> bool:
    """Name on stderr each process other than 0 that ended otherwise than process 0 or whose failure ended the
    job, with its last line and its log's path (``inline``: with the last lines of its log, which is about to be
    removed), and the processes stopped after it. Whether any was named."""
    reported = False
    codes = end.codes
    for index, (code, log_path) in enumerate(zip(codes, end.paths)):
        if log_path is None or index in end.stopped or code == 0:
            continue
        lines = _last_lines(log_path, INLINE_LOG_LINES)
        if code == codes[0] and index != end.first and not _found_no_gpu(lines):
            continue  # process 0's own words tell of the same end
        sys.stderr.write(failure_message(index, processes, code, lines, None if inline else log_path) + "\n")
        reported = True
    if end.first is not None:
        who = " and ".join(f"process {index}" for index in end.stopped)
        sys.stderr.write(f"jaxdbg: process {end.first} of {processes} failed (exit {codes[end.first]}) and a job "
                         f"cannot go on without one of its processes: {who} "
                         f"{'was' if len(end.stopped) == 1 else 'were'} stopped {FAILED_PEER_GRACE_S:.0f} s after it\n")
    return reported


# What a process of a job says where the GPU it was given is not there (JAX gives each process of a SLURM step the
# GPU numbered by its SLURM_LOCALID): CUDA's and ROCm's words, and the backend's start that failed.
_NO_GPU = re.compile(r"no supported devices found for platform (CUDA|ROCM)|"
                     r"Unable to initialize backend '(cuda|rocm|gpu)'", re.IGNORECASE)


def failure_message(index: int, processes: int, code: int, lines: Sequence[str], log_path: str | None) -> str:
    """What the launcher says of process ``index``, which ended with ``code`` after its output's last ``lines``:
    the last line and its log's path, or (``log_path`` None: the log is about to be removed) the lines themselves;
    with what to do where the process found no GPU of its own.

    Example:
        >>> print(failure_message(1, 2, 3, ["reading shard 1", "shard 1 is missing"], "o/process-1/launch.log"))
        jaxdbg: process 1 of 2 exited with 3: shard 1 is missing (log: o/process-1/launch.log)
        >>> said = "RuntimeError: Unable to initialize backend 'cuda': no supported devices found for platform CUDA"
        >>> print(failure_message(1, 2, 3, [said], None))  # doctest: +NORMALIZE_WHITESPACE
        jaxdbg: process 1 of 2 exited with 3; each process of a local job takes the GPU numbered by its
        SLURM_LOCALID, as in a SLURM step, so --processes 2 needs 2 GPUs: with fewer, set JAX_PLATFORMS=cpu to play
        the job on host devices (XLA_FLAGS=--xla_force_host_platform_device_count=K for K devices per process);
        the last lines of its output (give --out to keep its whole log):
          | RuntimeError: Unable to initialize backend 'cuda': no supported devices found for platform CUDA
    """
    said = f"jaxdbg: process {index} of {processes} exited with {code}"
    hint = (f"; each process of a local job takes the GPU numbered by its SLURM_LOCALID, as in a SLURM step, so "
            f"--processes {processes} needs {processes} GPUs: with fewer, set JAX_PLATFORMS=cpu to play the job on "
            "host devices (XLA_FLAGS=--xla_force_host_platform_device_count=K for K devices per process)"
            if _found_no_gpu(lines) else "")
    if log_path is not None:
        return f"{said}: {lines[-1] if lines else 'no output'} (log: {log_path}){hint}"
    shown = "".join(f"\n  | {line}" for line in lines) or "\n  | (no output)"
    return f"{said}{hint}; the last lines of its output (give --out to keep its whole log):{shown}"


def _found_no_gpu(lines: Sequence[str]) -> bool:
    return any(_NO_GPU.search(line) for line in lines)


def out_option(argv: Sequence[str]) -> str | None:
    """The ``--out`` folder of a jaxdbg command line whose parent exists (None for none, or for a program run
    with ``python``): the launched processes' logs go there, beside their reports.

    Example:
        >>> out_option(["profile", "train.py", "--out", "/tmp", "--", "--out", "x"])
        '/tmp'
        >>> out_option(["profile", "--out=/no/such/parent/x", "train.py"]) is None
        True
    """
    if not argv or argv[0] == "python":
        return None
    args = list(argv[:argv.index("--")] if "--" in argv else argv)
    found = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--out"), None)
    found = next((a.partition("=")[2] for a in args if a.startswith("--out=")), found)
    if not found or not os.path.isdir(os.path.dirname(os.path.abspath(found))):
        return None  # the command itself reports the bad --out
    return found


def _made(folder: str) -> str:
    os.makedirs(folder, exist_ok=True)
    return folder


STOP_GRACE_S = 15.0  # from SIGTERM to SIGKILL: room for a stopped jaxdbg command to write its report


def stop(procs: Sequence[subprocess.Popen], grace_s: float = STOP_GRACE_S) -> None:
    """Stop processes still running: SIGTERM first, which a jaxdbg process turns into stopping the program it
    contains (its own session: SIGKILL to jaxdbg alone would leave it running, an orphan) and writing its report
    as at its --timeout, then SIGKILL."""
    running = [proc for proc in procs if proc.poll() is None]
    for proc in running:
        proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in running:
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _last_lines(path: str, count: int) -> list[str]:
    """The last ``count`` lines of a log that are not blank."""
    with open(path, "rb") as handle:
        lines = [line.rstrip() for line in handle.read().decode(errors="replace").splitlines() if line.strip()]
    return lines[-count:]
