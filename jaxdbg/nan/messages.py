"""What a nan-hunt job is asked and sends back (typed: see :mod:`jaxdbg.protocol`).

Example:
    >>> NonFiniteDetected("train_step", 2, None, "nan").call_index
    2
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from jaxdbg._source import SourceLocation
from jaxdbg.nan.result import OriginKind
from jaxdbg.protocol import Message, Request

if TYPE_CHECKING:  # types only: a messages module stays light and out of import cycles
    from jaxdbg.nan.api import HuntOptions
    from jaxdbg.nan.result import NanHuntResult
    from jaxdbg.target import TargetSpec


@dataclass(frozen=True)
class HuntJob(Request, handler_module="jaxdbg.nan.session"):
    """The request: the TARGET and the command's ``HuntOptions``."""

    spec: TargetSpec
    options: HuntOptions


@dataclass(frozen=True)
class NonFiniteDetected(Message):
    """Sent as soon as a jitted call returned non-finite values, before the (longer) analysis starts: if the
    analysis does not finish, the parent still knows what was found."""

    function: str
    call_index: int
    source: SourceLocation | None
    kind: OriginKind


@dataclass(frozen=True)
class JobFinding:
    """What one process of a job found, shared with process 0 (multihost): whether it found the origin, the
    origin in a line, and the process, device and shard that hold the first non-finite value."""

    found: bool
    origin: str | None = None
    process: int | None = None
    device: str | None = None
    shard: tuple[tuple[int, int], ...] | None = None


@dataclass(frozen=True)
class HuntFinished(Message):
    """The analysis: the result, the artifacts written, and the child's jax environment."""

    result: NanHuntResult
    artifacts: dict[str, str] = field(default_factory=dict)
    environment: dict | None = None


@dataclass(frozen=True)
class PeerNote(Message):
    """A line about another process of the job (lost, or the one the job hangs on), sent as the heartbeat
    sees it: a run stopped at ``--timeout`` still says it."""

    text: str
