"""A jitted step that waits, through a host callback, for data a producer thread was supposed to supply.

`fetch_batch` blocks on an Event that only the producer sets, and the producer is never started (its
`start()` call was lost in a refactor), so the first jitted call hangs forever inside the callback.
"""
import threading

import jax
import jax.numpy as jnp
import numpy as np

ready = threading.Event()
buffer = {}


def producer():
    buffer["batch"] = np.ones((4, 8), np.float32)
    ready.set()


def fetch_batch(step):
    ready.wait()  # never set: the producer thread was never started
    return buffer["batch"] * np.float32(step)


@jax.jit
def train_step(w, step):
    batch = jax.pure_callback(fetch_batch, jax.ShapeDtypeStruct((4, 8), jnp.float32), step)
    return w - 0.1 * jnp.mean(batch @ w)


if __name__ == "__main__":
    thread = threading.Thread(target=producer, daemon=True)
    w = jnp.ones((8, 8), jnp.float32)
    for step in range(3):
        w = train_step(w, step)
    print("done", float(w.sum()))
