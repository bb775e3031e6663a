"""Where each stage's time went in one run, and how far the run is from the best any order could do.

Per stage: ``busy`` (computing), ``wait`` (between its first and last task with nothing it could run:
inputs not yet arrived, or a forward held back by the memory cap, reported apart as ``memory_wait``),
``blocked`` (inside a blocking send) and ``idle`` (before its first task and after its last: the fill
and drain of the pipeline). ``busy + wait + blocked + idle`` is the makespan.

The lower bound holds for any order and any memory budget: the longest microbatch's dependency chain
(its forwards, backwards and messages), and for each stage its earliest possible start, all of its work,
and the shortest way from its last backward to the end of the pipeline.

Example:
    >>> from jaxdbg.pipeline.tasks import PipelineShape
    >>> from jaxdbg.pipeline.variability import Costs, parse_variability, realise
    >>> d = realise(parse_variability("none"), PipelineShape(4, 8), Costs(1.0, 2.0, 0.0), seed=0)
    >>> lower_bound(d)   # stage 3 starts at 3 and works 24; its backwards need 3 more to reach stage 0
    33.0
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jaxdbg.pipeline.arbiter import RunRecord
from jaxdbg.pipeline.tasks import BACKWARD, FORWARD, WEIGHT
from jaxdbg.pipeline.variability import Durations


@dataclass(frozen=True)
class RunMetrics:
    makespan_s: float
    throughput_mb_s: float
    bubble_fraction: float
    stage_busy: list[float]
    stage_wait: list[float]
    stage_memory_wait: list[float]
    stage_blocked: list[float]
    stage_idle: list[float]
    peak_inflight: list[int]
    decisions: int
    decision_ns_mean: float


def measure(record: RunRecord) -> RunMetrics:
    """Makespan, throughput, bubble fraction and the per-stage split of time of one run."""
    shape = record.shape
    worker = np.asarray(shape.graph().worker)
    p = shape.stages
    begin = float(record.start.min())
    makespan = float(record.end.max()) - begin
    busy = np.bincount(worker, weights=record.end - record.start, minlength=p)
    first = np.full(p, np.inf)
    last = np.full(p, -np.inf)
    np.minimum.at(first, worker, record.start)
    np.maximum.at(last, worker, record.end)
    blocked = np.asarray(record.blocked_s)
    idle = (first - begin) + (begin + makespan - last)
    wait = np.maximum((last - first) - busy - blocked, 0.0)
    memory_wait = np.minimum(np.asarray(record.memory_wait_s), wait)
    bubble = 1.0 - float(busy.sum()) / (p * makespan) if makespan > 0 else 0.0
    return RunMetrics(
        makespan_s=makespan,
        throughput_mb_s=shape.microbatches / makespan if makespan > 0 else float("inf"),
        bubble_fraction=bubble,
        stage_busy=busy.tolist(),
        stage_wait=wait.tolist(),
        stage_memory_wait=memory_wait.tolist(),
        stage_blocked=blocked.tolist(),
        stage_idle=idle.tolist(),
        peak_inflight=list(record.peak_inflight),
        decisions=record.decisions,
        decision_ns_mean=record.decision_ns / record.decisions if record.decisions else 0.0,
    )


def occupancy(stage_busy: list[float], makespan_s: float) -> list[float]:
    """Busy fraction (0..1) of each stage over a run's makespan (``--csv``'s and the metrics' occupancy)."""
    return [busy / makespan_s if makespan_s > 0 else 0.0 for busy in stage_busy]


def lower_bound(durations: Durations) -> float:
    """A makespan no order can beat with these realised durations (see the module docstring)."""
    shape = durations.shape
    K, S, m, p = shape.kinds, shape.model_stages, shape.microbatches, shape.stages
    task = durations.task.reshape(K, S, m)
    comm = durations.comm.reshape(K, S, m)
    forward, backward = task[FORWARD], task[BACKWARD]
    send_forward, send_backward = comm[FORWARD], comm[BACKWARD]  # zero where no message is sent
    chain = forward.sum(0) + send_forward.sum(0) + backward.sum(0) + send_backward.sum(0)
    if shape.split:
        chain = chain + task[WEIGHT][0]
    # head[k, j]: the earliest F(k, j) can start; tail[k, j]: the least time from B(k, j)'s end to the end.
    head = np.cumsum(forward + send_forward, axis=0) - (forward + send_forward)
    tail = np.cumsum(backward + send_backward, axis=0) - backward
    work = np.bincount(np.arange(S) % p, weights=task.sum(axis=(0, 2)), minlength=p)
    stage_bound = head[:p].min(axis=1) + work + (0.0 if shape.split else tail[:p].min(axis=1))
    return float(max(chain.max(), stage_bound.max()))


def timeline_problems(
    record: RunRecord, durations: Durations, orders: tuple[tuple[int, ...], ...] | None = None,
    caps: list[int] | None = None, tolerance: float = 1e-9,
) -> list[str]:
    """What a run's timeline breaks (empty when nothing): a task shorter than its realised duration, a
    dependency or message delay not respected, two tasks at once on a stage, a fixed order not followed
    (``orders``), a memory cap exceeded (``caps``), or a peak in flight misreported.
    """
    shape = record.shape
    graph = shape.graph()
    start, end = record.start, record.end
    problems = [f"{shape.name(int(t))} ran shorter than drawn"
                for t in np.flatnonzero(end - start < durations.task - tolerance)]
    for task in range(shape.num_tasks):
        problems.extend(f"{shape.name(nxt)} started before {shape.name(task)} ended"
                        for nxt in (graph.local_a[task], graph.local_b[task])
                        if nxt >= 0 and start[nxt] < end[task] - tolerance)
        nxt = graph.remote[task]
        if nxt >= 0 and start[nxt] < end[task] + durations.comm[task] - tolerance:
            problems.append(f"{shape.name(nxt)} started before the message from {shape.name(task)} arrived")
    worker = np.asarray(graph.worker)
    for w in range(shape.stages):
        mine = np.flatnonzero(worker == w)
        ran = mine[np.argsort(start[mine], kind="stable")]
        if np.any(start[ran[1:]] < end[ran[:-1]] - tolerance):
            problems.append(f"stage {w} ran two tasks at once")
        if orders is not None and list(ran) != list(orders[w]):
            problems.append(f"stage {w} left its fixed order")
        changes = sorted([(end[t], -1) for t in mine if graph.releases[t]]
                         + [(start[t], 1) for t in mine if graph.admits[t]])
        peak = int(np.cumsum([delta for _, delta in changes]).max())
        if peak != record.peak_inflight[w]:
            problems.append(f"stage {w} reported {record.peak_inflight[w]} microbatches in flight at most, held {peak}")
        if caps is not None and peak > caps[w]:
            problems.append(f"stage {w} held {peak} microbatches over its cap of {caps[w]}")
    return problems
