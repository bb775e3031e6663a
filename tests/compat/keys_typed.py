"""Typed PRNG keys (jax.random.key): a VAE-style reparameterised sample, the key split each step and passed
into the jitted step, as JAX's and Flax's VAE examples thread it. The bug: the encoder predicts a variance
(not a log-variance) without a softplus, and sqrt of a negative variance is NaN."""
import jax
import jax.numpy as jnp
import numpy as np


@jax.jit
def train_step(params, key, x):
    def loss_fn(p):
        mean, var = x @ p["mu"], x @ p["var"]
        z = mean + jnp.sqrt(var) * jax.random.normal(key, mean.shape)  # NaN: sqrt of a negative variance
        return ((z @ p["dec"] - x) ** 2).mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), loss


def main(steps=4):
    rng = np.random.default_rng(0)
    params = {"mu": jnp.asarray(rng.normal(size=(4, 2)), jnp.float32),
              "var": jnp.full((4, 2), 0.2, jnp.float32),
              "dec": jnp.asarray(rng.normal(size=(2, 4)), jnp.float32)}
    key = jax.random.key(0)
    for step in range(steps):
        key, sub = jax.random.split(key)
        x = rng.uniform(0.0, 1.0, size=(3, 4)).astype(np.float32)
        if step == 2:
            x[0] = -5.0  # a corrupt example: its predicted variance is negative
        params, loss = train_step(params, sub, jnp.asarray(x))
    return float(loss)


if __name__ == "__main__":
    print(main())
