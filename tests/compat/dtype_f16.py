"""float16: a half-precision layer fed raw pixel values, the issue's case of a model cast to float16 to
save memory with its inputs never scaled. The bug: the projection of pixels near 275 overflows float16's
range (65504) to Inf in the forward pass, and the layer norm after it makes NaN of it (inf - inf)."""
import jax
import jax.numpy as jnp
import numpy as np


def layer_norm(h):
    mean = h.mean(-1, keepdims=True)
    centred = h - mean  # NaN: inf - inf
    return centred * jax.lax.rsqrt((centred ** 2).mean(-1, keepdims=True) + jnp.float16(1e-3))


@jax.jit
def train_step(w, pixels):
    def loss_fn(w):
        h = pixels.astype(jnp.float16) @ w.astype(jnp.float16)  # the root cause: leaves float16's range
        return (layer_norm(h).astype(jnp.float32) ** 2).mean()

    loss, grad = jax.value_and_grad(loss_fn)(w)
    return w - 0.01 * grad, loss


def main(steps=4):
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.uniform(60.0, 80.0, size=(6, 4)), jnp.float32)
    for step in range(steps):
        pixels = rng.uniform(0.0, 1.0, size=(3, 6)).astype(np.float32)
        if step == 2:
            pixels = rng.uniform(250.0, 300.0, size=(3, 6)).astype(np.float32)  # raw, unscaled pixels
        w, loss = train_step(w, jnp.asarray(pixels))
    return float(loss)


if __name__ == "__main__":
    print(main())
