"""Out-of-memory errors: is this one, and what did it ask for.

XLA reports them as ``RESOURCE_EXHAUSTED`` runtime errors, worded by each backend: XLA:CPU "Out of memory
allocating 1099511627776 bytes.", XLA:GPU's allocator "Out of memory while trying to allocate 17.50GiB." (or a
byte count), XLA:TPU at compile time "Ran out of memory in memory space hbm. Used 20.5G of 15.48G hbm.
Exceeded hbm capacity by 5.02G.".

Example:
    >>> is_out_of_memory(RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 1099511627776 bytes."))
    True
    >>> requested_bytes("RESOURCE_EXHAUSTED: Out of memory allocating 1099511627776 bytes.")
    1099511627776
    >>> requested_bytes("Out of memory while trying to allocate 17.50GiB.")
    18790481920
    >>> requested_bytes("Ran out of memory in memory space hbm. Used 20.5G of 15.48G hbm.")
    22011707392
"""

from __future__ import annotations

import re

from jaxdbg.memory.units import parse_bytes

_MARKERS = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory", "Ran out of memory")
_ASKED = [
    re.compile(r"allocat\w*\s+([0-9.]+\s*[KMGT]?i?B?)\b(?:\s*bytes)?", re.IGNORECASE),  # CPU, GPU
    re.compile(r"Used\s+([0-9.]+[KMGT]?)\s+of\s+[0-9.]+[KMGT]?", re.IGNORECASE),  # TPU: what the program needs
]
_SHORT_UNIT = re.compile(r"^([0-9.]+)\s*([KMGT])$")


def is_out_of_memory(err: BaseException) -> bool:
    """An XLA runtime error (or any error) whose message says the device ran out of memory."""
    text = str(err)
    return any(marker in text for marker in _MARKERS)


def requested_bytes(message: str) -> int | None:
    """The size the failed allocation asked for (the TPU compiler: what the program needs), or None."""
    for pattern in _ASKED:
        match = pattern.search(message)
        if match:
            return _amount(match.group(1))
    return None


def _amount(text: str) -> int | None:
    text = text.strip()
    short = _SHORT_UNIT.match(text)
    if short:  # TPU's "20.5G": binary units
        text = f"{short.group(1)}{short.group(2)}iB"
    try:
        return parse_bytes(text)
    except ValueError:
        return None


def first_line(message: str) -> str:
    return next((line.strip() for line in message.splitlines() if line.strip()), "")[:400]
