"""The Arbiter: dependency counting and memory accounting around one policy per stage.

The discrete-event simulator (:mod:`jaxdbg.pipeline.simulate`) and the threaded multi-device executor
(:mod:`jaxdbg.pipeline.real`) both drive an :class:`Arbiter` and differ only in where time comes from. The
policies (:mod:`jaxdbg.pipeline.policies`) decide which ready task a stage runs. Where a readiness-first
run needs a dry run on the expected durations (whether leaving the plan pays, the plan's deadlines), the
Arbiter runs the simulator it is given: the simulator sits above this module, not below it.

Example:
    >>> from jaxdbg.pipeline.policies import make_policies
    >>> from jaxdbg.pipeline.simulate import simulate
    >>> from jaxdbg.pipeline.tasks import PipelineShape
    >>> shape = PipelineShape(stages=2, microbatches=4)
    >>> arbiter = Arbiter(shape, make_policies("ready", shape, hint="bf"), simulator=simulate)
    >>> arbiter.start()              # tasks without prerequisites become ready
    >>> shape.name(arbiter.pick(0))  # worker 0 admits microbatch 0
    '0F0'
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from jaxdbg._errors import JaxdbgError
from jaxdbg.pipeline.lookahead import LookAhead, remembered
from jaxdbg.pipeline.policies import FixedOrder
from jaxdbg.pipeline.tasks import PipelineShape
from jaxdbg.pipeline.variability import Durations

_JUDGED: dict = {}  # configuration -> whether to keep the plan's order while on plan (Arbiter)
_PLAN_RUNS: dict = {}  # the plan's own fixed-order runs (plan_run)
# Why a stage with nothing to run is waiting (see Arbiter.wait_reason).
WAIT_INPUT, WAIT_MEMORY = 0, 1


class PipelineDeadlock(JaxdbgError):
    """The stages' orders and the communication model left every stage waiting on another."""


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


Simulator = Callable[[PipelineShape, list, Durations, str], RunRecord]  # simulate(shape, policies, durations, comm)


class Arbiter:
    """Dependency counting and memory accounting around one policy per worker.

    The drivers call :meth:`start` once, then :meth:`pick` when a worker is free, :meth:`finish` when a
    task ends (it readies local successors and returns the remote one, or NO_TASK), and :meth:`satisfy`
    when a message arrives, each with the current time. Each call writes only the given worker's state
    (the look-ahead reads the others'), so one thread per worker may drive its own worker without locks.
    A worker whose policy holds back (NO_TASK with ready work) asks to be woken at :meth:`wake_at`.
    ``simulator`` (:func:`jaxdbg.pipeline.simulate.simulate`) runs the dry runs on the expected durations
    that the look-ahead's plan rules ask for.
    """

    def __init__(self, shape: PipelineShape, policies: list, comm: str = "async", *, simulator: Simulator):
        self.shape = shape
        self.simulator = simulator
        self.graph = graph = shape.graph()
        self.policies = policies
        self.missing = list(graph.prerequisites)
        guarded = [p for p in policies if getattr(p, "wants_lookahead", False)]
        expected = getattr(guarded[0], "expected", None) if guarded else None
        self.lookahead = LookAhead(shape, comm, *(expected or ())) if guarded else None
        self.comm = comm
        if self.lookahead is not None and len(guarded) == len(policies):
            plans = [p.plan[:-1] for p in policies]
            keys = policies[0].keys
            if all(keys[a] < keys[b] for plan in plans for a, b in itertools.pairwise(plan)):  # the plan's own hint
                keep = policies[0].keep_plan
                can_keep = all(p.fits_plan for p in policies)
                self.lookahead.keep_plan = keep if can_keep else False
                self.lookahead.follow(plans, self._plan_beats_leaving_it if keep is None and can_keep else None,
                                      self._plan_run)
        for worker, policy in enumerate(policies):
            policy.bind(worker, self.lookahead)
        self.inflight = [0] * shape.stages
        self.peak = [0] * shape.stages
        self.decisions = [0] * shape.stages
        self.decision_ns = [0] * shape.stages
        self.memory_wait = [0.0] * shape.stages
        self._waiting_since: list[float | None] = [None] * shape.stages
        self._wait_reason = [WAIT_INPUT] * shape.stages

    def _plan_beats_leaving_it(self) -> bool:
        """Whether the plan, run in its order on the expected durations, ends sooner than a dry run of these
        policies leaving it there (kept per configuration: paired runs without variability ask alike).

        Keeping the plan's order while on plan runs exactly the fixed order, so the plan's own run stands for
        it. The decision uses only what the run knows before it starts: the expected durations."""
        look = self.lookahead
        assert look is not None  # handed to the look-ahead as its judge: only exists with one
        durations = look.expected_durations()
        if durations is None:
            return False
        plans = [p.plan[:-1] for p in self.policies]
        key = (self.shape, self.comm, look.prior, look.prior_comm, tuple(map(tuple, plans)),
               tuple((p.cap, p.headroom) for p in self.policies), tuple(self.policies[0].keys))

        def judge() -> bool:
            planned = self._plan_run(plans, durations, self.comm)
            try:
                left = self.simulator(self.shape, [p.fresh(False) for p in self.policies], durations, self.comm)
            except PipelineDeadlock:
                left = None
            return planned is not None and (left is None or planned.end.max() < left.end.max() * (1 - 1e-9))

        return remembered(_JUDGED, key, judge)

    def _plan_run(self, plans: list[list[int]], durations: Durations, comm: str) -> RunRecord | None:
        return plan_run(self.shape, plans, durations, comm, self.simulator)

    def start(self) -> None:
        for task, count in enumerate(self.missing):
            if count == 0:
                self.policies[self.graph.worker[task]].push(task)

    def satisfy(self, task: int, delay: float | None = None) -> None:
        """The message ``task`` waited for arrived, ``delay`` seconds after it was sent."""
        if self.lookahead is not None:
            self.lookahead.delivered(task, delay)
        self._satisfy(task)

    def _satisfy(self, task: int) -> None:
        """One prerequisite of ``task`` is done (its message arrived, or a local task finished)."""
        self.missing[task] -= 1
        if self.missing[task] == 0:
            self.policies[self.graph.worker[task]].push(task)

    def pick(self, worker: int, now: float = 0.0) -> int:
        """The task ``worker`` starts at ``now``, or NO_TASK; the decision's cost is timed."""
        if self.lookahead is not None:
            self.lookahead.wake[worker] = math.inf  # a hold asks anew at each decision
        began = time.perf_counter_ns()
        task = self.policies[worker].pick(self.inflight[worker], now)
        self.decision_ns[worker] += time.perf_counter_ns() - began
        self.decisions[worker] += 1
        if task >= 0:
            if self.lookahead is not None:
                self.lookahead.started(worker, task, now)
            if self.graph.admits[task]:
                self.inflight[worker] += 1
                if self.inflight[worker] > self.peak[worker]:
                    self.peak[worker] = self.inflight[worker]
        return task

    def wake_at(self, worker: int) -> float:
        """When a worker that holds back should look again (inf: only when something arrives)."""
        return self.lookahead.wake[worker] if self.lookahead is not None else math.inf

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

    def finish(self, task: int, now: float = 0.0) -> int:
        """``task`` ended at ``now``: ready its local successors; returns the remote one (or NO_TASK)."""
        graph = self.graph
        worker = graph.worker[task]
        if self.lookahead is not None:
            self.lookahead.ended_at(worker, task, now)
        if graph.releases[task]:
            self.inflight[worker] -= 1
        for nxt in (graph.local_a[task], graph.local_b[task]):
            if nxt >= 0:
                self._satisfy(nxt)
        return graph.remote[task]



def plan_run(shape: PipelineShape, plans: list[list[int]], durations: Durations, comm: str,
             simulator: Simulator) -> RunRecord | None:
    """The plan run in fixed order on ``durations`` (None if it deadlocks), kept for reuse."""

    def run() -> RunRecord | None:
        ready = bytearray(shape.num_tasks)  # shared by the stages' policies, as in make_policies
        try:
            return simulator(shape, [FixedOrder(plan, ready, shape) for plan in plans], durations, comm)
        except PipelineDeadlock:
            return None

    key = (shape, comm, durations.task.tobytes(), durations.comm.tobytes(), tuple(map(tuple, plans)))
    return remembered(_PLAN_RUNS, key, run)
