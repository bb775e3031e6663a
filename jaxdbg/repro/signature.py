"""Failure criteria and signatures: what "fails the same way" means for ``jaxdbg repro``.

A :class:`Criterion` is the contract's ``{"kind", "type", "message", "signal"}``; a :class:`FailureSignature`
adds where the failure happened. ``kind`` is ``exception`` (a Python exception: its type and normalised
message), ``crash`` (a fatal signal), ``timeout``, ``nonfinite`` (a jitted call produced NaN/Inf) or
``mismatch`` (a jitted call disagrees with op-by-op execution or float64).
Messages are normalised so that a reproducer with smaller shapes or another temp folder still matches:
numbers, hex addresses and paths are abstracted.

Example:
    >>> normalise_message("dot_general requires contracting dimensions to have the same shape, got (128,) and (64,).")
    'dot_general requires contracting dimensions to have the same shape, got (<n>,) and (<n>,).'
    >>> normalise_message("carry h has type float32[8] but the output has type bfloat16[8]")
    'carry h has type float32[<n>] but the output has type bfloat16[<n>]'
    >>> normalise_message("object at 0x7f3a2c1b90d0 in /home/me/run/train.py")
    'object at <addr> in <path>'
    >>> normalise_message('Below is the stack inside of JIT:\\n  File "run.py", line 3, in f\\n    y = g(x)\\n'
    ...                   'EquinoxRuntimeError: too large')
    'Below is the stack inside of JIT: EquinoxRuntimeError: too large'
    >>> normalise_message('CpuCallback error: Traceback (most recent call last):\\n  File "run.py", line 3, in main\\n'
    ...                   'ValueError: too large: 2.5')
    'CpuCallback error: ValueError: too large: <n>'
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from jaxdbg._source import SourceLocation
from jaxdbg._tracebacks import without_tracebacks

Kind = Literal["exception", "crash", "timeout", "nonfinite", "mismatch"]
KINDS: tuple[Kind, ...] = get_args(Kind)
_NONFINITE = "jitted function produced "  # + NaN or Inf
# What the AssertionError of a written reproducer says (repro.program and repro.source_check write the check).
REPRO_NONFINITE = "jax.jit({function}) produced {what}"
REPRO_MISMATCH = "jit and op-by-op (jax.disable_jit) disagree"
REPRO_MISMATCH_FLOAT64 = "jit and float64 (jax.enable_x64) disagree"

_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_PATH = re.compile(r"(?:[A-Za-z]:)?(?:[\w.~-]*/)+[\w.-]+|[\w.-]+\.py\b")
# (not the digits of a name: "float32" stays, else a dtype mismatch reads "float3<n>" and float32 == float64)
_NUMBER = re.compile(r"(?<![A-Za-z_\d])[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_SPACE = re.compile(r"\s+")
# A stack frame quoted in a message (its File line, then its indented source and ^^^ lines): Equinox's
# EquinoxRuntimeError lists the stack inside jit, which under jaxdbg holds jaxdbg's own frames, other ones in
# each kind of run; and the user's frames change as the program shrinks. What failed is said after them.
_FRAME = re.compile(r'^[ \t]*File "[^"\n]*", line \d+, in [^\n]*\n?(?:[ \t]+(?!File ")[^\n]*\n?)*', re.M)
# Messages can carry a whole traceback or a long listing; the head says what failed.
MESSAGE_CHARS = 400


def normalise_message(message: str | None) -> str:
    """The message with embedded tracebacks cut to the exception they end with, addresses, paths and numbers
    abstracted, and whitespace collapsed (first 400 chars)."""
    text = _ADDRESS.sub("<addr>", without_frames(message))
    text = _PATH.sub("<path>", text)
    text = _NUMBER.sub("<n>", text)
    return _SPACE.sub(" ", text).strip()[:MESSAGE_CHARS]


def without_frames(message: str | None) -> str:
    """The message with embedded tracebacks cut to the exception they end with, and stack frames it quotes
    without a traceback's header (Equinox's "Below is the stack inside of JIT:") left out.

    Example:
        >>> without_frames('stack inside of JIT:\\n  File "a.py", line 3, in f\\n    y = g(x)\\n        ^^^^\\n\\n'
        ...                'EquinoxRuntimeError: diverged')
        'stack inside of JIT:\\n\\nEquinoxRuntimeError: diverged'
    """
    return _FRAME.sub("", without_tracebacks(message))


@dataclass(frozen=True)
class Criterion:
    """What "fails the same way" means, decided here and nowhere else: the contract's signature less where it
    happened. ``type`` and ``message`` are an exception's type name and normalised message (for a NaN/Inf or
    a mismatch, jaxdbg's words for it; for a process that exited, its status), ``signal`` a crash's.

    The original run, every candidate, a cut checked in its child and a reproducer verified alone are all
    compared with one criterion; it travels as its JSON too (a report's ``signature`` reads back as one).

    Example:
        >>> criterion = Criterion.exception("TypeError", "got (128,) and (64,) in /tmp/x/model.py")
        >>> criterion.same_exception("TypeError", "got (8,) and (4,) in /home/me/model.py")
        True
        >>> Criterion.from_json(criterion.to_json()) == criterion
        True
        >>> nan = Criterion.nonfinite("NaN")
        >>> nan.what, nan.reproduced_by("AssertionError", "jax.jit(f) produced NaN: [nan]")
        ('NaN', True)
        >>> nan.assertion("step"), nan.reproduced_by("AssertionError", "jax.jit(step) produced NaN: [nan]")
        ('jax.jit(step) produced NaN', True)
    """

    kind: Kind
    type: str | None = None
    message: str | None = None
    signal: str | None = None

    @classmethod
    def exception(cls, type_name: str | None, message: str | None) -> Criterion:
        """An exception of ``type_name`` saying ``message`` (as raised: normalised here)."""
        return cls("exception", type_name, normalise_message(message))

    @classmethod
    def nonfinite(cls, what: str) -> Criterion:
        """A jitted call produced ``what``: 'NaN' or 'Inf'."""
        return cls("nonfinite", None, _NONFINITE + what)

    @classmethod
    def mismatch(cls, reference: str = "op-by-op") -> Criterion:
        """A jitted call disagrees with ``reference``: 'op-by-op' or 'float64'."""
        return cls("mismatch", None, f"jit and {reference} disagree")

    @property
    def what(self) -> str | None:
        """What a nonfinite failure produced, 'NaN' or 'Inf' (None for the other kinds)."""
        return (self.message or "").removeprefix(_NONFINITE) if self.kind == "nonfinite" else None

    @property
    def reference(self) -> str | None:
        """What a mismatch compared the jitted call with, 'op-by-op' or 'float64' (None for the other kinds)."""
        if self.kind != "mismatch":
            return None
        return (self.message or "").removeprefix("jit and ").removesuffix(" disagree")

    def key(self) -> tuple[str, str | None, str | None, str | None]:
        """What must stay equal between the original and a reduced program."""
        return (self.kind, self.type, self.message, self.signal)

    def same_as(self, other: Criterion | None) -> bool:
        return other is not None and self.key() == other.key()

    def same_exception(self, type_name: str, message: str) -> bool:
        """Whether an exception ``type_name: message`` (as raised) fails this way."""
        return self.kind == "exception" and type_name == self.type and normalise_message(message) == self.message

    def assertion(self, function: str = "f") -> str:
        """The words of the AssertionError a written reproducer of a NaN/Inf or a mismatch raises (``function``:
        the jitted function's name in it, ``f`` in a cut)."""
        if self.kind == "nonfinite":
            return REPRO_NONFINITE.format(function=function, what=self.what)
        return REPRO_MISMATCH_FLOAT64 if self.reference == "float64" else REPRO_MISMATCH

    def reproduced_by(self, type_name: str, message: str) -> bool:
        """Whether a written reproducer that ended raising ``type_name: message`` fails this way: the same
        exception, or for a NaN/Inf or a mismatch the AssertionError of its check."""
        if self.kind == "nonfinite":  # whatever the function is called
            before, _, after = REPRO_NONFINITE.partition("{function}")
            said = re.escape(before) + r"[^\n]+?" + re.escape(after.format(what=self.what)) + r"\b"
            return type_name == "AssertionError" and re.search(said, message) is not None
        if self.kind == "mismatch":
            return type_name == "AssertionError" and self.assertion() in message
        return self.same_exception(type_name, message)

    def to_json(self) -> dict[str, str | None]:
        """The contract's four keys (a signature's place is no part of its criterion)."""
        return {"kind": self.kind, "type": self.type, "message": self.message, "signal": self.signal}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Criterion:
        """The criterion of its JSON, or of a report's ``signature`` (whose other keys say where, not how)."""
        if data.get("kind") not in KINDS:
            raise ValueError(f"a failure criterion's kind is one of {', '.join(KINDS)}, not {data.get('kind')!r}")
        return Criterion(data["kind"], data.get("type"), data.get("message"), data.get("signal"))


@dataclass(frozen=True)
class FailureSignature(Criterion):
    """The contract's signature: the criterion, plus where it happened (no part of the criterion: code moves
    as it shrinks)."""

    function: str | None = None  # the jitted function of a nonfinite/mismatch failure, or where it raised
    location: SourceLocation | None = None

    @classmethod
    def of(cls, criterion: Criterion, function: str | None = None,
           location: SourceLocation | None = None) -> FailureSignature:
        return cls(criterion.kind, criterion.type, criterion.message, criterion.signal, function, location)

    def describe(self) -> str:
        if self.kind == "exception":
            return f"{self.type}: {self.message}"
        if self.kind == "crash":  # a fatal signal, or a process that exited on its own (os._exit(3))
            return f"crash with {self.signal}" if self.signal else f"crash: {self.message}"
        if self.kind == "timeout":
            return "timeout (hang)"
        return f"{self.kind} in {self.function}: {self.message}"


def matches_pattern(signature: FailureSignature, raw_text: str, pattern: str | None) -> bool:
    """``--match REGEX`` against the raw (not normalised) description of a failure."""
    return (pattern is None or re.search(pattern, raw_text) is not None
            or re.search(pattern, signature.describe()) is not None)
