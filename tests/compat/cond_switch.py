"""cond / switch: a per-layer activation picked by lax.switch from a config index, and a lax.cond that
skips the update on a flagged batch, as mixture-of-experts routers and gradient-skipping steps do. The bug:
activation 2 is a log "compression" that a negative pre-activation breaks."""
import jax
import jax.numpy as jnp
import numpy as np

ACTIVATIONS = [jax.nn.relu, jnp.tanh, lambda x: jnp.log(x + 1.0)]  # NaN: log of x + 1 < 0


@jax.jit
def train_step(w, x, kind, skip):
    def loss_fn(w):
        h = jax.lax.switch(kind, ACTIVATIONS, x @ w)
        return (h ** 2).mean()

    loss, grad = jax.value_and_grad(loss_fn)(w)
    w = jax.lax.cond(skip, lambda: w, lambda: w - 0.01 * grad)
    return w, loss


def main(steps=4):
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.uniform(0.1, 0.2, size=(4, 4)), jnp.float32)
    for step in range(steps):
        x = rng.uniform(0.0, 1.0, size=(2, 4)).astype(np.float32)
        if step == 2:
            x[0] = -20.0  # an unnormalised batch
        w, loss = train_step(w, x, jnp.int32(2), jnp.bool_(False))
    return float(loss)


if __name__ == "__main__":
    print(main())
