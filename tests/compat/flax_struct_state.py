"""Flax struct dataclasses: a Linen MLP trained with flax.training.train_state.TrainState (a
flax.struct.dataclass holding params, the Optax optimizer state and the apply function as a static field),
as Flax's Linen examples train. The bug: a log-scale regression loss takes log of the labels, and one
batch holds a negative label."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn
from flax import struct
from flax.training import train_state


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(8)(x))
        return nn.Dense(1)(x)[..., 0]


@struct.dataclass
class Batch:
    x: jax.Array
    y: jax.Array
    source: str = struct.field(pytree_node=False, default="train")


@jax.jit
def train_step(state, batch):
    def loss_fn(params):
        pred = state.apply_fn({"params": params}, batch.x)
        return ((pred - jnp.log(batch.y)) ** 2).mean()  # NaN: log of a negative label

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss


def main(steps=4):
    rng = np.random.default_rng(0)
    model = MLP()
    params = model.init(jax.random.PRNGKey(0), jnp.ones((1, 4)))["params"]
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-2))
    for step in range(steps):
        y = rng.uniform(1.0, 5.0, size=8).astype(np.float32)
        if step == 2:
            y[5] = -1.0  # a sentinel for "missing" left in the labels
        state, loss = train_step(state, Batch(jnp.asarray(rng.normal(size=(8, 4)), jnp.float32), jnp.asarray(y)))
    return float(loss)


if __name__ == "__main__":
    print(main())
