"""pmap: data-parallel training the way JAX's pmap examples write it (replicated parameters, one batch
shard per device, gradients averaged with lax.pmean). The bug: a Poisson regression takes log of the raw
predicted rate; one device's shard holds features that make the rate negative at the third step."""
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np


def loss_fn(w, x, y):
    rate = x @ w
    return jnp.mean(rate - y * jnp.log(rate))  # NaN: log of a negative rate


@partial(jax.pmap, axis_name="batch")
def train_step(w, x, y):
    loss, grad = jax.value_and_grad(loss_fn)(w, x, y)
    grad = jax.lax.pmean(grad, "batch")
    return w - 0.01 * grad, jax.lax.pmean(loss, "batch")


def main(steps=4):
    n = jax.local_device_count()
    rng = np.random.default_rng(0)
    w = jnp.full((n, 3), 0.5)  # one replica per device
    for step in range(steps):
        x = rng.uniform(0.5, 1.5, size=(n, 4, 3)).astype(np.float32)
        if step == 2:
            x[n - 1, 0] = -2.0  # the last device's shard: a corrupt example
        y = rng.poisson(2.0, size=(n, 4)).astype(np.float32) + 1.0
        w, loss = train_step(w, x, y)
    return float(loss[0])


if __name__ == "__main__":
    print(main())
