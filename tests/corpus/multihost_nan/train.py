"""A NaN in one shard: at step 2, one example of process 1's part of the batch has a negative feature, and
the model takes its log (a log-scaled input feature), so the loss of the whole job turns NaN.

Data parallelism over a jax.distributed job, one process per host as on a TPU pod slice: each process
feeds its own shard of the batch (make_array_from_process_local_data), the step all-reduces the gradient.
jax.distributed.initialize() takes its place from the cluster (SLURM, Cloud TPU, ...); locally,
`jaxdbg --processes 2 profile train.py` plays the cluster (CPU devices, gloo collectives)."""
import jax

jax.distributed.initialize()
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

mesh = Mesh(np.array(jax.devices()), ("data",))
sharding = NamedSharding(mesh, P("data"))


@jax.jit
def step(w, x):
    h = jnp.log(x[:, :1]) * 0.1  # log-scaled first feature: NaN for a negative value
    y = jnp.tanh(x @ w + h)
    return w - 0.1 * (x.T @ y) / x.shape[0], jnp.mean(y ** 2)  # x.T @ y sums over every shard: all-reduce


w = jnp.ones((8, 8), jnp.float32) * 0.1
rng = np.random.default_rng(jax.process_index())
for i in range(5):
    local = np.abs(rng.normal(size=(4 * jax.local_device_count(), 8))).astype(np.float32)
    if i == 2 and jax.process_index() == 1:
        local[len(local) - 3, 0] = -1.0  # a corrupt example in process 1's shard
    x = jax.make_array_from_process_local_data(sharding, local)
    w, loss = step(w, x)
print(jax.process_index(), float(loss))
