"""Fine-tuning a pretrained MLP classifier with Optax the way its documentation composes optimisers: a
``warmup_cosine_decay_schedule``, ``clip_by_global_norm`` chained before AdamW, and ``optax.MultiSteps`` to
accumulate gradients over 4 micro-batches (a larger effective batch on a small device). To stay close to
the pretrained weights, the loss adds an L2-SP penalty: the distance ``||params - pretrained||`` measured
with ``optax.tree.norm``.

The bug: at the first step the parameters *are* the pretrained ones, the distance is exactly 0, and the
gradient of a square root at 0 is 0 * inf = NaN. The loss is finite (the penalty is 0), but the gradients
are all NaN from the first micro-batch on (clipping by a NaN norm spreads it to every leaf), and
``MultiSteps`` accumulates them into its state until the 4th micro-batch applies them: training is dead
before it starts. (The fix: penalise the squared distance, or ``sqrt(d**2 + eps)``.)"""
import jax
import jax.numpy as jnp
import numpy as np
import optax

FEATURES = 16
CLASSES = 4
HIDDEN = 64
ACCUMULATE = 4
L2SP = 0.1


def init_mlp(key, sizes):
    keys = jax.random.split(key, len(sizes) - 1)
    return [{"w": jax.random.normal(k, (m, n)) / jnp.sqrt(m), "b": jnp.zeros(n)}
            for k, m, n in zip(keys, sizes[:-1], sizes[1:])]


def forward(params, x):
    for layer in params[:-1]:
        x = jax.nn.gelu(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


def loss_fn(params, pretrained, x, labels):
    ce = optax.softmax_cross_entropy_with_integer_labels(forward(params, x), labels).mean()
    drift = optax.tree.norm(jax.tree.map(jnp.subtract, params, pretrained))  # the NaN: d sqrt at 0
    return ce + L2SP * drift


def make_optimizer(total_steps):
    schedule = optax.warmup_cosine_decay_schedule(init_value=0.0, peak_value=3e-4, warmup_steps=total_steps // 10,
                                                  decay_steps=total_steps, end_value=1e-5)
    inner = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=1e-4))
    return optax.MultiSteps(inner, every_k_schedule=ACCUMULATE)


@jax.jit
def train_step(params, opt_state, pretrained, x, labels):
    loss, grads = jax.value_and_grad(loss_fn)(params, pretrained, x, labels)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def clusters(rng, count):
    centers = np.random.default_rng(1).normal(size=(CLASSES, FEATURES)) * 2
    labels = rng.integers(0, CLASSES, count)
    return (centers[labels] + rng.normal(size=(count, FEATURES))).astype(np.float32), labels.astype(np.int32)


STEPS = 40
optimizer = make_optimizer(STEPS // ACCUMULATE)

if __name__ == "__main__":
    rng = np.random.default_rng(0)
    pretrained = init_mlp(jax.random.PRNGKey(0), [FEATURES, HIDDEN, HIDDEN, CLASSES])
    params = jax.tree.map(jnp.copy, pretrained)
    opt_state = optimizer.init(params)
    for step in range(STEPS):
        x, labels = clusters(rng, 32)
        params, opt_state, loss = train_step(params, opt_state, pretrained, jnp.asarray(x), jnp.asarray(labels))
        if step % ACCUMULATE == ACCUMULATE - 1:
            print(step, float(loss), float(optax.tree.norm(params)))
