"""Out-of-memory errors: is this one, and what did it ask for.

XLA reports them as ``RESOURCE_EXHAUSTED`` runtime errors, worded by each backend: XLA:CPU "Out of memory
allocating 1099511627776 bytes.", XLA:GPU's allocator "Out of memory while trying to allocate 17.50GiB." (or a
byte count), XLA:TPU at compile time "Ran out of memory in memory space hbm. Used 20.5G of 15.48G hbm.
Exceeded hbm capacity by 5.02G.".

Two ways the message misleads, explained here in plain words:

- Asynchronous dispatch (GPU, TPU): a jitted call returns before its program runs; when the program cannot
  allocate its temporaries, the error is stored in its outputs and raised by whatever reads them later (an
  eager ``[0, 0]``, whose executable the message names: ``[executable_name='jit_squeeze']``). The call that
  failed is the one whose program allocates the size asked for (:func:`asked_by`): XLA:GPU words it with two
  decimals ("96.00GiB"), so sizes are compared within :data:`SIZE_TOLERANCE`.
- XLA:GPU's autotuner, which times candidate kernels of a matmul or convolution while compiling, reports
  ``NOT_FOUND: All configs failed during profiling`` when none could run in the memory left.

Example:
    >>> is_out_of_memory(RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 1099511627776 bytes."))
    True
    >>> requested_bytes("RESOURCE_EXHAUSTED: Out of memory allocating 1099511627776 bytes.")
    1099511627776
    >>> requested_bytes("Out of memory while trying to allocate 17.50GiB.")
    18790481920
    >>> requested_bytes("Ran out of memory in memory space hbm. Used 20.5G of 15.48G hbm.")
    22011707392
    >>> executable_name("Out of memory while trying to allocate 96.00GiB. [executable_name='jit_squeeze']")
    'jit_squeeze'
    >>> same_size(requested_bytes("allocate 96.00GiB"), 96 * 2**30 + 5 * 2**20), same_size(96 * 2**30, 90 * 2**30)
    (True, False)
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from jaxdbg._source import SourceLocation
from jaxdbg.memory.result import ProgramMemory
from jaxdbg.memory.units import format_bytes, parse_bytes
from jaxdbg.report import relative_or_absolute

_MARKERS = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory", "Ran out of memory")
_ASKED = [
    re.compile(r"allocat\w*\s+([0-9.]+\s*[KMGT]?i?B?)\b(?:\s*bytes)?", re.IGNORECASE),  # CPU, GPU
    re.compile(r"Used\s+([0-9.]+[KMGT]?)\s+of\s+[0-9.]+[KMGT]?", re.IGNORECASE),  # TPU: what the program needs
]
_SHORT_UNIT = re.compile(r"^([0-9.]+)\s*([KMGT])$")
_EXECUTABLE = re.compile(r"\[executable_name='([^']+)'\]")
_AUTOTUNER = "All configs failed during profiling"
# XLA:GPU words a size with two decimals of its unit ("96.00GiB", at worst 0.5% off) and its allocator rounds
# requests up: a size asked for and a program's own figure are the same within this share.
SIZE_TOLERANCE = 0.03


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


def executable_name(message: str) -> str | None:
    """The XLA executable that raised the error, as the message names it (jax 0.5 and later), or None."""
    match = _EXECUTABLE.search(message)
    return match.group(1) if match else None


def same_size(asked: int | None, size: int | None) -> bool:
    """Whether an allocation of ``asked`` bytes (as a message words it) is one of ``size`` bytes."""
    if not asked or not size:
        return False
    return abs(asked - size) <= SIZE_TOLERANCE * size


def asked_by(asked: int | None, programs: Iterable[ProgramMemory]) -> ProgramMemory | None:
    """The first of ``programs`` (the caller puts the most recently called first) that allocates about ``asked``
    bytes when it runs: its temporaries (one block on XLA:GPU; on XLA:CPU a temporary buffer of its largest), or
    all it adds to its arguments (outputs and temporaries): the call whose own allocation failed, where a later
    operation raised the error. Not its peak, which counts the arguments: a call that consumed the failed call's
    outputs would match it."""
    for program in programs if asked else ():
        sizes = [program.temp_bytes, program.peak_bytes - program.argument_bytes]
        sizes += [b.bytes for b in program.largest if b.kind == "temp"]
        if any(same_size(asked, size) for size in sizes):
            return program
    return None


def explanation(message: str, asked: int | None, function: str | None, *, call_index: int | None = None,
                asynchronous: bool = False, surfaced_at: SourceLocation | None = None,
                surfaced_in: str | None = None) -> str | None:
    """What the error means in plain words where XLA's message hides it: the autotuner's NOT_FOUND, or an error
    raised later than the call that failed (``asynchronous``: at ``surfaced_at``, by the executable
    ``surfaced_in``); None where the message says it plainly."""
    if _AUTOTUNER in message:
        of = f" of {function}" if function else ""
        size = f" ({format_bytes(asked)})" if asked else ""
        return (f"XLA's GPU autotuner, which runs each candidate kernel (configuration) of a matmul or convolution"
                f"{of} while compiling it to pick the fastest, could run none of them in the memory left: the output "
                f"and workspace they need{size} did not fit; XLA says so as NOT_FOUND \"{_AUTOTUNER}\"")
    if not asynchronous or not function:
        return None
    call = f"call {call_index} of {function}" if call_index is not None else function
    asking = format_bytes(asked) if asked else "what it needed"
    at = f" at {relative_or_absolute(surfaced_at.file)}:{surfaced_at.line}" if surfaced_at else ""
    by = f" by {surfaced_in}" if surfaced_in and surfaced_in != f"jit_{function}" else ""
    return (f"{call} could not allocate {asking} on the device; jax dispatches asynchronously, so the call had "
            f"returned and the error was raised later{at}{by}, when its result was used")
