"""``--monitor``: host memory, CPU, network and disk I/O, device memory and (on TPU hosts) the TPU runtime's
own figures, sampled through the run by a background thread.

Infrastructure trouble (a host swapping, another process eating the cores, device memory near its
limit, a saturated network link, slow input reading) looks like slow code in a profile; the series, on
the same time axis as the trace, tell them apart. Samples leave in batches over the channel, so a run
that dies still leaves what was sampled.

Example:
    >>> import time
    >>> batches = []
    >>> with Sampler(send=lambda message: batches.append(message.rows), interval_s=0.01):
    ...     time.sleep(0.05)                        # the profiled run
    >>> monitor = series([sample for batch in batches for sample in batch], interval_s=0.01)
    >>> monitor.summary["samples"] == len(monitor.t_s) >= 1, monitor.summary["peak_host_rss_bytes"] > 0
    (True, True)
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from jaxdbg.profile import host_io, tpu_runtime
from jaxdbg.profile.messages import MonitorSamples
from jaxdbg.profile.model import MonitorSeries
from jaxdbg.protocol import Message

# The TPU runtime is asked at most once a second: one ask is four gRPC calls (~20 ms of the monitor thread),
# and libtpu's duty cycle is itself an average over a window. Samples in between hold None for it.
TPU_INTERVAL_S = 1.0
# Each sample is also a zero-length annotation in the jax.profiler capture (when one runs), so that the trace
# shows the host's CPU and I/O on its own time axis; trace.write_perfetto turns them into counter tracks.
MONITOR_EVENT = "jaxdbg monitor"
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def host_rss_bytes() -> int:
    """Resident memory of this process (Linux /proc; falls back to peak RSS elsewhere)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def host_available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def system_cpu_ticks() -> tuple[int, int] | None:
    """(busy, total) jiffies of the whole machine from /proc/stat (None elsewhere)."""
    try:
        with open("/proc/stat") as handle:
            fields = [int(v) for v in handle.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def _backend_started() -> bool:
    """_compat.backend_started, imported only once jax is: the profile package is also imported by parents that
    never import jax (``jaxdbg memory`` assembles its report without it)."""
    from jaxdbg._compat import backend_started  # imports jax (heavy): lazily

    return backend_started()


def device_bytes_in_use() -> tuple[int, ...] | None:
    """Bytes in use on each local device, or None where the backend keeps no count (CPU)."""
    import jax

    from jaxdbg._compat import device_memory_stats

    found = []
    for device in jax.local_devices():
        stats = device_memory_stats(device)
        if not stats or "bytes_in_use" not in stats:
            return None
        found.append(int(stats["bytes_in_use"]))
    return tuple(found)


class Sampler:
    """A daemon thread that samples every ``interval_s`` and sends batches of samples."""

    def __init__(self, send: Callable[[Message], None], interval_s: float = 0.1, batch_s: float = 1.0,
                 tpu_interval_s: float = TPU_INTERVAL_S):
        self.send = send
        self.tpu_interval_s = tpu_interval_s
        self.interval_s = interval_s
        self.batch_s = batch_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pending: list[tuple] = []
        self._tpu_address: str | None = None
        self._tpu_failed = False
        self._tpu_last = -float("inf")

    def __enter__(self) -> Sampler:
        self._start = time.perf_counter()
        self._cpu = self._cpu_seconds()
        self._system = system_cpu_ticks()
        self._thread = threading.Thread(target=self._run, name="jaxdbg-monitor", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._sample()
        self._flush()

    @staticmethod
    def _cpu_seconds() -> float:
        times = os.times()
        return times.user + times.system

    def _run(self) -> None:
        last_flush = time.perf_counter()
        while not self._stop.wait(self.interval_s):
            self._sample()
            if time.perf_counter() - last_flush >= self.batch_s:
                self._flush()
                last_flush = time.perf_counter()

    def _sample(self) -> None:
        now = time.perf_counter()
        cpu = self._cpu_seconds()
        elapsed = now - getattr(self, "_last_t", self._start)
        percent = 100.0 * (cpu - self._cpu) / elapsed if elapsed > 0 else 0.0
        self._last_t, self._cpu = now, cpu
        system, busy = system_cpu_ticks(), None
        if system and self._system and system[1] > self._system[1]:
            busy = round(100.0 * (system[0] - self._system[0]) / (system[1] - self._system[1]), 1)
        self._system = system
        try:  # not before the target started jax's backend (see _compat.backend_started); none without jax
            devices = device_bytes_in_use() if "jax" in sys.modules and _backend_started() else None
        except Exception:  # noqa: BLE001
            devices = None
        row = (now - self._start, host_rss_bytes(), round(percent, 1), host_available_bytes(), devices, busy,
               host_io.network_bytes(), host_io.disk_bytes(), self._tpu())
        self._pending.append(row)
        self._annotate(row)

    def _annotate(self, row: tuple) -> None:
        """The sample as an annotation in a running capture: CPU, and MB moved since the monitor started."""
        if "jax" not in sys.modules:  # never import jax from the monitor thread
            return
        import jax

        if not hasattr(self, "_io_start"):
            self._io_start = (row[6], row[7])
        figures = {"host_cpu_percent": row[2], "host_rss_mb": round(row[1] / 1e6, 1)}
        for (name, columns), start, now in zip((("net", ("receive", "transmit")), ("disk", ("read", "write"))),
                                               self._io_start, (row[6], row[7])):
            if start is not None and now is not None:
                figures.update({f"{name}_{c}_mb": round((now[i] - start[i]) / 1e6, 3) for i, c in enumerate(columns)})
        with jax.profiler.TraceAnnotation(MONITOR_EVENT, **figures):
            pass

    def _tpu(self) -> tuple | None:
        """The TPU runtime's figures; after one failed ask, no more (a service that is not there costs time)."""
        now = time.perf_counter()
        if self._tpu_failed or now - self._tpu_last < self.tpu_interval_s:
            return None
        if self._tpu_address is None:
            self._tpu_address = tpu_runtime.address()
            if self._tpu_address is None:
                return None
        self._tpu_last = now
        try:
            return tuple(tpu_runtime.read(self._tpu_address))
        except Exception:  # noqa: BLE001 - grpc.RpcError and its kin: the service is not answering
            self._tpu_failed = True
            return None

    def _flush(self) -> None:
        if self._pending:
            batch, self._pending = self._pending, []
            self.send(MonitorSamples(batch))


def series(samples: list[tuple], interval_s: float) -> MonitorSeries | None:
    """The samples as a series with a summary, and flags for infrastructure trouble."""
    if not samples:
        return None
    t, rss, cpu, available, devices, system, net, disk, tpu = (tuple(column) for column in zip(*samples))
    summary: dict[str, Any] = {
        "samples": len(samples), "peak_host_rss_bytes": max(rss),
        "mean_host_cpu_percent": round(sum(cpu) / len(cpu), 1), "max_host_cpu_percent": max(cpu),
    }
    known = [a for a in available if a is not None]
    if known:
        summary["min_host_available_bytes"] = min(known)
    device_rows = [d for d in devices if d]
    if device_rows:
        summary["peak_device_bytes_in_use"] = [max(col) for col in zip(*device_rows)]
    warnings = []
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if known and min(known) < 0.05 * max(max(rss), 1) + 256 * 1024**2:
        warnings.append("host memory nearly exhausted during the run: expect swapping or an OOM kill")
    if summary["mean_host_cpu_percent"] > 90 * cores:
        warnings.append("the process used every core throughout: CPU-bound, or threads competing")
    busy = [b for b in system if b is not None]
    if busy:
        summary["mean_system_cpu_percent"] = round(sum(busy) / len(busy), 1)
        own = summary["mean_host_cpu_percent"] / cores
        if summary["mean_system_cpu_percent"] - own > 50:
            warnings.append(f"other processes kept the machine {summary['mean_system_cpu_percent'] - own:.0f}% "
                            "busy: timings are slowed by contention, not by this program")
    net_in, net_out = _rates(t, net, 0), _rates(t, net, 1)
    disk_read, disk_write = _rates(t, disk, 0), _rates(t, disk, 1)
    warnings.extend(_io_summary(summary, t, net, disk))
    tpu_series = _tpu_summary(summary, tpu)
    summary["warnings"] = warnings
    return MonitorSeries(interval_s, t, rss, cpu, available, devices, system, summary, net_in, net_out, disk_read,
                         disk_write, *tpu_series)


def _rates(t: tuple, counters: tuple, column: int) -> tuple[float | None, ...]:
    """Bytes per second between each sample and the one before (the first sample: None)."""
    rates: list[float | None] = [None]
    for i in range(1, len(t)):
        before, now, dt = counters[i - 1], counters[i], t[i] - t[i - 1]
        ok = before is not None and now is not None and dt > 0
        rates.append(round(max(now[column] - before[column], 0) / dt, 1) if ok else None)
    return tuple(rates)


def _io_summary(summary: dict, t: tuple, net: tuple, disk: tuple) -> list[str]:
    """Totals and peaks of the host's network and disk I/O, and warnings where they may be what steps wait on."""
    for name, counters, columns in (("net", net, ("receive", "transmit")), ("disk", disk, ("read", "write"))):
        known = [c for c in counters if c is not None]
        if len(known) < 2:
            continue
        for i, column in enumerate(columns):
            summary[f"{name}_{column}_bytes"] = max(known[-1][i] - known[0][i], 0)
            rates = [r for r in _rates(t, counters, i) if r is not None]
            summary[f"peak_{name}_{column}_bytes_per_s"] = max(rates) if rates else 0.0
    link = host_io.link_bytes_per_s()
    if link:
        summary["link_bytes_per_s"] = link
    return [warning for warning, _ in io_findings(summary)]


def io_findings(summary: dict) -> list[tuple[str, str]]:
    """(warning, what to try) where the host's I/O may be what the steps waited on: a network link near its
    speed, or heavy disk reads while the process itself stayed mostly idle (from a monitor summary).

    Example:
        >>> io_findings({"mean_host_cpu_percent": 12.0, "peak_disk_read_bytes_per_s": 400e6})[0][0][:30]
        'disk reads peaked at 400 MB/s '
    """
    found = []
    link = summary.get("link_bytes_per_s")
    busiest = max(summary.get("peak_net_receive_bytes_per_s", 0.0), summary.get("peak_net_transmit_bytes_per_s", 0.0))
    if link and busiest > 0.8 * link:
        found.append((f"the network ran at {busiest / 1e6:.0f} MB/s, near its links' {link / 1e6:.0f} MB/s: "
                      "steps may be waiting on the network (data loading, checkpoints, collectives)",
                      "prefetch input ahead of the step, cache the data set locally, or checkpoint less often"))
    reads = summary.get("peak_disk_read_bytes_per_s", 0.0)
    if reads > 50e6 and summary["mean_host_cpu_percent"] < 50:
        found.append((f"disk reads peaked at {reads / 1e6:.0f} MB/s while this process kept under half a core busy: "
                      "steps may be waiting on input reading",
                      "read input in background threads (prefetch), use a faster local disk, or cache decoded data"))
    return found


def monitor_hints(monitor: MonitorSeries | None) -> tuple[str, ...]:
    """The I/O findings as the profile's hints (the warning, then what to try)."""
    if monitor is None:
        return ()
    return tuple(f"{warning}; {advice}" for warning, advice in io_findings(monitor.summary))


def _tpu_summary(summary: dict, tpu: tuple) -> tuple[tuple, tuple, tuple, tuple]:
    """The TPU runtime's series (duty cycle, HBM in use, HBM bandwidth, TensorCore utilisation) and summary."""
    readings = [tpu_runtime.TpuReading(*r) if r is not None else None for r in tpu]
    known = [r for r in readings if r is not None]
    columns = ("duty_cycle_percent", "hbm_bytes_in_use", "hbm_bandwidth_percent", "tensorcore_util_percent")
    series = tuple(tuple(getattr(r, c) if r is not None else None for r in readings) for c in columns)
    if not known:
        return (), (), (), ()
    found: dict[str, Any] = {"samples": len(known), "hbm_total_bytes": list(known[-1].hbm_total_bytes)}
    for column, key in (("duty_cycle_percent", "duty_cycle_percent"), ("hbm_bytes_in_use", "hbm_bytes"),
                        ("hbm_bandwidth_percent", "hbm_bandwidth_percent"),
                        ("tensorcore_util_percent", "tensorcore_util_percent")):
        rows = [getattr(r, column) for r in known if getattr(r, column)]
        if rows:
            found[f"peak_{key}"] = [max(col) for col in zip(*rows)]
            if column.endswith("percent"):
                found[f"mean_{key}"] = [round(sum(col) / len(col), 1) for col in zip(*rows)]
    summary["tpu"] = found
    return series  # type: ignore[return-value]
