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

# Inside a shard_map the body's values span both processes' devices: process 1's last device gets padding only
# (every weight 0), and its weighted mean is 0 / 0; the replay reads each process's own blocks and gathers them.
with jaxdbg.watch(out=sys.argv[1] + "-shard-map", action="log"):
    def device_mean(x, weight):
        return jax.lax.pmean(jnp.sum(weight * x) / jnp.sum(weight), "data")  # <- block origin

    mean = jax.jit(jax.shard_map(device_mean, mesh=mesh, in_specs=(P("data"), P("data")), out_specs=P()))
    weight = np.ones(2 * jax.local_device_count(), np.float32)
    if jax.process_index() == 1:
        weight[-2:] = 0.0
    mean(*(jax.make_array_from_process_local_data(sharding, a) for a in (np.ones_like(weight), weight)))
print("done", jax.process_index(), flush=True)
