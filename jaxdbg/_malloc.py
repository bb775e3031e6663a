"""Give memory that glibc's malloc holds free back to the system (``malloc_trim``), where there is glibc.

A freed buffer stays resident while glibc keeps it for reuse: in the heap's middle (a hole that only a trim
returns) or in the arena of the thread that freed it (XLA:CPU frees on its own threads). :func:`trim` releases
the free pages of every arena. Elsewhere (macOS, musl) it does nothing and says so.

Example:
    >>> trim() in (True, False)
    True
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
from typing import Any


@functools.lru_cache(maxsize=1)
def _function() -> Any:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    with contextlib.suppress(OSError, AttributeError):
        return ctypes.CDLL(name).malloc_trim
    return None


def trim() -> bool:
    """``malloc_trim(0)``: whether there was one to call."""
    function = _function()
    if function is None:
        return False
    with contextlib.suppress(OSError, ctypes.ArgumentError):
        function(0)
    return True
