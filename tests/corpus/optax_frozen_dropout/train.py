"""A plain JAX MLP classifier with Optax (AdamW, a cosine schedule), regularised by dropout whose mask is
drawn with NumPy inside the jitted step, as one would in NumPy code. The bug: `np.random` runs once, while
`jax.jit` traces the step, so the mask is a constant of the compiled step and every step drops the same
units (op by op, `jax.disable_jit`, a new mask is drawn each call: the two disagree from the first call).
The fix: `jax.random.bernoulli` with a key passed in and split per step."""
import jax
import jax.numpy as jnp
import numpy as np
import optax

FEATURES, HIDDEN, CLASSES = 16, 128, 4
DROPOUT = 0.5


def init_mlp(key, sizes):
    keys = jax.random.split(key, len(sizes) - 1)
    return [{"w": jax.random.normal(k, (m, n)) / jnp.sqrt(m), "b": jnp.zeros(n)}
            for k, m, n in zip(keys, sizes[:-1], sizes[1:])]


def dropout(x, rate):
    keep = np.random.rand(*x.shape) >= rate  # the bug: drawn once, at trace time
    return jnp.where(keep, x / (1.0 - rate), 0.0)


def forward(params, x, train):
    for layer in params[:-1]:
        x = jax.nn.relu(x @ layer["w"] + layer["b"])
        if train:
            x = dropout(x, DROPOUT)
    return x @ params[-1]["w"] + params[-1]["b"]


def loss_fn(params, x, labels):
    logits = forward(params, x, train=True)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


optimizer = optax.adamw(optax.cosine_decay_schedule(1e-3, decay_steps=200), weight_decay=1e-4)


@jax.jit
def train_step(params, opt_state, x, labels):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, labels)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def clusters(rng, count):
    centers = np.random.default_rng(1).normal(size=(CLASSES, FEATURES)) * 2
    labels = rng.integers(0, CLASSES, count)
    return (centers[labels] + rng.normal(size=(count, FEATURES))).astype(np.float32), labels.astype(np.int32)


if __name__ == "__main__":
    params = init_mlp(jax.random.PRNGKey(0), [FEATURES, HIDDEN, HIDDEN, CLASSES])
    opt_state = optimizer.init(params)
    rng = np.random.default_rng(0)
    for step in range(20):
        x, labels = clusters(rng, 64)
        params, opt_state, loss = train_step(params, opt_state, x, labels)
    print("final loss", float(loss))
