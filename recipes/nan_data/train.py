"""A data loader that yields one corrupt batch (a NaN feature): the NaN comes in with the data."""
import jax
import jax.numpy as jnp
import numpy as np


def batches():
    rng = np.random.default_rng(0)
    for i in range(5):
        x = rng.normal(size=(8, 3)).astype(np.float32)
        if i == 2:
            x[5, 1] = np.nan  # a missing value in the raw data
        yield {"x": x, "y": x.sum(axis=1)}


def loss_fn(w, batch):
    return jnp.mean((batch["x"] @ w - batch["y"]) ** 2)


@jax.jit
def train_step(w, batch):
    loss, grad = jax.value_and_grad(loss_fn)(w, batch)
    return w - 0.05 * grad, loss


w = jnp.zeros(3)
for step, batch in enumerate(batches()):
    w, loss = train_step(w, batch)
    print(f"step {step}: loss {float(loss):.4f}")
