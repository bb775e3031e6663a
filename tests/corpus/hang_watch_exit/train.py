"""A production loop under `jaxdbg.watch(stall_after=..., stall_action="exit")`: its data loader stops
answering at step 2. The watch writes hang-hunt's verdict to OUT/report.json and ends the process with status
75, so that a job scheduler restarts it instead of letting it hang."""
import sys
import time

import jax
import jax.numpy as jnp

import jaxdbg

OUT = sys.argv[1]


@jax.jit
def train_step(w, x):
    return w - 0.1 * jnp.tanh(x @ w), jnp.mean(x)


def next_batch(step):
    if step == 2:
        time.sleep(10 ** 6)  # the stuck read
    return jnp.full((8, 8), 0.1 * step)


with jaxdbg.watch(out=OUT, nans=False, stall_after=3, stall_action="exit"):
    w = jnp.eye(8)
    for step in range(5):
        w, loss = train_step(w, next_batch(step))
print("not reached")
