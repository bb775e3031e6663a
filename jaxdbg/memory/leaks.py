"""Leaks: live arrays of one producer that pile up call after call, and what keeps them.

At every sample each producer group (a jitted function called from one line, or arrays made outside jitted
calls) has a count of live arrays, their bytes and the distinct calls they come from. A loop that carries its
state holds the outputs of one or two calls at a time; one that appends each step's outputs to a list holds
an ever growing number of calls. A group is a leak when, over at least :data:`MIN_SAMPLES` samples, the bytes
of its calls before the latest (:func:`piled`) never shrank in nearly every step (:data:`MONOTONE`) and grew in
:data:`MIN_CALLS` - 1 of them or more (one jump then flat is no pile), by at least the threshold, and it holds
outputs of :data:`MIN_CALLS` or more calls.

What keeps them is found from one of the arrays: its referrers (``gc.get_referrers``), up through tuples
and dicts, to a list, dict, deque or set that has a name in the program's globals (or an attribute of one of
them); the line that fills it is the first ``name.append(``/``name[...] =``/... in the file of the call.

Example:
    >>> series = [GroupPoint(i, arrays=i + 1, bytes=(i + 1) * 4096, calls=i + 1) for i in range(8)]
    >>> is_leak(series, min_bytes=16384)
    True
    >>> is_leak([GroupPoint(i, arrays=1, bytes=4096, calls=1) for i in range(8)], min_bytes=16384)
    False
"""

from __future__ import annotations

import gc
import itertools
import re
import types
from collections import deque
from dataclasses import dataclass
from typing import Any

from jaxdbg._source import SourceLocation

MIN_SAMPLES = 6
MIN_CALLS = 4
MONOTONE = 0.8  # share of consecutive samples in which the group did not shrink
DEFAULT_MIN_BYTES = 1 << 20


@dataclass(frozen=True)
class GroupPoint:
    """One producer group at one sample."""

    sample: int
    arrays: int
    bytes: int
    calls: int  # distinct calls (0 for arrays made outside jitted calls)
    first_call: int | None = None
    last_call: int | None = None
    latest_arrays: int = 0  # of those, the latest call's (often the loop's state: not leaked)
    latest_bytes: int = 0


def is_leak(series: list[GroupPoint], min_bytes: int = DEFAULT_MIN_BYTES) -> bool:
    """Whether a group's points say it grows step after step (see the module's description)."""
    if len(series) < MIN_SAMPLES:
        return False
    first, last = series[0], series[-1]
    if piled(last) - piled(first) < min_bytes or piled(last) < min_bytes:
        return False
    steps = list(itertools.pairwise(series))
    steady = sum(1 for a, b in steps if piled(b) >= piled(a))
    if steady < MONOTONE * len(steps):
        return False
    # and it grew again and again: one jump then flat (constants a first call put on the device) is no pile
    if sum(1 for a, b in steps if piled(b) > piled(a)) < MIN_CALLS - 1:
        return False
    held = last.calls if last.calls else last.arrays
    return held >= MIN_CALLS


def piled(point: GroupPoint) -> int:
    """The bytes of a group's older calls: the latest call's outputs are the loop's state, which may grow (a KV
    cache built by concatenation) without anything keeping old outputs; it is no leak, and must not make the
    few bytes something does keep (a list of scalars) look like one.

    Example:
        >>> piled(GroupPoint(9, arrays=11, bytes=1 << 20, calls=10, latest_arrays=2, latest_bytes=(1 << 20) - 36))
        36
    """
    return point.bytes - point.latest_bytes


def growing_state(series: list[GroupPoint], min_bytes: int = DEFAULT_MIN_BYTES) -> tuple[int, int, float] | None:
    """``(first, last, bytes per call)`` of a group whose latest call's outputs (the loop's state) grew in
    nearly every sample by ``min_bytes`` or more over the run (a cache built by concatenation), else None.

    Example:
        >>> kv = [GroupPoint(i, 2, (i + 1) << 18, i + 1, i, i, 2, (i + 1) << 18) for i in range(8)]
        >>> growing_state(kv)
        (262144, 2097152, 262144.0)
    """
    points = [p for p in series if p.latest_bytes > 0]
    if len(points) < MIN_SAMPLES:
        return None
    first, last = points[0], points[-1]
    if last.latest_bytes - first.latest_bytes < min_bytes:
        return None
    steps = list(itertools.pairwise(points))
    if sum(1 for a, b in steps if b.latest_bytes > a.latest_bytes) < MONOTONE * len(steps):
        return None
    calls = (last.last_call or 0) - (first.last_call or 0)
    return first.latest_bytes, last.latest_bytes, (last.latest_bytes - first.latest_bytes) / max(calls, 1)


_CONTAINERS = (list, dict, set, deque)


def find_keeper(array: Any, namespaces: list[dict]) -> tuple[str, str] | None:
    """``(description, name)`` of what keeps ``array`` alive, e.g. ``("list 'history'", "history")``: the
    nearest container over it (through tuples and dicts) that a global of ``namespaces`` names, directly or
    as an attribute of a named object; ``(description, '')`` for an unnamed container; None if none found."""
    seen: set[int] = {id(namespaces)} | {id(n) for n in namespaces}
    frontier, unnamed = [array], None
    for _ in range(4):  # array -> tuple/dict (a pytree) -> list -> ...
        following = []
        for item in frontier:
            for referrer in gc.get_referrers(item):
                if id(referrer) in seen or isinstance(referrer, (types.FrameType, types.ModuleType)):
                    continue
                seen.add(id(referrer))
                if isinstance(referrer, _CONTAINERS) or type(referrer) is tuple:
                    name = _name_of(referrer, namespaces)
                    if name is not None and not isinstance(referrer, tuple):
                        return f"{_kind(referrer)} '{name}'", name.split(".")[-1]
                    if unnamed is None and not isinstance(referrer, tuple) and not _is_namespace(referrer, namespaces):
                        unnamed = f"an unnamed {_kind(referrer)}"
                    following.append(referrer)
        frontier = following
    return (unnamed, "") if unnamed else None


def _kind(container: Any) -> str:
    return type(container).__name__


def _is_namespace(obj: Any, namespaces: list[dict]) -> bool:
    return any(obj is namespace for namespace in namespaces) or (isinstance(obj, dict) and "__name__" in obj)


def _name_of(container: Any, namespaces: list[dict]) -> str | None:
    for namespace in namespaces:
        for name, value in list(namespace.items()):
            if value is container:
                return name
        for name, value in list(namespace.items()):
            attributes = getattr(value, "__dict__", None)
            if isinstance(attributes, dict) and not isinstance(value, (type, types.ModuleType)):
                for attribute, inner in list(attributes.items()):
                    if inner is container:
                        return f"{name}.{attribute}"
    return None


def filling_line(path: str | None, name: str) -> SourceLocation | None:
    """The first line of ``path`` that puts something into ``name``: ``name.append(``, ``.extend(``,
    ``.insert(``, ``.add(``, ``.appendleft(``, ``name[...] =`` or ``name +=``.

    Example:
        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "train.py")
        >>> _ = open(path, "w").write("history = []\\nfor i in range(3):\\n    history.append(i)\\n")
        >>> filling_line(path, "history").line
        3
    """
    if not path or not name:
        return None
    methods = "append|extend|insert|add|appendleft|update|setdefault"
    # ``self.history.append(`` too: a keeper found as an attribute is named by the attribute
    pattern = re.compile(rf"(?<![\w]){re.escape(name)}\s*(\.\s*({methods})\s*\(|\[[^\]]*\]\s*=[^=]|\+=)")
    try:
        with open(path) as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    function = "<module>"
    for number, line in enumerate(lines, start=1):
        definition = re.match(r"\s*def\s+(\w+)", line)
        if definition:
            function = definition.group(1)
        elif line[:1] not in ("", " ", "\t", "#"):
            function = "<module>"  # back at the top level
        if pattern.search(line) and not line.lstrip().startswith("#"):
            return SourceLocation(path, number, function)
    return None
