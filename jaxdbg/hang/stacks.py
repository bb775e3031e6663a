"""Every thread of this process at one moment: its Python stack (``sys._current_frames()``, read from another
thread as data), where it stands in the user's code, and what it waits in below Python.

Below Python, a thread that waits is in a system call: the kernel says which (``/proc/self/task/<tid>``:
its state, the kernel function it sleeps in, the system call), which tells a sleep from a lock from a
socket. Where py-spy is installed and this process may be traced, its ``dump --native`` adds the native
frames (e.g. a gloo or NCCL receive inside a collective); where not, the kernel's word stands alone.

Example:
    >>> threads = snapshot(native=False)
    >>> main = next(t for t in threads if t.main)
    >>> main.frames[0].function
    'snapshot'
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from jaxdbg._source import SourceLocation, is_jaxdbg_file, is_user_file

MAX_FRAMES = 40
OWN_THREADS = "jaxdbg-"  # jaxdbg's own threads (the watchdog, heartbeats) are named so and left out
# x86-64 system call numbers of the waits a stuck thread is usually in (the kernel's word for others).
_SYSCALLS_X86_64 = {0: "read", 7: "poll", 23: "select", 35: "nanosleep", 45: "recvfrom", 47: "recvmsg",
                    61: "wait4", 202: "futex", 230: "clock_nanosleep", 232: "epoll_wait", 247: "waitid",
                    270: "pselect6", 271: "ppoll", 281: "epoll_pwait", 43: "accept", 288: "accept4"}
_WAITS = (("futex", "a lock, condition or event (futex)"), ("nanosleep", "a sleep"), ("epoll", "I/O (epoll)"),
          ("poll", "I/O (poll)"), ("select", "I/O (select)"), ("pipe_read", "a read from a pipe"),
          ("recv", "a socket receive"), ("sk_wait", "a socket"), ("inet_csk_accept", "a socket accept"),
          ("accept", "a socket accept"), ("wait4", "a child process"), ("waitid", "a child process"),
          ("read", "a read"))


@dataclass(frozen=True)
class ThreadStack:
    """One thread: its Python frames innermost first (every file; ``user`` is the innermost user frame) and
    what it waits in below Python (``kernel``: state and kernel function; ``native``: py-spy's frames)."""

    name: str
    ident: int
    native_id: int | None
    main: bool
    daemon: bool
    frames: tuple[SourceLocation, ...]
    user: SourceLocation | None
    kernel: str = ""
    native: tuple[str, ...] = ()
    in_jax: bool = False  # its innermost frames are jax's (a jitted call, a transfer, a wait for results)
    extra: dict = field(default_factory=dict)

    def waiting_in(self) -> str:
        """What the thread waits in below Python, in words: 'a sleep (clock_nanosleep)'."""
        # The outermost telling native frame (nearest Python) says what was asked: tsl::BlockUntilReady, a gloo
        # receive; the innermost ones are the same futex or poll for every wait.
        native = next((f for f in reversed(self.native) if not f.startswith("0x") and not _is_plumbing(f)), "")
        native = "::".join(_without_templates(native).split("::")[-2:])
        state, _, calls = self.kernel.partition(" ")
        syscall = calls.rsplit(", ", 1)[-1] if calls else ""
        if state == "R":
            return "running (on a CPU)"
        named = native or syscall or calls
        words = next((said for key, said in _WAITS if key in calls or key in native), "")
        if words and named:
            return f"{words}: {named}" if named not in words else words
        return words or named

    def as_dict(self) -> dict:
        return {"name": self.name, "ident": self.ident, "native_id": self.native_id, "main": self.main,
                "daemon": self.daemon, "frames": [f.as_dict() for f in self.frames],
                "user": self.user.as_dict() if self.user else None, "kernel": self.kernel,
                "native": list(self.native), "in_jax": self.in_jax, "waiting_in": self.waiting_in(), **self.extra}


_TEMPLATE_ARGUMENTS = re.compile(r"<[^<>]*>")


def _without_templates(name: str) -> str:
    """A C++ frame's name without its template arguments, which hold ``::`` of their own.

    Example:
        >>> _without_templates("xla::Wrapper<absl::StatusOr<int> (xla::PyArray)>::operator()")
        'xla::Wrapper::operator()'
    """
    previous = None
    while previous != name:
        previous, name = name, _TEMPLATE_ARGUMENTS.sub("", name)
    return name


def _is_plumbing(name: str) -> bool:
    """Native frames that say nothing of what the thread waits for (libc's and the interpreter's wrappers)."""
    return name in ("syscall",) or "nb_func" in name or name.startswith((
        "_Py", "Py", "pthread_", "__", "time_sleep", "lock_", "acquire_", "method_vectorcall", "cfunction_", "call_",
        "nanobind::", "detail::", "_PyEval"))


def snapshot(native: bool = True, frames: dict[int, Any] | None = None) -> list[ThreadStack]:
    """Every thread of this process (jaxdbg's own left out), main thread first. ``native``: also ask py-spy
    for the native frames (a fraction of a second; skipped where py-spy is missing or may not trace)."""
    frames = frames if frames is not None else sys._current_frames()
    threads = {t.ident: t for t in threading.enumerate()}
    main_ident = threading.main_thread().ident
    natives = native_frames(os.getpid()) if native else {}
    found = []
    for ident, frame in frames.items():
        thread = threads.get(ident)
        name = thread.name if thread is not None else f"thread {ident}"
        if name.startswith(OWN_THREADS):
            continue
        native_id = getattr(thread, "native_id", None)
        stack = _frames(frame)
        native_names = tuple(natives.get(native_id, ())) if native_id is not None else ()
        found.append(ThreadStack(
            name, ident, native_id, ident == main_ident, bool(getattr(thread, "daemon", False)), stack,
            next((f for f in stack if is_user_file(f.file)), None), kernel_state(native_id), native_names,
            in_jax(stack, native_names)))
    found.sort(key=lambda t: (not t.main, t.name))
    return found


def _frames(frame: Any) -> tuple[SourceLocation, ...]:
    out: list[SourceLocation] = []
    while frame is not None and len(out) < MAX_FRAMES:
        code = frame.f_code
        out.append(SourceLocation(code.co_filename, frame.f_lineno or 0, code.co_name))
        frame = frame.f_back
    return tuple(out)


# Native frames of jax's runtime (py-spy's names): a thread in them is in a JAX call even where no Python frame
# of jax is on its stack (jax's C++ dispatch, an array's C++ block_until_ready).
_NATIVE_JAX = ("xla::", "pjrt", "pjit", "jaxlib", "gloo", "nccl", "tsl::", "blockuntilready", "pyarray")
_RESULT_WAITS = ("block_until_ready", "device_get")  # calls on a user line that wait for a jitted call's results


def in_jax(stack: tuple[SourceLocation, ...], native: tuple[str, ...] | list[str] = ()) -> bool:
    """Whether a thread is inside a JAX call: jax's (or the jit layer's) frames inside its innermost user
    frame, jax's runtime in its native frames, or a user line that waits for results (``block_until_ready``)."""
    user = None
    for location in stack:
        if is_user_file(location.file):
            user = location
            break
        if f"{os.sep}jax{os.sep}" in location.file or f"{os.sep}jaxlib{os.sep}" in location.file:
            return True
        if is_jaxdbg_file(location.file) and location.function in ("execute", "around", "call", "__call__"):
            return True  # the jit layer's call of a jitted function
    if any(key in name.lower() for name in native for key in _NATIVE_JAX):
        return True
    if user is None:
        return False
    from jaxdbg.hang.locks import called_name

    return called_name(user.file, user.line) in _RESULT_WAITS


def kernel_state(native_id: int | None) -> str:
    """``'S futex_do_wait, futex'``: the thread's scheduler state, the kernel function it sleeps in and its
    system call, from /proc ('' where /proc does not say).

    Example:
        >>> kernel_state(None), kernel_state(threading.main_thread().native_id)[:1] in ("R", "S", "")
        ('', True)
    """
    if native_id is None:
        return ""
    base = f"/proc/self/task/{native_id}"
    parts = []
    with contextlib.suppress(OSError, IndexError), open(f"{base}/stat") as handle:
        parts.append(handle.read().rsplit(")", 1)[1].split()[0])
    with contextlib.suppress(OSError):
        with open(f"{base}/wchan") as handle:
            wchan = handle.read().strip()
        if wchan and wchan != "0":
            parts.append(wchan)
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open(f"{base}/syscall") as handle:
            number = handle.read().split()[0]
        if number.isdigit() and platform.machine() in ("x86_64", "AMD64"):
            name = _SYSCALLS_X86_64.get(int(number))
            if name:
                parts.append(name)
    if not parts:
        return ""
    return parts[0] + (" " + ", ".join(parts[1:]) if len(parts) > 1 else "")


def runnable_threads(exclude: int | set[int] | None = None) -> int:
    """How many threads of this process are running or waiting for a CPU (``R``), ``exclude`` (OS thread ids:
    the asker's own, spinning ones) left out: a process starved of CPU by others is working, not stuck."""
    count = 0
    left_out = {str(e) for e in ({exclude} if isinstance(exclude, int) else exclude or ())}
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0
    for tid in tasks:
        if tid in left_out:
            continue
        with contextlib.suppress(OSError, IndexError), open(f"/proc/self/task/{tid}/stat") as handle:
            count += handle.read().rsplit(")", 1)[1].split()[0] == "R"
    return count


def py_spy() -> str | None:
    """The py-spy executable (next to this Python, or on PATH), or None."""
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return beside if os.access(beside, os.X_OK) else shutil.which("py-spy")


def py_spy_dump(pid: int, native: bool = True, timeout: float = 20.0) -> tuple[list[dict], str]:
    """``py-spy dump --json`` of a process: its threads as py-spy describes them, or ([], why not)."""
    tool = py_spy()
    if tool is None:
        return [], "py-spy is not installed (pip install py-spy)"
    command = [tool, "dump", "--pid", str(pid), "--json", *(["--native"] if native else [])]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [], f"py-spy did not answer within {timeout:.0f} s"
    if done.returncode != 0 and native:  # some builds or kernels refuse native unwinding: Python frames still help
        return py_spy_dump(pid, native=False, timeout=timeout)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        reason = said[-1] if said else f"exit status {done.returncode}"
        if "ermission" in reason or "ptrace" in reason.lower():
            reason += (" (tracing this process is not permitted here: run as the same user with ptrace allowed, "
                       "e.g. kernel.yama.ptrace_scope=0 or CAP_SYS_PTRACE)")
        return [], f"py-spy failed: {reason}"
    try:
        return json.loads(done.stdout), ""
    except ValueError:
        return [], "py-spy's output was not JSON"


NATIVE_NOTES: list[str] = []  # why native frames could not be read, said once per process


def native_frames(pid: int) -> dict[int, list[str]]:
    """Per OS thread id, the native frames py-spy reads above the innermost Python frame ({} if it cannot:
    why is kept in :data:`NATIVE_NOTES`)."""
    threads, why = py_spy_dump(pid, native=True, timeout=5.0)  # a loaded machine: better no native frames than late
    if why and f"native frames not read: {why}" not in NATIVE_NOTES:
        NATIVE_NOTES.append(f"native frames not read: {why}")
    found: dict[int, list[str]] = {}
    for thread in threads:
        names = []
        for frame in thread.get("frames") or ():
            filename = frame.get("filename") or ""
            if filename.endswith(".py") or filename.startswith("<"):
                break  # the Python frames: sys._current_frames() has them
            names.append(str(frame.get("name") or ""))
        if thread.get("os_thread_id") is not None:
            found[int(thread["os_thread_id"])] = names[:24]
    return found
