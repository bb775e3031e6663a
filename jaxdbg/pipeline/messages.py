"""What the real-mode pipeline job is asked and sends back (typed: see :mod:`jaxdbg.protocol`).

Example:
    >>> StageDevices(("TFRT_CPU_0", "TFRT_CPU_1")).devices
    ('TFRT_CPU_0', 'TFRT_CPU_1')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from jaxdbg.protocol import Message, Request

if TYPE_CHECKING:  # types only: a messages module stays light and out of import cycles
    from jaxdbg.pipeline.bench import RunKey
    from jaxdbg.pipeline.real import ModelSpec
    from jaxdbg.pipeline.tasks import PipelineShape
    from jaxdbg.pipeline.variability import Costs, Durations


@dataclass(frozen=True)
class RealRun:
    """One run of a real job: its key, shape, schedule (by name: the child builds it), durations, the hint ready
    runs and the admission order (None: the data order)."""

    key: RunKey
    shape: PipelineShape
    schedule: str
    durations: Durations
    hint: str | None
    order: tuple[int, ...] | None


@dataclass(frozen=True)
class RealJob(Request, handler_module="jaxdbg.pipeline.bench"):
    """The request: the model, devices per stage, an optional xprof folder, and the runs to make."""

    model: ModelSpec
    devices_per_stage: int
    xprof_dir: str | None
    costs: Costs
    lookahead: bool
    jobs: tuple[RealRun, ...]
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

    key: RunKey
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
