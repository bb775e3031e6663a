"""How much freed memory glibc's malloc keeps, where there is glibc (XLA:CPU's buffers come from it).

A freed buffer stays resident while glibc keeps it for reuse: in the heap's middle (a hole that only a trim
returns) or in the arena of the thread that freed it (XLA:CPU frees on its own threads). :func:`trim` releases
the free pages of every arena. Free memory at a heap's top is given back on its own once it passes the trim
threshold, and faulted in again at the next allocation: :func:`set_trim_threshold` moves that threshold.
Elsewhere (macOS, musl) both do nothing and say so.

Example:
    >>> trim() in (True, False)
    True
    >>> set_trim_threshold(GLIBC_TRIM_THRESHOLD) in (True, False)
    True
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
from typing import Any

GLIBC_TRIM_THRESHOLD = 128 * 1024  # glibc's default M_TRIM_THRESHOLD
_M_TRIM_THRESHOLD = -1  # mallopt's parameter number (malloc.h)


@functools.lru_cache(maxsize=2)
def _function(symbol: str) -> Any:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    with contextlib.suppress(OSError, AttributeError):
        return getattr(ctypes.CDLL(name), symbol)
    return None


def _call(symbol: str, *args: int) -> bool:
    function = _function(symbol)
    if function is None:
        return False
    with contextlib.suppress(OSError, ctypes.ArgumentError):
        function(*args)
    return True


def trim() -> bool:
    """``malloc_trim(0)``: whether there was one to call."""
    return _call("malloc_trim", 0)


def set_trim_threshold(nbytes: int) -> bool:
    """``mallopt(M_TRIM_THRESHOLD, nbytes)``: free memory at a heap's top is kept up to ``nbytes`` instead of
    being given back (and faulted in again); whether there was one to call. glibc then stops adapting its
    thresholds to the program (its mmap threshold stays where it has grown to)."""
    return _call("mallopt", _M_TRIM_THRESHOLD, int(nbytes))


_holders = 0  # watches holding freed memory now: nested ones share one setting


def hold_freed(nbytes: int) -> bool:
    """One more holder wants glibc to keep up to ``nbytes`` of free memory (the first sets the threshold);
    whether there is glibc. Each holder calls :func:`release_freed` when done."""
    global _holders
    if _holders == 0 and not set_trim_threshold(nbytes):
        return False
    _holders += 1
    return True


def release_freed() -> None:
    """A holder is done: the last one sets glibc's default trim threshold back."""
    global _holders
    _holders -= 1
    if _holders == 0:
        set_trim_threshold(GLIBC_TRIM_THRESHOLD)


class TrimAfter:
    """:func:`trim` each time another ``nbytes`` of arrays were made: for work that frees about as much as it makes,
    array by array, such as an op-by-op replay. The heap keeps the pages of the arrays it freed, and the arrays made
    since do not all reuse them: replaying a 48-block MLP's training step (4 MiB arrays), the main heap grew by
    230 MiB during the backward pass while the live arrays fell by 170 MiB (1570 MiB resident for 820 MiB of
    arrays). Trimmed every 64 MiB made, that replay's peak fell from 1665-1698 MiB to 1302-1305 MiB.

    Example:
        >>> every = TrimAfter(1024)
        >>> every.made(1024), every.made(512)  # the second is below another 1024
        (True, False)
    """

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self._made = 0

    def made(self, nbytes: int) -> bool:
        """Another ``nbytes`` of arrays were made; whether this trimmed."""
        self._made += nbytes
        if self._made < self.nbytes:
            return False
        self._made = 0
        trim()
        return True
