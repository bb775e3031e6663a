"""A jitted step that calls a host function through `jax.pure_callback`; the host code crashes the process.

`host_histogram` stands in for a native extension: on a negative input it dereferences a null pointer
(through ctypes), so the whole Python process dies with SIGSEGV in the middle of the jitted computation.
No exception, no traceback: only faulthandler's stack of the crash.
"""
import ctypes

import jax
import jax.numpy as jnp
import numpy as np

BINS = 8


def host_histogram(values):
    values = np.asarray(values)
    if (values < 0).any():
        ctypes.string_at(0)  # the "native library" reads a null pointer: SIGSEGV
    counts, _ = np.histogram(values, bins=BINS, range=(0.0, 1.0))
    return counts.astype(np.float32)


@jax.jit
def step(x, w):
    h = jnp.tanh(x @ w)
    counts = jax.pure_callback(host_histogram, jax.ShapeDtypeStruct((BINS,), jnp.float32), h)
    return h.sum() + counts.sum()


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((4, 16)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((16, 16)), jnp.float32)
    for i in range(3):
        print("step", i, float(step(x, w)))
