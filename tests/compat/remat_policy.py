"""remat / checkpoint: a residual block under jax.checkpoint with a named-save policy
(checkpoint_name + save_only_these_names), as JAX's remat docs and Flax's nn.remat write it. The bug: a
norm penalty differentiates sqrt at 0 for an all-zero activation row, in the backward pass only."""
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

POLICY = jax.checkpoint_policies.save_only_these_names("hidden")


@partial(jax.checkpoint, policy=POLICY)
def block(w, x):
    h = checkpoint_name(jnp.tanh(x @ w), "hidden")
    penalty = jnp.sqrt(jnp.sum(h ** 2, axis=-1))  # NaN (backward): d sqrt at 0
    return h, penalty.mean()


@jax.jit
def train_step(w, x):
    def loss_fn(w):
        h, penalty = block(w, x)
        return (h.mean() - 1.0) ** 2 + 0.01 * penalty

    loss, grad = jax.value_and_grad(loss_fn)(w)
    return w - 0.1 * grad, loss


def main(steps=4):
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.uniform(0.1, 0.5, size=(4, 4)), jnp.float32)
    for step in range(steps):
        x = rng.uniform(0.1, 1.0, size=(3, 4)).astype(np.float32)
        if step == 2:
            x[1] = 0.0  # a padding row: its activations are exactly zero
        w, loss = train_step(w, x)
    return float(loss)


if __name__ == "__main__":
    print(main())
