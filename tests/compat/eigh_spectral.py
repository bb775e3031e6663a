"""jnp.linalg.eigh: a spectral loss, as in spectral clustering and graph-learning code: the edge weights of a
graph are learned so that the Fiedler vector of its Laplacian (the eigenvector of the second-smallest
eigenvalue) separates two labelled groups. The bug: a batch whose edge list is empty has a Laplacian of
zeros, every eigenvalue is exactly 0, and eigh's derivative divides by their differences, 1 / (0 - 0)."""
import jax
import jax.numpy as jnp
import numpy as np


def laplacian(weights, adjacency):
    w = adjacency * jax.nn.softplus(weights)
    w = (w + w.T) / 2
    return jnp.diag(w.sum(axis=1)) - w


@jax.jit
def train_step(weights, adjacency, labels):
    def loss_fn(ws):
        _, vectors = jnp.linalg.eigh(laplacian(ws, adjacency))  # NaN: the derivative of eigh at repeated eigenvalues
        return -(vectors[:, 1] @ labels) ** 2

    loss, grads = jax.value_and_grad(loss_fn)(weights)
    return weights - 0.1 * grads, loss


def main(steps=3):
    rng = np.random.default_rng(0)
    weights = jnp.asarray(rng.normal(size=(6, 6)), jnp.float32)
    labels = jnp.asarray([1.0, 1.0, 1.0, -1.0, -1.0, -1.0]) / np.sqrt(6.0)
    for step in range(steps):
        adjacency = np.triu((rng.uniform(size=(6, 6)) < 0.5).astype(np.float32), 1)
        adjacency[np.arange(5), np.arange(1, 6)] = 1.0  # a path through every node: the graph is connected
        if step == 2:
            adjacency[:] = 0.0  # the edge list of this batch came back empty
        weights, loss = train_step(weights, jnp.asarray(adjacency + adjacency.T), labels)
    return float(loss)


if __name__ == "__main__":
    print(main())
