"""A Flax NNX training loop whose learning rate spikes at one late step (for jaxdbg.watch and its bench).

``train(steps, spike_at, ...)`` builds and jits everything when called (inside a running ``jaxdbg.watch``, its
functions are watched); with ``spike_at=None`` it stays finite.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, width: int = 128):
        self.hidden = nnx.Linear(64, width, rngs=rngs)
        self.out = nnx.Linear(width, 10, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        hidden = self.hidden(x)
        return self.out(nnx.relu(hidden))  # <- origin: blown-up weights overflow this matmul (its NaN or its Inf)


def loss_fn(model: MLP, x: jax.Array, labels: jax.Array) -> jax.Array:
    logits = model(x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def train(steps: int, spike_at: int | None = None, batch: int = 128, width: int = 128) -> float:
    model = MLP(nnx.Rngs(0), width)
    optimizer = nnx.Optimizer(model, optax.inject_hyperparams(optax.sgd)(learning_rate=0.05), wrt=nnx.Param)

    @nnx.jit
    def train_step(model: MLP, optimizer: nnx.Optimizer, x: jax.Array, labels: jax.Array) -> jax.Array:
        loss, grads = nnx.value_and_grad(loss_fn)(model, x, labels)
        optimizer.update(model, grads)
        return loss

    keys = jax.random.split(jax.random.key(1), 2)
    x = jax.random.normal(keys[0], (batch, 64))
    labels = jax.random.randint(keys[1], (batch,), 0, 10)
    loss = jnp.zeros(())
    for step in range(steps):
        if step == spike_at:
            optimizer.opt_state.hyperparams["learning_rate"][...] = jnp.asarray(1e36)
        loss = train_step(model, optimizer, x, labels)
    return float(loss)
