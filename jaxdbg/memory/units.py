"""Byte counts as people write and read them: ``--device-memory 16GiB``, ``peak_bytes<=512MiB``, "1.2 GiB".

Example:
    >>> parse_bytes("1.5GiB"), parse_bytes("80 GB"), parse_bytes("4096")
    (1610612736, 80000000000, 4096)
    >>> format_bytes(1288490189), format_bytes(512), format_bytes(-3 * 2**20)
    ('1.2 GiB', '512 B', '-3.0 MiB')
"""

from __future__ import annotations

import re

_BINARY = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50}
_DECIMAL = {"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_AMOUNT = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_bytes(text: str) -> int:
    """A byte count from ``4096``, ``512MiB``, ``1.5 GiB`` or ``80GB``; ValueError naming what was wrong."""
    match = _AMOUNT.match(str(text))
    unit = match.group(2).lower() if match else ""
    scale = _BINARY.get(unit) or _DECIMAL.get(unit)
    if match is None or scale is None:
        raise ValueError(f"'{text}' is not a byte count; write a number with an optional unit: B, KiB, MiB, GiB, "
                         "TiB (or KB, MB, GB, TB), e.g. 16GiB")
    return round(float(match.group(1)) * scale)


def format_bytes(count: float | None) -> str:
    """``count`` in the largest binary unit that keeps it at or above 1 (one decimal), or '?' when unknown."""
    if count is None:
        return "?"
    size, sign = abs(float(count)), "-" if count < 0 else ""
    for unit, scale in (("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{sign}{size / scale:.1f} {unit}"
    return f"{sign}{int(size)} B"
