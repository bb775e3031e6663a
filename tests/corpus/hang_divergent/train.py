"""Processes that run different programs at the same step, without hanging. Every 4 steps the loop
evaluates, but the schedule counts `step + jax.process_index()` (a per-process offset that should not be
there), so at step 2 process 1 calls `eval_step` while process 0 calls `train_step`. With CPU collectives
(gloo) the all-reduce of one pairs up with the all-reduce of the other (same devices, same shape), so the job
goes on and every process silently gets a wrong value. `jaxdbg --processes 2 hang-hunt train.py` must report
the divergence at step 2 with both sides' function, call index and line."""
import jax

jax.distributed.initialize()
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

mesh = Mesh(np.array(jax.devices()), ("data",))
sharding = NamedSharding(mesh, P("data"))


@jax.jit
def train_step(x):
    return jnp.sum(x)  # a sum all-reduce across the processes


@jax.jit
def eval_step(x):
    return jnp.max(x)  # a max all-reduce across the processes


totals = []
for step in range(6):
    local = np.full((2 * jax.local_device_count(),), float(step + 1 + jax.process_index()), np.float32)
    x = jax.make_array_from_process_local_data(sharding, local)
    if (step + jax.process_index()) % 4 == 3:
        totals.append(float(eval_step(x)))  # the evaluation branch
    else:
        totals.append(float(train_step(x)))  # the training branch
print(jax.process_index(), totals)
