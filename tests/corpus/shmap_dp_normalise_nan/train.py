"""Data-parallel training with `jax.shard_map`, as JAX's shard_map tutorial writes it: the batch is split over
a 1-D mesh of every device, each device computes its loss and gradient on its shard, `lax.pmean` averages the
gradients. The features are L2-normalised inside the body with `jnp.linalg.norm` (itself a jitted jnp
function). The bug: the input pipeline pads the batch with all-zero rows, and one padding row lands in the
second device's shard: its norm is 0 and x / norm is 0 / 0 = NaN, on that device only.

Run alone it uses 8 CPU devices; under pytest, the 4 that tests/conftest.py gives."""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

ROWS_PER_DEVICE, FEATURES = 8, 16
mesh = jax.make_mesh((jax.device_count(),), ("data",))


def loss_fn(w, x, y):
    x = x / jnp.linalg.norm(x, axis=-1, keepdims=True)  # the bug: a zero (padding) row gives 0 / 0
    return jnp.mean((x @ w - y) ** 2)


@jax.jit
@partial(jax.shard_map, mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=(P(), P()))
def train_step(w, x, y):
    loss, grad = jax.value_and_grad(loss_fn)(w, x, y)
    return w - 0.1 * jax.lax.pmean(grad, "data"), jax.lax.pmean(loss, "data")


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    rows = ROWS_PER_DEVICE * jax.device_count()
    x = rng.normal(size=(rows, FEATURES)).astype(np.float32)
    y = rng.normal(size=(rows,)).astype(np.float32)
    x[ROWS_PER_DEVICE + 2] = 0.0  # a padding row, in the second device's shard
    shard = NamedSharding(mesh, P("data"))
    w = jnp.zeros(FEATURES)
    for step in range(3):
        w, loss = train_step(w, jax.device_put(x, shard), jax.device_put(y, shard))
        print(step, float(loss))
