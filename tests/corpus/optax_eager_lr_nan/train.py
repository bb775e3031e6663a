"""A linear regression trained with Optax the way its quick-start does it: the loss and gradient are
jitted, the update is applied eagerly in the Python loop (``optimizer.update`` and
``optax.apply_updates`` outside jit). The bug: the learning rate is far too high for the unscaled
features, so every eager update multiplies the weights by ~-10. The loss overflows to inf first (call 15,
and it is never fed back); the weights keep growing until the gradient of the prediction overflows (call
32), and the next eager update adds -inf to an infinite weight: NaN."""
import jax
import jax.numpy as jnp
import numpy as np
import optax


def predict(params, x):
    return x @ params["w"] + params["b"]  # its gradient overflows once the weights are ~1e36


def mse(params, x, y):
    return jnp.mean((predict(params, x) - y) ** 2)


loss_and_grad = jax.jit(jax.value_and_grad(mse))


def synthetic_housing(rng, n=256):
    # Unscaled features (rooms, age in decades, distance in km): no standardisation before training.
    x = np.stack([rng.integers(1, 8, n), rng.uniform(0, 10, n), rng.uniform(0, 30, n)], 1).astype(np.float32)
    y = x @ np.array([[25.0], [-3.0], [-1.5]], np.float32) + 100 + rng.normal(0, 5, (n, 1)).astype(np.float32)
    return jnp.asarray(x), jnp.asarray(y)


if __name__ == "__main__":
    x, y = synthetic_housing(np.random.default_rng(0))
    params = {"w": jnp.zeros((3, 1)), "b": jnp.zeros(1)}
    optimizer = optax.sgd(learning_rate=0.02)  # the bug: far too high for unscaled features
    opt_state = optimizer.init(params)
    for step in range(200):
        loss, grads = loss_and_grad(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)  # the NaN: applied eagerly, inf + (-inf)
        if step % 10 == 0:
            print(step, float(loss))
