"""sparse: a graph convolution with a jax.experimental.sparse BCOO adjacency (sparse @ dense), mean
aggregation over neighbours, as the jax.experimental.sparse docs and jraph-style GCNs write it. The bug:
a node with no edges has degree 0, and its mean over no neighbours is 0 / 0."""
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import sparse


def gcn_layer(w, adj, x):
    degree = adj @ jnp.ones((adj.shape[1],))  # sparse @ dense: the number of neighbours
    mean = (adj @ (x @ w)) / degree[:, None]  # NaN: 0 / 0 for an isolated node
    return jax.nn.relu(mean)


@jax.jit
def train_step(w, adj, x, y):
    def loss_fn(w):
        return ((gcn_layer(w, adj, x).sum(1) - y) ** 2).mean()

    loss, grad = jax.value_and_grad(loss_fn)(w)
    return w - 0.1 * grad, loss


def main(steps=4):
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.normal(size=(3, 4)) * 0.1, jnp.float32)
    for step in range(steps):
        dense = (rng.uniform(size=(6, 6)) < 0.5).astype(np.float32)
        np.fill_diagonal(dense, 1.0)  # self-loops: every node is its own neighbour
        if step == 2:
            dense[4, :] = 0.0  # node 4 lost its edges, self-loop included
        adj = sparse.BCOO.fromdense(jnp.asarray(dense), nse=36)
        x = rng.normal(size=(6, 3)).astype(np.float32)
        w, loss = train_step(w, adj, x, jnp.ones((6,)))
    return float(loss)


if __name__ == "__main__":
    print(main())
