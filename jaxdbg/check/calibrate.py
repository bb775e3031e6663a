"""A fixed workload timed on each machine, so figures from two machines compare as ratios to it.

``python -m jaxdbg.check.calibrate`` prints ``{"compile_s": .., "execute_s": ..}``: the time to compile a
small fixed jitted function and the median time of a jitted 256x256 matmul, on the default backend.
:func:`jaxdbg.check.baseline.compare_check` divides a figure's change by the change of these.

Example:
    >>> figures = calibrate(calls=5)
    >>> sorted(figures), figures["execute_s"] > 0 and figures["compile_s"] > 0
    (['compile_s', 'execute_s'], True)
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time


def calibrate(calls: int = 30) -> dict[str, float]:
    """Time the fixed workload in this process (imports jax)."""
    import jax
    import jax.numpy as jnp

    def workload(x):
        for _ in range(4):
            x = jnp.tanh(x @ x) + 0.5 * x
        return x.sum()

    x = jnp.full((256, 256), 1.0 / 256, dtype=jnp.float32)
    start = time.perf_counter()
    compiled = jax.jit(workload).lower(x).compile()
    compile_s = time.perf_counter() - start
    compiled(x).block_until_ready()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        compiled(x).block_until_ready()
        times.append(time.perf_counter() - start)
    return {"compile_s": compile_s, "execute_s": statistics.median(times)}


def calibrate_in_child(timeout_s: float = 120.0) -> dict[str, float]:
    """The workload timed in a fresh process, as the checks' own commands run (this one keeps jax unloaded)."""
    done = subprocess.run([sys.executable, "-m", "jaxdbg.check.calibrate"], capture_output=True, text=True,
                          timeout=timeout_s, check=True)
    return {k: float(v) for k, v in json.loads(done.stdout).items()}


if __name__ == "__main__":
    print(json.dumps(calibrate()))
