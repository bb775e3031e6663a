"""Failure signatures: what "fails the same way" means for ``jaxdbg repro``.

A signature is the contract's ``{"kind", "type", "message", "signal"}``. ``kind`` is ``exception`` (a Python
exception: its type and normalised message), ``crash`` (a fatal signal), ``timeout``, ``nonfinite`` (a
jitted call produced NaN/Inf) or ``mismatch`` (a jitted call disagrees with op-by-op execution or float64).
Messages are normalised so that a reproducer with smaller shapes or another temp folder still matches:
numbers, hex addresses and paths are abstracted.

Example:
    >>> normalise_message("dot_general requires contracting dimensions to have the same shape, got (128,) and (64,).")
    'dot_general requires contracting dimensions to have the same shape, got (<n>,) and (<n>,).'
    >>> normalise_message("object at 0x7f3a2c1b90d0 in /home/me/run/train.py")
    'object at <addr> in <path>'
    >>> normalise_message('CpuCallback error: Traceback (most recent call last):\\n  File "run.py", line 3, in main\\n'
    ...                   'ValueError: too large: 2.5')
    'CpuCallback error: ValueError: too large: <n>'
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from jaxdbg._source import SourceLocation
from jaxdbg._tracebacks import without_tracebacks

KINDS = ("exception", "crash", "timeout", "nonfinite", "mismatch")

_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_PATH = re.compile(r"(?:[A-Za-z]:)?(?:[\w.~-]*/)+[\w.-]+|[\w.-]+\.py\b")
_NUMBER = re.compile(r"(?<![A-Za-z_])[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_SPACE = re.compile(r"\s+")
# Messages can carry a whole traceback or a long listing; the head says what failed.
MESSAGE_CHARS = 400


def normalise_message(message: str | None) -> str:
    """The message with embedded tracebacks cut to the exception they end with, addresses, paths and numbers
    abstracted, and whitespace collapsed (first 400 chars)."""
    text = _ADDRESS.sub("<addr>", without_tracebacks(message))
    text = _PATH.sub("<path>", text)
    text = _NUMBER.sub("<n>", text)
    return _SPACE.sub(" ", text).strip()[:MESSAGE_CHARS]


@dataclass(frozen=True)
class FailureSignature:
    """The contract's signature, plus where it happened (not part of equality: code moves as it shrinks)."""

    kind: str
    type: str | None = None
    message: str | None = None
    signal: str | None = None
    function: str | None = None  # the jitted function of a nonfinite/mismatch failure, or where it raised
    location: SourceLocation | None = None

    def key(self) -> tuple:
        """What must stay equal between the original and a reduced program."""
        return (self.kind, self.type, self.message, self.signal)

    def same_as(self, other: FailureSignature | None) -> bool:
        return other is not None and self.key() == other.key()

    def describe(self) -> str:
        if self.kind == "exception":
            return f"{self.type}: {self.message}"
        if self.kind == "crash":
            return f"crash with {self.signal}"
        if self.kind == "timeout":
            return "timeout (hang)"
        return f"{self.kind} in {self.function}: {self.message}"


def exception_signature(type_name: str, message: str, location: SourceLocation | None = None) -> FailureSignature:
    return FailureSignature("exception", type_name, normalise_message(message), location=location)


def nonfinite_signature(function: str, what: str) -> FailureSignature:
    """``what`` is 'NaN' or 'Inf'."""
    return FailureSignature("nonfinite", None, f"jitted function produced {what}", function=function)


def mismatch_signature(function: str, reference: str) -> FailureSignature:
    return FailureSignature("mismatch", None, f"jit and {reference} disagree", function=function)


def matches_pattern(signature: FailureSignature, raw_text: str, pattern: str | None) -> bool:
    """``--match REGEX`` against the raw (not normalised) description of a failure."""
    return (pattern is None or re.search(pattern, raw_text) is not None
            or re.search(pattern, signature.describe()) is not None)
