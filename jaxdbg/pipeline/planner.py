"""``--hint auto``: pick a readiness-first policy before the run, by dry runs on what the runtime knows.

A runtime knows before a step what each microbatch will roughly cost (its modality, its sequences' lengths,
the stages' partition: :meth:`~jaxdbg.pipeline.variability.Durations.known`), and from the steps it has
profiled, how noisy things are; not this step's noise. The planner simulates every candidate on the expected
durations, at the run's memory cap and communication model:

- the hint (:data:`~jaxdbg.pipeline.policies.HINTS`): the schedule's own order (1F1B's family: ZB-H1 with a
  split backward), backward first (``bf``), input gradients first with weight gradients deferred (``bfw``,
  the zero-bubble idea: W fills the bubbles), forwards first (``gpipe``, which runs forwards as far as the
  cap lets it), or ``fixed``: the schedule's order kept strictly, readiness-first not used at all;
- the admission order (:mod:`~jaxdbg.pipeline.admission`): the data order, or, when microbatches differ in
  expected cost, grouped by cost (light first and last, heavy in the middle), light first or heavy first.

Each ``ready`` candidate runs the same executor (look-ahead on the plan's next task, memory-aware admission
under the cap). The fastest few on the expected durations, with the schedule as written and the schedule's
own hint, then run again on :data:`SAMPLES` draws of the noise (``samples``: other seeds of the same
variability, as past steps would have shown it); the pick is the best mean there. The schedule as written
(``fixed`` in the data order) is the default: another candidate is picked only if it is at least
:data:`MARGIN` faster, so that a gain on paper does not turn into a loss. :class:`Pick` records every
candidate's dry run, which is the report's answer to "why this policy".

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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from jaxdbg.pipeline.admission import ORDERS, Order, admission_order, costs_differ, microbatch_costs
from jaxdbg.pipeline.lookahead import remembered
from jaxdbg.pipeline.policies import HINTS, Hint, make_policies
from jaxdbg.pipeline.schedules import Schedule
from jaxdbg.pipeline.simulate import simulate
from jaxdbg.pipeline.tasks import PipelineShape
from jaxdbg.pipeline.variability import Costs, Durations

MARGIN = 0.01  # share of the schedule's own makespan another candidate must save to be picked
SAMPLES = 4  # draws of the noise the finalists are run on
FINALISTS = 3  # candidates, besides the schedule and its own hint, run on them
Candidate = Hint | Literal["fixed"]  # fixed: the schedule's own order
DEFAULT: tuple[Candidate, Order] = ("fixed", "data")  # the schedule as written: the candidate that needs no reason
OWN_HINT: tuple[Candidate, Order] = ("1f1b", "data")
CANDIDATE_HINTS: tuple[Candidate, ...] = (*HINTS, "fixed")
_PICKS: dict = {}


@dataclass(frozen=True)
class Pick:
    """What ``auto`` runs and why: the chosen hint (``fixed``: the schedule's order) and admission order, and
    every candidate's dry run on the expected durations."""

    hint: Candidate
    admission: Order
    order: tuple[int, ...]
    expected_s: float  # the pick's makespan in the dry run on the expected durations
    fixed_s: float  # the schedule's (data order) in the same dry run
    candidates: tuple[tuple[str, str, float], ...]  # (hint, admission, dry-run makespan), fastest first
    noisy: tuple[tuple[str, str, float], ...] = ()  # finalists' mean makespans over the noise samples

    def why(self) -> str:
        """One line: what was picked, and by how much it beat the schedule as written in the dry runs."""
        name = "the schedule's own order" if self.hint == "fixed" else f"ready/{self.hint}"
        line = (f"{name} in {self.admission} order: {self.expected_s * 1e3:.1f} ms in a dry run on the expected "
                f"durations, the schedule as written {self.fixed_s * 1e3:.1f} ms")
        if self.noisy:
            scores = {(h, a): s for h, a, s in self.noisy}
            mine, plan = scores[self.hint, self.admission], scores[DEFAULT]
            line += f"; over {SAMPLES} draws of the noise {mine * 1e3:.1f} ms vs {plan * 1e3:.1f} ms"
        if (self.hint, self.admission) == DEFAULT:
            ranked = self.noisy or self.candidates
            runner = next(((h, a, s) for h, a, s in ranked if (h, a) != DEFAULT), None)
            if runner is not None:
                line += (f"; kept: the best other (ready/{runner[0]} in {runner[1]} order, {runner[2] * 1e3:.1f} ms) "
                         f"saves less than {MARGIN:.0%}")
        return line


def expected_run_durations(shape: PipelineShape, known: np.ndarray, costs: Costs) -> Durations:
    """The durations a dry run assumes: every task as known, every message its base delay."""
    comm = np.where(np.asarray(shape.graph().remote) >= 0, costs.comm_s, 0.0)
    known = np.asarray(known, dtype=float)
    return Durations(shape, known, comm, np.zeros(shape.microbatches, dtype=bool), known)


def choose(shape: PipelineShape, schedule: Schedule, cap: float, known: np.ndarray, costs: Costs, comm: str,
           lookahead: bool = True, samples: Sequence[Durations] = ()) -> Pick:
    """The best candidate in dry runs on ``known`` and on the noise ``samples`` (see the module docstring);
    kept per configuration."""
    known = np.asarray(known, dtype=float)
    key = (shape, schedule.name, cap, known.tobytes(), costs, comm, lookahead,
           tuple(sample.task.tobytes() + sample.comm.tobytes() for sample in samples))
    return remembered(_PICKS, key, lambda: _choose(shape, schedule, cap, known, costs, comm, lookahead, samples))


def _choose(shape: PipelineShape, schedule: Schedule, cap: float, known: np.ndarray, costs: Costs, comm: str,
            lookahead: bool, samples: Sequence[Durations]) -> Pick:
    per_microbatch = microbatch_costs(shape, known)
    names: tuple[Order, ...] = ORDERS if costs_differ(per_microbatch) else ("data",)
    orders = {name: admission_order(name, per_microbatch) for name in names}

    def makespan(hint: Candidate, admission: Order, durations: Durations) -> float:
        order = orders[admission]
        if hint == "fixed":
            policies = make_policies("fixed", shape, schedule, order=order)
        else:
            policies = make_policies("ready", shape, schedule, hint, cap, costs, lookahead, known=known, order=order)
        return float(simulate(shape, policies, durations, comm).end.max())

    expected = expected_run_durations(shape, known, costs)
    tried = sorted(((hint, name, makespan(hint, name, expected)) for name in orders for hint in CANDIDATE_HINTS),
                   key=lambda c: c[2])  # stable: among equals the data order, then CANDIDATE_HINTS' order
    scores = {(h, a): s for h, a, s in tried}
    noisy: tuple[tuple[Candidate, Order, float], ...] = ()
    if samples:
        finalists = list(dict.fromkeys([(h, a) for h, a, _ in tried[:FINALISTS]] + [DEFAULT, OWN_HINT]))
        noisy = tuple(sorted(((h, a, float(np.mean([makespan(h, a, d) for d in samples]))) for h, a in finalists),
                             key=lambda c: c[2]))
        scores = {(h, a): s for h, a, s in noisy}
    best = min(scores, key=scores.__getitem__)
    if scores[best] > scores[DEFAULT] * (1 - MARGIN):
        best = DEFAULT
    expected_s = next(s for h, a, s in tried if (h, a) == best)
    return Pick(best[0], best[1], orders[best[1]], expected_s, next(s for h, a, s in tried if (h, a) == DEFAULT),
                tuple(tried), noisy)
