"""Live device memory at call boundaries: the bytes of ``jax.live_arrays()`` per device, grouped by the watched
call that made each array (a weak reference per output leaf), and the device's own statistics where it has
them (``memory_stats()``: GPU and TPU; CPU devices have none).

Example:
    >>> import jax, jax.numpy as jnp
    >>> producers = Producers()
    >>> double = jax.jit(lambda x: x * 2)
    >>> kept = double(jnp.ones((256, 256)))
    >>> producers.tag([kept], Producer("double", 0, None))
    >>> snapshot = take_snapshot(producers)
    >>> group = next(g for g in snapshot.groups.values() if g.producer == "double")
    >>> group.arrays, group.bytes >= 256 * 256 * 4
    (1, True)
"""

from __future__ import annotations

import contextlib
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from jaxdbg._source import SourceLocation

OUTSIDE = "outside jitted calls"


@dataclass(frozen=True)
class Producer:
    """The watched call that made an array: the function, which call, and the user's line that called it."""

    function: str
    call_index: int
    source: SourceLocation | None


class Producers:
    """Which watched call made each live array: a weak reference per output leaf, so tagging keeps nothing alive.

    Two tables keyed by ``id``, the weak reference and the call's one shared :class:`Producer`, so a tagged leaf
    costs one garbage-collected object (its weak reference), not two: a Flax NNX step returns hundreds of
    leaves, and objects made per step are what makes Python's collector run (the watch measured it)."""

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref] = {}
        self._made_by: dict[int, Producer] = {}

    def tag(self, leaves: list, producer: Producer) -> None:
        refs, made_by = self._refs, self._made_by
        for leaf in leaves:
            try:
                refs[id(leaf)] = weakref.ref(leaf)
            except TypeError:  # not an array (a Python scalar output of a framework wrapper)
                continue
            made_by[id(leaf)] = producer

    def of(self, array: Any) -> Producer | None:
        ref = self._refs.get(id(array))
        return self._made_by.get(id(array)) if ref is not None and ref() is array else None

    def prune(self, live: int) -> None:
        """Forget dead arrays once the table holds twice as many entries as there are live arrays."""
        if len(self._refs) <= max(2 * live, 1024):
            return
        self._refs = {key: ref for key, ref in self._refs.items() if ref() is not None}
        self._made_by = {key: self._made_by[key] for key in self._refs}


@dataclass
class Group:
    """Live arrays of one producer (function and calling line) at one moment."""

    producer: str
    source: SourceLocation | None
    arrays: int = 0
    bytes: int = 0  # all devices
    device_bytes: dict[str, int] = field(default_factory=dict)
    calls: set[int] = field(default_factory=set)
    shapes: dict[str, int] = field(default_factory=dict)
    # A weak reference to an array of the oldest call still live: what a leak keeps (the latest call's outputs may
    # be a loop's state, passed on), to find who keeps them.
    oldest: Any = None
    oldest_call: int | None = None
    latest_call: int | None = None  # the latest call with live arrays here, and what it holds: a loop's state
    latest_arrays: int = 0
    latest_bytes: int = 0

    def add(self, array: Any, per_device: list[tuple[str, int]], call: int | None, shape: str) -> None:
        self.arrays += 1
        for device, size in per_device:
            self.bytes += size
            self.device_bytes[device] = self.device_bytes.get(device, 0) + size
        if call is not None:
            self.calls.add(call)
            if self.latest_call is None or call > self.latest_call:
                self.latest_call, self.latest_arrays, self.latest_bytes = call, 0, 0
            if call == self.latest_call:
                self.latest_arrays += 1
                self.latest_bytes += sum(size for _, size in per_device)
        self.shapes[shape] = self.shapes.get(shape, 0) + 1
        if self.oldest is None or (call is not None and (self.oldest_call is None or call < self.oldest_call)):
            with contextlib.suppress(TypeError):
                self.oldest, self.oldest_call = weakref.ref(array), call

    def shape_text(self, limit: int = 3) -> str:
        ordered = sorted(self.shapes.items(), key=lambda item: -item[1])
        text = ", ".join(f"{shape} x{count}" if count > 1 else shape for shape, count in ordered[:limit])
        return text + (f", +{len(ordered) - limit} more shapes" if len(ordered) > limit else "")


@dataclass
class Snapshot:
    """Live memory at one moment: bytes per device, the device's own figures, and the groups by producer."""

    t: float
    live: dict[str, int]
    groups: dict[tuple, Group]
    in_use: dict[str, int] = field(default_factory=dict)  # memory_stats bytes_in_use
    peak_in_use: dict[str, int] = field(default_factory=dict)  # memory_stats peak_bytes_in_use
    limits: dict[str, int] = field(default_factory=dict)  # memory_stats bytes_limit
    seconds: float = 0.0  # what taking it cost


def device_name(device: Any) -> str:
    """``cpu:0``, ``cuda:1``, ``tpu:3``."""
    return f"{device.platform}:{device.id}"


_LOCAL: list[str] = []


def local_device_names() -> list[str]:
    """This process's devices, named (asked once: they do not change while a backend runs)."""
    if not _LOCAL:
        import jax

        _LOCAL.extend(device_name(d) for d in jax.local_devices())
    return _LOCAL


_LAYOUTS: dict[tuple, tuple[list[tuple[str, int]], str]] = {}


def per_device(array: Any) -> tuple[list[tuple[str, int]], str]:
    """``([(device, bytes held there)], 'f32[8,128]')`` of an array: a shard on each of this process's devices."""
    import numpy as np

    sharding, shape, dtype = array.sharding, array.shape, array.dtype
    key = (sharding, shape, dtype)
    known = _LAYOUTS.get(key)
    if known is None:
        from jaxdbg.target import short_dtype

        shard = sharding.shard_shape(shape)
        size = int(np.prod(shard, dtype=np.int64)) * np.dtype(dtype).itemsize
        text = f"{short_dtype(dtype)}[{','.join(str(d) for d in shape)}]"
        known = ([(device_name(d), size) for d in sharding.addressable_devices], text)
        if len(_LAYOUTS) > 4096:
            _LAYOUTS.clear()
        _LAYOUTS[key] = known
    return known


def take_snapshot(producers: Producers, stats: bool = True) -> Snapshot:
    """Live arrays now, by device and by producer; ``stats``: also the devices' own memory statistics."""
    import jax

    started = time.perf_counter()
    live: dict[str, int] = dict.fromkeys(local_device_names(), 0)  # every device, those holding nothing too
    groups: dict[tuple, Group] = {}
    arrays = jax.live_arrays()
    for array in arrays:
        try:
            devices, shape = per_device(array)
        except Exception:  # noqa: BLE001 - deleted meanwhile, or an extended dtype without a size
            continue
        for device, size in devices:
            live[device] = live.get(device, 0) + size
        producer = producers.of(array)
        key = (producer.function, producer.source) if producer else (OUTSIDE, None)
        group = groups.get(key)
        if group is None:
            group = groups[key] = Group(key[0], key[1])
        group.add(array, devices, producer.call_index if producer else None, shape)
    producers.prune(len(arrays))
    snapshot = Snapshot(started, live, groups)
    if stats:
        device_statistics(snapshot)
    snapshot.seconds = time.perf_counter() - started
    return snapshot


def device_statistics(snapshot: Snapshot) -> None:
    """Fill the snapshot's in-use, peak and limit figures from ``memory_stats()`` of this process's devices."""
    import jax

    from jaxdbg import _compat

    for device in jax.local_devices():
        figures = _compat.device_memory_stats(device)
        if not figures:
            continue
        name = device_name(device)
        for key, target in (("bytes_in_use", snapshot.in_use), ("peak_bytes_in_use", snapshot.peak_in_use),
                            ("bytes_limit", snapshot.limits)):
            if key in figures:
                target[name] = int(figures[key])


def device_limits() -> dict[str, int]:
    """``bytes_limit`` of this process's devices that report one (none on CPU)."""
    snapshot = Snapshot(0.0, {}, {})
    device_statistics(snapshot)
    return snapshot.limits
