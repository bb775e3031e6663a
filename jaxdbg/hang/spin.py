"""Busy-wait loops: a thread that burns a CPU going round the same loop while nothing it looks at changes.

``while not done: pass`` or a poll with ``time.sleep(0)`` keeps the process on a CPU, which the watchdog
otherwise takes for work (a long computation on CPU devices, slow host code). A thread spins when, tick after
tick, its innermost user frame is the same frame, its variables (and the globals its code names) hold the
same values, it still executes that frame's bytecode (the instruction it stands at moves, or it is a jump
back), and it uses the CPU. A loop that computes changes a variable (its counter, its result); a long C call
(numpy, a compile) stands still at its call instruction; a JAX call is JAX's own wait: none of them spin.

Example:
    >>> spin = Spin(SourceLocation("train.py", 29, "<module>"), (29, 30), since=0.0)
    >>> spin.words()
    'a busy-wait loop: spinning on a CPU over lines 29-30, its variables unchanged'
    >>> watch = SpinWatch()
    >>> watch.update(now=0.0), watch.spinning()     # this (the only) thread is the asker: never its own spin
    ({}, {})
"""

from __future__ import annotations

import contextlib
import dis
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from jaxdbg._source import SourceLocation, is_user_path

SPIN_CONFIRM_S = 2.0  # a thread unchanged for this long, on a CPU, spins (a few ticks are chance)
SPIN_CPU_SHARE = 0.05  # of one core over the window (half the watchdog's BUSY_FRACTION): a sleep or lock uses ~0
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_JUMPS = {op for op in dis.opmap if "JUMP" in op}
SPIN_WORDS = "a busy-wait loop"  # how a spinning thread's ``waiting_in`` starts (the verdict reads it)


@dataclass(frozen=True)
class Spin:
    """One spinning thread: its user frame's place, the lines it goes round, since when (monotonic seconds)."""

    location: SourceLocation
    lines: tuple[int, ...]
    since: float

    def words(self) -> str:
        """``a busy-wait loop: spinning on a CPU over lines 29-30``."""
        low, high = self.lines[0], self.lines[-1]
        span = f"line {low}" if low == high else f"lines {low}-{high}"
        return f"{SPIN_WORDS}: spinning on a CPU over {span}, its variables unchanged"


@dataclass
class _Track:
    key: tuple
    since: float
    cpu: float | None
    offsets: set[int] = field(default_factory=set)
    lines: set[int] = field(default_factory=set)
    location: SourceLocation | None = None


class SpinWatch:
    """Per thread, how long its user frame has gone round unchanged (see the module docstring)."""

    def __init__(self, confirm_s: float = SPIN_CONFIRM_S) -> None:
        self.confirm_s = confirm_s
        self._tracks: dict[int, _Track] = {}
        self._spinning: dict[int, Spin] = {}

    def update(self, now: float, frames: dict[int, Any] | None = None) -> dict[int, Spin]:
        """One look at every thread (but the caller's); returns the spinning ones by thread ident."""
        frames = frames if frames is not None else sys._current_frames()
        natives = {t.ident: t.native_id for t in threading.enumerate()}
        me = threading.get_ident()
        seen = set()
        for ident, top in frames.items():
            if ident == me:
                continue
            frame = _user_frame(top)
            if frame is None or _in_jax(top, frame):
                continue
            seen.add(ident)
            key = (id(frame), frame.f_code, _fingerprint(frame))
            track = self._tracks.get(ident)
            cpu = thread_cpu_s(natives.get(ident))
            if track is None or track.key != key:
                track = self._tracks[ident] = _Track(key, now, cpu)
            track.offsets.add(frame.f_lasti)
            track.lines.add(frame.f_lineno or 0)
            track.location = SourceLocation(frame.f_code.co_filename, frame.f_lineno or 0, frame.f_code.co_name)
            spin = self._judge(track, frame, now, cpu)
            if spin is None:
                self._spinning.pop(ident, None)
            else:
                self._spinning[ident] = spin
        for ident in set(self._tracks) - seen:
            self._tracks.pop(ident, None)
            self._spinning.pop(ident, None)
        return dict(self._spinning)

    def spinning(self) -> dict[int, Spin]:
        return dict(self._spinning)

    def clear(self) -> None:
        """Something moved (a call, a result): every track starts again."""
        self._tracks.clear()
        self._spinning.clear()

    def cpu_s(self) -> float:
        """CPU seconds used so far by the spinning threads (left out of the process's work)."""
        natives = {t.ident: t.native_id for t in threading.enumerate()}
        return sum(thread_cpu_s(natives.get(ident)) or 0.0 for ident in self._spinning)

    def native_ids(self) -> set[int]:
        natives = {t.ident: t.native_id for t in threading.enumerate()}
        return {n for n in (natives.get(ident) for ident in self._spinning) if n is not None}

    def _judge(self, track: _Track, frame: Any, now: float, cpu: float | None) -> Spin | None:
        held = now - track.since
        if held < self.confirm_s or track.location is None:
            return None
        if cpu is not None and track.cpu is not None and (cpu - track.cpu) < SPIN_CPU_SHARE * held:
            return None  # it mostly waits (a sleep, a lock): a stall the watchdog already sees, not a spin
        if len(track.offsets) == 1 and _opname(frame) not in _JUMPS:
            return None  # one instruction all along, a call: a long C call (numpy, an import), not a loop
        lines = tuple(sorted(track.lines))
        return Spin(track.location, lines, track.since)


def _user_frame(frame: Any) -> Any:
    while frame is not None and not is_user_path(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def _in_jax(top: Any, user: Any) -> bool:
    """A frame of jax's between the user frame and the top: a JAX call (its waits are JAX's own to report)."""
    frame = top
    while frame is not None and frame is not user:
        name = frame.f_code.co_filename
        if f"{os.sep}jax{os.sep}" in name or f"{os.sep}jaxlib{os.sep}" in name:
            return True
        frame = frame.f_back
    return False


def _opname(frame: Any) -> str:
    with contextlib.suppress(IndexError, TypeError):
        return dis.opname[frame.f_code.co_code[frame.f_lasti]]
    return ""


def _fingerprint(frame: Any) -> tuple:
    """The values the frame's code can look at: its locals and the globals it names (scalars by value,
    containers by identity and length, anything else by identity)."""
    code = frame.f_code
    names = set(code.co_varnames) | set(code.co_cellvars) | set(code.co_freevars) | set(code.co_names)
    found = []
    with contextlib.suppress(Exception):  # reading another thread's frame: best effort, never fatal
        local = frame.f_locals
        scope = frame.f_globals
        for name in sorted(names):
            if name in local:
                found.append((name, _value_key(local[name])))
            elif name in scope:
                found.append((name, _value_key(scope[name])))
    return tuple(found)


SHALLOW_ITEMS = 32  # a small container's (or object's) scalar items are compared too: a counter in a dict moves


def _value_key(value: Any, shallow: bool = True) -> Any:
    """What tells a changed value: a scalar's value; a container's identity, length and (when small) its
    scalar items; an object's identity and (when small) its scalar attributes (``self.step += 1`` moves)."""
    if value is None or isinstance(value, (bool, int, float, complex)):
        return value
    if isinstance(value, (str, bytes)):
        return (len(value), value[:64])
    numpy = sys.modules.get("numpy")  # only a program that imported numpy can hold its arrays
    if numpy is not None and isinstance(value, numpy.ndarray):
        return (id(value), value.shape, _array_sample(value))
    if not shallow:
        return id(value)
    with contextlib.suppress(Exception):
        if isinstance(value, dict):
            items = list(value.items())[:SHALLOW_ITEMS] if len(value) <= SHALLOW_ITEMS else []
            return (id(value), len(value), tuple((k, _value_key(v, False)) for k, v in items if isinstance(k, str)))
        if isinstance(value, (list, tuple)):
            small = value if len(value) <= SHALLOW_ITEMS else ()
            return (id(value), len(value), tuple(_value_key(v, False) for v in small))
        if isinstance(value, (set, frozenset, bytearray)):
            return (id(value), len(value))
        attributes = getattr(value, "__dict__", None)
        if isinstance(attributes, dict) and len(attributes) <= SHALLOW_ITEMS:
            return (id(value), tuple((k, _value_key(v, False)) for k, v in attributes.items()))
    return id(value)


ARRAY_SAMPLE = 256  # elements of a numpy array compared, evenly spaced: a loop that updates it in place moves


def _array_sample(array: Any) -> bytes:
    """Evenly spaced elements of a numpy array, as bytes: an array a loop changes in place (``grid += dt * f``)
    is seen to move, at the cost of a few hundred elements whatever its size.

    Example:
        >>> import numpy as np
        >>> grid = np.zeros(1_000_000)
        >>> before = _array_sample(grid); grid += 1.0
        >>> before != _array_sample(grid), len(before) == 8 * ARRAY_SAMPLE
        (True, True)
    """
    with contextlib.suppress(Exception):  # another thread's array, maybe being resized: best effort
        flat = array.reshape(-1)  # a view where the layout allows; a copy of a strided array, rare in a loop
        return bytes(flat[::max(1, flat.size // ARRAY_SAMPLE)][:ARRAY_SAMPLE].tobytes())
    return b""


def thread_cpu_s(native_id: int | None) -> float | None:
    """CPU seconds a thread of this process has used (user + system), from /proc; None where it cannot say."""
    if native_id is None:
        return None
    with contextlib.suppress(OSError, IndexError, ValueError):
        with open(f"/proc/self/task/{native_id}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    return None
