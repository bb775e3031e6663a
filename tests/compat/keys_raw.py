"""Raw uint32 PRNG keys (jax.random.PRNGKey), as Flax Linen programs pass them in rngs: dropout in a jitted
step whose key comes in as an argument. The bug: dropout's rescaling divides by the keep probability, and
a schedule drives the dropout rate to 1.0, so kept / 0.0 makes Inf and NaN."""
import jax
import jax.numpy as jnp
import numpy as np


def dropout(key, x, rate):
    keep = 1.0 - rate
    mask = jax.random.bernoulli(key, 0.5, x.shape)
    return jnp.where(mask, x / keep, 0.0)  # NaN: x / 0 once the rate reaches 1


@jax.jit
def train_step(w, key, x, rate):
    def loss_fn(w):
        h = dropout(key, jnp.tanh(x @ w), rate)
        return (h.sum(-1) - 1.0).mean() ** 2

    loss, grad = jax.value_and_grad(loss_fn)(w)
    return w - 0.1 * grad, loss


def main(steps=4):
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.normal(size=(4, 4)), jnp.float32)
    key = jax.random.PRNGKey(0)
    for step in range(steps):
        key, sub = jax.random.split(key)
        x = rng.normal(size=(2, 4)).astype(np.float32)
        w, loss = train_step(w, sub, x, jnp.float32(min(1.0, 0.5 * step)))
    return float(loss)


if __name__ == "__main__":
    print(main())
