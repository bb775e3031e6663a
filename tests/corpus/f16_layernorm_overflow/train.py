"""An embedding model trained in float16 (contrastive style: the embeddings are L2-normalised), with a layer norm
written by hand as E[x^2] - E[x]^2. The bug: the input features are raw sensor values (centred, but with a
spread of ~400, never scaled), and `x * x` overflows float16 (max 65504): the mean of squares is inf, so the
variance is inf, rsqrt(inf + eps) is 0 and every embedding is exactly 0; the L2 normalisation then divides
0 by 0: NaN, at the first step. The epsilon is there; it does not help."""
import jax
import jax.numpy as jnp
import numpy as np

D, E = 32, 8


def layer_norm(x, eps=1e-5):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    mean_sq = jnp.mean(x * x, axis=-1, keepdims=True)  # the bug: x * x overflows float16
    return (x - mean) * jax.lax.rsqrt(mean_sq - mean * mean + eps)


def embed(params, x):
    z = layer_norm(x) @ params["w"]
    return z / jnp.linalg.norm(z, axis=-1, keepdims=True)  # the NaN: 0 / 0


def loss_fn(params, x, x_pair):
    similarity = jnp.sum(embed(params, x) * embed(params, x_pair), axis=-1)
    return jnp.mean(1.0 - similarity.astype(jnp.float32))


@jax.jit
def train_step(params, x, x_pair):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, x_pair)
    return jax.tree_util.tree_map(lambda p, g: p - jnp.float16(1e-2) * g, params, grads), loss


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(0, 1 / np.sqrt(D), (D, E)), jnp.float16)}
    for step in range(3):
        x = rng.normal(0, 400, (16, D))  # raw readings: centred, never scaled
        params, loss = train_step(params, jnp.asarray(x, jnp.float16), jnp.asarray(x + 1.0, jnp.float16))
        print(step, float(loss))
