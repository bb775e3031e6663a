"""A step whose output no machine can hold: XLA raises RESOURCE_EXHAUSTED ("Out of memory allocating ...")
when its output buffer is allocated, on CPU too (the allocation is beyond what the address space can map)."""
import jax
import jax.numpy as jnp


@jax.jit
def expand(scale):
    return jnp.arange(1 << 55, dtype=jnp.float32) * scale  # <- 128 PiB of output


weights = [jnp.ones((256, 256)) * i for i in range(4)]  # what else is live when it fails
print(float(expand(jnp.float32(2.0))[0]))  # <- the call
