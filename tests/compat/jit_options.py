"""jit: a nested jitted layer, a static argument and donated parameters, as JAX's jit tutorial and the
Optax quick start write a training step. The bug: the config's epsilon is 0.0 (a static argument), and a
batch holds an all-zero row (padding), so the layer norm divides 0 by sqrt(0 + 0)."""
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

EPS = 0.0  # the bug: read from a config where someone set it to 0


@partial(jax.jit, static_argnames=("eps",))
def layer_norm(x, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + eps)  # NaN: 0 / 0 on a zero row


def loss_fn(params, x, y, eps):
    h = layer_norm(x @ params["w"], eps=eps)
    return ((h @ params["v"] - y) ** 2).mean()


@partial(jax.jit, static_argnames=("eps",), donate_argnums=(0,))
def train_step(params, x, y, eps):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y, eps)
    return jax.tree.map(lambda p, g: p - 0.05 * g, params, grads), loss


def main(steps=4):
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(size=(6, 8)), jnp.float32),
              "v": jnp.asarray(rng.normal(size=(8, 1)), jnp.float32)}
    for step in range(steps):
        x = rng.normal(size=(4, 6)).astype(np.float32)
        if step == 2:
            x[1] = 0.0  # a padding row
        params, loss = train_step(params, jnp.asarray(x), jnp.ones((4, 1)), eps=EPS)
    return float(loss)


if __name__ == "__main__":
    print(main())
