"""The live figures of a :func:`jaxdbg.watch` as Prometheus metric families, for ``metrics_port``.

Served by :func:`jaxdbg.metrics.live.serve` (127.0.0.1 only); each scrape reads the figures as they are
then, under the same names and labels as the exported reports (:mod:`jaxdbg.metrics.families`, docs/metrics.md).

Example:
    >>> from urllib.request import urlopen
    >>> from jaxdbg.live.figures import Figures
    >>> from jaxdbg.metrics.live import serve
    >>> figures = Figures()
    >>> figures.function("train_step").called(1.0)
    >>> with serve(WatchCollector(figures), port=0) as url:
    ...     text = urlopen(url).read().decode()
    >>> 'jaxdbg_calls_total{function="train_step",process="0"} 1.0' in text
    True
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from jaxdbg.live.figures import Figures
from jaxdbg.metrics.table import Families, device_memory


class WatchCollector(Collector):
    """Yields the watch's figures at scrape time."""

    def __init__(self, figures: Figures):
        self.figures = figures
        self._live_peaks: dict[str, int] = {}

    def collect(self) -> Iterable[Metric]:
        out = Families()
        process = str(_process_index())
        for row in list(self.figures.functions.values()):
            labels = {"function": row.name, "process": process}
            out.add("calls", labels, row.calls)
            out.add("compiles", labels, row.compiles)
            out.add("recompiles", labels, max(row.compiles - 1, 0))
            out.add("compile_seconds", labels, row.compile_s)
            out.add("nonfinite", labels, row.nonfinite)
            out.add("step_seconds", labels, row.step_s)  # the interval between its two latest calls
        for device, used in _device_memory():
            out.add("device_memory_bytes", {"device": device, "process": process}, used)
        for device, live, peak in self.live_memory():
            device_memory(out, device, process, live, peak)
        return out.all()

    def live_memory(self) -> list[tuple[str, int, int]]:
        """``(device, bytes of live arrays, peak)`` per device of this process, read at scrape time (all
        backends, CPU included); the peak is the device's own where it keeps one, else the most seen so far."""
        from jaxdbg import _compat

        if not _compat.backend_started():
            return []
        import jax

        from jaxdbg.memory.live import device_name, per_device

        live: dict[str, int] = {device_name(d): 0 for d in jax.local_devices()}
        for array in jax.live_arrays():
            with contextlib.suppress(Exception):  # deleted meanwhile
                for device, size in per_device(array)[0]:
                    if device in live:
                        live[device] += size
        rows = []
        for device in jax.local_devices():
            name = device_name(device)
            stats = _compat.device_memory_stats(device) or {}
            seen = self._live_peaks[name] = max(self._live_peaks.get(name, 0), live[name])
            rows.append((name, live[name], int(stats.get("peak_bytes_in_use", seen))))
        return rows


def _process_index() -> int:
    from jaxdbg import _compat

    if not _compat.backend_started():  # a scrape must not start the backend before jax.distributed.initialize()
        return 0
    import jax

    return jax.process_index()


def _device_memory() -> list[tuple[str, int]]:
    """``(local device index, bytes in use)`` of this process's devices that report it (CPU devices do not)."""
    from jaxdbg import _compat

    if not _compat.backend_started():
        return []
    import jax

    rows = []
    for i, device in enumerate(jax.local_devices()):
        stats = device.memory_stats() if hasattr(device, "memory_stats") else None
        if stats and "bytes_in_use" in stats:
            rows.append((str(i), int(stats["bytes_in_use"])))
    return rows
