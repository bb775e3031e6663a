"""A host-transfer bottleneck: the data lives on the host as float64 numpy arrays and every step
hands a fresh one to the jitted step (converted and copied to the device on each call), then reads
the loss back with float() (a device->host sync every step). The step itself is cheap: it pools each
row of 1024 values down to 64 features before a small linear model.
Run: jaxdbg profile recipes/host_transfer/train.py
"""

import jax
import jax.numpy as jnp
import numpy as np


@jax.jit
def train_step(w, batch):
    features = batch.reshape(batch.shape[0], 64, -1).mean(axis=-1)  # pool 1024 -> 64 per row
    error = features @ w - 1.0
    loss = jnp.mean(error**2)
    return w - 1e-2 * features.T @ error / batch.shape[0], loss


def main(steps: int = 12) -> None:
    rng = np.random.default_rng(0)
    batches = [rng.standard_normal((1024, 1024)) for _ in range(4)]  # float64 on the host, 8 MiB each
    w = jnp.zeros((64,))
    losses = []
    for step in range(steps):
        w, loss = train_step(w, batches[step % len(batches)])
        losses.append(float(loss))
    print(f"final loss {losses[-1]:.4f}")


if __name__ == "__main__":
    main()
