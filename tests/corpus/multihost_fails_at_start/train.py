"""A process fails as the job starts: process 1 finds no data shard of its own right after joining the job and
raises, while process 0 goes on into the job's start (its devices, then a sum over every shard) and waits there
for a process that is gone, until the runtime gives up (on CPU gloo's rendezvous deadline, about 100 s; on a GPU
it may wait in the backend's start for good). `jaxdbg --processes 2 profile train.py` stops it a grace period
after process 1 failed. On a machine with fewer GPUs than processes, a process fails like process 1 here, at
`jax.devices()` ('no supported devices found for platform CUDA')."""
import jax

jax.distributed.initialize()
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

shards = {0: np.random.default_rng(0).normal(size=(16, 8)).astype(np.float32)}  # the manifest lost shard 1
if jax.process_index() not in shards:
    raise FileNotFoundError(f"no data shard for process {jax.process_index()}")  # <- process 1 fails here
mesh = Mesh(np.array(jax.devices()), ("data",))  # every process's devices: process 0 waits here for process 1's
local = shards[jax.process_index()][: 4 * jax.local_device_count()]
batch = jax.make_array_from_process_local_data(NamedSharding(mesh, P("data")), local)
print("mean of the batch:", float(jax.jit(jnp.mean)(batch)))  # an all-reduce over every process
