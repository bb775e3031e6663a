"""A host is lost mid-job: at step 3 process 1 is killed (SIGKILL stands for a preemption or the OOM killer),
and the gradient's all-reduce in process 0 fails at once (gloo: the connection to the lost peer is reset).

The job asks JAX's coordination service to notice a silent host within 10 s (heartbeat_timeout_seconds,
default 100 s), as jobs that would rather restart soon than wait do; so every process of the job ends
soon after the loss instead of waiting minutes in the runtime's shutdown.

Data parallelism over a jax.distributed job, one process per host: each process feeds its own shard of the
batch (make_array_from_process_local_data), the step all-reduces the gradient. Locally,
`jaxdbg --processes 2 repro train.py` plays the cluster (CPU devices, gloo collectives)."""
import os
import signal

import jax

jax.distributed.initialize(heartbeat_timeout_seconds=10)
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
        os.kill(os.getpid(), signal.SIGKILL)  # the host was preempted
    local = rng.normal(size=(4 * jax.local_device_count(), 8)).astype(np.float32)
    x = jax.make_array_from_process_local_data(sharding, local)
    w, loss = step(w, x)
    print(jax.process_index(), i, float(loss))
