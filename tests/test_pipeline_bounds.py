"""The memory-aware lower bound against exhaustive search: on small pipelines every combination of per-stage
orders that keeps the memory caps is run at its earliest times, and the least makespan is the optimum. The
bound must never exceed it, must reach it where HiGHS solves the program, and must know the cap (rise above
the memory-free bound where the cap is what costs time)."""

from __future__ import annotations

import pytest

from jaxdbg.pipeline.bounds import memory_lower_bound, slot_bound
from jaxdbg.pipeline.metrics import lower_bound
from jaxdbg.pipeline.policies import memory_caps
from jaxdbg.pipeline.schedules import shape_for
from jaxdbg.pipeline.variability import Costs, parse_variability, realise


def optimum(durations, caps) -> float:
    """Exhaustive search: every interleaving of the stages' next tasks that keeps the caps, each task at its
    earliest start (buffered messages). Interleavings that give the same per-stage orders are searched once;
    a branch stops when some stage's time so far plus its work left cannot beat the best found."""
    shape = durations.shape
    graph, n, p = shape.graph(), shape.num_tasks, shape.stages
    task, comm = durations.task.tolist(), durations.comm.tolist()
    preds = [[] for _ in range(n)]
    for t in range(n):
        for s in (graph.local_a[t], graph.local_b[t], graph.remote[t]):
            if s >= 0:
                preds[s].append(t)
    end, done, seen, left = [0.0] * n, [False] * n, set(), [0.0] * p
    for t in range(n):
        left[graph.worker[t]] += task[t]
    best = [float("inf")]

    def search(free, inflight, orders, count):
        if count == n:
            best[0] = min(best[0], max(free))
            return
        if orders in seen or max(f + r for f, r in zip(free, left)) >= best[0] - 1e-12:
            return
        seen.add(orders)
        for t in range(n):
            w = graph.worker[t]
            if done[t] or any(not done[u] for u in preds[t]) or (graph.admits[t] and inflight[w] >= caps[w]):
                continue
            start = max([free[w]] + [end[u] + (comm[u] if graph.worker[u] != w else 0.0) for u in preds[t]])
            done[t], end[t] = True, start + task[t]
            left[w] -= task[t]
            search((*free[:w], end[t], *free[w + 1:]),
                   (*inflight[:w], inflight[w] + graph.admits[t] - graph.releases[t], *inflight[w + 1:]),
                   (*orders[:w], (*orders[w], t), *orders[w + 1:]), count + 1)
            left[w] += task[t]
            done[t] = False

    search((0.0,) * p, (0,) * p, ((),) * p, 0)
    return best[0]


# (schedule, stages, microbatches, chunks, variability, seed, memory cap): caps below, at and above 1F1B's.
CASES = [
    ("1f1b", 2, 3, 1, "multimodal:heavy=0.5,factor=3", 0, 1.0),
    ("1f1b", 2, 3, 1, "multimodal:heavy=0.5,factor=3", 1, 2.0),
    ("1f1b", 2, 4, 1, "jitter:cv=0.5+comm:cv=1", 0, 0.5),
    ("1f1b", 2, 4, 1, "link:stage=0,factor=20", 1, 1.0),
    ("zb-h1", 2, 3, 1, "seqlen:mean=512,cv=0.8", 0, 1.0),
    ("zb-h1", 2, 3, 1, "link:stage=0,factor=20", 0, 1.0),
    ("interleaved", 2, 2, 2, "jitter:cv=0.5", 0, 1.0),
    ("1f1b", 3, 3, 1, "multimodal:heavy=0.5,factor=3", 1, 1.0),
]


@pytest.fixture(scope="module")
def solved():
    """Per case: the optimum, the memory-aware bound, the memory-free bound and the slot bound alone."""
    out = []
    for name, p, m, v, spec, seed, cap in CASES:
        shape = shape_for(name, p, m, v)
        durations = realise(parse_variability(spec, p), shape, Costs(), seed)
        caps = memory_caps(shape, cap)
        out.append((optimum(durations, caps), memory_lower_bound(durations, caps, time_limit=20.0),
                    lower_bound(durations), slot_bound(durations, caps)))
    return out


def test_the_bound_never_exceeds_the_optimum(solved):
    for case, (best, bound, free, slots) in zip(CASES, solved):
        assert bound.value <= best * (1 + 1e-9), case
        assert free <= best * (1 + 1e-9) and slots <= best * (1 + 1e-9), case


def test_the_bound_is_the_optimum_where_highs_solves_it(solved):
    for case, (best, bound, _free, _slots) in zip(CASES, solved):
        assert bound.method == "exact", case
        assert bound.value == pytest.approx(best, rel=1e-6), case


def test_the_bound_knows_the_memory_cap(solved):
    """Where the cap costs time, the memory-aware bound rises above the memory-free one: with one microbatch
    per stage (cap 0.5x of 1F1B's) the slot bound alone already reaches the optimum."""
    above = [case for case, (best, bound, free, _) in zip(CASES, solved) if bound.value > free * 1.01]
    assert len(above) >= 4, above
    best, _, free, slots = solved[2]  # caps [1, 1]: every stage runs each microbatch's round trip alone
    assert slots == pytest.approx(best, rel=1e-9) and best > 1.5 * free


def test_large_pipelines_get_the_combinatorial_bounds_only():
    shape = shape_for("1f1b", 8, 32, 1)
    durations = realise(parse_variability("multimodal:heavy=0.3,factor=3"), shape, Costs(), 0)
    bound = memory_lower_bound(durations, memory_caps(shape, 1.0))
    assert bound.method in ("memory-free", "slots") and bound.value >= lower_bound(durations)
