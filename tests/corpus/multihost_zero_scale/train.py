"""A NaN from 0/0 on one process only: each process normalises its own part of the batch by that part's scale
(its largest absolute value, computed on the host as a loader would), and at step 2 process 1's part is all
padding (zeros), so its scale is 0 and its rows become 0/0 = NaN; the gradient's all-reduce then spreads the
NaN to every process's weights.

Data parallelism over a jax.distributed job, one process per host: each process feeds its own shard of the batch
and of the per-example scale (make_array_from_process_local_data); jax.distributed.initialize() takes its place
from the cluster; locally, `jaxdbg --processes 2 nan-hunt train.py` plays the cluster (CPU devices, gloo)."""
import jax

jax.distributed.initialize()
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

mesh = Mesh(np.array(jax.devices()), ("data",))
rows = NamedSharding(mesh, P("data"))


@jax.jit
def step(w, x, scale):
    xn = x / scale  # the batch normalised by its process's scale: 0/0 where a scale is 0
    y = jnp.tanh(xn @ w)
    return w - 0.1 * (xn.T @ y) / x.shape[0], jnp.mean(y ** 2)  # xn.T @ y sums over every shard: all-reduce


def loader(process: int, rows_per_process: int):
    """This process's part of each batch and its scale (its largest absolute value, one per example)."""
    rng = np.random.default_rng(process)
    for number in range(5):
        part = rng.normal(size=(rows_per_process, 8)).astype(np.float32)
        if number == 2 and process == 1:
            part[:] = 0.0  # an all-padding part of the batch
        yield part, np.full((rows_per_process, 1), np.abs(part).max(), np.float32)


w = jnp.ones((8, 8), jnp.float32) * 0.1
for part, scale in loader(jax.process_index(), 4 * jax.local_device_count()):
    w, loss = step(w, jax.make_array_from_process_local_data(rows, part),
                   jax.make_array_from_process_local_data(rows, scale))
print(jax.process_index(), float(loss))
