"""A feature extractor whose jitted result disagrees with op-by-op execution, and a test that notices.

`snap` rounds values to the float32 grid at 1e8 with the classic `(y + 1e8) - 1e8` trick. Op by op, float32
rounding turns every small value into 0. Under jax.jit, XLA's algebraic simplifier rewrites the
expression to `y`, so the jitted features differ. The script's own check fails with
`AssertionError: jit and op-by-op disagree`.
"""
import jax
import jax.numpy as jnp
import numpy as np

SHIFT = 1e8


def snap(y):
    return (y + SHIFT) - SHIFT


def features(x, w, b):
    h = jnp.tanh(x @ w + b)
    pooled = jnp.concatenate([h.mean(0), h.max(0)])
    scaled = pooled / (1.0 + jnp.abs(pooled).sum())
    return jnp.sort(snap(scaled * 4.0))


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((16, 8)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((8, 4)), jnp.float32)
    b = jnp.zeros(4, jnp.float32)
    jit_out = jax.jit(features)(x, w, b)
    with jax.disable_jit():
        eager_out = features(x, w, b)
    print("jit  :", np.asarray(jit_out))
    print("eager:", np.asarray(eager_out))
    assert np.allclose(jit_out, eager_out, atol=1e-3), "jit and op-by-op disagree"
