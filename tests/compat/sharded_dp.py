"""Arrays sharded over 8 CPU devices: data-parallel jit with NamedSharding (the batch split over a 1-D mesh,
the parameters replicated), as JAX's "Distributed arrays and automatic parallelization" tutorial trains an
MLP. The bug: a per-example loss normalised by each target row's norm, one target row all zeros."""
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

MESH = Mesh(np.array(jax.devices()), ("batch",))


@jax.jit
def train_step(params, x, y):
    def loss_fn(params):
        h = jnp.tanh(x @ params["w1"]) @ params["w2"]
        scale = jnp.sqrt((y ** 2).sum(-1))
        return (((h - y) ** 2).sum(-1) / scale).mean()  # NaN: 0 / 0 for a padding example

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), loss


def main(steps=4):
    rng = np.random.default_rng(0)
    n = jax.device_count()
    replicated, rows = NamedSharding(MESH, P()), NamedSharding(MESH, P("batch"))
    params = jax.device_put({"w1": rng.normal(size=(4, 8)).astype(np.float32),
                             "w2": rng.normal(size=(8, 2)).astype(np.float32)}, replicated)
    for step in range(steps):
        x = rng.normal(size=(2 * n, 4)).astype(np.float32)
        y = rng.normal(size=(2 * n, 2)).astype(np.float32)
        if step == 2:
            x[-1], y[-1] = 0.0, 0.0  # the last device's second example: padding
        params, loss = train_step(params, jax.device_put(x, rows), jax.device_put(y, rows))
    return float(loss)


if __name__ == "__main__":
    print(main())
