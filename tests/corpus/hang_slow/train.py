"""Merely slow, not stuck: every step is one long computation (a loop of matmuls, sized at start to take
about SLOW_S seconds on this machine) and the host prepares each batch with a slow pure-Python loop (about
SLOW_S seconds of CPU). Nothing waits: `jaxdbg hang-hunt train.py --stall 1.5` must let it finish."""
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

SLOW_S = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0


@jax.jit
def step(w, n):
    return jax.lax.fori_loop(0, n, lambda i, w: jnp.tanh(w @ w) * 0.5, w)


def slow_batch(seconds):
    total, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:  # a decoder in pure Python
        total += sum(i * 0.5 for i in range(1000))
    return np.full((256, 256), total % 1.0, np.float32)


w = jnp.eye(256) * 0.5
started = time.perf_counter()
step(w, 20).block_until_ready()
n = max(20, int(20 * SLOW_S / max(time.perf_counter() - started, 1e-3)))  # about SLOW_S seconds a step
for i in range(2):
    w = step(w + slow_batch(SLOW_S), n)
    w.block_until_ready()
print(float(w.sum()))
