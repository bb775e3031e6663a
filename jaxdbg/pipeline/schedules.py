"""Pipeline schedules as per-worker task orders: GPipe, 1F1B, interleaved 1F1B and ZB-H1.

A schedule is what a fixed-order runtime executes verbatim and what a readiness-first runtime uses as a
hint (see :mod:`jaxdbg.pipeline.policies`). :func:`validate` checks that every task appears exactly once,
on its own worker, and that the orders together respect every dependency (they can all run to the end).

Example:
    >>> from jaxdbg.pipeline.tasks import PipelineShape
    >>> sched = build_schedule("1f1b", PipelineShape(stages=2, microbatches=3))
    >>> sched.format().splitlines()[0]
    'stage 0: 0F0 0F1 0B0 0F2 0B1 0B2'
    >>> validate(sched)
    []
"""

from __future__ import annotations

import functools
from collections import deque
from dataclasses import dataclass
from typing import Literal, get_args

from jaxdbg._choices import choice
from jaxdbg._errors import UsageError
from jaxdbg.pipeline.tasks import BACKWARD, FORWARD, WEIGHT, PipelineShape

ScheduleName = Literal["gpipe", "1f1b", "interleaved", "zb-h1"]
SCHEDULES: tuple[ScheduleName, ...] = get_args(ScheduleName)


@dataclass(frozen=True)
class Schedule:
    """Per-worker task orders of one schedule."""

    name: ScheduleName
    shape: PipelineShape
    orders: tuple[tuple[int, ...], ...]

    def format(self, limit: int | None = None) -> str:
        """One line per worker in ``<stage><F|B|I|W><microbatch>`` notation (``limit`` tasks per line)."""
        lines = []
        for worker, order in enumerate(self.orders):
            names = [self.shape.name(t) for t in order[:limit]]
            more = " ..." if limit is not None and len(order) > limit else ""
            lines.append(f"stage {worker}: {' '.join(names)}{more}")
        return "\n".join(lines)


def shape_for(schedule: str, stages: int, microbatches: int, virtual: int) -> PipelineShape:
    """The task shape a named schedule runs on, with the user's options checked (UsageError if unfit)."""
    if schedule not in SCHEDULES:
        raise UsageError(f"--schedule '{schedule}': unknown schedule; use one of {', '.join(SCHEDULES)}")
    if stages < 1 or microbatches < 1 or virtual < 1:
        raise UsageError("--stages, --microbatches and --virtual-stages must be at least 1")
    if schedule == "interleaved":
        if virtual < 2:
            raise UsageError("--schedule interleaved needs --virtual-stages 2 or more (chunks per stage)")
        if microbatches % stages:
            raise UsageError(
                f"--schedule interleaved needs --microbatches a multiple of --stages "
                f"(got {microbatches} and {stages}), as in Megatron; change one of them"
            )
    elif virtual != 1:
        raise UsageError(
            f"--virtual-stages {virtual} only applies to --schedule interleaved; drop it or switch schedule")
    return PipelineShape(stages, microbatches, virtual, split=schedule == "zb-h1")


@functools.lru_cache(maxsize=32)
def build_schedule(name: str, shape: PipelineShape) -> Schedule:
    """The named schedule's orders for ``shape`` (any shape for gpipe/1f1b; see :func:`shape_for`)."""
    builders = {"gpipe": _gpipe, "1f1b": _one_f_one_b, "interleaved": _interleaved, "zb-h1": _zb_h1}
    known = choice(name, SCHEDULES)
    if known is None:
        raise UsageError(f"unknown schedule '{name}'; use one of {', '.join(SCHEDULES)}")
    orders = tuple(tuple(builders[known](shape, w)) for w in range(shape.stages))
    return Schedule(known, shape, orders)


def _backward(shape: PipelineShape, model_stage: int, mb: int) -> list[int]:
    """The backward of one microbatch: B, or I immediately followed by W when the backward is split."""
    tasks = [shape.task(BACKWARD, model_stage, mb)]
    if shape.split:
        tasks.append(shape.task(WEIGHT, model_stage, mb))
    return tasks


def _gpipe(shape: PipelineShape, w: int) -> list[int]:
    p, v, m = shape.stages, shape.virtual, shape.microbatches
    order = [shape.task(FORWARD, c * p + w, j) for c in range(v) for j in range(m)]
    for c in reversed(range(v)):
        for j in range(m):
            order += _backward(shape, c * p + w, j)
    return order


def _one_f_one_b(shape: PipelineShape, w: int) -> list[int]:
    """1F1B: ``p-w-1`` warm-up forwards, then one forward one backward, then the remaining backwards."""
    if shape.virtual > 1:
        return _interleaved(shape, w)
    p, m = shape.stages, shape.microbatches
    warm = min(p - w - 1, m)
    order = [shape.task(FORWARD, w, j) for j in range(warm)]
    for i in range(m - warm):
        order.append(shape.task(FORWARD, w, warm + i))
        order += _backward(shape, w, i)
    for i in range(m - warm, m):
        order += _backward(shape, w, i)
    return order


def _interleaved(shape: PipelineShape, w: int) -> list[int]:
    """Megatron's interleaved 1F1B: microbatches go round the chunks in groups of ``p``."""
    p, v, m = shape.stages, shape.virtual, shape.microbatches
    total = m * v

    def task(k: int, forward: bool) -> list[int]:
        chunk = (k % (p * v)) // p
        mb = (k // (p * v)) * p + k % p
        if forward:
            return [shape.task(FORWARD, chunk * p + w, mb)]
        return _backward(shape, (v - 1 - chunk) * p + w, mb)

    warm = total if m == p else min((p - w - 1) * 2 + (v - 1) * p, total)
    order = [t for k in range(warm) for t in task(k, True)]
    for i in range(total - warm):
        order += task(warm + i, True) + task(i, False)
    for i in range(total - warm, total):
        order += task(i, False)
    return order


def _zb_h1(shape: PipelineShape, w: int) -> list[int]:
    """ZB-H1: 1F1B's forwards and input gradients, with ``w`` weight gradients held back at stage ``w``.

    The later a stage, the longer its drain bubble (waiting for input gradients to reach stage 0), so
    stage ``w`` keeps up to ``w`` weight-gradient tasks pending and runs them at the end, while the input
    gradients race to the first stage. A pending W keeps its microbatch's layer inputs, so every stage
    holds up to ``p`` microbatches: 1F1B's peak (at its first stage), now on every stage.
    """
    if not shape.split or shape.virtual != 1:
        raise UsageError("zb-h1 needs a split backward (I and W) and one chunk per stage")
    p, m = shape.stages, shape.microbatches
    warm = min(p - w - 1, m)
    pending: deque[int] = deque()
    order = [shape.task(FORWARD, w, j) for j in range(warm)]

    def backward(i: int) -> None:
        order.append(shape.task(BACKWARD, w, i))
        pending.append(shape.task(WEIGHT, w, i))
        if len(pending) > w:
            order.append(pending.popleft())

    for i in range(m - warm):
        order.append(shape.task(FORWARD, w, warm + i))
        backward(i)
    for i in range(m - warm, m):
        backward(i)
    order.extend(pending)
    return order


def static_peak_inflight(schedule: Schedule) -> list[int]:
    """Per worker, the most microbatches in flight when its order runs as written (admit to release)."""
    graph = schedule.shape.graph()
    peaks = []
    for order in schedule.orders:
        inflight = peak = 0
        for t in order:
            inflight += graph.admits[t] - graph.releases[t]
            peak = max(peak, inflight)
        peaks.append(peak)
    return peaks


def validate(schedule: Schedule) -> list[str]:
    """Problems with a schedule (empty when valid): missing, repeated or misplaced tasks, or a deadlock."""
    shape = schedule.shape
    graph = shape.graph()
    problems = []
    seen = [0] * shape.num_tasks
    for w, order in enumerate(schedule.orders):
        for t in order:
            seen[t] += 1
            if graph.worker[t] != w:
                problems.append(f"{shape.name(t)} is on stage {w} but belongs to stage {graph.worker[t]}")
    for t, count in enumerate(seen):
        if count != 1:
            problems.append(f"{shape.name(t)} appears {count} times")
    if problems or len(schedule.orders) != shape.stages:
        return problems or [f"{len(schedule.orders)} stage orders for {shape.stages} stages"]
    missing = list(graph.prerequisites)
    position = [0] * shape.stages
    queue = deque(range(shape.stages))
    done = 0
    while queue:
        w = queue.popleft()
        order = schedule.orders[w]
        while position[w] < len(order) and missing[order[position[w]]] == 0:
            t = order[position[w]]
            position[w] += 1
            done += 1
            for nxt in (graph.local_a[t], graph.local_b[t], graph.remote[t]):
                if nxt >= 0:
                    missing[nxt] -= 1
                    if missing[nxt] == 0 and graph.worker[nxt] != w:
                        queue.append(graph.worker[nxt])
    if done < shape.num_tasks:
        stuck = [
            f"stage {w} waits at {shape.name(order[position[w]])}"
            for w, order in enumerate(schedule.orders) if position[w] < len(order)
        ]
        problems.append("the orders deadlock: " + "; ".join(stuck[:4]))
    return problems
