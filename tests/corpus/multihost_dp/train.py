"""Data parallelism over a jax.distributed job, one process per host as on a TPU pod slice: each process
feeds its own shard of the batch (make_array_from_process_local_data), the step all-reduces the gradient.
Run locally with CPU devices and gloo collectives; the launcher sets COORD, NPROC and PID."""
import os
import sys

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(os.environ["COORD"], num_processes=int(os.environ["NPROC"]),
                           process_id=int(os.environ["PID"]))
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
    local = rng.normal(size=(4 * jax.local_device_count(), 8)).astype(np.float32)
    x = jax.make_array_from_process_local_data(sharding, local)
    w, loss = step(w, x)
print(jax.process_index(), float(loss))
