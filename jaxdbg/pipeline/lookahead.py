"""Look-ahead for readiness-first arbitration: leave the hint order only for work that fits in the gap.

A readiness-first stage whose *next task* (the best-ranked task of its hint order it has not started) is
not ready may start a lower-ranked ready task instead. Started blindly, that task can still be running
when the next task's input arrives and then delays it: ZB-H1's weight gradients pushed in front of an
input gradient on the critical path, or, with blocking sends, a stage busy with out-of-order work while a
neighbour waits to hand it a message. Without variability the hint order is often already the best one,
and each such delay makes readiness-first slower than the fixed order.

:class:`LookAhead` estimates when the next task can start and lets a stage take an out-of-order task only
if it is expected to be done by then (with blocking sends: done, its own send paired, and no neighbour's
send left waiting). Expected durations are the configured costs (the durations without variability), each
replaced by the running mean of the durations measured so far for that kind of task on that model stage;
message delays likewise, per receiving stage. Where a runtime knows more of single microbatches before it
runs them (their modality, their sequences' lengths: :meth:`~jaxdbg.pipeline.variability.Durations.known`),
a task's expectation is its own known duration scaled by the ratio measured so far on its (kind, model
stage): the known costs keep the spread between microbatches, the measurements correct the level. The
simulator and the real executor feed it the same way.
With blocking sends and the plan's own hint, a stage also holds for a neighbour whose send the plan's
deadlines (:meth:`LookAhead.plan_deadlines`, computed when first needed) call critical while its own task
has slack, as long as every duration and delay so far has been as expected (``on_plan``).

These estimates are local: each out-of-order choice assumes the rest of the run keeps to its estimates,
and with blocking sends several choices that each fit can still add up to a later end (forwards run ahead,
then a neighbour's send meets a busy stage). So where the hint is the plan's own order, the run decides
once, the first time keeping the plan and leaving it would differ while still on plan, whether leaving it
pays: :meth:`LookAhead.keeps_plan` asks the Arbiter for a dry run of the same policies on the expected
durations and compares it with the plan's own run (:func:`jaxdbg.pipeline.arbiter.plan_run`). If the plan
is faster, stages keep the plan's order (and post only the receives it would) for as long as the run stays
on plan: without variability that is the fixed order's timeline exactly. The decision uses only what the run
knows before it starts; a run whose first durations already differ from expectations never pays for the dry run.

An estimate is made only from work that is under way: ended tasks, messages in flight, running tasks,
and tasks (up to ``DEPTH`` hops back) that are ready or becoming ready on a stage that is computing. When
the next task waits on anything else, including this stage's own work, the gap is unknown and the stage
runs its best-ranked ready task. So a stage only holds back while another stage computes or a message
travels: every hold ends, and holds cannot deadlock. A running task past its expected end is expected to
overrun as much again (a straggler that ran 1.5x its mean is taken for a 2x one).

Example:
    >>> from jaxdbg.pipeline.tasks import PipelineShape
    >>> look = LookAhead(PipelineShape(2, 2), "async", prior=[1.0] * 8, prior_comm=0.0)
    >>> look.expect(0), look.free_at(0, now=5.0)   # a forward of model stage 0 takes 1 s
    (1.0, 6.0)
"""

from __future__ import annotations

import functools
import itertools
import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from jaxdbg.pipeline.tasks import PipelineShape

INF = math.inf
DEPTH = 2  # hops back along the next task's inputs that an estimate may follow
RELIABLE = 0.1  # root-mean-square relative error of a stage's expected durations to trust its timing
_ON_PLAN = 1e-6  # relative: a duration or delay this close to its expectation keeps the run on the plan
_TOLERANCE = 1e-9  # relative: a task that ends exactly when the next one's input arrives fits


class LookAhead:
    """Expected durations and the progress of one run, and the fit test of an out-of-order task.

    ``prior`` holds the expected seconds of every task before the run (None: unknown until measured; then
    a task is expected to take its (kind, model stage) slot's mean), ``prior_comm`` those of a message.
    Measurements rescale each slot (``scale``: measured over expected so far). The :class:`Arbiter` keeps
    ``began``, ``ended``, ``running`` and ``arrived`` current through :meth:`started`, :meth:`ended_at`
    and :meth:`delivered`; each write touches only the acting stage's slots, so stage threads need no lock.
    """

    def __init__(self, shape: PipelineShape, comm: str, prior: list[float] | None = None, prior_comm: float = 0.0):
        graph = shape.graph()
        n, p = shape.num_tasks, shape.stages
        self.shape = shape
        self.sync = comm == "sync"
        self.m = shape.microbatches
        self.worker = graph.worker
        self.remote = graph.remote
        self.pred_a, self.pred_b = _predecessors(shape)
        slots = shape.kinds * shape.model_stages
        self.known = [float(x) for x in prior] if prior is not None else [1.0] * n
        self.scale = [1.0 if prior is not None else INF] * slots  # measured over known, per slot
        self.prior = tuple(prior) if prior is not None else None  # the plan's timing: see expected_durations
        self.prior_comm = prior_comm
        self.total = [0.0] * slots  # seconds measured, and known seconds of the same tasks, per slot
        self.known_total = [0.0] * slots
        self.miss_total = [0.0] * p  # squared relative error of the duration expected for each ended task
        self.miss_count = [0] * p
        self.comm_mean = [prior_comm] * p
        self.comm_total = [0.0] * p
        self.comm_count = [0] * p
        self.began = [-1.0] * (n + 1)  # one more: the never-started sentinel that ends each plan
        self.ended = [-1.0] * n
        self.arrived = bytearray(n)
        self.running = [-1] * p
        # Neighbours whose messages this stage receives (a pipeline sends only to the next or previous stage).
        self.neighbours = [sorted({(w - 1) % p, (w + 1) % p} - {w}) for w in range(p)]
        self.wake = [INF] * p  # when a holding stage should look again (estimates move as time passes)
        self.start_by: list[float] | None = None  # with blocking sends and a plan: see plan_deadlines
        self.finish_by: list[float] | None = None
        self.on_plan = True  # every duration and delay so far as expected: the plan's deadlines still hold
        self.plans: list[list[int]] | None = None  # per worker, the plan the hint ranks in order (see follow)
        self.keep_plan: bool | None = None  # on plan, run the plan's order (None: not decided yet)
        self._judge: Callable[[], bool] | None = None
        self._plan_run: Callable[..., Any] | None = None  # (plans, durations, comm) -> the plan's own run
        self._lock = threading.RLock()  # lazy work may be asked for by several stage threads at once

    # --- progress, reported by the Arbiter ----------------------------------------------------------

    def started(self, worker: int, task: int, now: float) -> None:
        self.began[task] = now
        self.running[worker] = task

    def ended_at(self, worker: int, task: int, now: float) -> None:
        self.ended[task] = now
        self.running[worker] = -1
        slot = task // self.m
        took, expected = now - self.began[task], self.expect(task)
        if 0 < expected < INF:
            if abs(took - expected) > _ON_PLAN * expected:
                self.on_plan = False
            self.miss_total[worker] += (took / expected - 1.0) ** 2
            self.miss_count[worker] += 1
        self.total[slot] += took
        self.known_total[slot] += self.known[task]
        if self.known_total[slot] > 0:
            self.scale[slot] = self.total[slot] / self.known_total[slot]

    def delivered(self, task: int, delay: float | None) -> None:
        """The message ``task`` waited for arrived, ``delay`` seconds after it was sent."""
        self.arrived[task] = 1
        if delay is not None:
            w = self.worker[task]
            if abs(delay - self.comm_mean[w]) > _ON_PLAN * max(self.comm_mean[w], 1e-9):
                self.on_plan = False
            self.comm_total[w] += delay
            self.comm_count[w] += 1
            self.comm_mean[w] = self.comm_total[w] / self.comm_count[w]

    # --- estimates ----------------------------------------------------------------------------------

    def expect(self, task: int) -> float:
        """Expected seconds of ``task``."""
        return self.known[task] * self.scale[task // self.m]

    def end_of_running(self, task: int, now: float) -> float:
        end = self.began[task] + self.expect(task)
        return end if end >= now else 2 * now - end  # overrunning: as much again

    def busy_until(self, worker: int, now: float) -> float:
        task = self.running[worker]
        return now if task < 0 else self.end_of_running(task, now)

    def output_at(self, task: int, now: float, depth: int) -> float:
        """When ``task`` is expected to end (its output ready to send); INF if not grounded in running work."""
        ended = self.ended[task]
        if ended >= 0:
            return ended
        if self.began[task] >= 0:
            return self.end_of_running(task, now)
        w = self.worker[task]
        if depth == 0 or self.running[w] < 0:
            return INF
        ready = self.inputs_at(task, now, depth - 1)
        if ready == INF:
            return INF
        return max(ready, self.busy_until(w, now)) + self.expect(task)

    def inputs_at(self, task: int, now: float, depth: int, arrival: bool = True) -> float:
        """When every input of ``task`` is expected on its stage; with ``arrival=False`` a remote input counts
        when its sender ends (the moment a blocking send needs the receiver free). INF if not grounded."""
        ready = now
        w = self.worker[task]
        for pred in (self.pred_a[task], self.pred_b[task]):
            if pred < 0:
                continue
            remote = self.worker[pred] != w
            if remote and self.arrived[task]:
                continue
            at = self.output_at(pred, now, depth)
            if at == INF:
                return INF
            if remote and (arrival or self.ended[pred] >= 0):
                at += self.comm_mean[w]  # a message already paired travels whatever the receiver does
            if at > ready:
                ready = at
        return ready

    def free_at(self, task: int, now: float) -> float:
        """When this stage is expected to be free again if it starts ``task`` now (incl. a blocking send)."""
        end = now + self.expect(task)
        if self.sync:
            receiver_task = self.remote[task]
            if receiver_task >= 0:
                receiver = self.worker[receiver_task]
                end = max(end, self.busy_until(receiver, now)) + self.comm_mean[receiver]
        return end

    def gap_end(self, worker: int, next_task: int, now: float) -> float:
        """Until when ``worker`` may compute without delaying ``next_task`` (or, with blocking sends, a
        neighbour's send to it); INF when that is unknown."""
        end = self.inputs_at(next_task, now, DEPTH, arrival=not self.sync)
        if self.sync and end != INF:
            for x in self.neighbours[worker]:
                sending = self.running[x]
                if sending >= 0 and self.remote[sending] >= 0 and self.worker[self.remote[sending]] == worker:
                    end = min(end, self.end_of_running(sending, now))
        return end

    def sender_due(self, worker: int, now: float, task: int) -> float:
        """With blocking sends: when a neighbour's send to ``worker`` is due, if starting ``task`` now would
        keep that neighbour waiting longer than ``worker`` would idle by receiving first; else -1. Only a
        neighbour whose durations have matched expectations (``RELIABLE``) is waited for: holding on a
        noisy estimate idles the stage for nothing."""
        if not self.sync:
            return -1.0
        end = now + self.expect(task)
        for x in self.neighbours[worker]:
            sending = self.running[x]
            if sending >= 0 and self.remote[sending] >= 0 and self.worker[self.remote[sending]] == worker:
                if self.miss_total[x] > RELIABLE * RELIABLE * self.miss_count[x]:
                    continue
                due = self.end_of_running(sending, now)
                if now < due < end and (due - now < end - due
                                        or self._sender_critical(worker, task, sending, due, end)):
                    self.wake[worker] = due
                    return due
        return -1.0

    def _sender_critical(self, worker: int, task: int, sending: int, due: float, end: float) -> bool:
        """Whether running ``task`` to ``end`` would make the neighbour's ``sending`` pair too late for the
        plan (its latest finish), while receiving first still starts ``task`` in time for the plan."""
        finish_by = self.deadlines() if self.on_plan else None
        if finish_by is None or self.start_by is None:  # start_by is set with finish_by
            return False
        slack = _TOLERANCE * max(abs(end), 1.0)
        late = end > finish_by[sending] + slack
        return late and due + self.comm_mean[worker] <= self.start_by[task] + slack

    def follow(self, plans: list[list[int]], judge: Callable[[], bool] | None, plan_run: Callable[..., Any]) -> None:
        """The stages' hint ranks ``plans`` in order. ``judge`` says, from a dry run on the expected
        durations, whether to keep to the plan's order while the run is on plan (None: never decided).
        ``plan_run(plans, durations, comm)`` simulates the plan in fixed order (None if it deadlocks)."""
        self.plans, self._judge, self._plan_run = plans, judge, plan_run

    def keeps_plan(self) -> bool:
        """Whether, while every duration so far is as expected, stages keep the plan's order (decided once,
        when first asked: a run that is off plan by then never pays for the dry runs)."""
        if self.keep_plan is None:
            with self._lock:
                if self.keep_plan is None:
                    self.keep_plan = bool(self._judge()) if self._judge is not None else False
        return self.keep_plan

    def deadlines(self) -> list[float] | None:
        """The plan's latest finish per task with blocking sends (computed when first asked), or None."""
        if self.finish_by is None and self.sync and self.plans is not None:
            with self._lock:
                if self.finish_by is None:
                    self.plan_deadlines(self.plans)
                    self.plans = self.plans if self.finish_by is not None else None  # none to compute: ask no more
        return self.finish_by

    def expected_durations(self):
        """Every task's and message's duration as expected before the run (a :class:`Durations`), or None.

        The priors, not the running means: while the run is on plan they agree, and the means' rounding
        would split the plan's simultaneous events."""
        from jaxdbg.pipeline.variability import Durations

        if self.prior is None:
            return None
        shape, m = self.shape, self.m
        remote = np.asarray(shape.graph().remote)
        comm = np.where(remote >= 0, self.prior_comm, 0.0)
        known = np.asarray(self.prior)
        return Durations(shape, known, comm, np.zeros(m, dtype=bool), known)

    def plan_deadlines(self, plans: list[list[int]]) -> None:
        """Latest start and finish of every task that keeps the plan's makespan, with blocking sends.

        The plans run in fixed order on the expected durations (the simulator, on the realised durations
        of "no variability"); a backward pass over the dependencies and each stage's order, counting a
        blocking send's transfer before the sender's next task, gives each task its latest times. A stage
        then holds for a neighbour's send when its own work has slack and the neighbour's has none."""
        durations = self.expected_durations()
        if durations is None:
            return
        key = (self.shape, self.prior, self.prior_comm, tuple(map(tuple, plans)))
        found = remembered(_DEADLINES, key, lambda: self._latest_times(plans, durations))
        if found is not None:
            self.start_by, self.finish_by = found

    def _latest_times(self, plans: list[list[int]], durations) -> tuple[list[float], list[float]] | None:
        """``(start_by, finish_by)`` for :meth:`plan_deadlines`; None for a plan that cannot run in fixed
        order with blocking sends (no deadlines to keep)."""
        record = self._plan_run(plans, durations, "sync") if self._plan_run is not None else None
        if record is None:
            return None
        shape, n = self.shape, self.shape.num_tasks
        graph = shape.graph()
        took, comm = durations.task.tolist(), durations.comm.tolist()
        makespan = float(record.end.max())
        comm_in = [self.prior_comm] * n
        after = [-1] * n
        for plan in plans:
            for a, b in itertools.pairwise(plan):
                after[a] = b
        starts = [float(x) for x in record.start]
        start_by = [INF] * n

        def gap_after(t: int) -> float:
            # Between two tasks a stage may have to send (blocked for the transfer) and then receive the
            # next one's input (a transfer that starts only once it is free): as long as the plan took.
            nxt = after[t]
            transfers = comm[t] + (comm_in[nxt] if self.remote_input(nxt) else 0.0)
            return max(min(transfers, starts[nxt] - float(record.end[t])), 0.0)

        def send_bound(t: int) -> float:
            bound = start_by[graph.remote[t]] - comm[t]
            return min(bound, start_by[after[t]] - gap_after(t)) if after[t] >= 0 else bound

        for t in sorted(range(n), key=lambda t: (starts[t], record.end[t]), reverse=True):
            latest = makespan
            for nxt in (graph.local_a[t], graph.local_b[t]):
                if nxt >= 0:
                    latest = min(latest, start_by[nxt])
            if graph.remote[t] >= 0:
                latest = min(latest, send_bound(t))
            elif after[t] >= 0:
                latest = min(latest, start_by[after[t]] - gap_after(t))
            start_by[t] = latest - took[t]
        return start_by, [s + d for s, d in zip(start_by, took)]

    def remote_input(self, task: int) -> bool:
        """Whether an input of ``task`` comes from another stage (a message to receive)."""
        w = self.worker[task]
        return any(pred >= 0 and self.worker[pred] != w for pred in (self.pred_a[task], self.pred_b[task]))

    def choose(self, worker: int, now: float, next_task: int, best: int, other: int) -> int:
        """``best`` (or else ``other``, -1 if none) if it fits before ``next_task`` can start; else -1 and a
        time to look again. With an unknown gap, ``best``."""
        end = self.gap_end(worker, next_task, now)
        if end == INF:
            return best
        limit = end + _TOLERANCE * max(abs(end), 1.0)
        shortest = INF
        for task in (best, other):
            if task >= 0:
                free = self.free_at(task, now)
                if free <= limit:
                    return task
                shortest = min(shortest, free - now)
        # Look again once the gap could have grown enough (an input that overruns its estimate).
        self.wake[worker] = now + max(shortest - (end - now), 1e-3 * shortest) if shortest != INF else INF
        return -1


_CACHED = 16  # entries per remembered() cache (the paired runs of a benchmark share a plan's results)
_DEADLINES: dict = {}


def remembered(cache: dict, key: Any, compute: Callable[[], Any]) -> Any:
    """``compute()`` once per ``key`` in a small module-level ``cache``, emptied when full."""
    if key not in cache:
        if len(cache) >= _CACHED:
            cache.clear()
        cache[key] = compute()
    return cache[key]


@functools.lru_cache(maxsize=16)
def _predecessors(shape: PipelineShape) -> tuple[list[int], list[int]]:
    """Up to two prerequisites per task, inverted from the graph's successor lists (read-only, shared)."""
    graph, n = shape.graph(), shape.num_tasks
    pred_a, pred_b = [-1] * n, [-1] * n
    for task in range(n):
        for nxt in (graph.local_a[task], graph.local_b[task], graph.remote[task]):
            if nxt >= 0:
                if pred_a[nxt] < 0:
                    pred_a[nxt] = task
                else:
                    pred_b[nxt] = task
    return pred_a, pred_b
