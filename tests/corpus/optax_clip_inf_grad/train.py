"""Plain JAX + Optax Poisson regression (log link) with clip_by_global_norm in front of Adam, as the
recommended recipe goes. One batch holds an outlier row with unscaled features: exp(eta) overflows to Inf
there, the gradient is Inf, clip_by_global_norm's norm is Inf and its rescaling by max_norm / norm makes
inf / inf = NaN: clipping bounds large gradients, not infinite ones."""
import jax
import jax.numpy as jnp
import numpy as np
import optax


def loss_fn(params, x, y):
    eta = x @ params["w"] + params["b"]
    return jnp.mean(jnp.exp(eta) - y * eta)  # the bug: exp overflows on the outlier row


tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2))


@jax.jit
def step(params, opt_state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, opt_state = tx.update(grads, opt_state, params)  # the NaN: clipping an Inf gradient
    return optax.apply_updates(params, updates), opt_state, loss


if __name__ == "__main__":
    rng = np.random.default_rng(1)
    params = {"w": jnp.full(8, 0.1), "b": jnp.zeros(())}
    opt_state = tx.init(params)
    for i in range(4):
        x = rng.normal(size=(32, 8)).astype(np.float32)
        if i == 2:
            x[3] = 1e3  # an outlier row: a sensor that reported raw counts instead of z-scores
        y = rng.poisson(2.0, size=32).astype(np.float32)
        params, opt_state, loss = step(params, opt_state, x, y)
        print(i, float(loss))
