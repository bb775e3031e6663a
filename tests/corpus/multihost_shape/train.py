"""A shape error in a sharded step: the layer's weight is made (16, 16), the hidden width twice, instead of
(features, hidden) = (8, 16), so `x @ w` cannot contract 8 features with 16 rows. Every process traces the same step on the global batch, so
every process fails the same way, with the job's global shapes: no second process is needed to see it.

Data parallelism over a jax.distributed job, one process per host: each process feeds its own shard of the
batch (make_array_from_process_local_data); locally, `jaxdbg --processes 2 repro train.py` plays the cluster."""
import jax

jax.distributed.initialize()
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

mesh = Mesh(np.array(jax.devices()), ("data",))
sharding = NamedSharding(mesh, P("data"))


@jax.jit
def step(params, x):
    w, b = params
    y = jnp.tanh(x @ w + b)  # the hidden layer: fails here
    return jnp.mean(y ** 2)


params = (jnp.ones((16, 16), jnp.float32) * 0.1, jnp.zeros((16,), jnp.float32))  # bug: w's rows are not 8
rng = np.random.default_rng(jax.process_index())
for i in range(3):
    local = rng.normal(size=(4 * jax.local_device_count(), 8)).astype(np.float32)
    x = jax.make_array_from_process_local_data(sharding, local)
    print(jax.process_index(), float(step(params, x)))
