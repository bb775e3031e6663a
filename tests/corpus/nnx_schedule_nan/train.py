"""An NNX MLP classifier trained with ``nnx.Optimizer`` and a hand-written inverse-square-root learning
rate schedule (the Transformer-style "rsqrt decay"), passed to ``optax.adamw`` as a callable. The bug: the
schedule divides by sqrt(step) and Optax counts steps from 0, so the very first update has an infinite
learning rate; times an update that is exactly 0 (the bias of a hidden unit no example activated) that is
NaN, made inside ``optimizer.update``."""
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx


class MLP(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.layers = nnx.List([nnx.Linear(20, 64, rngs=rngs), nnx.Linear(64, 64, rngs=rngs),
                                nnx.Linear(64, 3, rngs=rngs)])

    def __call__(self, x):
        for layer in self.layers[:-1]:
            x = nnx.relu(layer(x))
        return self.layers[-1](x)


def rsqrt_schedule(step):
    return 1e-3 * 10.0 / jnp.sqrt(step)  # the bug: optax's step count starts at 0


def loss_fn(model, x, labels):
    return optax.softmax_cross_entropy_with_integer_labels(model(x), labels).mean()


@nnx.jit
def train_step(model, optimizer, x, labels):
    loss, grads = nnx.value_and_grad(loss_fn)(model, x, labels)
    optimizer.update(model, grads)  # the NaN: inf learning rate * 0 update
    return loss


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(3, 20)) * 2
    model = MLP(rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adamw(rsqrt_schedule, weight_decay=1e-4), wrt=nnx.Param)
    for step in range(3):
        labels = rng.integers(0, 3, 128)
        x = (centers[labels] + rng.normal(size=(128, 20))).astype(np.float32)
        print(step, float(train_step(model, optimizer, jnp.asarray(x), jnp.asarray(labels))))
