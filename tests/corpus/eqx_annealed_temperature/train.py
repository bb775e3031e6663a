"""An Equinox classifier trained the way Equinox's examples train (an `eqx.Module` with a static field,
`eqx.filter_jit`, `eqx.filter_value_and_grad`, optax), on synthetic data. The training step is defined
inside `train()`, as in Equinox's tutorials.

The recompiles: the softmax temperature is annealed and passed to `make_step` as a Python float.
`filter_jit` traces arrays only and holds every other argument static, so each new temperature (calls 4
and 8) compiles `make_step` again. Passing `jnp.asarray(temperature)` would compile once.
"""
from collections.abc import Callable

import equinox as eqx
import jax
import optax


class Classifier(eqx.Module):
    layers: list
    activation: Callable = eqx.field(static=True)

    def __init__(self, in_size, hidden, num_classes, *, key):
        k1, k2 = jax.random.split(key)
        self.layers = [eqx.nn.Linear(in_size, hidden, key=k1), eqx.nn.Linear(hidden, num_classes, key=k2)]
        self.activation = jax.nn.gelu

    def __call__(self, x):
        return self.layers[1](self.activation(self.layers[0](x)))


def loss_fn(model, x, y, temperature):
    logits = jax.vmap(model)(x) / temperature
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def train(steps=12, batch_size=32, seed=0):
    key, data_key, model_key = jax.random.split(jax.random.PRNGKey(seed), 3)
    centres = jax.random.normal(data_key, (4, 16))
    model = Classifier(16, 32, 4, key=model_key)
    optim = optax.adamw(3e-3)
    opt_state = optim.init(eqx.filter(model, eqx.is_array))

    @eqx.filter_jit
    def make_step(model, opt_state, x, y, temperature):
        loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y, temperature)
        updates, opt_state = optim.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        model = eqx.apply_updates(model, updates)
        return loss, model, opt_state

    for step in range(steps):
        key, k1, k2 = jax.random.split(key, 3)
        y = jax.random.randint(k1, (batch_size,), 0, 4)
        x = centres[y] + 0.5 * jax.random.normal(k2, (batch_size, 16))
        temperature = 2.0 * 0.5 ** (step // 4)  # annealed: 2.0, then 1.0 at step 4, then 0.5 at step 8
        loss, model, opt_state = make_step(model, opt_state, x, y, temperature)
        print(f"step {step} temperature {temperature} loss {float(loss):.4f}")
    return model


if __name__ == "__main__":
    train()
