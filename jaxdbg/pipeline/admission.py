"""Admission orders: which microbatch a pipeline takes in next, from what it knows of each one's cost.

A schedule names microbatches by their place in the step (the data loader's order). The gradients of a step
are the same sum in any order, so a runtime that knows, before running them, what microbatches will cost
(their modality, their sequences' lengths: :meth:`~jaxdbg.pipeline.variability.Durations.known`) may admit
them in another order. It matters most at the fixed schedule's own activation memory: there each stage runs
about one microbatch ahead of the next, so a light microbatch behind a heavy one leaves its stage waiting,
and heavy and light microbatches mixed at random cost more than the same ones in runs of similar cost
(DynaPipe orders microbatches by length for the same reason). The orders:

- ``data``: as the step lists them (what the fixed schedule runs);
- ``grouped``: by expected cost, the lightest first and last and the heaviest in the middle, so similar
  microbatches run together and the pipeline fills and drains on the light ones;
- ``light-first`` and ``heavy-first``: by expected cost, ascending or descending.

An order is a tuple ``order`` with ``order[i]`` the microbatch admitted ``i``-th; :func:`renamed` maps a
schedule's tasks (written for the ``i``-th admitted microbatch) onto the microbatches.

Example:
    >>> import numpy as np
    >>> admission_order("grouped", np.array([1.0, 3.0, 1.0, 3.0, 1.0, 1.0]))
    (0, 4, 1, 3, 5, 2)
    >>> admission_order("data", np.array([2.0, 1.0]))
    (0, 1)
"""

from __future__ import annotations

import functools
from typing import Literal, get_args

import numpy as np

from jaxdbg._errors import UsageError
from jaxdbg.pipeline.schedules import Schedule
from jaxdbg.pipeline.tasks import PipelineShape

Order = Literal["data", "grouped", "light-first", "heavy-first"]
ORDERS: tuple[Order, ...] = get_args(Order)
_SAME = 1e-9  # relative: microbatch costs closer than this are equal (no order to choose)


def microbatch_costs(shape: PipelineShape, known: np.ndarray) -> np.ndarray:
    """Per microbatch, the seconds all its tasks are expected to take (its whole pass through the pipeline)."""
    return np.asarray(known, dtype=float).reshape(shape.kinds * shape.model_stages, shape.microbatches).sum(axis=0)


def costs_differ(costs: np.ndarray) -> bool:
    """Whether some microbatches are expected to cost more than others (else every order is the data order)."""
    return bool(costs.max() > costs.min() * (1 + _SAME))


def admission_order(name: str, costs: np.ndarray) -> tuple[int, ...]:
    """The microbatches in the order ``name`` admits them (ties keep the data order)."""
    if name not in ORDERS:
        raise UsageError(f"--admit '{name}': unknown order; use one of {', '.join(ORDERS)}")
    m = len(costs)
    if name == "data" or not costs_differ(costs):
        return tuple(range(m))
    ascending = [int(j) for j in np.argsort(costs, kind="stable")]
    if name == "light-first":
        return tuple(ascending)
    if name == "heavy-first":
        return tuple(int(j) for j in np.argsort(-costs, kind="stable"))
    # grouped: every other microbatch of the ascending list to the front, the rest to the back reversed.
    return tuple(ascending[0::2] + ascending[1::2][::-1])


@functools.lru_cache(maxsize=64)
def renamed(shape: PipelineShape, order: tuple[int, ...]) -> tuple[int, ...]:
    """Per task of a schedule written for admission slots, the task of the microbatch ``order`` puts there."""
    m = shape.microbatches
    if sorted(order) != list(range(m)):
        raise ValueError(f"an admission order must list each of the {m} microbatches once")
    ids = np.arange(shape.num_tasks)
    slot = ids % m
    return tuple((ids - slot + np.asarray(order)[slot]).tolist())


def reorder_schedule(schedule: Schedule, order: tuple[int, ...]) -> Schedule:
    """The schedule with its ``i``-th microbatch replaced by ``order[i]`` (the same as it for the data order)."""
    if order == tuple(range(schedule.shape.microbatches)):
        return schedule
    rename = renamed(schedule.shape, order)
    return Schedule(schedule.name, schedule.shape, tuple(tuple(rename[t] for t in o) for o in schedule.orders))


def reorder_ranks(ranks: list[int], shape: PipelineShape, order: tuple[int, ...]) -> list[int]:
    """Ranks written for admission slots, moved onto the microbatches ``order`` admits there."""
    if order == tuple(range(shape.microbatches)):
        return ranks
    moved = [0] * len(ranks)
    for task, target in enumerate(renamed(shape, order)):
        moved[target] = ranks[task]
    return moved
