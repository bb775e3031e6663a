"""Read XLA's buffer assignment of one compiled module, as its dump writes it (``--xla_dump_to`` with
``--xla_dump_hlo_as_text``; jaxdbg asks for it per jitted function through ``compiler_options``).

Two files of the dump are read:

- ``*-buffer-assignment.txt``: the allocations (size; parameter N, output, maybe-live-out, thread-local,
  constant, preallocated-temp) and the values placed in each (HLO instruction, size, offset, shape);
- ``*-live-range.txt``: the schedule's live ranges and, under ``Live ranges at N (peak):``, the values live at
  the program's peak with their sizes: XLA's own answer to "what fills memory at the peak".

Each value is tied to its HLO instruction in the optimised module (:func:`jaxdbg.profile.hlo.parse_hlo`), which
gives the operation, the user's line (its stack-frame metadata) and, for an entry parameter, the user's
argument path (``params['w1']``).

Example:
    >>> text = ("allocation 0: size 1024, parameter 0, shape |f32[256]| at ShapeIndex {}:\\n"
    ...         " value: <3 x.1 @0> (size=1024,offset=0): f32[256]{0}\\n"
    ...         "allocation 1: size 2048, preallocated-temp:\\n"
    ...         " value: <5 fusion.2 @0> (size=2048,offset=0): f32[512]{0}\\n")
    >>> live = "Live ranges at 4 (peak):\\n  fusion.2{}: 2048 bytes (cumulative: 2048 bytes)\\n"
    >>> assignment = parse_assignment(text, live)
    >>> [(v.name, v.kind, v.shape) for v in assignment.values.values()]
    [('x.1', 'argument', 'f32[256]'), ('fusion.2', 'temp', 'f32[512]')]
    >>> assignment.peak_values, assignment.peak_bytes
    (('fusion.2',), 2048)
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass, field
from typing import get_args

from jaxdbg.memory.result import BufferKind

_ALLOCATION = re.compile(r"^allocation (\d+): size (\d+)(.*):\s*$")
# a loop's state carried from one iteration to the next is a "phi" value: `<126 arg_tuple.3{2} (phi) @0>`
_VALUE = re.compile(r"^\s*value: <(\d+) ([^\s{>]+)(\{[\d,]*\})?(?: \(phi\))? @\d+> \(size=(\d+),offset=(\d+)\): (.*)$")
_PARAMETER = re.compile(r"\bparameter (\d+)")
_PEAK_HEADER = re.compile(r"^\s*Live ranges at (\d+) \(peak\):\s*$")
_PEAK_VALUE = re.compile(r"^\s*([^\s{]+)(\{[\d,]*\})?: (\d+) bytes")
_LAYOUT = re.compile(r"\{[^{}]*\}$")
LISTED: tuple[BufferKind, ...] = get_args(BufferKind)  # what Assignment.largest lists


@dataclass(frozen=True)
class Allocation:
    """One block XLA allocates for the program: its index, size and what it holds."""

    index: int
    size: int
    kind: str  # argument, output, temp, constant, thread-local
    parameter: int | None = None
    live_out: bool = False


@dataclass(frozen=True)
class Value:
    """One HLO value placed in an allocation (an instruction's result, or one element of a tuple result)."""

    name: str
    index: str  # the shape index inside a tuple, '' for the whole result
    size: int
    offset: int
    shape: str  # e.g. f32[1024,256] (layout dropped)
    allocation: int
    kind: str  # the allocation's kind


@dataclass
class Assignment:
    """A module's buffer assignment: allocations, values by name, and the values live at the peak."""

    allocations: dict[int, Allocation] = field(default_factory=dict)
    values: dict[str, Value] = field(default_factory=dict)  # by value_key
    peak_values: tuple[str, ...] = ()  # names live at the peak of the schedule, largest first
    peak_bytes: int | None = None  # their sum (XLA's sequential peak), when the live-range file was there

    def largest(self, limit: int) -> list[Value]:
        """The values live at the peak, largest first; without a live-range file, the largest values of the
        program (values sharing a temp allocation at different times are then all listed). A tuple's own
        buffer (its table of pointers: the elements are values of their own) and a token hold no data: not listed."""
        names = self.peak_values or tuple(self.values)
        chosen = [value for n in names if (value := self.values.get(n)) is not None and value.kind in LISTED
                  and value.size > 0 and not value.shape.startswith(("(", "token"))]
        return sorted(chosen, key=lambda v: -v.size)[:limit]

    def parameter_of(self, value: Value) -> int | None:
        """The entry parameter whose buffer holds ``value``: the parameter itself, or an output XLA wrote in place
        into a donated argument's buffer."""
        allocation = self.allocations.get(value.allocation)
        return allocation.parameter if allocation is not None else None


def parse_assignment(assignment_text: str, live_range_text: str = "") -> Assignment:
    """Parse the buffer-assignment dump (and the live-range dump, when there is one)."""
    found = Assignment()
    current: Allocation | None = None
    for line in assignment_text.splitlines():
        header = _ALLOCATION.match(line)
        if header:
            current = _allocation(int(header.group(1)), int(header.group(2)), header.group(3))
            found.allocations[current.index] = current
            continue
        value = _VALUE.match(line)
        if value and current is not None:
            name, index = value.group(2), (value.group(3) or "").strip("{}")
            key = value_key(name, index)
            if key in found.values and found.values[key].kind == "argument":
                continue  # a donated parameter also placed in the output: it stays an argument
            shape = _LAYOUT.sub("", value.group(6).strip())
            found.values[key] = Value(name, index, int(value.group(4)), int(value.group(5)), shape, current.index,
                                      current.kind)
        elif not line.startswith(" "):
            current = None  # past the allocations (summaries that follow them)
    found.peak_values, found.peak_bytes = _distinct(found, _peak(live_range_text))
    return found


def value_key(name: str, index: str) -> str:
    """How a value is keyed in :attr:`Assignment.values` and named in the live ranges: its instruction, and the
    element's index for one element of a tuple (a loop's state: ``arg_tuple.3{2}``).

        >>> value_key("fusion.2", ""), value_key("arg_tuple.3", "2")
        ('fusion.2', 'arg_tuple.3{2}')
    """
    return f"{name}{{{index}}}" if index else name


def _allocation(index: int, size: int, rest: str) -> Allocation:
    parameter = _PARAMETER.search(rest)
    live_out = "maybe-live-out" in rest
    if parameter:
        kind = "argument"
    elif "preallocated-temp" in rest:
        kind = "temp"
    elif "thread-local" in rest:
        kind = "thread-local"
    elif "constant" in rest:
        kind = "constant"
    elif live_out or "output shape" in rest:
        kind = "output"
    else:
        kind = "temp"
    return Allocation(index, size, kind, int(parameter.group(1)) if parameter else None, live_out)


def _peak(text: str) -> dict[str, int] | None:
    """The values under ``Live ranges at N (peak):`` and their sizes, largest first; None without that list."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _PEAK_HEADER.match(line)), None)
    if start is None:
        return None
    sizes: dict[str, int] = {}
    for line in lines[start + 1:]:
        match = _PEAK_VALUE.match(line)
        if not match:
            break
        key = value_key(match.group(1), (match.group(2) or "").strip("{}"))
        sizes[key] = sizes.get(key, 0) + int(match.group(3))
    return {name: sizes[name] for name in sorted(sizes, key=lambda name: -sizes[name])}


def _distinct(found: Assignment, sizes: dict[str, int] | None) -> tuple[tuple[str, ...], int | None]:
    """The peak's values less those whose bytes an earlier one already holds, and the bytes they hold together.

    Two values live at once in the same bytes are one buffer: a loop's state and what its body writes into it in
    place (``arg_tuple.1{1}`` and ``multiply_subtract_fusion``) are both listed at the peak, and summed they
    counted the carry twice, above what ``memory_analysis()`` says the call holds."""
    if sizes is None:
        return (), None
    kept: list[str] = []
    held: dict[int, list[tuple[int, int]]] = {}  # allocation -> byte ranges counted
    total = 0
    for name, size in sizes.items():
        value = found.values.get(name)
        if value is None:
            kept.append(name)
            total += size
            continue
        ranges = held.setdefault(value.allocation, [])
        new = _uncovered(ranges, value.offset, value.offset + value.size)
        if new or value.size == 0:
            kept.append(name)
        total += new
        ranges.append((value.offset, value.offset + value.size))
    return tuple(kept), total


def _uncovered(ranges: list[tuple[int, int]], start: int, end: int) -> int:
    """The bytes of ``[start, end)`` that no range of ``ranges`` covers.

        >>> _uncovered([(0, 10), (20, 30)], 5, 25)
        10
    """
    points = sorted((max(a, start), min(b, end)) for a, b in ranges if a < end and b > start)
    covered, reach = 0, start
    for a, b in points:
        if b > reach:
            covered += b - max(a, reach)
            reach = b
    return end - start - covered


@dataclass(frozen=True)
class DumpFiles:
    """The dump files of one compiled module."""

    assignment: str
    live_range: str | None
    hlo: str | None

    def read(self) -> Assignment:
        with open(self.assignment) as handle:
            assignment = handle.read()
        live = ""
        if self.live_range and os.path.exists(self.live_range):
            with open(self.live_range) as handle:
                live = handle.read()
        return parse_assignment(assignment, live)


_MODULE_FILE = re.compile(r"^module_(\d+)\.(.+)\.(\w+)_after_optimizations-buffer-assignment\.txt$")


def find_dump(folder: str, module: str, newer_than: int = -1) -> tuple[int, DumpFiles] | None:
    """The newest module called ``module`` (e.g. ``jit_train_step``) dumped in ``folder`` with a number above
    ``newer_than``: ``(its number, its files)``, or None. XLA numbers modules in the order it compiles them.

    Example:
        >>> find_dump("/nonexistent", "jit_f") is None
        True
    """
    best: tuple[int, str] | None = None
    for path in glob.glob(os.path.join(glob.escape(folder), "module_*buffer-assignment.txt")):
        match = _MODULE_FILE.match(os.path.basename(path))
        number = int(match.group(1)) if match and match.group(2) == module else -1
        if number > newer_than and (best is None or number > best[0]):
            best = (number, path)
    if best is None:
        return None
    number, path = best
    stem = path[: -len("-buffer-assignment.txt")]
    hlo = stem + ".txt"
    live = f"{stem}-live-range.txt"
    return number, DumpFiles(path, live if os.path.exists(live) else None, hlo if os.path.exists(hlo) else None)
