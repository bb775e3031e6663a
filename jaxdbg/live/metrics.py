"""The live figures of a :func:`jaxdbg.watch` over HTTP, in the Prometheus text format (``prometheus-client``).

Served on 127.0.0.1 only, from a daemon thread; each scrape reads the figures as they are then. Names and
labels are the project's shared ones (``jaxdbg_calls_total{function,process}``, ...).

Example:
    >>> from urllib.request import urlopen
    >>> from jaxdbg.live.figures import Figures
    >>> figures = Figures()
    >>> figures.function("train_step").called(1.0)
    >>> server = serve(0, figures)
    >>> text = urlopen(server.url).read().decode()
    >>> 'jaxdbg_calls_total{function="train_step",process="0"} 1.0' in text
    True
    >>> server.close()
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from jaxdbg.live.figures import Figures


class _Collector:
    """Yields the metric families from the figures at scrape time."""

    def __init__(self, figures: Figures):
        self.figures = figures

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        process = str(_process_index())
        labels = ["function", "process"]
        calls = CounterMetricFamily("jaxdbg_calls", "top-level calls of a jitted function", labels=labels)
        compiles = CounterMetricFamily("jaxdbg_compiles", "compiles (first one included)", labels=labels)
        recompiles = CounterMetricFamily("jaxdbg_recompiles", "compiles after the first", labels=labels)
        compile_s = CounterMetricFamily("jaxdbg_compile_seconds", "time spent compiling", labels=labels)
        nonfinite = CounterMetricFamily("jaxdbg_nonfinite", "calls whose outputs held NaN/Inf", labels=labels)
        step = GaugeMetricFamily("jaxdbg_step_seconds", "interval between the two latest calls", labels=labels)
        for row in list(self.figures.functions.values()):
            key = [row.name, process]
            calls.add_metric(key, row.calls)
            compiles.add_metric(key, row.compiles)
            recompiles.add_metric(key, max(row.compiles - 1, 0))
            compile_s.add_metric(key, row.compile_s)
            nonfinite.add_metric(key, row.nonfinite)
            if row.step_s is not None:
                step.add_metric(key, row.step_s)
        memory = GaugeMetricFamily("jaxdbg_device_memory_bytes", "device memory in use", labels=["device", "process"])
        for device, used in _device_memory():
            memory.add_metric([device, process], used)
        yield from (calls, compiles, recompiles, compile_s, nonfinite, step, memory)


def _process_index() -> int:
    from jaxdbg import _compat

    if not _compat.backend_started():  # a scrape must not start the backend before jax.distributed.initialize()
        return 0
    import jax

    return jax.process_index()


def _device_memory() -> list[tuple[str, int]]:
    """``(device, bytes in use)`` of this process's devices that report it (CPU devices do not)."""
    from jaxdbg import _compat

    if not _compat.backend_started():
        return []
    import jax

    rows = []
    for device in jax.local_devices():
        stats = device.memory_stats() if hasattr(device, "memory_stats") else None
        if stats and "bytes_in_use" in stats:
            rows.append((f"{device.platform}:{device.id}", int(stats["bytes_in_use"])))
    return rows


class MetricsServer:
    """A running ``/metrics`` endpoint; :meth:`close` stops it."""

    def __init__(self, server: Any, thread: threading.Thread):
        self._server = server
        self._thread = thread
        self.port = int(server.server_port)
        self.url = f"http://127.0.0.1:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve(port: int, figures: Figures) -> MetricsServer:
    """Serve ``figures`` on http://127.0.0.1:PORT/metrics (port 0: a free one, see ``.url``)."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(figures))  # a collector by duck typing (collect())
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    return MetricsServer(server, thread)
