"""Data-parallel Poisson regression with `jax.pmap`, as JAX's pmap tutorial writes a training step: the batch
is reshaped to (devices, per device, ...), each device computes its gradient and `lax.pmean` averages them
over the "batch" axis. The bug: the model forgot the exponential link, so the predicted rate `x @ w` can be
negative, and the Poisson loss takes its log: NaN on the device whose batch holds a negative feature row
(the third), at the first step.

Run alone it uses 8 CPU devices; under pytest, the 4 that tests/conftest.py gives."""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
import jax
import jax.numpy as jnp
import numpy as np

PER_DEVICE, FEATURES = 16, 4


def loss_fn(w, x, counts):
    rate = x @ w  # the model forgot jnp.exp: a rate must be positive
    return jnp.mean(rate - counts * jnp.log(rate))  # the NaN: log of a negative rate


def train_step(w, x, counts):
    loss, grad = jax.value_and_grad(loss_fn)(w, x, counts)
    grad = jax.lax.pmean(grad, axis_name="batch")
    return w - 0.01 * grad, jax.lax.pmean(loss, axis_name="batch")


p_train_step = jax.pmap(train_step, axis_name="batch", in_axes=(None, 0, 0))

if __name__ == "__main__":
    n = jax.local_device_count()
    rng = np.random.default_rng(0)
    x = rng.uniform(0.5, 2.0, size=(n, PER_DEVICE, FEATURES)).astype(np.float32)
    counts = rng.poisson(3.0, size=(n, PER_DEVICE)).astype(np.float32)
    x[2, 5] = -x[2, 5]  # one row of the third device's batch has negative features
    w = jnp.ones(FEATURES)
    for step in range(3):
        w, loss = p_train_step(w, jnp.asarray(x), jnp.asarray(counts))
        w = w[0]
        print(step, loss)
