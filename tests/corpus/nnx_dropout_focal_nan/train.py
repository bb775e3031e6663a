"""An NNX classifier trained the way Flax's MNIST tutorial does it (nnx.Optimizer, nnx.value_and_grad, nnx.jit), with
Dropout drawing from the model's own `nnx.Rngs` (so typed PRNG keys are among the step's inputs) and a focal
loss (RetinaNet's, gamma < 1 to soften it). The bug: the images are raw pixel values (0..255, never scaled),
so the logits are huge and the true class, where it is the largest, gets p = exactly 1.0; the focal factor
(1 - p) ** gamma then has an infinite derivative at 0, times log(p) = 0: the gradient is NaN from the first
step (the loss itself stays finite)."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx


class MLP(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.linear1 = nnx.Linear(14 * 14, 64, rngs=rngs)
        self.dropout = nnx.Dropout(0.2, rngs=rngs)
        self.linear2 = nnx.Linear(64, 10, rngs=rngs)

    def __call__(self, x):
        x = self.dropout(nnx.relu(self.linear1(x.reshape(x.shape[0], -1))))
        return self.linear2(x)


def focal_loss(logits, labels, gamma=0.5):
    log_p = jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(labels, 10), axis=-1)
    return -jnp.mean((1 - jnp.exp(log_p)) ** gamma * log_p)  # the bug: d/dp (1 - p)**0.5 is infinite at p = 1


def loss_fn(model, batch):
    logits = model(batch["image"])
    return focal_loss(logits, batch["label"]), logits


@nnx.jit
def train_step(model, optimizer, batch):
    (loss, _logits), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model, batch)
    optimizer.update(model, grads)
    return loss


def batches(rng, steps, size=64):
    for _ in range(steps):
        images = rng.integers(0, 256, size=(size, 14, 14, 1)).astype(np.float32)  # raw pixels, not / 255
        labels = rng.integers(0, 10, size)
        yield {"image": jnp.asarray(images), "label": jnp.asarray(labels)}


if __name__ == "__main__":
    model = MLP(rngs=nnx.Rngs(0, dropout=1))
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    for step, batch in enumerate(batches(np.random.default_rng(0), 4)):
        print(step, train_step(model, optimizer, batch))
