"""Device peaks (FLOP/s and memory bandwidth) and the rates a function achieves against them.

GPU and TPU parts come from a small table of published dense peaks, matched on ``device_kind``. A CPU
has no useful datasheet number (cores, clocks and vector units vary), so its peak is measured once per
run by a calibration: a jitted f32 matmul for FLOP/s and a large elementwise pass for bandwidth.

Example:
    >>> peak = table_peak("NVIDIA H100 80GB HBM3", "bf16")
    >>> peak.flops_per_s, peak.bytes_per_s
    (989000000000000.0, 3350000000000.0)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jaxdbg.profile.model import Bound, Rates


@dataclass(frozen=True)
class Peak:
    flops_per_s: float | None
    bytes_per_s: float | None
    source: str


# (substring of device_kind, name, {dtype class: dense FLOP/s}, memory bytes/s). The first match wins, so
# specific names come before general ones. f32 on GPUs is the non-tensor-core rate; TPUs run f32 matmuls
# through bf16 passes, so one number serves both.
_TABLE = [
    ("H200", "NVIDIA H200", {"bf16": 989e12, "f32": 67e12}, 4.8e12),
    ("H100 PCIe", "NVIDIA H100 PCIe", {"bf16": 756e12, "f32": 51e12}, 2.0e12),
    ("H100", "NVIDIA H100", {"bf16": 989e12, "f32": 67e12}, 3.35e12),
    ("B200", "NVIDIA B200", {"bf16": 2250e12, "f32": 75e12}, 8.0e12),
    ("A100-SXM4-40GB", "NVIDIA A100 40GB", {"bf16": 312e12, "f32": 19.5e12}, 1.555e12),
    ("A100", "NVIDIA A100 80GB", {"bf16": 312e12, "f32": 19.5e12}, 2.039e12),
    ("L4", "NVIDIA L4", {"bf16": 121e12, "f32": 30.3e12}, 0.3e12),
    ("A10", "NVIDIA A10", {"bf16": 125e12, "f32": 31.2e12}, 0.6e12),
    ("V100", "NVIDIA V100", {"bf16": 125e12, "f32": 15.7e12}, 0.9e12),
    ("T4", "NVIDIA T4", {"bf16": 65e12, "f32": 8.1e12}, 0.32e12),
    ("TPU v6", "TPU v6e", {"bf16": 918e12, "f32": 918e12}, 1.64e12),
    ("TPU v5p", "TPU v5p", {"bf16": 459e12, "f32": 459e12}, 2.765e12),
    ("TPU v5 lite", "TPU v5e", {"bf16": 197e12, "f32": 197e12}, 0.819e12),
    ("TPU v5e", "TPU v5e", {"bf16": 197e12, "f32": 197e12}, 0.819e12),
    ("TPU v4", "TPU v4", {"bf16": 275e12, "f32": 275e12}, 1.2e12),
    ("TPU v3", "TPU v3", {"bf16": 123e12, "f32": 123e12}, 0.9e12),
]


def table_peak(device_kind: str, dtype_class: str = "bf16") -> Peak | None:
    """The published peak of a GPU/TPU part, or None for parts not in the table."""
    for needle, name, flops, bandwidth in _TABLE:
        if needle.lower() in (device_kind or "").lower():
            cls = dtype_class if dtype_class in flops else "bf16"
            return Peak(flops[cls], bandwidth, f"table: {name} ({cls})")
    return None


def dtype_class(dtypes: list[str]) -> str:
    """'bf16' when the arguments are 16-bit floats, else 'f32' (the peak to compare against)."""
    return "bf16" if dtypes and all(d in ("bf16", "f16") for d in dtypes) else "f32"


def calibrate_cpu(size: int = 512, repeats: int = 5) -> Peak:
    """Measure this CPU's matmul FLOP/s and memory read bandwidth with jitted programs (best of ``repeats``).

    Bandwidth is read with row sums over 32 MiB (past the caches): an elementwise pass would mostly measure
    the page faults of its fresh output buffer, several times slower than the memory itself.
    """
    import jax
    import jax.numpy as jnp

    a = jnp.ones((size, size), jnp.float32)
    matmul = jax.jit(lambda x, y: x @ y)
    flops = 2.0 * size**3 / _best(lambda: matmul(a, a), repeats)
    big = jnp.ones((1024, 8 * 1024), jnp.float32)  # 32 MiB
    rows = jax.jit(lambda x: x.sum(axis=1))
    bandwidth = big.nbytes / _best(lambda: rows(big), repeats)
    return Peak(flops, bandwidth, f"calibrated on this CPU ({size}x{size} f32 matmul, 32 MiB read)")


def _best(run: Callable[[], Any], repeats: int) -> float:
    run().block_until_ready()  # compile and warm up
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run().block_until_ready()
        best = min(best, time.perf_counter() - started)
    return max(best, 1e-9)


def achieved_rates(cost: dict | None, median_s: float | None, peak: Peak | None) -> Rates | None:
    """FLOP/s, bytes/s and arithmetic intensity at the median time, as fractions of ``peak`` when known."""
    if not cost or not median_s:
        return None
    flops = cost.get("flops")
    nbytes = cost.get("bytes_accessed")
    flops_rate = flops / median_s if flops else None
    bytes_rate = nbytes / median_s if nbytes else None
    intensity = flops / nbytes if flops and nbytes else None
    peak_flops = peak.flops_per_s if peak else None
    peak_bytes = peak.bytes_per_s if peak else None
    bound: Bound | None = None
    if intensity and peak_flops and peak_bytes:
        bound = "compute" if intensity >= peak_flops / peak_bytes else "memory"
    return Rates(
        flops_rate, bytes_rate, intensity, peak_flops, peak_bytes,
        flops_rate / peak_flops if flops_rate and peak_flops else None,
        bytes_rate / peak_bytes if bytes_rate and peak_bytes else None,
        peak.source if peak else "unknown", bound,
    )
