"""The usual evaluation and training pair compiled from one loss: ``eval_loss = jax.jit(loss)`` beside
``train = jax.jit(jax.value_and_grad(loss))`` (two programs, both named ``loss``), the update applied eagerly.
The bug: a learning-rate warmup that doubles the step every iteration and was never capped. Past the stable
step SGD diverges: the held-out loss overflows to Inf (call 17), the weights keep growing until the update
overflows them to +-Inf, and the next prediction adds products of both signs: inf + (-inf) is NaN. Which
operation of that chain makes the NaN first (the prediction, its gradient, or the update) is the CPU's
arithmetic, so the matrix accepts each of them."""
import jax
import jax.numpy as jnp
import numpy as np


def loss(w, x, y):
    pred = x @ w  # NaN: inf + (-inf) in the dot of diverged weights (forward, or backward)
    return jnp.mean((pred - y) ** 2)  # Inf: the squared error overflows float32


eval_loss = jax.jit(loss)
train = jax.jit(jax.value_and_grad(loss))


def main(steps=24):
    rng = np.random.default_rng(0)
    x, x_val = (jnp.asarray(rng.normal(size=(16, 4)), jnp.float32) for _ in range(2))
    w_true = jnp.asarray(rng.normal(size=4), jnp.float32)
    y, y_val = x @ w_true, x_val @ w_true
    w, lr = jnp.zeros(4, jnp.float32), 0.01
    for _ in range(steps):
        value, grad = train(w, x, y)
        w = w - lr * grad  # update: applied eagerly
        lr = lr * 2.0  # the bug: a warmup never capped
        held_out = eval_loss(w, x_val, y_val)
    return float(value), float(held_out)


if __name__ == "__main__":
    print(main())
