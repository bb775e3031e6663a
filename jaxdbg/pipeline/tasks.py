"""Pipeline tasks as small integers, and the dependencies between them.

A pipeline of ``stages`` workers (devices or ranks) holds ``stages * virtual`` model stages; model stage
``k`` lives on worker ``k % stages`` as its chunk ``k // stages`` (Megatron's interleaved placement). Each
microbatch ``j`` needs a forward ``F`` and a backward at every model stage; with ``split`` the backward is
two tasks, ``I`` (input gradient, on the critical path) and ``W`` (weight gradient, deferrable), as in the
zero-bubble schedules. Tasks are integers so the simulator's hot loop indexes plain lists.

Dependencies: ``F(k,j)`` needs ``F(k-1,j)``; ``B/I(k,j)`` needs ``F(k,j)`` and ``B/I(k+1,j)``; ``W(k,j)``
needs ``I(k,j)``. A task's result goes to at most one task on another worker (the next or previous stage).

Example:
    >>> shape = PipelineShape(stages=2, microbatches=3)
    >>> shape.name(shape.task(FORWARD, 1, 2))
    '1F2'
    >>> graph = shape.graph()
    >>> shape.name(graph.remote[shape.task(FORWARD, 0, 2)])
    '1F2'
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

FORWARD, BACKWARD, WEIGHT = 0, 1, 2  # BACKWARD is the whole backward, or its input-gradient half when split


@dataclass(frozen=True)
class PipelineShape:
    """How many workers, microbatches, chunks per worker, and whether the backward is split into I and W."""

    stages: int
    microbatches: int
    virtual: int = 1
    split: bool = False

    @property
    def model_stages(self) -> int:
        return self.stages * self.virtual

    @property
    def kinds(self) -> int:
        return 3 if self.split else 2

    @property
    def num_tasks(self) -> int:
        return self.kinds * self.model_stages * self.microbatches

    def task(self, kind: int, model_stage: int, microbatch: int) -> int:
        return (kind * self.model_stages + model_stage) * self.microbatches + microbatch

    def decode(self, task: int) -> tuple[int, int, int]:
        """``(kind, model_stage, microbatch)`` of a task id."""
        rest, microbatch = divmod(task, self.microbatches)
        kind, model_stage = divmod(rest, self.model_stages)
        return kind, model_stage, microbatch

    def worker(self, task: int) -> int:
        return self.decode(task)[1] % self.stages

    def letter(self, kind: int) -> str:
        return "F" if kind == FORWARD else ("I" if self.split else "B") if kind == BACKWARD else "W"

    def name(self, task: int) -> str:
        """The ``<stage><F|B|I|W><microbatch>`` notation of torch.distributed.pipelining (model stage index)."""
        kind, model_stage, microbatch = self.decode(task)
        return f"{model_stage}{self.letter(kind)}{microbatch}"

    def graph(self) -> TaskGraph:
        return _graph(self)


@dataclass(frozen=True)
class TaskGraph:
    """Per-task arrays (lists, for fast indexing): worker, prerequisite count, successors, memory effects.

    ``local`` holds up to two successors on the same worker (-1 when absent), ``remote`` the successor on
    another worker that receives this task's output as a message. ``admits`` marks the forwards that bring
    a new microbatch onto a worker (its first chunk) and ``releases`` the last backward piece that frees it
    (B, or W when split, as the weight gradient needs the layer inputs): the activation-memory cap counts
    microbatches between the two.
    """

    shape: PipelineShape
    worker: list[int]
    prerequisites: list[int]
    local_a: list[int]
    local_b: list[int]
    remote: list[int]
    admits: list[bool]
    releases: list[bool]


@functools.lru_cache(maxsize=16)
def _graph(shape: PipelineShape) -> TaskGraph:
    p, S, m, K = shape.stages, shape.model_stages, shape.microbatches, shape.kinds
    ids = np.arange(K * S * m).reshape(K, S, m)
    stage = np.broadcast_to(np.arange(S)[None, :, None], (K, S, m))
    worker = stage % p
    prerequisites = np.zeros((K, S, m), dtype=np.int64)
    prerequisites[FORWARD, 1:] = 1
    prerequisites[BACKWARD] = 1
    prerequisites[BACKWARD, :-1] += 1
    if shape.split:
        prerequisites[WEIGHT] = 1
    # Successors: F(k)->F(k+1) and F(k)->B(k); B(k)->B(k-1) and B(k)->W(k) when split.
    nxt = np.full((K, S, m), -1, dtype=np.int64)
    nxt[FORWARD, :-1] = ids[FORWARD, 1:]
    nxt[BACKWARD, 1:] = ids[BACKWARD, :-1]
    own = np.full((K, S, m), -1, dtype=np.int64)
    own[FORWARD] = ids[BACKWARD]
    if shape.split:
        own[BACKWARD] = ids[WEIGHT]
    flat_worker = worker.reshape(-1)
    nxt_flat = nxt.reshape(-1)
    same = (nxt_flat >= 0) & (flat_worker[np.maximum(nxt_flat, 0)] == flat_worker)
    remote = np.where(same, -1, nxt_flat)
    local_b = np.where(same, nxt_flat, -1)
    first_chunk = stage < p
    admits = (np.arange(K)[:, None, None] == FORWARD) & first_chunk
    # The weight gradient still needs the layer inputs, so a split backward frees memory only at W.
    releases = (np.arange(K)[:, None, None] == (WEIGHT if shape.split else BACKWARD)) & first_chunk
    return TaskGraph(
        shape=shape,
        worker=flat_worker.tolist(),
        prerequisites=prerequisites.reshape(-1).tolist(),
        local_a=own.reshape(-1).tolist(),
        local_b=local_b.tolist(),
        remote=remote.tolist(),
        admits=admits.reshape(-1).tolist(),
        releases=releases.reshape(-1).tolist(),
    )
