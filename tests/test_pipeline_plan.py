"""Admission orders and ``--hint auto``: readiness-first policies chosen by dry runs on what the runtime knows
(each microbatch's modality and lengths, not the noise), at the fixed schedule's own memory. Simulation only:
makespans in virtual time, never wall time."""

from __future__ import annotations

import numpy as np
import pytest

from jaxdbg.pipeline.admission import admission_order, microbatch_costs, reorder_schedule
from jaxdbg.pipeline.metrics import timeline_problems
from jaxdbg.pipeline.planner import choose
from jaxdbg.pipeline.policies import make_policies, memory_caps
from jaxdbg.pipeline.schedules import build_schedule, shape_for, static_peak_inflight, validate
from jaxdbg.pipeline.simulate import simulate
from jaxdbg.pipeline.variability import Costs, noise_samples, parse_variability, realise

MULTIMODAL = "multimodal:heavy=0.3,factor=3"


def _fixed_and_auto(name, p, m, spec, seed, cap=1.0, comm="async"):
    shape = shape_for(name, p, m, 1)
    schedule = build_schedule(name, shape)
    variability = parse_variability(spec, p)
    durations = realise(variability, shape, Costs(), seed)
    samples = noise_samples(variability, durations, Costs(), seed, 4)
    pick = choose(shape, schedule, cap, durations.known(), Costs(), comm, samples=samples)
    policy = "fixed" if pick.hint == "fixed" else "ready"
    policies = make_policies(policy, shape, schedule, pick.hint, cap, Costs(), known=durations.known(),
                             order=pick.order)
    ready = simulate(shape, policies, durations, comm)
    fixed = simulate(shape, make_policies("fixed", shape, schedule), durations, comm)
    assert timeline_problems(ready, durations, caps=memory_caps(shape, cap)) == []
    return fixed.end.max(), ready.end.max(), pick


def test_an_admission_order_renames_microbatches_and_keeps_the_schedule_valid():
    shape = shape_for("zb-h1", 4, 8, 1)
    durations = realise(parse_variability(MULTIMODAL, 4), shape, Costs(), 3)
    order = admission_order("grouped", microbatch_costs(shape, durations.known()))
    assert sorted(order) == list(range(8)) and order != tuple(range(8))
    costs = microbatch_costs(shape, durations.known())[list(order)]
    assert costs[0] == costs.min() and costs[len(costs) // 2] == costs.max()  # light at the ends, heavy inside
    schedule = build_schedule("zb-h1", shape)
    moved = reorder_schedule(schedule, order)
    assert validate(moved) == [] and static_peak_inflight(moved) == static_peak_inflight(schedule)
    fixed = simulate(shape, make_policies("fixed", shape, schedule, order=order), durations)
    assert timeline_problems(fixed, durations, orders=moved.orders) == []
    first = [shape.decode(t)[2] for t in moved.orders[0] if shape.decode(t)[0] == 0]
    assert first == list(order)  # stage 0 admits the microbatches in that order


def test_auto_gains_at_the_fixed_schedules_own_memory_on_mixed_microbatches():
    """ZB-H1, 8 stages x 32 microbatches, images on 30% of them: at 1x memory auto groups microbatches of
    similar cost and beats the fixed order by more than 10% (the issue's target, median of 5 seeds in the bench)."""
    for seed in (0, 2):
        fixed, ready, pick = _fixed_and_auto("zb-h1", 8, 32, MULTIMODAL, seed)
        assert fixed / ready > 1.10, (seed, pick.why())
        assert pick.admission != "data" and pick.expected_s < pick.fixed_s
        assert "dry run" in pick.why() and len(pick.candidates) == 4 * 5  # orders x (hints and the schedule)


@pytest.mark.parametrize("name", ["1f1b", "zb-h1"])
def test_auto_keeps_the_schedule_where_nothing_pays(name):
    """Without variability auto runs the schedule as written; under jitter nothing is known of single
    microbatches, so every order is the data order, and the noise samples decide whether readiness pays."""
    fixed, ready, pick = _fixed_and_auto(name, 4, 16, "none", 0)
    assert (pick.hint, pick.admission) == ("fixed", "data") and ready == pytest.approx(fixed)
    assert "kept" in pick.why() and not pick.noisy  # nothing unknown: no noise to sample
    *_, pick = _fixed_and_auto(name, 4, 16, "jitter:cv=0.3", 0, cap=2.0)
    assert pick.admission == "data" and pick.order == tuple(range(16))
    assert pick.hint != "fixed" and "draws of the noise" in pick.why()  # with 2x memory readiness pays


def test_auto_keeps_1f1b_as_written_at_its_own_memory_under_jitter():
    """1F1B at 1x: every stage is about one microbatch ahead of the next, so readiness-first can only reorder
    a little, and on the noise samples that does not pay: auto runs the schedule (speedup exactly 1)."""
    wins = []
    for seed in range(3):
        fixed, ready, pick = _fixed_and_auto("1f1b", 8, 32, "jitter:cv=0.3", seed)
        assert (pick.hint, pick.admission) == ("fixed", "data"), pick.why()
        wins.append(fixed / ready)
    assert wins == pytest.approx([1.0, 1.0, 1.0])


def test_auto_orders_by_sequence_length():
    fixed, ready, pick = _fixed_and_auto("1f1b", 4, 16, "seqlen:mean=2048,cv=0.8,attention=0.3", 1)
    assert pick.admission != "data" and fixed / ready > 1.0
    lengths = realise(parse_variability("seqlen:mean=2048,cv=0.8,attention=0.3", 4), shape_for("1f1b", 4, 16, 1),
                      Costs(), 1).lengths[:, 0]
    ordered = lengths[list(pick.order)]
    assert not np.array_equal(ordered, lengths)
