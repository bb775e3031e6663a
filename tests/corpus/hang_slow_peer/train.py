"""A slow peer, not a stuck one: at step 1 process 1 decodes its batch in pure Python for SLOW_S seconds (CPU
work, no JAX call), while the other processes wait for it in the gradient's all-reduce. Their wait is longer
than `--stall`, but process 1 is working the whole time: `jaxdbg --processes 2 hang-hunt train.py --stall 1.5`
must let the job finish and report no stall."""
import sys
import time

import jax

jax.distributed.initialize()
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

SLOW_S = float(sys.argv[1]) if len(sys.argv) > 1 else 4.0
mesh = Mesh(np.array(jax.devices()), ("data",))
sharding = NamedSharding(mesh, P("data"))


@jax.jit
def step(w, x):
    y = jnp.tanh(x @ w)
    return w - 0.1 * (x.T @ y) / x.shape[0], jnp.mean(y ** 2)  # x.T @ y sums over every shard: all-reduce


def decode(rng, index):
    if index == 1 and jax.process_index() == 1:
        end, total = time.perf_counter() + SLOW_S, 0.0
        while time.perf_counter() < end:  # a slow decoder in pure Python
            total += sum(i * 0.5 for i in range(1000))
    return rng.normal(size=(4 * jax.local_device_count(), 8)).astype(np.float32)


w = jnp.ones((8, 8), jnp.float32) * 0.1
rng = np.random.default_rng(jax.process_index())
for i in range(4):
    x = jax.make_array_from_process_local_data(sharding, decode(rng, i))
    w, loss = step(w, x)
print(jax.process_index(), float(loss))
