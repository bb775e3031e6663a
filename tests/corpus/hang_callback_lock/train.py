"""A host callback waits for a lock its caller holds. The training loop takes `metrics_lock` around each step
from step 3 on (so that a metrics reader never sees half-written values), and the step logs its loss through
`jax.debug.callback`, whose host function takes the same lock. The callback runs while the step that made it
waits for it (on CPU on the calling thread itself), so it can never get the lock: nothing raises, nothing
moves. `jaxdbg hang-hunt train.py` must name the deadlock: the callback's line, and the `with` that holds the
lock."""
import threading

import jax
import jax.numpy as jnp

metrics_lock = threading.Lock()
history = []


def log_metrics(step, loss):
    with metrics_lock:  # the callback waits here
        history.append((int(step), float(loss)))


@jax.jit
def train_step(w, x, step):
    loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w) ** 2))(w)
    jax.debug.callback(log_metrics, step, loss)
    return w - 0.01 * grad, loss


w = jnp.ones((8, 4))
x = jnp.linspace(0.0, 1.0, 128).reshape(16, 8)
for step in range(6):
    if step < 3:
        w, loss = train_step(w, x, step)
        loss.block_until_ready()
    else:
        with metrics_lock:  # the loop holds the lock around the step
            w, loss = train_step(w, x, step)
            loss.block_until_ready()
print(history)
