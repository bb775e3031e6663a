"""A training loop whose data loader stops answering at step 2 (a read from a stuck network filesystem; a
sleep stands for it). One process, nothing raises: the loop waits forever outside any JAX call."""
import time

import jax
import jax.numpy as jnp


@jax.jit
def train_step(w, x):
    loss, grad = jax.value_and_grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
    return w - 0.1 * grad, loss


def next_batch(step):
    if step == 2:
        time.sleep(10 ** 6)  # the stuck read
    return jnp.full((16, 8), 0.1 * step)


w = jnp.ones((8, 4))
for step in range(5):
    w, loss = train_step(w, next_batch(step))
print(float(loss))
