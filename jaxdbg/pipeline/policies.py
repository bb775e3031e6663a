"""Which task a stage runs next: fixed order, or readiness-first with a hint ranking and a memory cap.

These classes are the single implementation of arbitration; the discrete-event simulator
(:mod:`jaxdbg.pipeline.simulate`) and the threaded multi-device executor (:mod:`jaxdbg.pipeline.real`) both
drive an :class:`Arbiter` and differ only in where time comes from.

- :class:`FixedOrder` runs its schedule verbatim: the stage waits for its next scheduled task even when
  another one is ready (Megatron, torch.distributed.pipelining).
- :class:`ReadyFirst` runs, among the tasks whose inputs have arrived, the one the hint ranks best. Ready
  tasks sit in two heaps keyed by rank (forwards that admit a new microbatch, and everything else), so a
  decision costs O(log n), not a scan of the ready set. A forward that admits a new microbatch is only
  taken while the stage holds fewer microbatches than its cap.

Hints rank tasks: ``1f1b`` and ``gpipe`` by position in that schedule's order (1F1B's family member for
the shape: interleaved when the stages hold several chunks, ZB-H1 when the backward is split), ``bf``
backward work before forwards, ``bfw`` input gradients, then forwards, then the deferred weight
gradients (``bf`` and ``bfw`` agree when the backward is not split). Ties go to the older microbatch.

Example:
    >>> from jaxdbg.pipeline.tasks import PipelineShape
    >>> shape = PipelineShape(stages=2, microbatches=4)
    >>> arbiter = Arbiter(shape, make_policies("ready", shape, hint="bf"))
    >>> arbiter.start()              # tasks without prerequisites become ready
    >>> shape.name(arbiter.pick(0))  # worker 0 admits microbatch 0
    '0F0'
"""

from __future__ import annotations

import functools
import heapq
import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from jaxdbg._errors import UsageError
from jaxdbg.pipeline.schedules import Schedule, build_schedule, static_peak_inflight
from jaxdbg.pipeline.tasks import PipelineShape

HINTS = ("1f1b", "bf", "bfw", "gpipe")
POLICIES = ("fixed", "ready")
NO_TASK = -1
# Why a stage with nothing to run is waiting (see Arbiter.wait_reason).
WAIT_INPUT, WAIT_MEMORY = 0, 1


class Policy(Protocol):
    """Per-stage arbitration: ``push`` a task that became ready, ``pick`` the next one (or NO_TASK)."""

    def push(self, task: int) -> None: ...

    def pick(self, inflight: int) -> int: ...

    def wants(self, task: int) -> bool: ...

    def memory_blocked(self, inflight: int) -> bool: ...


class FixedOrder:
    """Runs the order as written, waiting for the next scheduled task even when another one is ready.

    ``wants`` says which messages a blocking-send runtime has a receive posted for: the input of the next
    scheduled forward and of the next scheduled backward (Megatron posts both with its batched sends).
    """

    def __init__(self, order: tuple[int, ...] | list[int], ready: bytearray, shape: PipelineShape):
        self.order = list(order) + [NO_TASK]
        self.kinds = [shape.decode(t)[0] for t in order] + [NO_TASK]
        self.kind_of = dict(zip(order, self.kinds))
        self.position = 0
        self.ready = ready  # one flag per task, shared by all stages (each touches only its own tasks)

    def push(self, task: int) -> None:
        self.ready[task] = 1

    def pick(self, inflight: int) -> int:
        task = self.order[self.position]
        if task >= 0 and self.ready[task]:
            self.position += 1
            return task
        return NO_TASK

    def wants(self, task: int) -> bool:
        kind = self.kind_of.get(task)
        for position in range(self.position, len(self.kinds) - 1):
            if self.kinds[position] == kind:
                return self.order[position] == task
        return False

    def memory_blocked(self, inflight: int) -> bool:
        return False


class ReadyFirst:
    """Best-ranked ready task first, under a cap on the microbatches resident on the stage."""

    def __init__(self, keys: list[int], cap: int, admits: list[bool]):
        if cap < 1:
            raise UsageError(f"memory cap {cap}: a stage must hold at least one microbatch")
        self.cap = cap
        self.keys = keys  # shared by all stages: rank * num_tasks + task, so one int compares both
        self.scale = len(keys)
        self.admits = admits
        self.admit_heap: list[int] = []
        self.other_heap: list[int] = []

    def push(self, task: int) -> None:
        heapq.heappush(self.admit_heap if self.admits[task] else self.other_heap, self.keys[task])

    def pick(self, inflight: int) -> int:
        admit, other = self.admit_heap, self.other_heap
        if admit and inflight < self.cap and (not other or admit[0] < other[0]):
            return heapq.heappop(admit) % self.scale
        if other:
            return heapq.heappop(other) % self.scale
        return NO_TASK

    def wants(self, task: int) -> bool:
        return True  # a readiness-first runtime has a receive posted for every input it may use

    def memory_blocked(self, inflight: int) -> bool:
        return bool(self.admit_heap) and inflight >= self.cap


@dataclass(frozen=True)
class RunRecord:
    """What one run did, simulated or real: when each task ran, and what the stages waited for.

    Times are seconds from the run's start. ``blocked_s`` is time a stage spent in blocking sends,
    ``memory_wait_s`` time it had a ready forward held back by the memory cap and nothing else to run.
    """

    shape: PipelineShape
    start: np.ndarray
    end: np.ndarray
    blocked_s: tuple[float, ...]
    memory_wait_s: tuple[float, ...]
    peak_inflight: tuple[int, ...]
    decisions: int
    decision_ns: int


class Arbiter:
    """Dependency counting and memory accounting around one policy per worker.

    The drivers call :meth:`start` once, then :meth:`pick` when a worker is free, :meth:`finish` when a
    task ends (it readies local successors and returns the remote one, or NO_TASK), and :meth:`satisfy`
    when a message arrives. Each call touches only the given worker's state, so one thread per worker may
    drive its own worker without locks.
    """

    def __init__(self, shape: PipelineShape, policies: list):
        self.shape = shape
        self.graph = graph = shape.graph()
        self.policies = policies
        self.missing = list(graph.prerequisites)
        self.inflight = [0] * shape.stages
        self.peak = [0] * shape.stages
        self.decisions = [0] * shape.stages
        self.decision_ns = [0] * shape.stages
        self.memory_wait = [0.0] * shape.stages
        self._waiting_since: list[float | None] = [None] * shape.stages
        self._wait_reason = [WAIT_INPUT] * shape.stages

    def start(self) -> None:
        for task, count in enumerate(self.missing):
            if count == 0:
                self.policies[self.graph.worker[task]].push(task)

    def satisfy(self, task: int) -> None:
        """One prerequisite of ``task`` is done (its message arrived, or a local task finished)."""
        self.missing[task] -= 1
        if self.missing[task] == 0:
            self.policies[self.graph.worker[task]].push(task)

    def pick(self, worker: int) -> int:
        """The task ``worker`` runs now, or NO_TASK; the decision's cost is timed."""
        began = time.perf_counter_ns()
        task = self.policies[worker].pick(self.inflight[worker])
        self.decision_ns[worker] += time.perf_counter_ns() - began
        self.decisions[worker] += 1
        if task >= 0 and self.graph.admits[task]:
            self.inflight[worker] += 1
            if self.inflight[worker] > self.peak[worker]:
                self.peak[worker] = self.inflight[worker]
        return task

    def wait_reason(self, worker: int) -> int:
        """Why ``worker`` has nothing to run: WAIT_MEMORY if a ready forward is held back by the cap."""
        return WAIT_MEMORY if self.policies[worker].memory_blocked(self.inflight[worker]) else WAIT_INPUT

    def idle(self, worker: int, now: float) -> None:
        """``worker`` found nothing to run at ``now``: start (or re-classify) its wait."""
        reason = self.wait_reason(worker)
        since = self._waiting_since[worker]
        if since is None:
            self._waiting_since[worker], self._wait_reason[worker] = now, reason
        elif reason != self._wait_reason[worker]:
            if self._wait_reason[worker] == WAIT_MEMORY:
                self.memory_wait[worker] += now - since
            self._waiting_since[worker], self._wait_reason[worker] = now, reason

    def resume(self, worker: int, now: float) -> None:
        """``worker`` starts a task at ``now``: close its wait, counting time held back by the cap."""
        since = self._waiting_since[worker]
        if since is not None:
            if self._wait_reason[worker] == WAIT_MEMORY:
                self.memory_wait[worker] += now - since
            self._waiting_since[worker] = None

    def wants(self, worker: int, task: int) -> bool:
        return self.policies[worker].wants(task)

    def record(self, start: np.ndarray, end: np.ndarray, blocked_s: list[float]) -> RunRecord:
        """The run's record once every task has ended (times in seconds from the run's start)."""
        return RunRecord(
            self.shape, start, end, tuple(blocked_s), tuple(self.memory_wait), tuple(self.peak),
            sum(self.decisions), sum(self.decision_ns),
        )

    def finish(self, task: int) -> int:
        graph = self.graph
        if graph.releases[task]:
            self.inflight[graph.worker[task]] -= 1
        for nxt in (graph.local_a[task], graph.local_b[task]):
            if nxt >= 0:
                self.satisfy(nxt)
        return graph.remote[task]


def hint_ranks(hint: str, shape: PipelineShape) -> list[int]:
    """Rank of every task under a hint (lower runs first); unique within each worker."""
    if hint not in HINTS:
        raise UsageError(f"--hint '{hint}': unknown hint; use one of {', '.join(HINTS)}")
    if hint in ("1f1b", "gpipe"):
        return _position_ranks(build_schedule(_family(hint, shape), shape))
    K, S, m = shape.kinds, shape.model_stages, shape.microbatches
    kind, model_stage, mb = (a.reshape(-1) for a in np.meshgrid(np.arange(K), np.arange(S), np.arange(m), indexing="ij"))
    klass = np.array([1, 0, 0 if hint == "bf" or not shape.split else 2])[kind]
    order = np.lexsort((kind, model_stage // shape.stages, mb, klass))  # last key sorts first
    ranks = np.empty(shape.num_tasks, dtype=np.int64)
    ranks[order] = np.arange(shape.num_tasks)
    return ranks.tolist()


@functools.lru_cache(maxsize=32)
def rank_keys(hint: str, shape: PipelineShape) -> list[int]:
    """Heap keys ``rank * num_tasks + task`` of a hint: one int compares rank and breaks ties by task id."""
    n = shape.num_tasks
    return [rank * n + task for task, rank in enumerate(hint_ranks(hint, shape))]


def _position_ranks(schedule: Schedule) -> list[int]:
    ranks = [0] * schedule.shape.num_tasks
    for order in schedule.orders:
        for position, task in enumerate(order):
            ranks[task] = position
    return ranks


def _family(hint: str, shape: PipelineShape) -> str:
    """The schedule of a hint's family that fits the shape: 1F1B is interleaved when chunked, ZB-H1 when split."""
    if hint == "1f1b" and shape.virtual > 1:
        return "interleaved"
    if hint == "1f1b" and shape.split:
        return "zb-h1"
    return hint


@functools.lru_cache(maxsize=32)
def default_caps(shape: PipelineShape) -> tuple[int, ...]:
    """Per worker, the microbatches 1F1B keeps in flight there: ``p - s`` at stage ``s``.

    Chunked stages take interleaved 1F1B's count, and a split backward ZB-H1's (up to ``p`` on every stage,
    1F1B's peak, as deferred weight gradients keep their inputs).
    """
    return tuple(static_peak_inflight(build_schedule(_family("1f1b", shape), shape)))


def make_policies(
    policy: str, shape: PipelineShape, schedule: Schedule | None = None, hint: str | None = None,
    cap_multiple: float = 1.0,
) -> list:
    """One policy object per worker: ``fixed`` runs ``schedule``; ``ready`` ranks by ``hint`` under a cap."""
    if policy == "fixed":
        if schedule is None:
            raise UsageError("the fixed policy needs a schedule")
        ready = bytearray(shape.num_tasks)
        return [FixedOrder(order, ready, shape) for order in schedule.orders]
    if policy == "ready":
        keys = rank_keys(hint or "1f1b", shape)
        admits = shape.graph().admits
        return [ReadyFirst(keys, cap, admits) for cap in memory_caps(shape, cap_multiple)]
    raise UsageError(f"--policy '{policy}': unknown policy; use one of {', '.join(POLICIES)}")


def memory_caps(shape: PipelineShape, multiple: float) -> list[int]:
    """Per-worker caps in microbatches: ``multiple`` times 1F1B's, at least one, at most all microbatches."""
    if multiple <= 0:
        raise UsageError(f"--memory-cap {multiple}: use a positive multiple of 1F1B's memory, e.g. 1,2,4")
    return [max(1, min(shape.microbatches, int(round(base * multiple)))) for base in default_caps(shape)]
