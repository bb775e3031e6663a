"""Equinox Modules: an eqx.nn.MLP trained with eqx.filter_jit, eqx.filter_value_and_grad and Optax, the
loop of Equinox's examples (the model a pytree of arrays and static fields). The bug: a heteroscedastic
loss predicts the noise scale with an unconstrained output and takes its log; it turns negative."""
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax


class Regressor(eqx.Module):
    mlp: eqx.nn.MLP
    scale: jax.Array

    def __init__(self, key):
        self.mlp = eqx.nn.MLP(3, 1, width_size=8, depth=1, key=key)
        self.scale = jnp.ones(())

    def __call__(self, x):
        return self.mlp(x)[0]


def loss_fn(model, x, y):
    pred = jax.vmap(model)(x)
    return (0.5 * ((pred - y) / model.scale) ** 2 + jnp.log(model.scale)).mean()  # NaN: log(scale < 0)


@eqx.filter_jit
def train_step(model, opt_state, x, y):
    loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
    updates, opt_state = OPTIMIZER.update(grads, opt_state, eqx.filter(model, eqx.is_array))
    return eqx.apply_updates(model, updates), opt_state, loss


OPTIMIZER = optax.sgd(1.0)


def main(steps=5):
    rng = np.random.default_rng(0)
    model = Regressor(jax.random.PRNGKey(0))
    opt_state = OPTIMIZER.init(eqx.filter(model, eqx.is_array))
    for step in range(steps):
        x = jnp.asarray(rng.normal(size=(8, 3)), jnp.float32)
        y = jnp.zeros(8) if step < 2 else jnp.full(8, 0.1)
        if step == 2:
            model = eqx.tree_at(lambda m: m.scale, model, -model.scale)  # a restored checkpoint's sign bug
        model, opt_state, loss = train_step(model, opt_state, x, y)
    return float(loss)


if __name__ == "__main__":
    print(main())
