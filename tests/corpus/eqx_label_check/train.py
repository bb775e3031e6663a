"""A small Equinox classifier (an eqx.Module holding an eqx.nn.MLP, a static field, eqx.filter_jit and
eqx.filter_value_and_grad, Optax's SGD) whose loss takes class indices and checks it: the step passes one-hot
labels, and the check raises ValueError while filter_jit traces. No JAX operation raises, so `jaxdbg repro`
reduces the source; its repro.py must do without Equinox (tests/test_corpus_repro.py)."""
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import optax


class Classifier(eqx.Module):
    mlp: eqx.nn.MLP
    temperature: float = eqx.field(static=True)

    def __init__(self, key):
        self.mlp = eqx.nn.MLP(4, 3, width_size=8, depth=1, key=key)
        self.temperature = 2.0

    def __call__(self, x):
        return self.mlp(x) / self.temperature


def loss_fn(model, x, labels):
    if labels.ndim != 1:
        raise ValueError(f"labels must be class indices, got shape {labels.shape}")
    logits = jax.vmap(model)(x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


@eqx.filter_jit
def make_step(model, opt_state, x, y):
    loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, jax.nn.one_hot(y, 3))  # the bug: one-hot labels
    updates, opt_state = optim.update(grads, opt_state)
    return loss, eqx.apply_updates(model, updates), opt_state


optim = optax.sgd(0.1)
model = Classifier(jr.PRNGKey(0))
opt_state = optim.init(eqx.filter(model, eqx.is_array))
print(make_step(model, opt_state, jnp.ones((2, 4)), jnp.array([0, 2]))[0])
