"""Pipeline schedules: every task once, on its own stage, in an order that respects every dependency."""

import pytest

from jaxdbg._errors import UsageError
from jaxdbg.pipeline.policies import default_caps, hint_ranks, memory_caps
from jaxdbg.pipeline.schedules import SCHEDULES, Schedule, build_schedule, shape_for, static_peak_inflight, validate
from jaxdbg.pipeline.tasks import BACKWARD, FORWARD, WEIGHT, PipelineShape

SHAPES = [(1, 1), (2, 2), (3, 1), (4, 8), (4, 16), (8, 32), (5, 7)]


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("stages,microbatches", SHAPES)
def test_every_schedule_is_valid(name, stages, microbatches):
    if name == "interleaved" and microbatches % stages:
        with pytest.raises(UsageError, match="multiple of --stages"):
            shape_for(name, stages, microbatches, 2)
        return
    shape = shape_for(name, stages, microbatches, 2 if name == "interleaved" else 1)
    schedule = build_schedule(name, shape)
    assert validate(schedule) == []
    assert sorted(t for order in schedule.orders for t in order) == list(range(shape.num_tasks))


def test_notation_of_1f1b_and_zb_h1():
    assert build_schedule("1f1b", PipelineShape(2, 3)).format() == (
        "stage 0: 0F0 0F1 0B0 0F2 0B1 0B2\nstage 1: 1F0 1B0 1F1 1B1 1F2 1B2"
    )
    zb = build_schedule("zb-h1", PipelineShape(2, 3, split=True)).format()
    # Stage 1 holds one weight gradient back; stage 0 runs each W right after its I.
    assert zb == "stage 0: 0F0 0F1 0I0 0W0 0F2 0I1 0W1 0I2 0W2\nstage 1: 1F0 1I0 1F1 1I1 1W0 1F2 1I2 1W1 1W2"


def test_interleaved_places_chunks_round_robin():
    shape = shape_for("interleaved", 2, 4, 2)
    order = build_schedule("interleaved", shape).orders[0]
    # Worker 0 holds model stages 0 and 2; forwards go round the chunks in groups of p microbatches.
    assert [shape.name(t) for t in order[:4]] == ["0F0", "0F1", "2F0", "2F1"]
    assert {shape.decode(t)[1] for t in order} == {0, 2}


def test_validate_reports_missing_repeated_and_deadlocked_orders():
    shape = PipelineShape(2, 2)
    good = build_schedule("1f1b", shape)
    repeated = Schedule("bad", shape, (good.orders[0] + good.orders[0][:1], good.orders[1]))
    assert any("appears 2 times" in p for p in validate(repeated))
    misplaced = Schedule("bad", shape, (good.orders[1], good.orders[0]))
    assert any("belongs to stage" in p for p in validate(misplaced))
    # Stage 1 asks for microbatch 1 before 0 while stage 0 waits for 0's backward: a deadlock.
    f0, f1 = shape.task(FORWARD, 0, 0), shape.task(FORWARD, 0, 1)
    b0, b1 = shape.task(BACKWARD, 0, 0), shape.task(BACKWARD, 0, 1)
    stage1 = tuple(shape.task(k, 1, j) for k, j in [(FORWARD, 1), (BACKWARD, 1), (FORWARD, 0), (BACKWARD, 0)])
    stuck = Schedule("bad", shape, ((f0, b0, f1, b1), stage1))
    assert any("deadlock" in p for p in validate(stuck))


def test_memory_of_orders_and_default_caps():
    assert static_peak_inflight(build_schedule("1f1b", PipelineShape(4, 8))) == [4, 3, 2, 1]
    assert static_peak_inflight(build_schedule("gpipe", PipelineShape(4, 8))) == [8, 8, 8, 8]
    # ZB-H1 keeps every stage within 1F1B's peak of p microbatches (deferred W keeps its inputs).
    assert static_peak_inflight(build_schedule("zb-h1", PipelineShape(4, 8, split=True))) == [4, 4, 4, 4]
    assert default_caps(PipelineShape(4, 8)) == (4, 3, 2, 1)
    assert memory_caps(PipelineShape(4, 8), 2) == [8, 6, 4, 2]
    assert memory_caps(PipelineShape(4, 5), 4) == [5, 5, 5, 4]  # never more than all microbatches
    with pytest.raises(UsageError):
        memory_caps(PipelineShape(4, 8), 0)


def test_hint_rankings():
    shape = PipelineShape(2, 3, split=True)
    rank = hint_ranks("bfw", shape)
    i0, f2, w0 = shape.task(BACKWARD, 0, 0), shape.task(FORWARD, 0, 2), shape.task(WEIGHT, 0, 0)
    assert rank[i0] < rank[f2] < rank[w0]
    rank = hint_ranks("bf", shape)
    assert rank[w0] < rank[f2]
    rank = hint_ranks("gpipe", PipelineShape(2, 3))
    assert rank[shape.task(FORWARD, 0, 2)] < rank[shape.task(BACKWARD, 0, 0)]
    with pytest.raises(UsageError, match="unknown hint"):
        hint_ranks("lifo", shape)


@pytest.mark.parametrize("args,message", [
    (("pipedream", 4, 8, 1), "unknown schedule"),
    (("interleaved", 4, 8, 1), "--virtual-stages 2 or more"),
    (("1f1b", 4, 8, 2), "only applies to --schedule interleaved"),
    (("1f1b", 0, 8, 1), "at least 1"),
])
def test_shape_errors_are_usage_errors(args, message):
    with pytest.raises(UsageError, match=message):
        shape_for(*args)
