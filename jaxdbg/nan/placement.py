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

import numpy as np

from jaxdbg.memory.live import device_name
from jaxdbg.nonfinite import is_inexact, nonfinite_flags


@dataclass(frozen=True)
class Placement:
    """A shard: its process, its device (``platform:id``) and its ``[start, stop)`` range per dimension."""

    process: int
    device: str | None  # None: inside a shard_map whose mesh names no devices
    index: tuple[tuple[int, int], ...]


def first_bad_shard(values: Sequence[Any]) -> Placement | None:
    """The first shard (by process, then device id) holding a NaN or Inf, among ``values``. Of an array sharded
    over devices of other processes too, every process learns which shards hold one (a collective: the replay
    of an SPMD program calls it on every process, in the same order), so that a process whose own shards are
    finite still names the process and device that made the value."""
    import jax

    for value in values:
        if not isinstance(value, jax.Array) or not is_inexact(value):
            continue
        bad = [shard.device.id for shard in value.addressable_shards if any(nonfinite_flags(shard.data))]
        if not value.is_fully_addressable:
            bad = _bad_in_job(bad, len(value.addressable_shards))
        every: Any = value.sharding.device_set
        devices: dict[int, Any] = {device.id: device for device in every}
        held = sorted((devices[i] for i in bad if i in devices), key=lambda d: (d.process_index, d.id))
        if held:
            index = value.sharding.devices_indices_map(value.shape)[held[0]]
            return Placement(held[0].process_index, device_name(held[0]), index_ranges(index, value.shape))
    return None


def _bad_in_job(mine: list[int], shards: int) -> list[int]:
    """The ids of the devices whose shards hold a NaN/Inf, in every process of the job (``mine``: this
    process's, of its ``shards`` shards), gathered through JAX's own collectives."""
    from jax.experimental import multihost_utils

    from jaxdbg import jit_layer

    row = np.full(shards, -1, np.int64)
    row[:len(mine)] = mine
    with jit_layer.internal():  # the gather's own jitted function is jaxdbg's, not the program's
        every = np.asarray(multihost_utils.process_allgather(row))
    return sorted({int(i) for i in every.reshape(-1) if i >= 0})


def index_ranges(index: tuple, shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    return tuple((part.indices(size)[0], part.indices(size)[1]) if isinstance(part, slice)
                 else (int(part), int(part) + 1)
                 for part, size in zip(index, shape))


def first_bad_block(values: Sequence[Any], sizes: dict[str, int], manual: tuple[str, ...], devices: Any,
                    operands: Sequence[tuple[tuple[int, ...], Any]]) -> Placement | None:
    """Inside a shard_map (or pmap) body, where the first non-finite value sits: the device whose block holds
    it, and the index range that block covers in a global array of the map (an input or output with the same
    block shape, by its spec), else the device's position along each mesh axis of the map (``[(5, 6)]``: a
    pmap's index 5 on the mapped axis). Body values are stacked ``[*manual axis sizes, *block]`` (see
    :func:`jaxdbg.jaxpr.interpreter._to_device_blocks`); ``devices`` is the mesh's device array (or None),
    ``operands`` the map's global ``(shape, spec)`` pairs.

    Example:
        >>> import jax.numpy as jnp
        >>> from jax.sharding import PartitionSpec as P
        >>> block = jnp.ones((4, 2, 3)).at[2, 1, 0].set(jnp.nan)   # 4 devices, blocks of (2, 3)
        >>> where = first_bad_block([block], {"data": 4}, ("data",), None, [((8, 3), P("data"))])
        >>> where.device, where.index
        (None, ((4, 6), (0, 3)))
    """
    for value in values:
        if not is_inexact(value) or np.ndim(value) < len(manual):
            continue
        bad = _bad_blocks(value, len(manual))
        if not bad.any():
            continue
        coords = tuple(int(c) for c in np.argwhere(bad)[0])
        where = dict(zip(manual, coords))
        device = None
        if devices is not None:
            device = devices[tuple(where.get(axis, 0) for axis in sizes)]
        block = tuple(np.shape(value)[len(manual):])
        index = _block_range(block, where, sizes, operands) or tuple((i, i + 1) for i in coords)
        return Placement(device.process_index if device is not None else 0,
                         device_name(device) if device is not None else None, index)
    return None


def _bad_blocks(value: Any, lead: int) -> np.ndarray:
    """Per device block of a stacked body value (its first ``lead`` dimensions index the devices), whether it
    holds a NaN/Inf. In a multi-process job the stacked value spans every process's devices and none can read it
    whole: each reads its own shards and the blocks found are all-gathered (every process replays in lockstep)."""
    import jax
    import jax.numpy as jnp

    shape = tuple(np.shape(value)[:lead])
    if not isinstance(value, jax.Array) or value.is_fully_addressable:
        finite = np.asarray(jnp.isfinite(value))
        return np.asarray(~finite.reshape(*shape, -1).all(axis=-1))
    mine: set[int] = set()
    for shard in value.addressable_shards:
        data = shard.data
        local = ~np.asarray(jnp.isfinite(data)).reshape(*data.shape[:lead], -1).all(axis=-1)
        starts = [part.indices(size)[0] if isinstance(part, slice) else int(part)
                  for part, size in zip(shard.index[:lead], shape)]
        for coords in np.argwhere(local):
            mine.add(int(np.ravel_multi_index(tuple(int(c) + o for c, o in zip(coords, starts)), shape)))
    bad = np.zeros(int(np.prod(shape, dtype=int)), bool)
    bad[_bad_in_job(sorted(mine), bad.size)] = True
    return bad.reshape(shape)


def _block_range(block: tuple[int, ...], where: dict[str, int], sizes: dict[str, int],
                 operands: Sequence[tuple[tuple[int, ...], Any]]) -> tuple[tuple[int, int], ...] | None:
    """The ``[start, stop)`` ranges the block at mesh position ``where`` covers in the first global array of
    ``operands`` whose blocks have this shape."""
    for shape, spec in operands:
        entries = list(spec) + [None] * (len(shape) - len(tuple(spec)))
        ranges = []
        for size, extent, entry in zip(shape, block, entries):
            axes = [a for a in ((entry,) if isinstance(entry, str) else tuple(entry or ())) if a in where]
            parts = int(np.prod([sizes[a] for a in axes], dtype=int)) if axes else 1
            if len(shape) != len(block) or size != extent * parts:
                break
            position = 0
            for axis in axes:  # row-major over the spec's axes
                position = position * sizes[axis] + where[axis]
            ranges.append((position * extent, (position + 1) * extent))
        else:
            if len(shape) == len(block):
                return tuple(ranges)
    return None
