"""Ahead-of-time compilation: the step lowered and compiled once (``jax.jit(f).lower(...).compile()``, with
``jax.ShapeDtypeStruct`` placeholders for the batch), then the ``Compiled`` called in the loop, as serving code
and benchmarks write it. The bug: a Poisson regression takes log of the raw predicted rate, and a corrupt
example at the third step makes the rate negative."""
import jax
import jax.numpy as jnp
import numpy as np


def loss_fn(w, x, y):
    rate = x @ w
    return jnp.mean(rate - y * jnp.log(rate))  # NaN: log of a negative rate


def train_step(w, x, y):
    loss, grad = jax.value_and_grad(loss_fn)(w, x, y)
    return w - 0.01 * grad, loss


def main(steps=4):
    rng = np.random.default_rng(0)
    w = jnp.full((3,), 0.5)
    batch = (jax.ShapeDtypeStruct((8, 3), jnp.float32), jax.ShapeDtypeStruct((8,), jnp.float32))
    compiled = jax.jit(train_step).lower(w, *batch).compile()
    for step in range(steps):
        x = rng.uniform(0.5, 1.5, size=(8, 3)).astype(np.float32)
        if step == 2:
            x[5] = -2.0  # a corrupt example
        y = rng.poisson(2.0, size=(8,)).astype(np.float32) + 1.0
        w, loss = compiled(w, x, y)
    return float(loss)


if __name__ == "__main__":
    print(main())
