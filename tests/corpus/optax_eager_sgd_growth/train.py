"""Linear regression fit with Optax's SGD in a plain Python loop, with no jit anywhere (as a first try at JAX
often is: jax.value_and_grad, optimizer.update and optax.apply_updates all run eagerly). The parameters are one
array. The bug: the features are temperatures in degrees (20..40), never standardised, so a learning rate of
0.01 overshoots: the weights flip sign and grow ~10x per step, ~1e35x in all, until the gradient overflows
float32 and the next update adds -inf to an infinite weight: NaN."""
import jax
import jax.numpy as jnp
import numpy as np
import optax


def loss(w, x, y):
    return jnp.mean((x @ w - y) ** 2)


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    x = jnp.asarray(np.stack([rng.uniform(20, 40, 64), rng.uniform(20, 40, 64), np.ones(64)], 1), jnp.float32)
    y = x @ jnp.array([0.5, -0.2, 3.0]) + jnp.asarray(rng.normal(0, 0.1, 64), jnp.float32)
    w = jnp.zeros(3)
    optimizer = optax.sgd(learning_rate=0.01)  # the bug: far too high for unscaled features
    opt_state = optimizer.init(w)
    for step in range(100):
        value, grads = jax.value_and_grad(loss)(w, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, w)
        w = optax.apply_updates(w, updates)  # the NaN: inf + (-inf), after w grew every step
        if step % 10 == 0:
            print(step, float(value))
