"""Which task a stage runs next: fixed order, or readiness-first with a hint ranking and a memory cap.

These classes are the single implementation of arbitration: the :class:`~jaxdbg.pipeline.arbiter.Arbiter`
holds one per stage, for the discrete-event simulator and the threaded multi-device executor alike.

- :class:`FixedOrder` runs its schedule verbatim: the stage waits for its next scheduled task even when
  another one is ready (Megatron, torch.distributed.pipelining).
- :class:`ReadyFirst` runs, among the tasks whose inputs have arrived, the one the hint ranks best. Ready
  tasks sit in two heaps keyed by rank (forwards that admit a new microbatch, and everything else), so a
  decision costs O(log n), not a scan of the ready set. A forward that admits a new microbatch is only
  taken while the stage holds fewer microbatches than its cap. Its look-ahead
  (:mod:`jaxdbg.pipeline.lookahead`) keeps the schedule's next task on time: work the hint ranks below it
  starts only if it should be done before that task can start, so without variability a readiness-first
  run keeps the schedule's timing where the schedule is already tight, and fills only real gaps. While
  every duration matches its expectation, it leaves its plan at all only if a dry run on the expected
  durations says that pays (the Arbiter's ``_plan_beats_leaving_it``); otherwise it keeps the plan's order.

Hints rank tasks: ``1f1b`` and ``gpipe`` by position in that schedule's order (1F1B's family member for
the shape: interleaved when the stages hold several chunks, ZB-H1 when the backward is split), ``bf``
backward work before forwards, ``bfw`` input gradients, then forwards, then the deferred weight
gradients (``bf`` and ``bfw`` agree when the backward is not split). Ties go to the older microbatch.

Example:
    >>> from jaxdbg.pipeline.tasks import PipelineShape
    >>> shape = PipelineShape(stages=2, microbatches=4)
    >>> memory_caps(shape, 1.0), memory_caps(shape, 2.0)  # 1F1B holds p - s microbatches at stage s
    ([2, 1], [4, 2])
"""

from __future__ import annotations

import functools
import heapq
from typing import Literal, Protocol, get_args

import numpy as np

from jaxdbg._errors import UsageError
from jaxdbg.pipeline.admission import reorder_ranks, reorder_schedule
from jaxdbg.pipeline.lookahead import LookAhead
from jaxdbg.pipeline.schedules import Schedule, build_schedule, static_peak_inflight
from jaxdbg.pipeline.tasks import PipelineShape
from jaxdbg.pipeline.variability import Costs, parse_variability, realise

Hint = Literal["1f1b", "bf", "bfw", "gpipe"]
HINTS: tuple[Hint, ...] = get_args(Hint)
PolicyName = Literal["fixed", "ready"]
POLICIES: tuple[PolicyName, ...] = get_args(PolicyName)
NO_TASK = -1


class Policy(Protocol):
    """Per-stage arbitration: ``push`` a task that became ready, ``pick`` the next one (or NO_TASK)."""

    def push(self, task: int) -> None: ...

    def bind(self, worker: int, lookahead: LookAhead | None) -> None: ...

    def pick(self, inflight: int, now: float) -> int: ...

    def wants(self, task: int) -> bool: ...

    def memory_blocked(self, inflight: int) -> bool: ...


class FixedOrder:
    """Runs the order as written, waiting for the next scheduled task even when another one is ready.

    ``wants`` says which messages a blocking-send runtime has a receive posted for: the input of the next
    scheduled forward and of the next scheduled backward (Megatron posts both with its batched sends).
    """

    def __init__(self, order: tuple[int, ...] | list[int], ready: bytearray, shape: PipelineShape):
        self.order = [*order, NO_TASK]
        self.kinds = [shape.decode(t)[0] for t in order] + [NO_TASK]
        self.kind_of = dict(zip(order, self.kinds))
        self.position = 0
        self.ready = ready  # one flag per task, shared by all stages (each touches only its own tasks)

    def bind(self, worker: int, lookahead: LookAhead | None) -> None:
        pass  # the order alone decides

    def push(self, task: int) -> None:
        self.ready[task] = 1

    def pick(self, inflight: int, now: float = 0.0) -> int:
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
    """Best-ranked ready task first, under a cap on the microbatches resident on the stage.

    ``plan`` is the worker's order in the schedule the run follows (the fixed order it is compared with).
    With the look-ahead (bound by the :class:`~jaxdbg.pipeline.arbiter.Arbiter`), work the hint ranks *below* the
    plan's next task runs only if it is expected to be done before that task can start (see
    :mod:`jaxdbg.pipeline.lookahead`); otherwise the stage holds. Work the hint ranks above the plan's next
    task runs at once: the hint has the last word. With ``headroom`` (a cap above the plan's own peak),
    forwards that admit a microbatch are exempt: spare memory is there to run forwards ahead.
    ``keep_plan`` fixes the on-plan rule (True: keep the plan's order while durations are as expected;
    False: never); None lets the Arbiter decide by a dry run. ``fits_plan``: the cap holds the plan's peak.
    """

    def __init__(
        self, keys: list[int], cap: int, admits: list[bool], plan: list[int] | None = None,
        headroom: bool = False, lookahead: bool = True, expected: tuple[list[float], float] | None = None,
        fits_plan: bool = True, keep_plan: bool | None = None,
    ):
        if cap < 1:
            raise UsageError(f"memory cap {cap}: a stage must hold at least one microbatch")
        self.cap = cap
        self.keys = keys  # shared by all stages: rank * num_tasks + task, so one int compares both
        self.scale = len(keys)
        self.admits = admits
        self.admit_heap: list[int] = []
        self.other_heap: list[int] = []
        self.plan = [*(plan or []), len(keys)]  # the sentinel: LookAhead.began holds one more entry
        self.position = 0
        self.headroom = headroom
        self.wants_lookahead = lookahead and bool(plan)
        self.expected = expected  # prior durations per task and per message, shared
        self.lookahead: LookAhead | None = None
        self.worker = -1
        self.fits_plan = fits_plan  # the plan's order stays within the cap (it can be followed)
        self.keep_plan = keep_plan  # on plan, keep the plan's order; None: decide by dry runs (Arbiter)

    def fresh(self, keep_plan: bool) -> ReadyFirst:
        """A policy like this one before its run, for a dry run with the on-plan rule fixed to ``keep_plan``."""
        return ReadyFirst(
            self.keys, self.cap, self.admits, self.plan[:-1], self.headroom, self.wants_lookahead, self.expected,
            self.fits_plan, keep_plan,
        )

    def bind(self, worker: int, lookahead: LookAhead | None) -> None:
        self.worker, self.lookahead = worker, lookahead if self.wants_lookahead else None

    def push(self, task: int) -> None:
        heapq.heappush(self.admit_heap if self.admits[task] else self.other_heap, self.keys[task])

    def pick(self, inflight: int, now: float = 0.0) -> int:
        admit, other, scale = self.admit_heap, self.other_heap, self.scale
        # The best-ranked ready task the cap allows, and the top of the other heap (inlined: the hot path).
        admit_top = admit[0] % scale if admit and inflight < self.cap else NO_TASK
        other_top = other[0] % scale if other else NO_TASK
        if admit_top >= 0 and (other_top < 0 or admit[0] < other[0]):
            best, runner_up = admit_top, other_top
        elif other_top >= 0:
            best, runner_up = other_top, admit_top
        else:
            return NO_TASK
        if self.lookahead is not None:
            best = self._guard(best, runner_up, inflight, now)
            if best < 0:
                return NO_TASK
        heapq.heappop(admit if self.admits[best] else other)
        return best

    def _guard(self, best: int, runner_up: int, inflight: int, now: float) -> int:
        """What the stage runs instead of ``best`` (NO_TASK: hold) to keep the plan's next task on time."""
        look, plan, position = self.lookahead, self.plan, self.position
        assert look is not None  # pick() guards only with a look-ahead bound
        began = look.began
        while began[plan[position]] >= 0:  # the plan ends with a task id that never starts
            position += 1
        self.position = position
        upcoming = plan[position]
        if upcoming == best and not look.sync:
            return best
        keys, admits = self.keys, self.admits
        if upcoming >= self.scale:  # the plan has run: nothing left to protect (but a neighbour's send)
            upcoming = best
        # While every duration has been as expected, keep the plan's order if a dry run on the expected
        # durations said leaving it does not pay (see Arbiter). Asked only where keeping and leaving differ:
        # running other work than the plan's next task (not ready: it would rank best), or holding for a send.
        if look.on_plan and not (admits[upcoming] and inflight >= self.cap):
            if best != upcoming:
                if look.keeps_plan():
                    return NO_TASK
            elif look.keep_plan or (look.keep_plan is None and look.sender_due(self.worker, now, best) > now
                                    and look.keeps_plan()):
                return best
        # Only work the hint ranks below a plan task that waits for its inputs is held to the gap (were that
        # task ready, it would be ranked best; a cap-blocked one cannot run anyway).
        if (keys[best] > keys[upcoming] and not (admits[upcoming] and inflight >= self.cap)
                and not (self.headroom and admits[best])):
            spare = runner_up if self.headroom and runner_up >= 0 and admits[runner_up] else NO_TASK
            fits = look.choose(self.worker, now, upcoming, best, runner_up if spare < 0 else NO_TASK)
            best = fits if fits >= 0 else spare
            if best < 0:
                return NO_TASK
        if look.sync and look.sender_due(self.worker, now, best) > now:
            return NO_TASK  # receive a neighbour's message first rather than keep it blocked
        return best

    def wants(self, task: int) -> bool:
        """A readiness-first runtime has a receive posted for every input it may use; while it keeps the
        plan's order, only those the fixed order would post (the next forward's and the next backward's)."""
        look = self.lookahead
        if look is None or not look.on_plan or look.keep_plan is False:
            return True
        return self._posted_by_plan(task) or not look.keeps_plan()

    def _posted_by_plan(self, task: int) -> bool:
        look = self.lookahead
        assert look is not None  # wants() asks only with a look-ahead bound
        per_kind = look.shape.model_stages * look.m  # task ids run kind by kind
        kind = task // per_kind
        began, plan = look.began, self.plan
        for position in range(self.position, len(plan) - 1):
            if began[plan[position]] < 0 and plan[position] // per_kind == kind:
                return plan[position] == task
        return False

    def memory_blocked(self, inflight: int) -> bool:
        return bool(self.admit_heap) and inflight >= self.cap


def hint_ranks(hint: str, shape: PipelineShape) -> list[int]:
    """Rank of every task under a hint (lower runs first); unique within each worker."""
    if hint not in HINTS:
        raise UsageError(f"--hint '{hint}': unknown hint; use one of {', '.join(HINTS)}")
    if hint in ("1f1b", "gpipe"):
        return _position_ranks(build_schedule(_family(hint, shape), shape))
    K, S, m = shape.kinds, shape.model_stages, shape.microbatches
    kind, model_stage, mb = (a.reshape(-1)
                             for a in np.meshgrid(np.arange(K), np.arange(S), np.arange(m), indexing="ij"))
    klass = np.array([1, 0, 0 if hint == "bf" or not shape.split else 2])[kind]
    order = np.lexsort((kind, model_stage // shape.stages, mb, klass))  # last key sorts first
    ranks = np.empty(shape.num_tasks, dtype=np.int64)
    ranks[order] = np.arange(shape.num_tasks)
    return ranks.tolist()


@functools.lru_cache(maxsize=32)
def rank_keys(hint: str, shape: PipelineShape, order: tuple[int, ...] | None = None) -> list[int]:
    """Heap keys ``rank * num_tasks + task`` of a hint: one int compares rank and breaks ties by task id. With
    an admission ``order`` (see :mod:`~jaxdbg.pipeline.admission`) the hint ranks microbatches in that order."""
    n = shape.num_tasks
    ranks = hint_ranks(hint, shape)
    if order is not None:
        ranks = reorder_ranks(ranks, shape, order)
    return [rank * n + task for task, rank in enumerate(ranks)]


@functools.lru_cache(maxsize=32)
def hint_orders(hint: str, shape: PipelineShape, order: tuple[int, ...] | None = None) -> tuple[list[int], ...]:
    """Per worker, its tasks best-ranked first under a hint (read-only, shared by every run)."""
    by_rank = np.argsort(np.asarray(rank_keys(hint, shape, order)), kind="stable")
    worker = np.asarray(shape.graph().worker)[by_rank]
    return tuple(by_rank[worker == w].tolist() for w in range(shape.stages))


def expected_durations(shape: PipelineShape, costs: Costs) -> list[float]:
    """Seconds of every task without variability (what a runtime expects when it knows nothing more)."""
    return realise(parse_variability("none"), shape, costs, seed=0).task.tolist()


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
    cap_multiple: float = 1.0, costs: Costs | None = None, lookahead: bool = True,
    known: np.ndarray | None = None, order: tuple[int, ...] | None = None,
) -> list:
    """One policy object per worker: ``fixed`` runs ``schedule``; ``ready`` ranks by ``hint`` under a cap.

    With ``lookahead``, ``ready`` keeps the next task of ``schedule`` (without one, of the hint's own order)
    on time. It expects each task to take its ``known`` seconds (what the runtime knows of each microbatch
    before running it; without them, ``costs`` without variability) until measurements rescale them
    (without either, estimates start from the first measurements). An admission ``order`` (see
    :mod:`~jaxdbg.pipeline.admission`) takes the microbatches in that order: the schedule's ``i``-th
    microbatch is ``order[i]``, for ``fixed`` and for ``ready``'s plan and hint alike.
    """
    if order is not None and schedule is not None:
        schedule = reorder_schedule(schedule, order)
    if policy == "fixed":
        if schedule is None:
            raise UsageError("the fixed policy needs a schedule")
        ready = bytearray(shape.num_tasks)
        return [FixedOrder(worker_order, ready, shape) for worker_order in schedule.orders]
    if policy == "ready":
        keys = rank_keys(hint or "1f1b", shape, order)
        admits = shape.graph().admits
        # The plan is the schedule the run is compared with; without one, the hint's own order.
        plans = ([list(o) for o in schedule.orders] if schedule is not None
                 else hint_orders(hint or "1f1b", shape, order))
        peaks = static_peak_inflight(schedule) if schedule is not None else default_caps(shape)
        prior = [float(x) for x in known] if known is not None else (
            expected_durations(shape, costs) if costs is not None else None)
        expected = (prior, costs.comm_s if costs is not None else 0.0) if prior is not None else None
        return [
            ReadyFirst(keys, cap, admits, plans[w], cap > peaks[w], lookahead, expected, cap >= peaks[w])
            for w, cap in enumerate(memory_caps(shape, cap_multiple))
        ]
    raise UsageError(f"--policy '{policy}': unknown policy; use one of {', '.join(POLICIES)}")


def memory_caps(shape: PipelineShape, multiple: float) -> list[int]:
    """Per-worker caps in microbatches: ``multiple`` times 1F1B's, at least one, at most all microbatches."""
    if multiple <= 0:
        raise UsageError(f"--memory-cap {multiple}: use a positive multiple of 1F1B's memory, e.g. 1,2,4")
    return [max(1, min(shape.microbatches, round(base * multiple))) for base in default_caps(shape)]
