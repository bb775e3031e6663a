"""vmap: per-example gradients clipped to a norm, the DP-SGD step of JAX's autodiff cookbook and Optax's
differentially private examples (jax.vmap of jax.grad). The bug: the clipping divides each example's
gradient by its norm; an all-zero padding example has a zero gradient, and 0 / 0 is NaN."""
import jax
import jax.numpy as jnp
import numpy as np


def loss_fn(w, x, y):
    return (jnp.dot(x, w) - y) ** 2


def clip(g, max_norm=1.0):
    norm = jnp.sqrt(jnp.sum(g ** 2))
    return g * (jnp.minimum(norm, max_norm) / norm)  # NaN: 0 / 0 for a zero gradient


@jax.jit
def train_step(w, x, y):
    grads = jax.vmap(jax.grad(loss_fn), in_axes=(None, 0, 0))(w, x, y)
    clipped = jax.vmap(clip)(grads)
    return w - 0.1 * clipped.mean(0)


def main(steps=4):
    rng = np.random.default_rng(0)
    w = jnp.zeros((5,))
    for step in range(steps):
        x = rng.normal(size=(8, 5)).astype(np.float32)
        y = rng.normal(size=(8,)).astype(np.float32)
        if step == 2:
            x[3], y[3] = 0.0, 0.0  # a padding example: its gradient is exactly zero
        w = train_step(w, x, y)
    return float(w.sum())


if __name__ == "__main__":
    print(main())
