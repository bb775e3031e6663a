"""A compile-heavy function: a Python loop unrolls 48 layers into one long XLA program.

Compiling it takes far longer than running it. `lax.scan` over stacked weights compiles the layer once.
Run: jaxdbg profile recipes/compile_heavy/train.py   or   ... train.py::unrolled_mlp --args "f32[16,64]"
"""

import jax
import jax.numpy as jnp

LAYERS = 48


@jax.jit
def unrolled_mlp(x):
    for i in range(LAYERS):  # unrolled at trace time: 48 copies of the layer in the HLO
        w = jnp.eye(64, dtype=x.dtype) * (1.0 + 0.001 * i)
        x = jnp.tanh(x @ w + 0.01 * i)
    return x.sum()


def main() -> None:
    x = jnp.ones((16, 64))
    for _ in range(3):
        value = unrolled_mlp(x)
    print(f"value {float(value):.4f}")


if __name__ == "__main__":
    main()
