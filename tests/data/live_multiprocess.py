"""A two-process data-parallel job (jax.distributed, gloo) under jaxdbg.watch: at step 2 one example of
process 1's shard has a negative feature whose log turns the whole job NaN (tests/test_live_watch.py)."""
import sys

import jax

jax.distributed.initialize()  # first: before anything touches the backend
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxdbg  # noqa: E402

with jaxdbg.watch(out=sys.argv[1], action="log"):
    mesh = Mesh(np.array(jax.devices()), ("data",))
    sharding = NamedSharding(mesh, P("data"))

    @jax.jit
    def step(w, x):
        h = jnp.log(x[:, :1]) * 0.1  # <- origin
        y = jnp.tanh(x @ w + h)
        return w - 0.1 * (x.T @ y) / x.shape[0], jnp.mean(y ** 2)

    w = jnp.ones((8, 8), jnp.float32) * 0.1
    rng = np.random.default_rng(jax.process_index())
    for i in range(5):
        local = np.abs(rng.normal(size=(4 * jax.local_device_count(), 8))).astype(np.float32)
        if i == 2 and jax.process_index() == 1:
            local[len(local) - 3, 0] = -1.0
        x = jax.make_array_from_process_local_data(sharding, local)
        w, loss = step(w, x)
print("done", jax.process_index(), flush=True)
