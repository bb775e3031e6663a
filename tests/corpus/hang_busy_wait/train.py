"""Busy, but stuck: a hand-rolled async checkpoint. The writer thread dies before it sets `done`, so the
trainer spins in `while not done: pass` on a CPU forever. `jaxdbg hang-hunt train.py --stall 2` must call it
a stall spinning at that loop, not a program still making progress, and name the writer's death first."""
import threading

import jax
import jax.numpy as jnp
import numpy as np

done = False


def write_checkpoint(params):
    global done
    np.asarray(params).sum()
    raise OSError("disk quota exceeded")  # the writer dies before it sets `done`


@jax.jit
def step(w, x):
    return w - 0.1 * jax.grad(lambda w: jnp.mean((x @ w) ** 2))(w)


w, x = jnp.ones((32, 32)), jnp.ones((8, 32))
for _ in range(3):
    w = step(w, x)
threading.Thread(target=write_checkpoint, args=(w,), daemon=True).start()
while not done:  # <- spins
    pass
print("checkpoint written")
