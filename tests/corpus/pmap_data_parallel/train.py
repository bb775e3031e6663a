"""Data-parallel training with ``jax.pmap``, written the way JAX's pmap cookbook does it: the parameters are
replicated (one copy per device, stacked on a leading axis), every batch is split over the devices, and the
pmapped ``update`` averages the gradients with ``lax.pmean`` before the SGD step. A small MLP regression on
synthetic data held by NumPy; each step's batch is a NumPy array reshaped to ``(devices, per_device, ...)``.

What profile must say: ``update`` is a pmap'd function (its name and line, not an eager ``jit(_fun)``); it
compiles twice, because the first call gets the replicated parameters on one device (``jnp.stack`` makes them
there) and every later call gets ``update``'s own outputs, already split over the devices (a sharding change,
which ``jax_explain_cache_misses`` does not mention); every call is counted and timed, and the captured ones
per device. Replicating with ``jax.device_put(params, <the pmap's sharding>)`` would save the second compile.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np

STEPS = 16


def init_mlp(key, sizes):
    keys = jax.random.split(key, len(sizes) - 1)
    return [(jax.random.normal(k, (m, n)) / np.sqrt(m), jnp.zeros(n)) for k, m, n in zip(keys, sizes[:-1], sizes[1:])]


def loss_fn(params, xs, ys):
    for w, b in params[:-1]:
        xs = jnp.tanh(xs @ w + b)
    w, b = params[-1]
    return jnp.mean((xs @ w + b - ys) ** 2)


@functools.partial(jax.pmap, axis_name="devices")
def update(params, xs, ys):
    loss, grads = jax.value_and_grad(loss_fn)(params, xs, ys)
    grads = jax.lax.pmean(grads, axis_name="devices")  # the all-reduce
    loss = jax.lax.pmean(loss, axis_name="devices")
    return jax.tree.map(lambda p, g: p - 0.05 * g, params, grads), loss


def split(array, devices):
    """(batch, ...) -> (devices, batch // devices, ...)"""
    return array.reshape(devices, array.shape[0] // devices, *array.shape[1:])


if __name__ == "__main__":
    devices = jax.local_device_count()
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(STEPS * 256, 16)).astype(np.float32)
    ys = np.sin(xs.sum(axis=1, keepdims=True)).astype(np.float32)
    params = init_mlp(jax.random.key(0), [16, 64, 64, 1])
    replicated = jax.tree.map(lambda p: jnp.stack([p] * devices), params)
    for step in range(STEPS):
        batch = slice(step * 256, (step + 1) * 256)
        replicated, loss = update(replicated, split(xs[batch], devices), split(ys[batch], devices))
        if step % 4 == 3:
            print(f"step {step}: loss {float(loss[0]):.4f}")
