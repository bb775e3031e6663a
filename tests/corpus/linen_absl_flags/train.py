"""A Linen CNN trained the way Flax's example main.py files start one: absl flags, a required --workdir,
app.run(main), a TrainState with optax. Run without --workdir it stops in absl's flag parsing, before any
JAX work; absl prints the error line and then a usage hint ("Pass --helpshort or --helpfull ...").

What profile must show: the error line (which flag is missing), not absl's usage hint, and no advice about
jax.jit (the script never reached its jitted step). Given --workdir, the step's convolutions and matmuls are
made inside Linen's layers, and each is tied to the user's line that calls the layer."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags
from flax import linen as nn
from flax.training import train_state

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "Directory for checkpoints and metrics.")
flags.DEFINE_integer("steps", 6, "Training steps.")
flags.DEFINE_float("learning_rate", 0.05, "SGD learning rate.")
flags.mark_flags_as_required(["workdir"])


class CNN(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(features=16, kernel_size=(3, 3))(x))  # layer: conv
        x = nn.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(features=64)(x))  # layer: hidden
        return nn.Dense(features=10)(x)  # layer: logits


@jax.jit
def train_step(state, images, labels):
    def loss_fn(params):
        logits = state.apply_fn({"params": params}, images)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss


def main(argv):
    del argv
    os.makedirs(FLAGS.workdir, exist_ok=True)
    rng = np.random.default_rng(0)
    model = CNN()
    params = jax.jit(model.init)(jax.random.key(0), jnp.ones((1, 28, 28, 1)))["params"]
    state = train_state.TrainState.create(apply_fn=model.apply, params=params,
                                          tx=optax.sgd(FLAGS.learning_rate, momentum=0.9))
    for step in range(FLAGS.steps):
        images = jnp.asarray(rng.normal(size=(32, 28, 28, 1)), jnp.float32)
        labels = jnp.asarray(rng.integers(0, 10, 32))
        state, loss = train_step(state, images, labels)
    with open(os.path.join(FLAGS.workdir, "loss.txt"), "w") as handle:
        handle.write(f"{float(loss)}\n")


if __name__ == "__main__":
    app.run(main)
