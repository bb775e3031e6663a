"""custom_jvp: a softplus log(1 + exp(x)) with a hand-written derivative rule, JAX's own log1pexp example
of the custom derivative tutorial, but with the rule written the naive way exp(x) / (1 + exp(x)). The bug:
a large logit overflows exp in the rule, and inf / inf is NaN in the gradient."""
import jax
import jax.numpy as jnp
import numpy as np


@jax.custom_jvp
def softplus(x):
    return jnp.logaddexp(x, 0.0)


@softplus.defjvp
def softplus_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    slope = jnp.exp(x) / (1.0 + jnp.exp(x))  # NaN: inf / inf once exp overflows
    return softplus(x), slope * t


@jax.jit
def train_step(w, x, y):
    def loss_fn(w):
        return ((softplus(x @ w) - y) ** 2).mean()

    loss, grad = jax.value_and_grad(loss_fn)(w)
    return w - 1e-3 * grad, loss


def main(steps=4):
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.uniform(0.5, 1.0, size=(3,)), jnp.float32)
    for step in range(steps):
        x = rng.uniform(0.0, 1.0, size=(6, 3)).astype(np.float32)
        if step == 2:
            x[4] = 400.0  # an unscaled feature row: its logit is far past exp's range
        w, loss = train_step(w, x, jnp.ones(6))
    return float(loss)


if __name__ == "__main__":
    print(main())
