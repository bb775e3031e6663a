"""Python tracebacks embedded in an exception's message: the exception they end with, and where it was raised.

XLA passes on an exception raised inside a host callback as text: ``CpuCallback error: Traceback (most recent
call last): ... KeyError: 'accuracy'``. Its frames are whoever happened to call the computation (jaxdbg's runner,
runpy, the user's driver), so only the exception it ends with says what failed, and only its innermost frame of
the user's code says where.

Example:
    >>> without_tracebacks('CpuCallback error: Traceback (most recent call last):\\n  File "run.py", line 3, in main\\n'
    ...                    'ValueError: too large: 2.5')
    'CpuCallback error: ValueError: too large: 2.5'
"""

from __future__ import annotations

import re

from jaxdbg._source import SourceLocation, is_user_file

_EMBEDDED_TRACEBACK = re.compile(r"Traceback \(most recent call last\):\s*\n(?:[ \t]+.*\n)*")
_EMBEDDED_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)', re.M)
# XLA (jax >= 0.11) appends the C++ source locations of a failed status to its message: not the error's words.
_XLA_SOURCE_TRACE = re.compile(r"\s*=== Source Location Trace: ===.*\Z", re.S)


def without_tracebacks(message: str | None) -> str:
    """The message with each embedded Python traceback cut to the exception it ends with, and without the
    C++ source-location trace XLA appends to a failed status.

    Example:
        >>> without_tracebacks("INTERNAL: boom\\n\\n=== Source Location Trace: ===\\nxla/pjrt/a.cc:12")
        'INTERNAL: boom'
    """
    return _XLA_SOURCE_TRACE.sub("", _EMBEDDED_TRACEBACK.sub("", message or ""))


def embedded_raise(message: str | None) -> SourceLocation | None:
    """Where the exception embedded in a message (a host callback's, as XLA passes it on) was raised: the
    innermost frame of the user's code in its traceback (never jaxdbg's, jax's or runpy's).

    Example:
        >>> embedded_raise('CpuCallback error: Traceback (most recent call last):\\n'
        ...                '  File "/usr/lib/python3.11/runpy.py", line 88, in _run_code\\n'
        ...                '  File "/home/me/train.py", line 24, in __call__\\nKeyError: "accuracy"')
        SourceLocation(file='/home/me/train.py', line=24, function='__call__')
    """
    blocks = list(_EMBEDDED_TRACEBACK.finditer(message or ""))
    if not blocks:
        return None
    frames = [m for m in _EMBEDDED_FRAME.finditer(blocks[-1].group(0)) if is_user_file(m.group(1))]
    return SourceLocation(frames[-1].group(1), int(frames[-1].group(2)), frames[-1].group(3)) if frames else None
