"""Flax NNX graph state: an nnx.Module with BatchNorm (state updated in place), trained with
nnx.Optimizer, nnx.value_and_grad and nnx.jit, as Flax's NNX MNIST tutorial does. The bug: a cosine
similarity loss divides by the norm of the target embedding, and one target is all zeros."""
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx


class Model(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.linear = nnx.Linear(4, 8, rngs=rngs)
        self.norm = nnx.BatchNorm(8, rngs=rngs)
        self.out = nnx.Linear(8, 3, rngs=rngs)

    def __call__(self, x):
        return self.out(nnx.relu(self.norm(self.linear(x))))


def loss_fn(model, x, y):
    pred = model(x)
    norms = jnp.linalg.norm(pred, axis=-1) * jnp.linalg.norm(y, axis=-1)
    return 1.0 - jnp.mean(jnp.sum(pred * y, axis=-1) / norms)  # NaN: 0 / 0 for a zero target


@nnx.jit
def train_step(model, optimizer, x, y):
    loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
    optimizer.update(model, grads)
    return loss


def main(steps=4):
    rng = np.random.default_rng(0)
    model = Model(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    for step in range(steps):
        x = rng.normal(size=(8, 4)).astype(np.float32)
        y = rng.normal(size=(8, 3)).astype(np.float32)
        if step == 2:
            y[6] = 0.0  # an example without a target embedding
        loss = train_step(model, optimizer, jnp.asarray(x), jnp.asarray(y))
    return float(loss)


if __name__ == "__main__":
    print(main())
