"""One hot op: an attention-like score matmul dominates a step full of cheap elementwise work.
Run: jaxdbg profile recipes/hot_op/train.py
"""

import jax
import jax.numpy as jnp


@jax.jit
def step(q, k, v):
    q = jnp.tanh(q) * 0.5 + 0.1
    k = jax.nn.relu(k) - 0.2
    scores = q @ k.T  # the hot op: [1024, 256] x [256, 1024]
    weights = jax.nn.sigmoid(scores)
    return (weights[:, :64] * v[:, :64]).sum()


def main(steps: int = 6) -> None:
    keys = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(key, (1024, 256)) for key in keys)
    for _ in range(steps):
        value = step(q, k, v)
    print(f"value {float(value):.4f}")


if __name__ == "__main__":
    main()
