"""shard_map over every axis (manual): per-device loss and psum of the totals, as in JAX's shard_map
tutorial's data-parallel example; the squared error is taken as the norm of the masked residual
(jnp.linalg.norm, itself a jitted jnp function). The bug: each shard normalises its loss by its own count
of real examples; one shard of the third batch is all padding, so it divides 0 by 0."""
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

MESH = Mesh(np.array(jax.devices()), ("data",))


@partial(jax.shard_map, mesh=MESH, in_specs=(P(), P("data"), P("data"), P("data")), out_specs=P())
def sharded_loss(w, x, y, mask):
    residual = (x @ w - y) * mask
    local = jnp.linalg.norm(residual) ** 2 / mask.sum()  # NaN: a shard with no real example
    return jax.lax.pmean(local, "data")


@jax.jit
def train_step(w, x, y, mask):
    loss, grad = jax.value_and_grad(sharded_loss)(w, x, y, mask)
    return w - 0.1 * grad, loss


def main(steps=4):
    n = jax.device_count()
    rng = np.random.default_rng(0)
    w = jnp.full((3,), 0.1)
    for step in range(steps):
        x = rng.normal(size=(2 * n, 3)).astype(np.float32)
        y = rng.normal(size=(2 * n,)).astype(np.float32)
        mask = np.ones(2 * n, np.float32)
        if step == 2:
            mask[-2:] = 0.0  # the last shard is all padding
        w, loss = train_step(w, x, y, jnp.asarray(mask))
    return float(loss)


if __name__ == "__main__":
    print(main())
