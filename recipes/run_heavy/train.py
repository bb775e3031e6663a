"""A run-heavy function: small to compile, long to execute (a loop of matmuls inside one program).
Run: jaxdbg profile recipes/run_heavy/train.py   or   ... train.py::power_iterations --args "f32[384,384]"
"""

import jax
import jax.numpy as jnp


@jax.jit
def power_iterations(a):
    def body(_, v):
        v = a @ v
        return v / jnp.linalg.norm(v)

    v = jax.lax.fori_loop(0, 40, body, jnp.ones((a.shape[0], a.shape[0]), a.dtype) / a.shape[0])
    return v.sum()


def main() -> None:
    a = jax.random.normal(jax.random.key(0), (384, 384))
    for _ in range(4):
        value = power_iterations(a)
    print(f"value {float(value):.4f}")


if __name__ == "__main__":
    main()
