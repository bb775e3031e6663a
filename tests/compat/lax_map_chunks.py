"""lax.map: a pairwise RBF kernel evaluated in chunks with jax.lax.map(batch_size=...) to bound memory,
as GP and kernel-density code does (a scan over vmapped chunks), with jax.checkpoint on the row function.
The bug: the distance is sqrt(|q|^2 + |p|^2 - 2 q.p + offset), and a corrupt per-query offset in the third
chunk makes it negative."""
import jax
import jax.numpy as jnp
import numpy as np


@jax.jit
def kernel_rows(queries, points, offsets):
    sq_points = jnp.sum(points ** 2, axis=1)

    @jax.checkpoint
    def row(args):
        q, offset = args
        sq = jnp.sum(q ** 2) + sq_points - 2.0 * points @ q
        dist = jnp.sqrt(sq + offset)  # NaN: sqrt of a negative (a corrupt offset)
        return jnp.exp(-dist).sum()

    return jax.lax.map(row, (queries, offsets), batch_size=4)  # 3 chunks of 4 rows: a scan over vmapped rows


def main(steps=3):
    rng = np.random.default_rng(0)
    points = rng.normal(size=(5, 3)).astype(np.float32)
    for step in range(steps):
        queries = rng.normal(size=(12, 3)).astype(np.float32)
        offsets = np.zeros((12,), np.float32)
        if step == 1:
            offsets[9] = -1e3  # query 9 (chunk 2) carries a corrupt offset
        values = kernel_rows(queries, points, jnp.asarray(offsets))
    return float(values.sum())


if __name__ == "__main__":
    print(main())
