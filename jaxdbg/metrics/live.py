"""pipeline-bench ``--metrics-port N``: the per-stage occupancy of the latest finished run and the bench's
progress, served at ``http://127.0.0.1:N/metrics`` while the bench runs (loopback only).

The figures come from :func:`jaxdbg.pipeline.metrics.measure` (the same computation as the report's), and
their families from :func:`jaxdbg.metrics.pipeline.pipeline_run` (the same names and labels as the export).

Example:
    >>> import urllib.request
    >>> from jaxdbg.pipeline.bench import BenchOptions, run_bench
    >>> live = LiveBench()
    >>> with serve(live, port=0) as url:
    ...     _ = run_bench(BenchOptions(stages=2, microbatches=4, policies=("fixed",)), on_run=live.update)
    ...     text = urllib.request.urlopen(url, timeout=5).read().decode()
    >>> 'jaxdbg_pipeline_runs_done{process="0"} 1.0' in text, "jaxdbg_stage_occupancy{" in text
    (True, True)
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from jaxdbg._errors import UsageError
from jaxdbg.metrics.pipeline import pipeline_run
from jaxdbg.metrics.table import Families

if TYPE_CHECKING:
    from jaxdbg.pipeline.bench import RunKey
    from jaxdbg.pipeline.metrics import RunMetrics

HOST = "127.0.0.1"


class LiveBench(Collector):
    """What the endpoint serves: updated by ``run_bench(on_run=live.update)`` from the bench's thread."""

    def __init__(self, process: int = 0):
        self.process = str(process)
        self._lock = threading.Lock()
        self._done = 0
        self._total = 0
        self._latest: tuple[RunKey, RunMetrics] | None = None

    def update(self, done: int, total: int, key: RunKey, record: Any) -> None:
        from jaxdbg.pipeline.metrics import measure  # the pipeline package imports jax

        latest = (key, measure(record))
        with self._lock:
            self._done, self._total, self._latest = done, total, latest

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            done, total, latest = self._done, self._total, self._latest
        out = Families()
        own = {"process": self.process}
        out.add("pipeline_runs_done", own, done)
        out.add("pipeline_runs_total", own, total)
        if latest is not None:
            pipeline_run(out, *latest, self.process)
        return out.all()


@contextlib.contextmanager
def serve(collector: Collector, port: int, option: str = "--metrics-port {port}") -> Iterator[str]:
    """Serve ``collector`` on 127.0.0.1:``port`` (0: any free port) for the block; yields the URL. ``option`` names
    the port as the user gave it (a CLI option, or ``jaxdbg.watch(metrics_port=...)``) in a port-in-use error."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    try:
        server, thread = start_http_server(port, addr=HOST, registry=registry)
    except OSError as err:
        raise UsageError(f"{option.format(port=port)}: cannot listen on {HOST}:{port} ({err.strerror or err}); "
                         "pick a free port") from None
    try:
        yield f"http://{HOST}:{server.server_port}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
