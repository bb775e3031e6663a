"""A GRU sequence classifier in Equinox, written the way Equinox's RNN example writes it: an eqx.Module
holding an eqx.nn.GRUCell that lax.scan runs over the sequence, jax.vmap over the batch, an infinite
dataloader, eqx.filter_value_and_grad + eqx.filter_jit, and Optax (Adam with an exponential decay schedule).

The task: tell clockwise spirals from anticlockwise ones. The bug: the data pipeline appends the time
step as a third feature (so the model could see where it is in the sequence), but the model is still
built for the two (x, y) coordinates; the first step fails while tracing with a dot_general shape error
inside the GRU cell, inside the scan."""
import math

import equinox as eqx
import jax
import jax.lax as lax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import optax


def get_data(dataset_size, *, key):
    t = jnp.linspace(0, 2 * math.pi, 16)
    offset = jr.uniform(key, (dataset_size, 1), minval=0, maxval=2 * math.pi)
    x1 = jnp.sin(t + offset) / (1 + t)
    x2 = jnp.cos(t + offset) / (1 + t)
    y = jnp.zeros((dataset_size, 1))

    half = dataset_size // 2
    x1 = x1.at[:half].multiply(-1)
    y = y.at[:half].set(1)
    time = jnp.broadcast_to(t / t[-1], x1.shape)
    x = jnp.stack([x1, x2, time], axis=-1)  # (x, y, time): the time feature is new
    return x, y


def dataloader(arrays, batch_size, *, key):
    dataset_size = arrays[0].shape[0]
    assert all(array.shape[0] == dataset_size for array in arrays)
    indices = jnp.arange(dataset_size)
    while True:
        perm = jr.permutation(key, indices)
        (key,) = jr.split(key, 1)
        start = 0
        end = batch_size
        while end < dataset_size:
            batch_perm = perm[start:end]
            yield tuple(array[batch_perm] for array in arrays)
            start = end
            end = start + batch_size


class RNN(eqx.Module):
    hidden_size: int = eqx.field(static=True)
    cell: eqx.Module
    linear: eqx.nn.Linear
    bias: jax.Array

    def __init__(self, in_size, out_size, hidden_size, *, key):
        ckey, lkey = jr.split(key)
        self.hidden_size = hidden_size
        self.cell = eqx.nn.GRUCell(in_size, hidden_size, key=ckey)
        self.linear = eqx.nn.Linear(hidden_size, out_size, use_bias=False, key=lkey)
        self.bias = jnp.zeros(out_size)

    def __call__(self, input):
        hidden = jnp.zeros((self.hidden_size,))

        def f(carry, inp):
            return self.cell(inp, carry), None  # one GRU step per time step

        out, _ = lax.scan(f, hidden, input)
        # sigmoid because we're performing binary classification
        return jax.nn.sigmoid(self.linear(out) + self.bias)


def main(dataset_size=1000, batch_size=32, learning_rate=3e-3, steps=50, hidden_size=16, depth=1, seed=5678):
    data_key, loader_key, model_key = jr.split(jr.PRNGKey(seed), 3)
    xs, ys = get_data(dataset_size, key=data_key)
    iter_data = dataloader((xs, ys), batch_size, key=loader_key)

    model = RNN(in_size=2, out_size=1, hidden_size=hidden_size, key=model_key)

    @eqx.filter_value_and_grad
    def compute_loss(model, x, y):
        pred_y = jax.vmap(model)(x)
        # Trains with respect to binary cross-entropy
        return -jnp.mean(y * jnp.log(pred_y) + (1 - y) * jnp.log(1 - pred_y))

    # Important for efficiency whenever you use JAX: wrap everything into a single JIT region.
    @eqx.filter_jit
    def make_step(model, x, y, opt_state):
        loss, grads = compute_loss(model, x, y)
        updates, opt_state = optim.update(grads, opt_state)
        model = eqx.apply_updates(model, updates)
        return loss, model, opt_state

    schedule = optax.exponential_decay(learning_rate, transition_steps=steps // 5, decay_rate=0.8)
    optim = optax.adam(schedule)
    opt_state = optim.init(model)
    for step, (x, y) in zip(range(steps), iter_data):
        loss, model, opt_state = make_step(model, x, y, opt_state)
        loss = loss.item()
        if step % 10 == 0:
            print(f"step={step}, loss={loss}")

    pred_ys = jax.vmap(model)(xs)
    num_correct = jnp.sum((pred_ys > 0.5) == ys)
    final_accuracy = (num_correct / dataset_size).item()
    print(f"final_accuracy={final_accuracy}")
    return np.asarray(final_accuracy)


if __name__ == "__main__":
    main()
