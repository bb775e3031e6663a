"""Where a non-finite value sits: the process, the device and the shard (index range) holding it.

A sharded array lives in pieces on many devices (of many processes, in a multi-process job); the first
non-finite value was made in one of them. Each process can look only at its own shards, so each answers
for its own, and process 0 of a job takes the lowest process that holds one (see nan.session).

Example:
    >>> import jax.numpy as jnp
    >>> where = first_bad_shard([jnp.array([1.0, jnp.nan])])
    >>> where.process, where.device.endswith(":0"), where.index
    (0, True, ((0, 2),))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jaxdbg.nonfinite import is_inexact, nonfinite_flags


@dataclass(frozen=True)
class Placement:
    """A shard: its process, its device (``platform:id``) and its ``[start, stop)`` range per dimension."""

    process: int
    device: str
    index: tuple[tuple[int, int], ...]


def device_name(device: Any) -> str:
    return f"{device.platform}:{device.id}"


def first_bad_shard(values: Sequence[Any]) -> Placement | None:
    """The first of this process's shards (by device id) holding a NaN or Inf, among ``values``."""
    import jax

    for value in values:
        if not isinstance(value, jax.Array) or not is_inexact(value):
            continue
        for shard in sorted(value.addressable_shards, key=lambda s: s.device.id):
            if any(nonfinite_flags(shard.data)):
                return Placement(shard.device.process_index, device_name(shard.device),
                                 index_ranges(shard.index, value.shape))
    return None


def index_ranges(index: tuple, shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    return tuple((part.indices(size)[0], part.indices(size)[1]) if isinstance(part, slice)
                 else (int(part), int(part) + 1)
                 for part, size in zip(index, shape))
