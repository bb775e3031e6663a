"""A small NNX classifier (nnx.Module, nnx.Optimizer, an nnx.jit train step) whose loss takes class indices, as
Optax's integer-label cross-entropy does, and checks it: the step passes one-hot labels, and the check raises
ValueError while nnx.jit traces. No JAX operation raises, so `jaxdbg repro` reduces the source; its repro.py
must do without Flax (tests/test_corpus_repro.py, tests/test_repro_source.py)."""
import jax.numpy as jnp
import optax
from flax import nnx


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(4, 8, rngs=rngs)
        self.out = nnx.Linear(8, 3, rngs=rngs)

    def __call__(self, x):
        return self.out(nnx.relu(self.hidden(x)))


def loss_fn(model, x, labels):
    if labels.ndim != 1:
        raise ValueError(f"labels must be class indices, got shape {labels.shape}")
    logits = model(x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


@nnx.jit
def train_step(model, optimizer, x, y):
    loss, grads = nnx.value_and_grad(loss_fn)(model, x, nnx.one_hot(y, 3))  # the bug: one-hot labels
    optimizer.update(model, grads)
    return loss


model = MLP(nnx.Rngs(0))
optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
print(train_step(model, optimizer, jnp.ones((2, 4)), jnp.array([0, 2])))
