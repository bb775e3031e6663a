"""A Flax Linen MLP trained with Optax on MNIST-sized digits, written the way Flax's MNIST example is (a
``TrainState``, ``apply_gradients``, a jitted ``train_step``) but fed the way many first training loops are:
every batch is built on the host with NumPy (each image shifted by a few pixels and given noise, as a data
augmentation, then normalised), turned into jax arrays with ``jnp.asarray``, and the loss read back with
``np.asarray`` after every step to log it. Synthetic digits (no download).

The device finishes each step long before the host has built the next batch, and the read of the loss makes
the host wait for every step before it starts on the next batch: the loop is input-bound. What fixes it: build
batches ahead in a background thread (prefetch), put the data on the device, read the loss every N steps.

``--feed device`` is the same training with the dataset put on the device once and eight batches cut and
trained on in each jitted call (a ``lax.scan``), the loss read every 4 calls: the device is busy all the time (not
input-bound).
"""
import argparse

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state

BATCH = 128
STEPS_PER_CALL = 8


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(128)(x))
        x = nn.relu(nn.Dense(128)(x))
        return nn.Dense(10)(x)


def synthetic_digits(count, rng):
    """Digit-like 28x28 uint8 images: a noisy template per class."""
    labels = rng.integers(0, 10, count)
    templates = rng.integers(0, 256, (10, 28, 28)).astype(np.uint8)
    images = np.clip(templates[labels] + rng.integers(-40, 40, (count, 28, 28)), 0, 255).astype(np.uint8)
    return images, labels


def augment(images, rng):
    """Random shifts by up to 3 pixels and pixel noise, one image at a time, then per-image normalisation."""
    out = np.empty(images.shape, np.float32)
    for i, image in enumerate(images):
        dy, dx = rng.integers(-3, 4, 2)
        shifted = np.roll(np.roll(image, dy, axis=0), dx, axis=1).astype(np.float32)
        shifted += rng.normal(0.0, 8.0, shifted.shape)
        out[i] = (shifted - shifted.mean()) / (shifted.std() + 1e-6)
    return out


def create_state(rng):
    model = MLP()
    params = jax.jit(model.init)(rng, jnp.ones((1, 28, 28)))["params"]
    return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.sgd(0.01, momentum=0.9))


def loss_and_grads(state, images, labels):
    def loss_fn(params):
        logits = state.apply_fn({"params": params}, images)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    return jax.value_and_grad(loss_fn)(state.params)


@jax.jit
def train_step(state, images, labels):
    loss, grads = loss_and_grads(state, images, labels)
    return state.apply_gradients(grads=grads), loss


@jax.jit
def train_steps_on_device(state, images, labels, starts):
    def one_step(state, start):
        batch = jax.lax.dynamic_slice_in_dim(images, start, BATCH)
        targets = jax.lax.dynamic_slice_in_dim(labels, start, BATCH)
        loss, grads = loss_and_grads(state, (batch - 128.0) / 64.0, targets)
        return state.apply_gradients(grads=grads), loss

    state, losses = jax.lax.scan(one_step, state, starts)
    return state, losses.mean()


def train_from_numpy(state, images, labels, steps, rng):
    for step in range(steps):
        index = rng.integers(0, len(images), BATCH)
        batch = augment(images[index], rng)
        batch, targets = jnp.asarray(batch), jnp.asarray(labels[index])  # copied to the device (the transfer)
        state, loss = train_step(state, batch, targets)
        history.append(np.asarray(loss))  # the host waits for every step here (the sync)
    return state


def train_on_device(state, images, labels, calls):
    images, labels = jax.device_put(images.astype(np.float32)), jax.device_put(labels)
    starts = jnp.arange(STEPS_PER_CALL) * BATCH
    for call in range(calls):
        state, loss = train_steps_on_device(state, images, labels, (starts + call * BATCH) % (len(labels) - BATCH))
        if call % 4 == 3:
            history.append(float(loss))
    return state


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--feed", choices=("numpy", "device"), default="numpy")
    parser.add_argument("--steps", type=int, default=12, help="jitted calls")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    images, labels = synthetic_digits(2048, rng)
    state = create_state(jax.random.key(0))
    history = []
    if args.feed == "numpy":
        state = train_from_numpy(state, images, labels, args.steps, rng)
    else:
        state = train_on_device(state, images, labels, args.steps)
    print(f"last loss {float(history[-1]):.3f}")
