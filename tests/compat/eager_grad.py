"""jax.value_and_grad called eagerly, outside any jit (every primitive of the forward and backward pass
dispatched on its own), as quick experiments and notebooks do, with only the optimiser's update jitted. The
bug: a metric-learning loss pulls an anchor towards its positive by their Euclidean distance
(``jnp.linalg.norm``); at the third step a duplicated example makes the distance exactly 0, where the forward
pass is finite but the derivative of sqrt is 0.5 / 0 = inf, and the backward pass multiplies it by 0."""
import jax
import jax.numpy as jnp
import numpy as np


def loss_fn(w, anchor, positive, negative):
    a, p, n = anchor @ w, positive @ w, negative @ w
    pull = jnp.linalg.norm(a - p, axis=-1)  # NaN (backward): d sqrt at 0
    push = jnp.maximum(1.0 - jnp.linalg.norm(a - n, axis=-1), 0.0)
    return jnp.mean(pull + push)


@jax.jit
def sgd_update(w, grad):
    return w - 0.1 * grad


def main(steps=4):
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.normal(size=(5, 3)), jnp.float32)
    for step in range(steps):
        anchor, positive, negative = (rng.normal(size=(4, 5)).astype(np.float32) for _ in range(3))
        if step == 2:
            positive[1] = anchor[1]  # a duplicated example
        loss, grad = jax.value_and_grad(loss_fn)(w, anchor, positive, negative)
        w = sgd_update(w, grad)
    return float(loss)


if __name__ == "__main__":
    print(main())
