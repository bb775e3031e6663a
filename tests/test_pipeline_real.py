"""Real execution on CPU devices (conftest gives 4): gradients equal the single-device reference, and the
real timeline keeps every dependency, message delay, fixed order and memory cap.

Only the recorded order of events is checked, never how long the run took against a prediction: wall
times depend on the load of the machine (scripts/bench_pipeline.py measures them)."""

import jax
import numpy as np
import pytest

from jaxdbg._errors import UsageError
from jaxdbg.pipeline.metrics import timeline_problems
from jaxdbg.pipeline.policies import make_policies, memory_caps
from jaxdbg.pipeline.real import ModelSpec, RealPipeline
from jaxdbg.pipeline.schedules import build_schedule, shape_for
from jaxdbg.pipeline.variability import Costs, parse_variability, realise

FAST = Costs(forward_s=0.002, backward_s=0.004, comm_s=0.0002)
SPEC = "jitter:cv=0.3+comm:cv=0.5"


@pytest.fixture(scope="module")
def four_stages():
    return RealPipeline(shape_for("1f1b", 4, 6, 1), ModelSpec(width=16, rows=4))


def _check(pipe, schedule_name, policy, hint=None, cap=1.0, comm="async", seed=0):
    shape = pipe.shape
    schedule = build_schedule(schedule_name, shape)
    durations = realise(parse_variability(SPEC, shape.stages), shape, FAST, seed)
    run = pipe.run(make_policies(policy, shape, schedule, hint, cap, costs=FAST), durations, comm)
    tolerance = 1e-6 + 1e-4 * run.max_abs_grad
    assert run.max_abs_grad > 0 and run.max_abs_grad_diff <= tolerance
    orders = schedule.orders if policy == "fixed" else None
    caps = memory_caps(shape, cap) if policy == "ready" else None
    # Each task took at least its drawn duration, started after its inputs (a message: its drawn delay after
    # the sender ended), one at a time per stage, in the fixed order, within the memory cap.
    assert timeline_problems(run.record, durations, orders, caps, tolerance=1e-6) == []
    sent = np.asarray(shape.graph().remote) >= 0
    np.testing.assert_allclose(run.message_delay[sent], durations.comm[sent])  # every message held as drawn
    assert np.all(run.message_delay[~sent] == 0)
    return run


@pytest.mark.parametrize("policy,hint,cap,comm", [
    ("fixed", None, 1, "async"), ("fixed", None, 1, "sync"), ("ready", "bf", 2, "async"), ("ready", "gpipe", 1, "sync"),
])
def test_four_stages_match_the_reference(four_stages, policy, hint, cap, comm):
    _check(four_stages, "1f1b", policy, hint, cap, comm)


def test_split_backward_on_stages_spanning_two_devices():
    pipe = RealPipeline(shape_for("zb-h1", 2, 4, 1), ModelSpec(width=16, rows=4), devices_per_stage=2)
    assert len({d for w in range(2) for d in pipe.params[w][0][0].devices()}) == 4
    _check(pipe, "zb-h1", "fixed")
    _check(pipe, "zb-h1", "ready", "bfw", 2)


def test_interleaved_chunks_share_a_device():
    pipe = RealPipeline(shape_for("interleaved", 2, 4, 2), ModelSpec(width=16, rows=4))
    # Model stages 0 and 2 are stage 0's two chunks: weights and incoming activations on its device.
    assert pipe.params[0][0][0].devices() == pipe.params[2][0][0].devices() != pipe.params[1][0][0].devices()
    assert pipe.activation[0].device_set == pipe.activation[2].device_set == pipe.params[0][0][0].devices()
    _check(pipe, "interleaved", "ready", "1f1b", 1)  # (one stage's two chunks never ran at once)


def test_measured_durations_replay_in_the_simulator(four_stages):
    run = _check(four_stages, "1f1b", "fixed")
    assert np.all(run.measured >= 0) and run.measured.shape == (four_stages.shape.num_tasks,)


def test_too_few_devices_is_a_usage_error():
    with pytest.raises(UsageError, match="needs 8 devices"):
        RealPipeline(shape_for("1f1b", 4, 2, 1), ModelSpec(width=16), devices_per_stage=2, devices=jax.devices()[:4])
