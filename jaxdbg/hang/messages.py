"""What a hang-hunt job is asked and sends back (typed: see :mod:`jaxdbg.protocol`).

Example:
    >>> HangVerdict({"count": 1}, None, stopping=True).stopping
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from jaxdbg.protocol import Message, Request

if TYPE_CHECKING:  # types only: a messages module stays light and out of import cycles
    from jaxdbg.hang.api import HangOptions
    from jaxdbg.target import TargetSpec


# The merger keeps the coordination service up until every process has the verdict, waiting at most this long.
ACK_WAIT_S = 20.0

@dataclass(frozen=True)
class HangJob(Request, handler_module="jaxdbg.hang.session"):
    """The request: the TARGET and the command's ``HangOptions``."""

    spec: TargetSpec
    options: HangOptions


@dataclass(frozen=True)
class ChildStarted(Message):
    """The child's pid, first: the parent forwards SIGUSR1 to it."""

    pid: int


@dataclass(frozen=True)
class HangVerdict(Message):
    """The job's facts (:func:`jaxdbg.hang.job.facts_json`), this process's jax environment (None where the
    program never started jax's backend), and whether the program is stopped now (a stall, a signal, the
    deadline) rather than ended on its own."""

    facts: dict
    environment: dict | None
    stopping: bool
