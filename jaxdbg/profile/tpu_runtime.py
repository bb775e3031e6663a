"""The TPU runtime's own figures for ``--monitor``: TensorCore duty cycle, HBM in use and its capacity, HBM
bandwidth utilisation, and TensorCore utilisation where libtpu's SDK offers it.

libtpu serves these over a gRPC runtime-metrics service on localhost (port 8431 by default); tpu-info
(``pip install 'jaxdbg[tpu]'``) holds its client and generated protocol modules, which this module calls.
TensorCore utilisation is read in-process from ``libtpu.sdk`` (the process that holds the TPU).
``JAXDBG_TPU_METRICS_ADDR`` names another address (and turns the reading on whatever the backend: the
tests point it at a local gRPC stand-in speaking the same service). Without tpu-info, or off TPU, nothing
is read. Only the stand-in has answered this code so far: it has never run on a TPU host.

Example:
    >>> import os
    >>> address() if "JAXDBG_TPU_METRICS_ADDR" not in os.environ else None   # no TPU, no address set
"""

from __future__ import annotations

import os
from typing import NamedTuple

ADDRESS_VARIABLE = "JAXDBG_TPU_METRICS_ADDR"
DEFAULT_ADDRESS = "localhost:8431"


class TpuReading(NamedTuple):
    """One sample, one entry per TPU device (None: the runtime did not give that figure)."""

    duty_cycle_percent: tuple[float, ...]
    hbm_bytes_in_use: tuple[int, ...]
    hbm_total_bytes: tuple[int, ...]
    hbm_bandwidth_percent: tuple[float, ...] | None
    tensorcore_util_percent: tuple[float, ...] | None


def address() -> str | None:
    """Where to ask, or None when there is nothing to ask (no tpu-info, no TPU backend, no address set)."""
    explicit = os.environ.get(ADDRESS_VARIABLE)
    try:
        import tpu_info.metrics  # noqa: F401
    except ImportError:
        return None
    if explicit:
        return explicit
    from jaxdbg._compat import backend_started

    if not backend_started():  # never start jax's backend from the monitor thread
        return None
    import jax

    return DEFAULT_ADDRESS if jax.default_backend() == "tpu" else None


def read(addr: str) -> TpuReading:
    """Ask the runtime-metrics service at ``addr`` (raises grpc.RpcError when it does not answer)."""
    from tpu_info import metrics

    usage = _usage(metrics, addr)
    try:
        bandwidth: tuple[float, ...] | None = tuple(value for _, value in metrics.get_runtime_hbm_utilization(addr))
    except Exception:  # noqa: BLE001 - older libtpu: no bandwidth metric (gRPC NOT_FOUND/UNIMPLEMENTED)
        bandwidth = None
    return TpuReading(
        tuple(float(u.duty_cycle_pct) for u in usage), tuple(int(u.memory_usage) for u in usage),
        tuple(int(u.total_memory) for u in usage), bandwidth or None, _tensorcore_util(),
    )


def _usage(metrics, addr: str) -> list:
    """Per-device usage; tpu-info's newer call needs no chip type (the older one repeats per-chip duty cycles)."""
    if hasattr(metrics, "get_chip_usage_new"):
        return list(metrics.get_chip_usage_new(None, addr=addr))
    from tpu_info import device

    chip_type, _ = device.get_local_chips()
    return list(metrics.get_chip_usage(chip_type, addr=addr))


def _tensorcore_util() -> tuple[float, ...] | None:
    """libtpu's in-process ``tensorcore_util`` metric (percent per core), where this libtpu has its SDK."""
    try:
        from libtpu import sdk

        monitoring = getattr(sdk, "tpumonitoring", None) or sdk.monitoring
        return tuple(float(v) for v in monitoring.get_metric("tensorcore_util").data())
    except Exception:  # noqa: BLE001 - no libtpu, no SDK, or a libtpu without the metric
        return None
