"""shard_map with a ring of lax.ppermute: each device holds a block of keys and values, and passes them round
the ring so every device scores its queries against all of them (the blockwise "ring attention" pattern),
with a running log-sum-exp. The bug: a block of keys that is all padding is masked to -inf, and the running
maximum of a query that has seen only padding so far is -inf: -inf - (-inf) in the rescaling."""
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

MESH = Mesh(np.array(jax.devices()[:4]), ("ring",))  # a ring of 4 of the 8 devices


@partial(jax.shard_map, mesh=MESH, in_specs=(P("ring"), P("ring"), P("ring"), P("ring")), out_specs=P("ring"))
def ring_attention(q, k, v, valid):
    n = jax.lax.psum(1, "ring")
    perm = [(i, (i + 1) % n) for i in range(n)]
    running_max = jnp.full((q.shape[0], 1), -jnp.inf)
    total = jnp.zeros((q.shape[0], 1))
    out = jnp.zeros_like(q)
    for _ in range(n):
        scores = jnp.where(valid[None, :], q @ k.T, -jnp.inf)  # padding: -inf
        new_max = jnp.maximum(running_max, scores.max(axis=-1, keepdims=True))
        correction = jnp.exp(running_max - new_max)  # NaN: -inf - (-inf) while only padding was seen
        p = jnp.exp(scores - new_max)
        total = total * correction + p.sum(axis=-1, keepdims=True)
        out = out * correction + p @ v
        running_max = new_max
        k, v, valid = (jax.lax.ppermute(t, "ring", perm) for t in (k, v, valid))
    return out / total


@jax.jit
def train_step(wq, x, valid):
    def loss_fn(wq):
        q = x @ wq
        return jnp.mean(ring_attention(q, x, x, valid) ** 2)
    loss, grad = jax.value_and_grad(loss_fn)(wq)
    return wq - 0.1 * grad, loss


def main(steps=4):
    n = MESH.size
    rng = np.random.default_rng(0)
    wq = jnp.asarray(rng.normal(size=(4, 4)) / 2, jnp.float32)
    for step in range(steps):
        x = jnp.asarray(rng.normal(size=(2 * n, 4)), jnp.float32)
        valid = np.ones(2 * n, bool)
        if step == 2:
            valid[:2] = False  # the first device's block of keys is padding
        wq, loss = train_step(wq, x, jnp.asarray(valid))
    return float(loss)


if __name__ == "__main__":
    print(main())
