"""What the real-mode pipeline job is asked and sends back (typed: see :mod:`jaxdbg.protocol`).

Example:
    >>> StageDevices(("TFRT_CPU_0", "TFRT_CPU_1")).devices
    ('TFRT_CPU_0', 'TFRT_CPU_1')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from jaxdbg.protocol import Message, Request


@dataclass(frozen=True)
class RealJob(Request, handler_module="jaxdbg.pipeline.bench"):
    """The request: the model, devices per stage, an optional xprof folder, and the runs
    ``(key, shape, schedule name, durations)`` to make."""

    model: Any
    devices_per_stage: int
    xprof_dir: str | None
    costs: Any
    lookahead: Any
    jobs: list[tuple]
    transfer_bind: str = "127.0.0.1"  # across processes: the interface jax.experimental.transfer's server binds
    timeout: float | None = None  # across processes: the longest wait for a peer (None: 300 s)
    message_auth: str = "full"  # across processes: what each message's HMAC covers (transport.AUTH)


@dataclass(frozen=True)
class StageDevices(Message):
    """The devices the stages run on (CPU devices where the accelerators are fewer than the stages)."""

    devices: tuple[str, ...]


@dataclass(frozen=True)
class RealTimeline(Message):
    """One real run: task start/end times, per-stage blocked time, memory waits and peak in-flight work,
    arbitration counts, the gradients' distance to the single-device reference, and what was measured."""

    key: Any
    start: np.ndarray
    end: np.ndarray
    blocked: tuple[float, ...]
    memory_wait: tuple[float, ...]
    peak: tuple[int, ...]
    decisions: int
    decision_ns: int
    grad_diff: float
    grad_max: float
    measured: np.ndarray
    message_delay: np.ndarray
