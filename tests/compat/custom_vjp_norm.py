"""custom_vjp: a hand-written norm with its own backward rule, as JAX's custom derivative tutorial defines
rules for numerically delicate functions. The bug: the backward rule divides by the norm, which is 0 for
an all-zero feature row (the forward pass is fine)."""
import jax
import jax.numpy as jnp
import numpy as np


@jax.custom_vjp
def row_norm(x):
    return jnp.sqrt(jnp.sum(x * x, axis=-1))


def row_norm_fwd(x):
    norm = row_norm(x)
    return norm, (x, norm)


def row_norm_bwd(res, g):
    x, norm = res
    return (g[:, None] * x / norm[:, None],)  # NaN (backward): 0 / 0 for a zero row


row_norm.defvjp(row_norm_fwd, row_norm_bwd)


@jax.jit
def train_step(w, x):
    def loss_fn(w):
        return (row_norm(x @ w) - 1.0).mean() ** 2

    loss, grad = jax.value_and_grad(loss_fn)(w)
    return w - 0.1 * grad, loss


def main(steps=4):
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.normal(size=(4, 3)), jnp.float32)
    for step in range(steps):
        x = rng.normal(size=(5, 4)).astype(np.float32)
        if step == 1:
            x[2] = 0.0  # a padding row
        w, loss = train_step(w, x)
    return float(loss)


if __name__ == "__main__":
    print(main())
