"""shard_map manual over one mesh axis and automatic over the other (axis_names={"data"}), inside jit, as
JAX's shard_map tutorial mixes the two: the model axis is left to the compiler. The bug: a per-shard
log-likelihood takes the log of a variance estimate that a corrupt shard makes negative."""
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

MESH = Mesh(np.array(jax.devices()).reshape(-1, 2), ("data", "model"))


@partial(jax.shard_map, mesh=MESH, in_specs=(P(), P("data")), out_specs=P(), axis_names={"data"})
def nll(var, x):
    scale = var * jnp.ones(x.shape[-1])
    local = jnp.mean(x ** 2 / scale + jnp.log(scale))  # NaN: log of a negative variance
    return jax.lax.pmean(local, "data")


@jax.jit
def train_step(var, x):
    loss, grad = jax.value_and_grad(nll)(var, x)
    return var - 0.5 * grad, loss


def main(steps=4):
    rows = MESH.shape["data"] * 2
    rng = np.random.default_rng(0)
    var = jax.device_put(jnp.float32(1.0), NamedSharding(MESH, P()))  # replicated, as the step returns it
    sharding = NamedSharding(MESH, P("data", "model"))
    for step in range(steps):
        x = rng.normal(size=(rows, 4)).astype(np.float32)
        var, loss = train_step(var, jax.device_put(x, sharding))
        if step == 1:
            var = -var  # the bug: a sign flipped by a schedule that restarts
    return float(loss)


if __name__ == "__main__":
    print(main())
