"""An NNX classifier trained the way Flax's MNIST tutorial does it (nnx.Optimizer, nnx.value_and_grad,
nnx.jit), on synthetic digits. The bug: the loss takes log(softmax(logits)) by hand; once the logits are
large, softmax underflows to 0 for the wrong classes, log gives -inf and 0 * -inf makes NaN."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx


class CNN(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.conv = nnx.Conv(1, 8, kernel_size=(3, 3), rngs=rngs)
        self.linear1 = nnx.Linear(8 * 7 * 7, 32, rngs=rngs)
        self.linear2 = nnx.Linear(32, 10, rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.conv(x))
        x = nnx.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
        x = x.reshape(x.shape[0], -1)
        x = nnx.relu(self.linear1(x))
        return self.linear2(x)


def loss_fn(model: CNN, batch):
    logits = model(batch["image"])
    probs = jax.nn.softmax(logits)
    labels = jax.nn.one_hot(batch["label"], 10)
    loss = -jnp.mean(jnp.sum(labels * jnp.log(probs), axis=-1))  # the bug: log of an underflowed softmax
    return loss, logits


@nnx.jit
def train_step(model: CNN, optimizer: nnx.Optimizer, metrics: nnx.MultiMetric, batch):
    grad_fn = nnx.value_and_grad(loss_fn, has_aux=True)
    (loss, logits), grads = grad_fn(model, batch)
    metrics.update(loss=loss, logits=logits, labels=batch["label"])
    optimizer.update(model, grads)


def batches(rng, steps, size=16):
    for step in range(steps):
        images = rng.normal(size=(size, 14, 14, 1)).astype(np.float32)
        images *= 1.0 + 40.0 * step  # the input pipeline forgot to normalise: later batches are huge
        yield {"image": jnp.asarray(images), "label": jnp.asarray(rng.integers(0, 10, size))}


if __name__ == "__main__":
    model = CNN(rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)
    metrics = nnx.MultiMetric(accuracy=nnx.metrics.Accuracy(), loss=nnx.metrics.Average("loss"))
    for step, batch in enumerate(batches(np.random.default_rng(0), 6)):
        train_step(model, optimizer, metrics, batch)
        print(step, metrics.compute())
