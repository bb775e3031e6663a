"""The simulator and the shared arbitration: hand-computed makespans, and invariants under random durations."""

import numpy as np
import pytest

from jaxdbg._errors import UsageError
from jaxdbg.pipeline.metrics import lower_bound, measure, timeline_problems
from jaxdbg.pipeline.policies import make_policies, memory_caps
from jaxdbg.pipeline.schedules import build_schedule, shape_for
from jaxdbg.pipeline.simulate import simulate
from jaxdbg.pipeline.variability import Costs, parse_variability, realise, split_specs

UNIT = Costs(forward_s=1.0, backward_s=2.0, comm_s=0.0)


def _run(name, p, m, policy="fixed", hint=None, cap=1.0, comm="async", spec="none", seed=0, costs=UNIT, v=1):
    shape = shape_for(name, p, m, v)
    durations = realise(parse_variability(spec, p), shape, costs, seed)
    schedule = build_schedule(name, shape)
    record = simulate(shape, make_policies(policy, shape, schedule, hint, cap), durations, comm)
    return shape, schedule, durations, record


@pytest.mark.parametrize("p,m", [(1, 4), (2, 2), (4, 8), (8, 32), (3, 10)])
@pytest.mark.parametrize("comm", ["async", "sync"])
def test_equal_durations_1f1b_takes_m_plus_p_minus_1_steps(p, m, comm):
    for name in ("1f1b", "gpipe"):
        *_, record = _run(name, p, m, comm=comm)
        assert record.end.max() == pytest.approx((m + p - 1) * (1.0 + 2.0))


def test_hand_computed_makespans_of_other_schedules():
    # ZB-H1 with F = I = W = 1: the bubble is (p - 1)(t_F + t_I - t_W) = p - 1, so 3m + p - 1.
    *_, record = _run("zb-h1", 4, 8)
    assert record.end.max() == pytest.approx(3 * 8 + 3)
    # Interleaved with 2 chunks halves each task, and its bubble: 3m + 3(p - 1)/2.
    *_, record = _run("interleaved", 4, 8, v=2)
    assert record.end.max() == pytest.approx(3 * 8 + 3 * 3 / 2)
    # One microbatch is a chain: p forwards, p backwards and 2(p - 1) messages.
    *_, record = _run("1f1b", 4, 1, costs=Costs(1.0, 2.0, 0.5))
    assert record.end.max() == pytest.approx(4 * 3 + 2 * 3 * 0.5)


def test_timeline_problems_catch_broken_runs():
    shape, schedule, durations, record = _run("1f1b", 3, 4, spec="jitter:cv=0.3", costs=Costs())
    assert timeline_problems(record, durations, orders=schedule.orders) == []
    early = record.start.copy()
    early[shape.task(1, 0, 0)] = 0.0  # 0B0 before its forward and its gradient
    broken = type(record)(shape, early, record.end, record.blocked_s, record.memory_wait_s, record.peak_inflight, 0, 0)
    problems = timeline_problems(broken, durations, orders=schedule.orders, caps=[1, 1, 1])
    assert any("started before 0F0 ended" in p for p in problems)
    assert any("over its cap" in p for p in problems)


def test_ready_with_the_schedule_as_hint_matches_fixed_without_variability():
    for name, hint in [("1f1b", "1f1b"), ("1f1b", "bf"), ("gpipe", "1f1b")]:
        *_, fixed = _run(name, 4, 12)
        *_, ready = _run(name, 4, 12, policy="ready", hint=hint, cap=1)
        assert ready.end.max() == pytest.approx(fixed.end.max())


@pytest.mark.parametrize("name", ["1f1b", "zb-h1", "interleaved", "gpipe"])
@pytest.mark.parametrize("comm", ["async", "sync"])
def test_invariants_under_random_durations(name, comm):
    p, m = 4, 8
    spec = "jitter:cv=0.6+straggler:factor=3,prob=0.2+comm:cv=1"
    v = 2 if name == "interleaved" else 1
    for seed in range(3):
        shape, schedule, durations, fixed = _run(name, p, m, comm=comm, spec=spec, seed=seed, costs=Costs(), v=v)
        assert np.allclose(fixed.end - fixed.start, durations.task)
        assert timeline_problems(fixed, durations, orders=schedule.orders) == []
        bound = lower_bound(durations)
        assert measure(fixed).makespan_s >= bound - 1e-12
        for hint in ("1f1b", "bf", "bfw", "gpipe"):
            for cap in (1, 2):
                *_, ready = _run(name, p, m, "ready", hint, cap, comm, spec, seed, Costs(), v)
                assert timeline_problems(ready, durations, caps=memory_caps(shape, cap)) == []
                assert measure(ready).makespan_s >= bound - 1e-12


def test_variability_draws_are_paired_and_seeded():
    shape = shape_for("1f1b", 4, 16, 1)
    spec = parse_variability("multimodal:heavy=0.5,factor=3+jitter:cv=0.2", 4)
    a, b = realise(spec, shape, Costs(), 3), realise(spec, shape, Costs(), 3)
    assert np.array_equal(a.task, b.task) and np.array_equal(a.comm, b.comm)
    assert not np.array_equal(a.task, realise(spec, shape, Costs(), 4).task)
    # The split backward of ZB-H1 shares its microbatch's draw: I + W equals the unsplit backward.
    split = realise(spec, shape_for("zb-h1", 4, 16, 1), Costs(), 3)
    task, whole = split.task.reshape(3, 4, 16), a.task.reshape(2, 4, 16)
    assert np.allclose(task[1] + task[2], whole[1]) and np.allclose(task[0], whole[0])
    assert a.heavy.any()


def test_straggler_and_multimodal_hit_the_stages_they_name():
    shape = shape_for("1f1b", 4, 64, 1)
    slow = realise(parse_variability("straggler:stage=2,factor=5,prob=0.5", 4), shape, Costs(), 0).task
    slow = slow.reshape(2, 4, 64)
    assert np.all(slow[:, [0, 1, 3]] == np.array([Costs().forward_s, Costs().backward_s])[:, None, None])
    assert np.isclose(slow[0, 2].max(), 5 * Costs().forward_s) and np.isclose(slow[0, 2].min(), Costs().forward_s)
    mm = realise(parse_variability("multimodal:heavy=0.5,factor=3,encoder=2,partition=layers", 4), shape, Costs(), 0)
    forward = mm.task.reshape(2, 4, 64)[0]
    assert np.allclose(forward[:2, mm.heavy], 3 * Costs().forward_s)
    # rest=2 by default: an image's tokens double the language stages' work too.
    assert np.allclose(forward[2:, mm.heavy], 2 * Costs().forward_s)
    assert np.allclose(forward[:, ~mm.heavy], Costs().forward_s)


def test_multimodal_light_rest_and_length_shape_the_costs():
    shape = shape_for("1f1b", 4, 64, 1)
    F = Costs().forward_s
    base = realise(parse_variability("multimodal:heavy=0.5,factor=3,encoder=2", 4), shape, Costs(), 0)
    spec = "multimodal:heavy=0.5,factor=3,encoder=2,light=0.2,rest=1.5,partition=layers"
    mixed = realise(parse_variability(spec, 4), shape, Costs(), 0)
    assert np.array_equal(base.heavy, mixed.heavy)  # the same modality draws
    forward = mixed.task.reshape(2, 4, 64)[0]
    assert np.allclose(forward[:2, ~mixed.heavy], 0.2 * F) and np.allclose(forward[2:, ~mixed.heavy], F)
    assert np.allclose(forward[:2, mixed.heavy], 3 * F) and np.allclose(forward[2:, mixed.heavy], 1.5 * F)
    # length: one lognormal factor per microbatch, on every stage and kind.
    long = realise(parse_variability("multimodal:heavy=0.5,factor=3,encoder=2,length=0.5", 4), shape, Costs(), 0)
    ratio = long.task.reshape(2, 4, 64) / base.task.reshape(2, 4, 64)
    assert np.allclose(ratio, ratio[:1, :1, :]) and 0.3 < ratio.std() < 0.7


def test_multimodal_partition_balances_each_stages_expected_load_by_default():
    """A partitioner balances expected cost: every stage's mean load per microbatch is the base, while heavy
    microbatches still cost factor/light times the light ones on the encoder stages."""
    shape = shape_for("1f1b", 4, 64, 1)
    F, B = Costs().forward_s, Costs().backward_s
    for spec in ("multimodal:heavy=0.5,factor=3,encoder=2", "multimodal:heavy=0.3,factor=3,light=0.2,rest=1.5"):
        params = parse_variability(spec, 4).models[0].params
        d = realise(parse_variability(spec, 4), shape, Costs(), 0)
        task = d.task.reshape(2, 4, 64)
        heavy, light = task[:, :, d.heavy][..., 0], task[:, :, ~d.heavy][..., 0]  # one microbatch of each
        expected = params["heavy"] * heavy + (1 - params["heavy"]) * light  # per kind and stage
        assert np.allclose(expected, np.array([F, B])[:, None]), spec
        encoders = params["encoder"] or 1
        assert np.allclose(heavy[:, :encoders] / light[:, :encoders], params["factor"] / params["light"])
    # partition=layers keeps the units: the encoder stages carry 0.5 x 3 + 0.5 x 1 = 2x the others' mean load.
    layers = realise(parse_variability("multimodal:heavy=0.5,factor=3,encoder=2,partition=layers", 4), shape,
                     Costs(), 0)
    balanced = realise(parse_variability("multimodal:heavy=0.5,factor=3,encoder=2", 4), shape, Costs(), 0)
    assert np.array_equal(layers.heavy, balanced.heavy)
    assert np.allclose(layers.task.reshape(2, 4, 64)[0, :2][:, layers.heavy], 3 * F)
    assert np.allclose(balanced.task.reshape(2, 4, 64)[0, :2][:, balanced.heavy], 1.5 * F)


@pytest.mark.parametrize("spec,message", [
    ("wobble:x=1", "unknown model 'wobble'"),
    ("jitter:cv=abc", "is not a float"),
    ("jitter:sigma=0.3", "not a parameter of jitter"),
    ("straggler:stage=9,factor=2,prob=0.1", "stages are 0..3"),
    ("straggler:prob=1.5", "between 0.0 and 1.0"),
    ("multimodal:factor=0", "must be positive"),
    ("multimodal:light=0", "light must be positive"),
    ("multimodal:length=-1", "at least 0.0"),
    ("multimodal:partition=even", "not one of balanced, layers"),
    ("replay:/no/such/durations.json", "no file"),
    ("jitter:cv=-1", "at least 0.0"),
])
def test_bad_variability_specs_are_usage_errors(spec, message):
    with pytest.raises(UsageError, match=message):
        parse_variability(spec, 4)


def test_comma_separated_specs_keep_their_parameters():
    assert split_specs("none,straggler:stage=2,factor=2,prob=0.1,jitter:cv=0.3+comm:cv=0.5") == [
        "none", "straggler:stage=2,factor=2,prob=0.1", "jitter:cv=0.3+comm:cv=0.5",
    ]


def test_replay_durations_drive_the_simulator(tmp_path):
    path = tmp_path / "durations.json"
    forward = [[0.001 * (s + 1)] * 2 for s in range(3)]
    path.write_text(f'{{"forward": {forward}, "backward": {[[2 * x for x in row] for row in forward]}}}')
    shape = shape_for("1f1b", 3, 4, 1)
    durations = realise(parse_variability(f"replay:{path}", 3), shape, Costs(comm_s=0.0), 0)
    assert np.allclose(durations.task.reshape(2, 3, 4)[0, 2], 0.003)  # microbatches repeat cyclically
    bad = tmp_path / "bad.json"
    bad.write_text('{"forward": [[1.0]], "backward": [[1.0]]}')
    with pytest.raises(UsageError, match="needs 3 model stages"):
        realise(parse_variability(f"replay:{bad}", 3), shape, Costs(), 0)


def test_readiness_gains_with_memory_headroom_under_variability():
    """Not a timing test: with 2x memory, ready beats fixed order on most seeds of a jittery pipeline."""
    wins = 0
    for seed in range(6):
        *_, fixed = _run("1f1b", 8, 32, spec="jitter:cv=0.4", seed=seed, costs=Costs())
        *_, ready = _run("1f1b", 8, 32, "ready", "1f1b", 2, spec="jitter:cv=0.4", seed=seed, costs=Costs())
        wins += ready.end.max() < fixed.end.max()
        assert ready.decisions > 0 and ready.decision_ns > 0
    assert wins >= 5


def test_sequence_lengths_cost_linear_plus_quadratic_and_are_known(tmp_path):
    """seqlen: every stage's work scales with the microbatch's tokens (attention quadratic); the runtime knows
    it (expected), while jitter stays noise it does not know."""
    shape = shape_for("1f1b", 4, 32, 1)
    d = realise(parse_variability("seqlen:mean=1000,cv=0.8,batch=2,attention=0.3+jitter:cv=0.2", 4), shape, Costs(), 0)
    r = d.lengths / 1000.0
    factor = ((0.7 * r + 0.3 * r * r).mean(axis=1))
    base = realise(parse_variability("none"), shape, Costs(), 0).task.reshape(2, 4, 32)
    assert np.allclose(d.expected.reshape(2, 4, 32), base * factor[None, None, :])
    assert not np.allclose(d.task, d.expected)  # the jitter is drawn on top, unknown beforehand
    assert d.lengths.shape == (32, 2) and d.lengths.min() >= 1
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("100\n400, 400\n1600\n")
    f = realise(parse_variability(f"seqlen:file={lengths},attention=0", 4), shape, Costs(), 1)
    assert set(f.lengths.ravel()) <= {100.0, 400.0, 1600.0}
    assert np.allclose(f.task.reshape(2, 4, 32), base * (f.lengths[:, 0] / 625.0)[None, None, :])


def test_hetero_stages_and_a_slow_link():
    shape = shape_for("1f1b", 4, 8, 1)
    base = realise(parse_variability("none"), shape, Costs(), 0)
    hetero = realise(parse_variability("hetero:costs=2/1/1/0.5", 4), shape, Costs(), 0)
    ratio = (hetero.task / base.task).reshape(2, 4, 8)
    assert np.allclose(ratio, np.array([2, 1, 1, 0.5])[None, :, None]) and np.array_equal(hetero.task, hetero.expected)
    link = realise(parse_variability("link:stage=1,factor=10", 4), shape, Costs(), 0)
    slow = (link.comm / np.where(base.comm > 0, base.comm, 1)).reshape(2, 4, 8)
    # Stage 1 -> 2 carries the forwards of model stage 1 and stage 2 -> 1 the backwards of model stage 2.
    assert np.allclose(slow[0, 1], 10) and np.allclose(slow[1, 2], 10)
    assert np.allclose(slow[0, [0, 2]], 1) and np.allclose(slow[1, [1, 3]], 1)
    assert np.array_equal(link.expected, base.task)  # a slow link is found by measuring, not known


@pytest.mark.parametrize("spec,message", [
    ("seqlen:file=/no/such/lengths.txt", "no file"),
    ("seqlen:mean=100,cv=0.5,min=50,max=10", "below min"),
    ("hetero:costs=1/x", "'/'-separated numbers"),
    ("hetero:costs=1/1/1", "3 stage costs for 4 model stages"),
    ("link:stage=4", "stages are 0..3"),
    ("seqlen:attention=2", "between 0.0 and 1.0"),
])
def test_bad_real_cause_specs_are_usage_errors(spec, message):
    with pytest.raises(UsageError, match=message):
        parse_variability(spec, 4, 4)


def test_a_lengths_file_must_hold_lengths(tmp_path):
    bad = tmp_path / "lengths.txt"
    bad.write_text("length\n100\n")
    with pytest.raises(UsageError, match="not a number"):
        parse_variability(f"seqlen:file={bad}", 4)
    bad.write_text("100 -3\n")
    with pytest.raises(UsageError, match="positive number"):
        parse_variability(f"seqlen:file={bad}", 4)
