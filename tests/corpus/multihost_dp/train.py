"""Data parallelism over a jax.distributed job, one process per host as on a TPU pod slice: each process
feeds its own shard of the batch (make_array_from_process_local_data), the step all-reduces the gradient.
jax.distributed.initialize() takes its place from the cluster (SLURM, Cloud TPU, ...); locally,
`jaxdbg --processes 2 profile train.py` plays the cluster (CPU devices, gloo collectives). After the loop every
process waits for the others in a barrier (multihost_utils.sync_global_devices), which jax runs as a jitted
all-gather of its own (`_identity_fn`): profile and memory name it as called, at its line."""
import jax

jax.distributed.initialize()
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
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
multihost_utils.sync_global_devices("weights saved")  # <- every process has its weights: the barrier
print(jax.process_index(), float(loss))
