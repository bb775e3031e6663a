"""A fully connected MNIST classifier written the way JAX's own `mnist_classifier_fromscratch` example is:
parameters made by numpy (float64), `jax.jit` on the update, `jax.grad` of a log-softmax loss, batches cut
from a shuffled permutation without dropping the remainder. Synthetic digits (1000 examples).

The recompile: 1000 = 7 x 128 + 104, so the last batch of every epoch is smaller and `update` compiles a
second time (call 7). The float64 numpy parameters of call 0 are not a cause: without x64 jax turns them
into float32, the same signature as the float32 arrays `update` returns.
"""
import time

import jax.numpy as jnp
import numpy as np
import numpy.random as npr
from jax import grad, jit
from jax.scipy.special import logsumexp


def init_random_params(scale, layer_sizes, rng=npr.RandomState(0)):
    return [(scale * rng.randn(m, n), scale * rng.randn(n))  # numpy float64
            for m, n in zip(layer_sizes[:-1], layer_sizes[1:])]


def predict(params, inputs):
    activations = inputs
    for w, b in params[:-1]:
        outputs = jnp.dot(activations, w) + b
        activations = jnp.tanh(outputs)
    final_w, final_b = params[-1]
    logits = jnp.dot(activations, final_w) + final_b
    return logits - logsumexp(logits, axis=1, keepdims=True)


def loss(params, batch):
    inputs, targets = batch
    preds = predict(params, inputs)
    return -jnp.mean(jnp.sum(preds * targets, axis=1))


def accuracy(params, batch):
    inputs, targets = batch
    target_class = jnp.argmax(targets, axis=1)
    predicted_class = jnp.argmax(predict(params, inputs), axis=1)
    return jnp.mean(predicted_class == target_class)


def synthetic_mnist(num, rng):
    labels = rng.randint(0, 10, num)
    centres = rng.rand(10, 784).astype(np.float32)
    images = (centres[labels] + 0.3 * rng.rand(num, 784)).astype(np.float32)
    return images, np.eye(10, dtype=np.float32)[labels]


if __name__ == "__main__":
    layer_sizes = [784, 256, 128, 10]
    param_scale = 0.1
    step_size = 0.001
    num_epochs = 3
    batch_size = 128

    train_images, train_labels = synthetic_mnist(1000, npr.RandomState(1))
    num_train = train_images.shape[0]
    num_complete_batches, leftover = divmod(num_train, batch_size)
    num_batches = num_complete_batches + bool(leftover)  # the ragged last batch is kept

    def data_stream():
        rng = npr.RandomState(0)
        while True:
            perm = rng.permutation(num_train)
            for i in range(num_batches):
                batch_idx = perm[i * batch_size:(i + 1) * batch_size]
                yield train_images[batch_idx], train_labels[batch_idx]

    batches = data_stream()

    @jit
    def update(params, batch):
        grads = grad(loss)(params, batch)
        return [(w - step_size * dw, b - step_size * db)
                for (w, b), (dw, db) in zip(params, grads)]

    params = init_random_params(param_scale, layer_sizes)
    for epoch in range(num_epochs):
        start_time = time.time()
        for _ in range(num_batches):
            params = update(params, next(batches))
        epoch_time = time.time() - start_time
        train_acc = accuracy(params, (train_images, train_labels))
        print(f"Epoch {epoch} in {epoch_time:0.2f} sec, training set accuracy {train_acc:.3f}")
