"""Pallas: masked attention whose softmax is a Pallas kernel (pl.pallas_call, interpret mode so it runs on
CPU, no grid: the kernel sees the whole block), the fused softmax of the Pallas tutorials. The bug: a
sequence of padding only masks a whole row of scores to -inf, and the kernel's max-subtraction is
-inf - (-inf)."""
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl


def softmax_kernel(scores_ref, mask_ref, out_ref):
    scores = jnp.where(mask_ref[...], scores_ref[...], -jnp.inf)  # mask: -inf
    shifted = scores - jnp.max(scores, axis=-1, keepdims=True)  # NaN: -inf - (-inf) on a fully masked row
    e = jnp.exp(shifted)
    out_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)


def masked_softmax(scores, mask):
    return pl.pallas_call(softmax_kernel, out_shape=jax.ShapeDtypeStruct(scores.shape, scores.dtype),
                          interpret=True)(scores, mask)


@jax.jit
def attend(q, k, v, lengths):
    scores = q @ k.T / jnp.sqrt(q.shape[-1])
    mask = jnp.arange(k.shape[0])[None, :] < lengths[:, None]
    return masked_softmax(scores, mask) @ v


def main(steps=3):
    rng = np.random.default_rng(0)
    for step in range(steps):
        q, k, v = (jnp.asarray(rng.normal(size=(4, 8)), jnp.float32) for _ in range(3))
        lengths = np.array([8, 5, 3, 6], np.int32)
        if step == 1:
            lengths[2] = 0  # a sequence of padding only
        out = attend(q, k, v, jnp.asarray(lengths))
    return float(out.sum())


if __name__ == "__main__":
    print(main())
