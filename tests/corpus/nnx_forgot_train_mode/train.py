"""An NNX classifier with dropout and batch norm, trained the way Flax's NNX MNIST tutorial trains
(nnx.Optimizer, nnx.MultiMetric, nnx.value_and_grad, `nnx.jit` train and eval steps, `model.eval()` before
evaluating), on synthetic data.

The bug: the loop switches the model to evaluation mode for the periodic evaluation and never switches
it back, so from step 4 on `train_step` trains without dropout and with frozen batch statistics. jax
sees it: `model.dropout.deterministic` and `model.bn.use_running_average` are static attributes of the
model, and `train_step` compiles a second time at call 4. `eval_step` compiles twice for a plainer
reason: the last test batch is smaller (80 = 2 x 32 + 16).
"""
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx


class MLP(nnx.Module):
    def __init__(self, din, dhidden, dout, *, rngs: nnx.Rngs):
        self.linear1 = nnx.Linear(din, dhidden, rngs=rngs)
        self.bn = nnx.BatchNorm(dhidden, rngs=rngs)
        self.dropout = nnx.Dropout(0.2, rngs=rngs)
        self.linear2 = nnx.Linear(dhidden, dout, rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.dropout(self.bn(self.linear1(x))))
        return self.linear2(x)


def loss_fn(model: MLP, batch):
    logits = model(batch["image"])
    loss = optax.softmax_cross_entropy_with_integer_labels(logits=logits, labels=batch["label"]).mean()
    return loss, logits


@nnx.jit
def train_step(model: MLP, optimizer: nnx.Optimizer, metrics: nnx.MultiMetric, batch):
    grad_fn = nnx.value_and_grad(loss_fn, has_aux=True)
    (loss, logits), grads = grad_fn(model, batch)
    metrics.update(loss=loss, logits=logits, labels=batch["label"])
    optimizer.update(model, grads)


@nnx.jit
def eval_step(model: MLP, metrics: nnx.MultiMetric, batch):
    loss, logits = loss_fn(model, batch)
    metrics.update(loss=loss, logits=logits, labels=batch["label"])


def synthetic_digits(rng, count, centres):
    labels = rng.integers(0, 10, count)
    images = centres[labels] + 0.5 * rng.normal(size=(count, centres.shape[1]))
    return {"image": images.astype(np.float32), "label": labels.astype(np.int32)}


def batches(data, size):
    for start in range(0, len(data["label"]), size):
        yield {k: jnp.asarray(v[start:start + size]) for k, v in data.items()}


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(10, 64))
    train_data, test_data = synthetic_digits(rng, 320, centres), synthetic_digits(rng, 80, centres)
    model = MLP(64, 128, 10, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)
    metrics = nnx.MultiMetric(accuracy=nnx.metrics.Accuracy(), loss=nnx.metrics.Average("loss"))
    eval_every = 4

    model.train()
    for step, batch in enumerate(batches(train_data, 32)):
        train_step(model, optimizer, metrics, batch)
        if (step + 1) % eval_every == 0:
            train_metrics = metrics.compute()
            metrics.reset()
            model.eval()  # the bug: model.train() never follows
            for test_batch in batches(test_data, 32):
                eval_step(model, metrics, test_batch)
            test_metrics = metrics.compute()
            metrics.reset()
            print(f"step {step}: train loss {float(train_metrics['loss']):.3f}, "
                  f"test accuracy {float(test_metrics['accuracy']):.3f}")
