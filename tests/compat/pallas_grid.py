"""Pallas with a grid: a row-wise RMS normalisation kernel over blocks of rows (pl.pallas_call with a grid and
BlockSpecs, interpret mode so it runs on CPU), the tiled layout of the Pallas tutorials. The bug: the kernel
divides by the block's root mean square with no epsilon; a batch whose third block of rows is all zeros
(padding) divides 0 by 0 in the program that handles it."""
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

BLOCK = 8


def rms_norm_kernel(x_ref, scale_ref, out_ref):
    x = x_ref[...]
    rms = jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True))
    out_ref[...] = x / rms * scale_ref[...]  # NaN: 0 / 0 on a row of padding


def rms_norm(x, scale):
    rows, width = x.shape
    return pl.pallas_call(
        rms_norm_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(rows // BLOCK,),
        in_specs=[pl.BlockSpec((BLOCK, width), lambda i: (i, 0)), pl.BlockSpec((1, width), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((BLOCK, width), lambda i: (i, 0)), interpret=True)(x, scale)


@jax.jit
def train_step(w, scale, x, y):
    def loss_fn(w):
        return jnp.mean((rms_norm(x, scale) @ w - y) ** 2)
    loss, grad = jax.value_and_grad(loss_fn)(w)
    return w - 0.05 * grad, loss


def main(steps=4):
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.normal(size=(16, 1)) / 4, jnp.float32)
    scale = jnp.ones((1, 16), jnp.float32)
    for step in range(steps):
        x = rng.normal(size=(4 * BLOCK, 16)).astype(np.float32)
        if step == 2:
            x[2 * BLOCK:3 * BLOCK] = 0.0  # the third block of rows is padding
        y = rng.normal(size=(4 * BLOCK, 1)).astype(np.float32)
        w, loss = train_step(w, scale, jnp.asarray(x), jnp.asarray(y))
    return float(loss)


if __name__ == "__main__":
    print(main())
