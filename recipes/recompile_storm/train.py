"""A training loop that recompiles on almost every step.

Two classic causes: the batch size changes from step to step (ragged batches from a data loader that
does not drop the remainder), and the evaluation function is jitted anew inside the loop.
Run: python recipes/recompile_storm/train.py  (plain)  or  jaxdbg profile recipes/recompile_storm/train.py
"""

import jax
import jax.numpy as jnp
import numpy as np


@jax.jit
def train_step(params, batch):
    def loss_fn(p):
        return jnp.mean((batch @ p["w"] + p["b"]) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss


def main(steps: int = 12) -> None:
    params = {"w": jnp.full((32, 1), 0.1), "b": jnp.zeros(1)}
    rng = np.random.default_rng(0)
    for step in range(steps):
        size = 8 + step % 4  # ragged batches: 8, 9, 10, 11, 8, ...
        batch = jnp.asarray(rng.standard_normal((size, 32)), jnp.float32)
        params, loss = train_step(params, batch)
        evaluate = jax.jit(lambda p, x: jnp.abs(x @ p["w"]).max())  # a fresh callable every step
        evaluate(params, batch)
    print(f"final loss {float(loss):.4f}")


if __name__ == "__main__":
    main()
