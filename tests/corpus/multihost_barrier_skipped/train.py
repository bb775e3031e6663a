"""A barrier only the chief reaches: after training, process 0 saves the model and calls
`multihost_utils.sync_global_devices("checkpoint saved")` to wait for the others before it uploads, but the
save sits under `if jax.process_index() == 0`, barrier included, and the other processes leave straight after
their loop. Process 0 waits in the barrier forever.

jax runs the barrier as a jitted all-gather of its own (`_identity_fn`): `jaxdbg --processes 2 hang-hunt
train.py --stall 2` must name what process 0 waits in as the user called it, `sync_global_devices('checkpoint
saved')`, at the line that called it, with its all-gather over both processes, and point at the `if`."""
import jax

jax.distributed.initialize()
import jax.numpy as jnp
from jax.experimental import multihost_utils


@jax.jit
def step(w):
    return w * 0.99 + 0.01


w = jnp.ones((16,))
for i in range(4):
    w = step(w)
if jax.process_index() == 0:  # <- the chief's branch
    print("saving", float(w.sum()))
    multihost_utils.sync_global_devices("checkpoint saved")  # <- the barrier only process 0 reaches
print("bye")
