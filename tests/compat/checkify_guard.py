"""checkify: a jitted step wrapped in jax.experimental.checkify with user checks (checkify.check on the
inputs), as JAX's checkify docs write it: jax.jit(checkify.checkify(f)), then err.throw(). The check
guards the learning rate, not the data; the bug: a log-likelihood takes log of a negative variance
estimate, which no user check covers."""
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify


def step(params, x, lr):
    checkify.check(lr > 0, "learning rate must be positive, got {lr}", lr=lr)

    def nll(params):
        var = params["var"] - jnp.mean(x) * 0.0 + params["shift"]
        return 0.5 * jnp.mean((x - params["mu"]) ** 2 / var + jnp.log(var))  # NaN: log of a negative var

    loss, grads = jax.value_and_grad(nll)(params)
    return jax.tree.map(lambda p, g: p - lr * g, params, grads), loss


checked_step = jax.jit(checkify.checkify(step, errors=checkify.user_checks))


def main(steps=4):
    rng = np.random.default_rng(0)
    params = {"mu": jnp.float32(0.0), "var": jnp.float32(1.0), "shift": jnp.float32(0.0)}
    for step_index in range(steps):
        x = rng.normal(size=(16,)).astype(np.float32)
        if step_index == 2:
            params = {**params, "shift": jnp.float32(-3.0)}  # a bad restore: the variance goes negative
        err, (params, loss) = checked_step(params, x, jnp.float32(0.01))
        err.throw()
    return float(loss)


if __name__ == "__main__":
    print(main())
