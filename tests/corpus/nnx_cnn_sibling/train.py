"""Training the CNN of models.py the way Flax's MNIST tutorial does (nnx.Optimizer, nnx.MultiMetric,
nnx.value_and_grad, nnx.jit train and eval steps), on a synthetic stand-in for a digit dataset.

The bug: the dataset was switched to 32x32 images (SVHN-style digits) but the model in models.py still
flattens for 28x28 inputs: linear1 expects 64 * 7 * 7 features and gets 64 * 8 * 8. The first train step
fails while tracing, with a dot_general shape error raised in models.py."""
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from models import CNN

IMAGE_SIZE = 32  # was 28 with MNIST
BATCH_SIZE = 32
TRAIN_STEPS = 60
EVAL_EVERY = 20
LEARNING_RATE = 0.005
MOMENTUM = 0.9


def synthetic_digits(rng, count):
    """Blurry blobs whose position encodes the label: enough signal for a CNN to learn something."""
    labels = rng.integers(0, 10, size=count)
    images = rng.normal(0.0, 0.3, size=(count, IMAGE_SIZE, IMAGE_SIZE, 1)).astype(np.float32)
    rows = (labels // 5) * (IMAGE_SIZE // 2) + IMAGE_SIZE // 4
    cols = (labels % 5) * (IMAGE_SIZE // 5) + IMAGE_SIZE // 10
    for image, row, col in zip(images, rows, cols):
        image[row - 2:row + 3, col - 2:col + 3, 0] += 2.0
    return {"image": images, "label": labels.astype(np.int32)}


def batches(data, rng):
    while True:
        order = rng.permutation(len(data["label"]))
        for start in range(0, len(order) - BATCH_SIZE + 1, BATCH_SIZE):
            index = order[start:start + BATCH_SIZE]
            yield {"image": jnp.asarray(data["image"][index]), "label": jnp.asarray(data["label"][index])}


def loss_fn(model: CNN, rngs: nnx.Rngs, batch):
    logits = model(batch["image"], rngs)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits=logits, labels=batch["label"]).mean()
    return loss, logits


@nnx.jit
def train_step(model: CNN, optimizer: nnx.Optimizer, metrics: nnx.MultiMetric, rngs: nnx.Rngs, batch):
    """Train for a single step."""
    grad_fn = nnx.value_and_grad(loss_fn, has_aux=True)
    (loss, logits), grads = grad_fn(model, rngs, batch)
    metrics.update(loss=loss, logits=logits, labels=batch["label"])
    optimizer.update(model, grads)


@nnx.jit
def eval_step(model: CNN, metrics: nnx.MultiMetric, rngs: nnx.Rngs, batch):
    loss, logits = loss_fn(model, rngs, batch)
    metrics.update(loss=loss, logits=logits, labels=batch["label"])


def main():
    rng = np.random.default_rng(0)
    train_data, test_data = synthetic_digits(rng, 2048), synthetic_digits(rng, 256)
    model = CNN(rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adamw(LEARNING_RATE, MOMENTUM), wrt=nnx.Param)
    metrics = nnx.MultiMetric(accuracy=nnx.metrics.Accuracy(), loss=nnx.metrics.Average("loss"))
    rngs = nnx.Rngs(0)
    history = {"train_loss": [], "train_accuracy": [], "test_loss": [], "test_accuracy": []}
    for step, batch in zip(range(TRAIN_STEPS), batches(train_data, rng)):
        model.train()
        train_step(model, optimizer, metrics, rngs, batch)
        if step > 0 and (step % EVAL_EVERY == 0 or step == TRAIN_STEPS - 1):
            for metric, value in metrics.compute().items():
                history[f"train_{metric}"].append(float(value))
            metrics.reset()
            model.eval()
            for test_batch in zip(range(len(test_data["label"]) // BATCH_SIZE), batches(test_data, rng)):
                eval_step(model, metrics, rngs, test_batch[1])
            for metric, value in metrics.compute().items():
                history[f"test_{metric}"].append(float(value))
            metrics.reset()
            print(f"step {step}: train loss {history['train_loss'][-1]:.3f}, "
                  f"test accuracy {history['test_accuracy'][-1]:.3f}")


if __name__ == "__main__":
    main()
