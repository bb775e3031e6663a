"""A process dies: at step 3 process 1 runs out of host memory (an abort stands for the OOM killer), and the
others are left waiting for it in the gradient's all-reduce.

Data parallelism over a jax.distributed job, one process per host as on a TPU pod slice: each process
feeds its own shard of the batch (make_array_from_process_local_data), the step all-reduces the gradient.
jax.distributed.initialize() takes its place from the cluster (SLURM, Cloud TPU, ...); locally,
`jaxdbg --processes 2 profile train.py` plays the cluster (CPU devices, gloo collectives)."""
import os

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


w = jnp.ones((8, 8), jnp.float32) * 0.1
rng = np.random.default_rng(jax.process_index())
for i in range(5):
    if i == 3 and jax.process_index() == 1:
        os.abort()  # the host ran out of memory
    local = rng.normal(size=(4 * jax.local_device_count(), 8)).astype(np.float32)
    x = jax.make_array_from_process_local_data(sharding, local)
    w, loss = step(w, x)
print(jax.process_index(), float(loss))
