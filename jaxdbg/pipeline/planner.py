"""``--hint auto``: pick a readiness-first policy before the run, by dry runs on what the runtime knows.

A runtime knows before a step what each microbatch will roughly cost (its modality, its sequences' lengths,
the stages' partition: :meth:`~jaxdbg.pipeline.variability.Durations.known`), not the noise around it. The
planner simulates every candidate on those expected durations, at the run's memory cap and communication
model, and keeps the fastest:

- the hint (:data:`~jaxdbg.pipeline.policies.HINTS`): the schedule's own order (1F1B's family: ZB-H1 with a
  split backward), backward first (``bf``), input gradients first with weight gradients deferred (``bfw``,
  the zero-bubble idea: W fills the bubbles), or forwards first (``gpipe``, which at the schedule's own memory
  runs forwards as far as the cap lets it);
- the admission order (:mod:`~jaxdbg.pipeline.admission`): the data order, or, when microbatches differ in
  expected cost, grouped by cost (light first and last, heavy in the middle), light first or heavy first.

Each candidate runs the same readiness-first executor (look-ahead on the plan's next task, memory-aware
admission under the cap). The schedule's own hint in the data order is the default: another candidate is
picked only if its dry run is at least :data:`MARGIN` faster, so that noise the dry run cannot see does not
turn a gain on paper into a loss. :class:`Pick` records every candidate's dry run, which is the report's
answer to "why this policy".

Example:
    >>> from jaxdbg.pipeline.schedules import build_schedule, shape_for
    >>> from jaxdbg.pipeline.variability import Costs, parse_variability, realise
    >>> shape = shape_for("1f1b", 4, 8, 1)
    >>> d = realise(parse_variability("multimodal:heavy=0.5,factor=3"), shape, Costs(), seed=1)
    >>> pick = choose(shape, build_schedule("1f1b", shape), 1.0, d.known(), Costs(), "async")
    >>> pick.admission != "data", pick.expected_s < pick.fixed_s
    (True, True)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jaxdbg.pipeline.admission import ORDERS, admission_order, costs_differ, microbatch_costs
from jaxdbg.pipeline.lookahead import remembered
from jaxdbg.pipeline.policies import HINTS, make_policies
from jaxdbg.pipeline.schedules import Schedule
from jaxdbg.pipeline.simulate import simulate
from jaxdbg.pipeline.tasks import PipelineShape
from jaxdbg.pipeline.variability import Costs, Durations

MARGIN = 0.01  # share of the default's dry-run makespan another candidate must save to be picked
DEFAULT = ("1f1b", "data")  # the schedule's own order: the candidate that needs no reason
_PICKS: dict = {}


@dataclass(frozen=True)
class Pick:
    """What ``auto`` runs and why: the chosen hint and admission order, and every candidate's dry run."""

    hint: str
    admission: str
    order: tuple[int, ...]
    expected_s: float  # the pick's makespan in the dry run
    fixed_s: float  # the fixed schedule's (data order) in the same dry run
    candidates: tuple[tuple[str, str, float], ...]  # (hint, admission, dry-run makespan), fastest first

    def why(self) -> str:
        """One line: what was picked, by how much it beat the fixed order and the runner-up in the dry run."""
        default = {(h, a): s for h, a, s in self.candidates}[DEFAULT]
        line = (f"{self.hint} in {self.admission} order: {self.expected_s * 1e3:.1f} ms in a dry run on the expected "
                f"durations, fixed order {self.fixed_s * 1e3:.1f} ms")
        if (self.hint, self.admission) != DEFAULT:
            return line + f", 1f1b in data order {default * 1e3:.1f} ms"
        runner = next(((h, a, s) for h, a, s in self.candidates if (h, a) != DEFAULT), None)
        if runner is None:
            return line
        return line + (f"; kept: the best other ({runner[0]} in {runner[1]} order, {runner[2] * 1e3:.1f} ms) "
                       f"saves less than {MARGIN:.0%}")


def expected_run_durations(shape: PipelineShape, known: np.ndarray, costs: Costs) -> Durations:
    """The durations a dry run assumes: every task as known, every message its base delay."""
    comm = np.where(np.asarray(shape.graph().remote) >= 0, costs.comm_s, 0.0)
    known = np.asarray(known, dtype=float)
    return Durations(shape, known, comm, np.zeros(shape.microbatches, dtype=bool), known)


def choose(shape: PipelineShape, schedule: Schedule, cap: float, known: np.ndarray, costs: Costs, comm: str,
           lookahead: bool = True) -> Pick:
    """The fastest candidate in dry runs on ``known`` (see the module docstring); kept per configuration."""
    known = np.asarray(known, dtype=float)
    key = (shape, schedule.name, cap, known.tobytes(), costs, comm, lookahead)
    return remembered(_PICKS, key, lambda: _choose(shape, schedule, cap, known, costs, comm, lookahead))


def _choose(shape: PipelineShape, schedule: Schedule, cap: float, known: np.ndarray, costs: Costs, comm: str,
            lookahead: bool) -> Pick:
    durations = expected_run_durations(shape, known, costs)
    per_microbatch = microbatch_costs(shape, known)
    names = ORDERS if costs_differ(per_microbatch) else ("data",)
    orders = {name: admission_order(name, per_microbatch) for name in names}
    fixed = float(simulate(shape, make_policies("fixed", shape, schedule), durations, comm).end.max())
    tried = []
    for name, order in orders.items():
        for hint in HINTS:
            policies = make_policies("ready", shape, schedule, hint, cap, costs, lookahead, known=known, order=order)
            tried.append((hint, name, float(simulate(shape, policies, durations, comm).end.max())))
    default = next(s for h, a, s in tried if (h, a) == DEFAULT)
    best = min(tried, key=lambda c: c[2])  # the first of equals: the data order, then HINTS' order
    if best[2] > default * (1 - MARGIN):
        best = (*DEFAULT, default)
    ranked = tuple(sorted(tried, key=lambda c: c[2]))
    return Pick(best[0], best[1], orders[best[1]], best[2], fixed, ranked)
