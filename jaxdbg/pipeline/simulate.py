"""A discrete-event simulator of a pipeline, driving the same :class:`~jaxdbg.pipeline.arbiter.Arbiter`
as the real executor.

Two communication models:

- ``async``: buffered messages; a message arrives its delay after the task that sends it ends, and the
  sender carries on at once.
- ``sync``: paired blocking sends, as in Megatron. A sender blocks until the receiver has posted the
  matching receive, then for the transfer. A fixed-order stage posts the receive its next scheduled task
  needs (also while it is itself blocked sending, as Megatron batches a send with a receive); a
  readiness-first stage receives any message whenever it is not computing.

All events at one instant are applied before any stage decides, so ties do not depend on event order. A
stage whose policy holds back (the look-ahead of :mod:`jaxdbg.pipeline.lookahead`) is woken at the time it
asks for, as the real executor's worker wakes from its wait.
128 stages and 1024 microbatches (262,144 tasks) take a few seconds.

Example:
    >>> from jaxdbg.pipeline.tasks import PipelineShape
    >>> from jaxdbg.pipeline.schedules import build_schedule
    >>> from jaxdbg.pipeline.policies import make_policies
    >>> from jaxdbg.pipeline.variability import Costs, parse_variability, realise
    >>> shape = PipelineShape(4, 8)
    >>> costs = Costs(forward_s=1.0, backward_s=2.0, comm_s=0.0)
    >>> durations = realise(parse_variability("none"), shape, costs, seed=0)
    >>> record = simulate(shape, make_policies("fixed", shape, build_schedule("1f1b", shape)), durations)
    >>> float(record.end.max())   # (m + p - 1) * (t_f + t_b)
    33.0
"""

from __future__ import annotations

import heapq
from math import inf
from typing import Literal, get_args

import numpy as np

from jaxdbg.pipeline.arbiter import Arbiter, PipelineDeadlock, RunRecord
from jaxdbg.pipeline.tasks import PipelineShape
from jaxdbg.pipeline.variability import Durations

Comm = Literal["async", "sync"]
COMMS: tuple[Comm, ...] = get_args(Comm)


def simulate(shape: PipelineShape, policies: list, durations: Durations, comm: str = "async") -> RunRecord:
    """Run the policies against realised durations in virtual time and record the timeline."""
    if comm not in COMMS:
        raise ValueError(f"comm must be one of {COMMS}")
    sync = comm == "sync"
    arbiter = Arbiter(shape, policies, comm, simulator=simulate)  # its dry runs are simulations too
    graph = arbiter.graph
    worker_of, n, p = graph.worker, shape.num_tasks, shape.stages
    duration, delay = durations.task.tolist(), durations.comm.tolist()
    start, end = [0.0] * n, [0.0] * n
    in_transit = [0.0] * n  # the delay of the message a task is waiting for, once sent
    busy, blocked = [False] * p, [False] * p
    blocked_since, blocked_total = [0.0] * p, [0.0] * p
    offers: list[dict[int, tuple[int, int]]] = [{} for _ in range(p)]  # receiver -> {task: (sender, sent task)}
    offered: set[int] = set()
    events: list[tuple[float, int, int]] = []
    seq = 0
    finished = 0
    pick, finish, satisfy = arbiter.pick, arbiter.finish, arbiter.satisfy
    push, pop = heapq.heappush, heapq.heappop

    def try_start(w: int, now: float) -> None:
        nonlocal seq
        task = pick(w, now)
        if task < 0:
            arbiter.idle(w, now)
            wake = arbiter.wake_at(w)
            if now < wake < inf:  # held back for the next task of its plan: look again then
                seq += 1
                push(events, (wake, seq, 3 * n + w))
            return
        arbiter.resume(w, now)
        busy[w] = True
        start[task] = now
        seq += 1
        push(events, (now + duration[task], seq, task))

    arbiter.start()
    for w in range(p):
        try_start(w, 0.0)
    while events:
        now = events[0][0]
        touched = []
        while events and events[0][0] == now:
            _, _, code = pop(events)
            if code < n:  # a task ended
                w = worker_of[code]
                busy[w] = False
                end[code] = now
                finished += 1
                receiver_task = finish(code, now)
                if receiver_task >= 0:
                    in_transit[receiver_task] = delay[code]
                    if sync:
                        blocked[w], blocked_since[w] = True, now
                        receiver = worker_of[receiver_task]
                        offers[receiver][receiver_task] = (w, code)
                        offered.add(receiver)
                    else:
                        seq += 1
                        push(events, (now + delay[code], seq, n + receiver_task))
                touched.append(w)
            elif code < 2 * n:  # a message arrived
                task = code - n
                satisfy(task, in_transit[task])
                touched.append(worker_of[task])
            elif code < 3 * n:  # a blocking send completed
                w = code - 2 * n
                blocked[w] = False
                blocked_total[w] += now - blocked_since[w]
                touched.append(w)
            else:  # a stage that held back looks again
                touched.append(code - 3 * n)
        if offered:  # a stage that is not computing takes the sends it has receives posted for, first
            for receiver in list(offered):
                if busy[receiver]:
                    continue
                for task in list(offers[receiver]):
                    if arbiter.wants(receiver, task):
                        sender, sent = offers[receiver].pop(task)
                        seq += 1
                        push(events, (now + delay[sent], seq, n + task))
                        seq += 1
                        push(events, (now + delay[sent], seq, 2 * n + sender))
                if not offers[receiver]:
                    offered.discard(receiver)
        for w in dict.fromkeys(touched):
            if not busy[w] and not blocked[w]:
                try_start(w, now)
    if finished < n:
        stuck = [f"stage {w}" + (" blocked sending" if blocked[w] else " waiting") for w in range(p) if not busy[w]]
        raise PipelineDeadlock(
            f"the run deadlocked with {n - finished} of {n} tasks left under --comm {comm} ({'; '.join(stuck[:4])}); "
            "this schedule cannot run with these orders and communication model"
        )
    return arbiter.record(np.asarray(start), np.asarray(end), blocked_total)
