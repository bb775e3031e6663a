"""Equinox: a module jitted and called directly, ``eqx.filter_jit(model)(x)`` (the module itself is the
jitted callable: its arrays traced, its static fields static), as Equinox's examples run inference. The model
predicts Poisson rates with an eqx.nn.MLP; the bug: the head takes the log of the MLP's raw output (a rate
needs a positive output, e.g. a softplus), and the untrained MLP's output is negative for most of the
first batch."""
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np


class Head(eqx.Module):
    mlp: eqx.nn.MLP

    def __init__(self, key):
        self.mlp = eqx.nn.MLP(4, "scalar", width_size=16, depth=2, key=key)

    def __call__(self, x):
        return jnp.log(jax.vmap(self.mlp)(x))  # NaN: log of a negative output (no softplus)


def main(steps=3):
    rng = np.random.default_rng(0)
    model = Head(jax.random.PRNGKey(0))
    predict = eqx.filter_jit(model)
    total = 0.0
    for _ in range(steps):
        x = jnp.asarray(rng.normal(scale=10.0, size=(8, 4)), jnp.float32)  # raw, unscaled features
        counts = jnp.asarray(rng.poisson(2.0, size=8), jnp.float32)
        log_rates = predict(x)
        total += float((jnp.exp(log_rates) - counts * log_rates).mean())  # Poisson negative log-likelihood
    return total


if __name__ == "__main__":
    print(main())
