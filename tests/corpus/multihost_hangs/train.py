"""A process hangs: at step 1 process 1 waits forever in host code (a read from a stuck network filesystem; a
sleep stands for it) while its heartbeat thread is alive, and the others wait for it in the gradient's
all-reduce. Nothing dies, nothing raises: only --timeout ends the job, and the report must say which process
the job hung on and where it stands.

Data parallelism over a jax.distributed job, one process per host as on a TPU pod slice: each process
feeds its own shard of the batch (make_array_from_process_local_data), the step all-reduces the gradient.
jax.distributed.initialize() takes its place from the cluster (SLURM, Cloud TPU, ...); locally,
`jaxdbg --processes 2 profile train.py` plays the cluster (CPU devices, gloo collectives)."""
import time

import jax

jax.distributed.initialize()
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

mesh = Mesh(np.array(jax.devices()), ("data",))
sharding = NamedSharding(mesh, P("data"))


@jax.jit
def step(w, x):
    y = jnp.tanh(x @ w)
    return w - 0.1 * (x.T @ y) / x.shape[0], jnp.mean(y ** 2)  # x.T @ y sums over every shard: all-reduce


def read_batch(rng, index):
    if index == 1 and jax.process_index() == 1:
        time.sleep(10 ** 6)  # the stuck read
    return rng.normal(size=(4 * jax.local_device_count(), 8)).astype(np.float32)


w = jnp.ones((8, 8), jnp.float32) * 0.1
rng = np.random.default_rng(jax.process_index())
for i in range(5):
    x = jax.make_array_from_process_local_data(sharding, read_batch(rng, i))
    w, loss = step(w, x)
print(jax.process_index(), float(loss))
