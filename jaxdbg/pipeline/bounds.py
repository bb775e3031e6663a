"""A lower bound on the makespan that knows the memory cap, beside the one that does not.

:func:`jaxdbg.pipeline.metrics.lower_bound` holds for any order and any memory, so at a tight cap (the
fixed schedule's own activation memory) no order may come near it and ``/LB`` says little. The bound here
takes the cap into account, by the strongest of:

- ``memory-free``: that bound (the longest microbatch chain; each stage's earliest start, work and drain);
- ``slots``: a stage with a cap of ``c`` microbatches holds each microbatch from its first forward there to
  the end of its last backward piece there (its *residency*, at least the microbatch's whole round trip
  through the later stages), and at most ``c`` residencies overlap. So the residencies fit on ``c`` tracks:
  parallel machines, each job released at the forward's earliest start and followed by the least time from
  the release to the end of the step. For any ``k <= c`` tracks in use, ``k * T`` covers the ``k`` earliest
  releases, every residency and the ``k`` shortest tails;
- ``exact`` / ``mip``: on small pipelines (at most :data:`EXACT_TASKS` tasks), the scheduling problem itself
  as a mixed-integer program solved by HiGHS (``scipy.optimize.milp``): a start time per task, a binary
  order for every pair of tasks on one stage (big-M disjunctions), and for each microbatch admitted on a
  stage, the microbatches still resident then counted against the cap. Solved to optimality it is the
  optimum itself (``exact``); stopped at :data:`EXACT_SECONDS` its dual bound still holds (``mip``). On
  larger pipelines the relaxation is too weak to beat the combinatorial bounds in useful time, so it is
  not tried.

Every bound assumes buffered messages: a run with blocking sends is feasible for them too, so the bounds
hold for both communication models. Durations are the realised ones (the bound asks what the best order
could have done with hindsight).

Example:
    >>> from jaxdbg.pipeline.policies import memory_caps
    >>> from jaxdbg.pipeline.tasks import PipelineShape
    >>> from jaxdbg.pipeline.variability import Costs, parse_variability, realise
    >>> shape = PipelineShape(2, 3)
    >>> d = realise(parse_variability("multimodal:heavy=0.5,factor=3"), shape, Costs(), seed=1)
    >>> bound = memory_lower_bound(d, memory_caps(shape, 1.0))
    >>> bound.method, round(bound.value * 1e3, 1), round(lower_bound(d) * 1e3, 1)
    ('exact', 42.4, 38.4)
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Literal

import numpy as np

from jaxdbg.pipeline.metrics import lower_bound
from jaxdbg.pipeline.tasks import BACKWARD, FORWARD, WEIGHT, PipelineShape
from jaxdbg.pipeline.variability import Durations

EXACT_TASKS = 32  # pipelines with at most this many tasks get the mixed-integer program
EXACT_SECONDS = 1.0  # HiGHS's time limit for one bound; its dual bound holds when it stops there
# Where every process of a job computes the same bound (real mode), HiGHS stops at a node count, which gives
# the same answer on a loaded machine as on an idle one; time then only as a safety.
EXACT_NODES = 2000
NODES_SAFETY_S = 60.0
_SAFETY = 1e-7  # relative: what is taken off a solver's bound for its feasibility tolerances


BoundMethod = Literal["memory-free", "slots", "mip", "exact"]


@dataclass(frozen=True)
class Bound:
    """A lower bound on the makespan at a memory cap, and which argument gave it."""

    value: float
    method: BoundMethod


def memory_lower_bound(durations: Durations, caps: list[int], exact_tasks: int = EXACT_TASKS,
                       time_limit: float = EXACT_SECONDS, upper: float | None = None,
                       node_limit: int | None = None) -> Bound:
    """The strongest bound of the module docstring for ``durations`` with ``caps`` microbatches per stage.

    ``upper`` is the makespan of a schedule known to keep the caps (it tightens the program; without it,
    one is simulated). ``node_limit``: stop HiGHS at that many nodes instead of at ``time_limit`` (the same
    bound whatever the machine's load; the time limit then becomes :data:`NODES_SAFETY_S`)."""
    best = Bound(lower_bound(durations), "memory-free")
    slots = slot_bound(durations, caps)
    if slots > best.value * (1 + 1e-12):
        best = Bound(slots, "slots")
    if durations.shape.num_tasks <= exact_tasks:
        solved = mip_bound(durations, caps, upper if upper is not None else _feasible_makespan(durations, caps),
                           time_limit, floor=best.value, node_limit=node_limit)
        if solved is not None and solved.method == "exact":  # the optimum (up to the solver's tolerance)
            best = Bound(max(solved.value, best.value), "exact")
        elif solved is not None and solved.value > best.value:
            best = solved
    return best


def slot_bound(durations: Durations, caps: list[int]) -> float:
    """The ``slots`` bound: residencies of at most ``caps[w]`` microbatches at a time on each stage ``w``."""
    shape = durations.shape
    release, residency, tail = _residencies(durations)
    best = 0.0
    for w in range(shape.stages):
        if caps[w] >= shape.microbatches:
            continue  # the cap never binds
        r, q, total = np.sort(release[w]), np.sort(tail[w]), float(residency[w].sum())
        tracks = range(1, caps[w] + 1)
        best = max(best, min((r[:k].sum() + total + q[:k].sum()) / k for k in tracks))
    return float(best)


def heads_and_tails(durations: Durations) -> tuple[np.ndarray, np.ndarray]:
    """Per task, its earliest start (longest chain of its predecessors and their messages) and the least time
    from its end to the end of the step (longest chain of its successors), on stages free to run anything."""
    shape, task, comm = durations.shape, durations.task, durations.comm
    graph, (order, preds, succs) = shape.graph(), _dag(shape)
    head, tail = np.zeros(shape.num_tasks), np.zeros(shape.num_tasks)
    for t in order:
        for u in preds[t]:
            head[t] = max(head[t], head[u] + task[u] + (comm[u] if graph.worker[u] != graph.worker[t] else 0.0))
    for t in reversed(order):
        for s in succs[t]:
            tail[t] = max(tail[t], task[s] + tail[s] + (comm[t] if graph.worker[s] != graph.worker[t] else 0.0))
    return head, tail


def _residencies(durations: Durations) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per worker (its first chunk, where it admits microbatches) and microbatch: the earliest start of the
    admitting forward, the least residency (that forward's start to the end of the task that frees the
    microbatch there: the round trip through the later model stages, with their messages) and the least time
    from that end to the end of the step. A microbatch's tasks form one chain, F through every model stage and
    B back, each W hanging off its B, so these are sums along it."""
    shape = durations.shape
    task = durations.task.reshape(shape.kinds, shape.model_stages, shape.microbatches)
    comm = durations.comm.reshape(shape.kinds, shape.model_stages, shape.microbatches)  # 0 where nothing is sent
    forward, backward = task[FORWARD] + comm[FORWARD], task[BACKWARD] + comm[BACKWARD]
    head = np.cumsum(forward, axis=0) - forward  # messages F(k) -> F(k+1) and B(k) -> B(k-1)
    forward_rest = np.cumsum(forward[::-1], axis=0)[::-1]  # F(k) .. F(S-1), each message on to the next
    backward_rest = np.cumsum(backward[::-1], axis=0)[::-1] - comm[BACKWARD]
    residency = forward_rest + backward_rest
    if shape.split:  # W frees the microbatch and nothing follows it
        residency, tail = residency + task[WEIGHT], np.zeros_like(residency)
    else:
        tail = np.cumsum(backward, axis=0) - task[BACKWARD]
    p = shape.stages
    return head[:p], residency[:p], tail[:p]


def _release_of(shape: PipelineShape, worker: int) -> dict[int, int]:
    """Microbatch -> the task that frees it on ``worker``."""
    graph = shape.graph()
    return {shape.decode(t)[2]: t for t in range(shape.num_tasks) if graph.releases[t] and graph.worker[t] == worker}


@functools.lru_cache(maxsize=16)
def _dag(shape: PipelineShape) -> tuple[list[int], list[list[int]], list[list[int]]]:
    """A topological order of the tasks, and each task's predecessors and successors."""
    graph, n = shape.graph(), shape.num_tasks
    succs = [[x for x in (graph.local_a[t], graph.local_b[t], graph.remote[t]) if x >= 0] for t in range(n)]
    preds: list[list[int]] = [[] for _ in range(n)]
    for t in range(n):
        for s in succs[t]:
            preds[s].append(t)
    missing = [len(p) for p in preds]
    ready = [t for t in range(n) if missing[t] == 0]
    order = []
    while ready:
        t = ready.pop()
        order.append(t)
        for s in succs[t]:
            missing[s] -= 1
            if missing[s] == 0:
                ready.append(s)
    return order, preds, succs


def _feasible_makespan(durations: Durations, caps: list[int]) -> float:
    """A makespan some schedule reaches within ``caps``: readiness-first in 1F1B's order under the caps."""
    from jaxdbg.pipeline.policies import ReadyFirst, rank_keys
    from jaxdbg.pipeline.simulate import simulate

    shape = durations.shape
    keys, admits = rank_keys("1f1b", shape), shape.graph().admits
    policies = [ReadyFirst(keys, cap, admits, lookahead=False) for cap in caps]
    return float(simulate(shape, policies, durations).end.max())


def mip_bound(durations: Durations, caps: list[int], upper: float, time_limit: float = EXACT_SECONDS,
              floor: float = 0.0, node_limit: int | None = None) -> Bound | None:
    """The mixed-integer program of the module docstring solved by HiGHS: ``exact`` when solved, else its dual
    bound (``mip``); None when HiGHS gives no bound in time. ``floor``: a bound known already (it starts the
    search there)."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    program = _Program(durations, caps, upper, floor)
    result = milp(program.objective(), constraints=LinearConstraint(*program.rows()),
                  integrality=program.integrality(), bounds=Bounds(*program.box()),
                  options={"time_limit": time_limit, "disp": False} if node_limit is None else
                  {"time_limit": max(time_limit, NODES_SAFETY_S), "node_limit": node_limit, "disp": False})
    dual = getattr(result, "mip_dual_bound", None)
    if dual is None or not np.isfinite(dual):
        return None
    value = float(dual) * program.unit * (1 - _SAFETY)
    return Bound(value, "exact" if result.status == 0 else "mip")


class _Program:
    """The scheduling problem as a mixed-integer program (variables: starts, makespan, pair orders, residents).

    Times are in units of the mean task duration, so that HiGHS's absolute tolerances stay small."""

    def __init__(self, durations: Durations, caps: list[int], upper: float, floor: float = 0.0):
        shape = durations.shape
        self.shape, self.graph, n = shape, shape.graph(), shape.num_tasks
        self.unit = float(durations.task.mean()) or 1.0
        self.task, self.comm = durations.task / self.unit, durations.comm / self.unit
        self.upper = upper / self.unit * (1 + 1e-9) + 1e-9
        self.floor = min(floor / self.unit * (1 - 1e-9), self.upper)
        order, self.preds, _ = _dag(shape)
        self.before_all = self._ancestors(order)
        head, tail = heads_and_tails(durations)
        self.head, self.tail = head / self.unit, tail / self.unit
        self.n, self.pairs = n, {}
        self.entries: list[tuple[dict[int, float], float, float]] = []
        workers = [[t for t in range(n) if self.graph.worker[t] == w] for w in range(shape.stages)]
        self.count = n + 1  # starts, then the makespan
        for tasks in workers:
            for a, b in itertools.combinations(tasks, 2):
                if a not in self.before_all[b] and b not in self.before_all[a]:
                    self.pairs[a, b] = self.count
                    self.count += 1
        self._timing()
        for w, tasks in enumerate(workers):
            self._memory(w, [t for t in tasks if self.graph.admits[t]], caps[w])

    def _ancestors(self, order: list[int]) -> list[set[int]]:
        before: list[set[int]] = [set() for _ in range(self.shape.num_tasks)]
        for t in order:
            for u in self.preds[t]:
                before[t] |= before[u] | {u}
        return before

    def _row(self, coefs: dict[int, float], low: float, high: float = np.inf) -> None:
        self.entries.append((coefs, low, high))

    def _gap(self, u: int, t: int) -> float:
        return self.task[u] + (self.comm[u] if self.graph.worker[u] != self.graph.worker[t] else 0.0)

    def _timing(self) -> None:
        for t in range(self.n):
            for u in self.preds[t]:
                self._row({t: 1.0, u: -1.0}, self._gap(u, t))
            self._row({self.n: 1.0, t: -1.0}, self.task[t] + self.tail[t])
        latest_end = self.upper - self.tail  # no task ends later in a schedule within the upper bound
        for (a, b), y in self.pairs.items():  # y = 1: a runs before b on their stage
            # Each big M as small as the heads and tails allow: the LP relaxation is that much tighter.
            big_a, big_b = max(latest_end[a] - self.head[b], 0.0), max(latest_end[b] - self.head[a], 0.0)
            self._row({b: 1.0, a: -1.0, y: -big_a}, self.task[a] - big_a)
            self._row({a: 1.0, b: -1.0, y: big_b}, self.task[b])

    def _before(self, a: int, b: int) -> tuple[dict[int, float], float]:
        """'a starts before b on their stage' as an affine expression of the pair variables (coefs, constant)."""
        if a in self.before_all[b]:
            return {}, 1.0
        if b in self.before_all[a]:
            return {}, 0.0
        if (a, b) in self.pairs:
            return {self.pairs[a, b]: 1.0}, 0.0
        return {self.pairs[b, a]: -1.0}, 1.0

    def _memory(self, worker: int, admits: list[int], cap: int) -> None:
        """When microbatch j is admitted, the others admitted before it and not yet released number < cap."""
        if cap >= len(admits):
            return
        releases = _release_of(self.shape, worker)
        for j in admits:
            resident: dict[int, float] = {}
            for i in admits:
                if i == j:
                    continue
                z = self.count
                self.count += 1
                earlier, k1 = self._before(i, j)
                unreleased, k2 = self._before(j, releases[self.shape.decode(i)[2]])
                coefs = {z: 1.0}
                for var, coef in itertools.chain(earlier.items(), unreleased.items()):
                    coefs[var] = coefs.get(var, 0.0) - coef
                self._row(coefs, k1 + k2 - 1)  # z >= [i before j] + [j before i's release] - 1
                resident[z] = 1.0
            self._row(resident, -np.inf, cap - 1)

    def objective(self) -> np.ndarray:
        c = np.zeros(self.count)
        c[self.n] = 1.0
        return c

    def rows(self):
        from scipy.sparse import coo_matrix

        r, col, val = [], [], []
        for i, (coefs, _low, _high) in enumerate(self.entries):
            for var, coef in coefs.items():
                r.append(i)
                col.append(var)
                val.append(coef)
        matrix = coo_matrix((val, (r, col)), shape=(len(self.entries), self.count)).tocsr()
        return matrix, [e[1] for e in self.entries], [e[2] for e in self.entries]

    def integrality(self) -> np.ndarray:
        kinds = np.ones(self.count)
        kinds[: self.n + 1] = 0
        return kinds

    def box(self) -> tuple[np.ndarray, np.ndarray]:
        low, high = np.zeros(self.count), np.ones(self.count)
        low[: self.n] = self.head
        high[: self.n] = self.upper - self.task - self.tail
        low[self.n] = max(float(np.max(self.head + self.task + self.tail)), self.floor)
        high[self.n] = self.upper
        return low, high
