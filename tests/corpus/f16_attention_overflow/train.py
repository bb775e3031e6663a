"""A small self-attention classifier trained in float16 to save memory (parameters and activations f16), the
way a first try at mixed precision often goes. The bug: the token features are raw sensor readings (up to
~500, never normalised), and the attention logits `q @ k.T` are neither scaled by 1/sqrt(d) nor computed in
float32, so they overflow float16 (max 65504) to inf; the softmax then takes inf - inf: NaN, at the first
step."""
import jax
import jax.numpy as jnp
import numpy as np

D = 16


def init(rng):
    scale = 1.0 / np.sqrt(D)
    return {name: jnp.asarray(rng.normal(0, scale, (D, D)), jnp.float16) for name in ("wq", "wk", "wv", "wo")}


def attention(params, x):
    q, k, v = x @ params["wq"], x @ params["wk"], x @ params["wv"]
    logits = q @ jnp.swapaxes(k, -1, -2)  # the bug: f16 logits, no 1/sqrt(d): they overflow 65504
    weights = jax.nn.softmax(logits, axis=-1)  # the NaN: inf - inf
    return (weights @ v) @ params["wo"]


def loss_fn(params, x, y):
    pred = attention(params, x).mean(axis=(1, 2))
    return jnp.mean((pred.astype(jnp.float32) - y) ** 2)


@jax.jit
def train_step(params, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return jax.tree_util.tree_map(lambda p, g: p - jnp.float16(1e-3) * g, params, grads), loss


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    params = init(rng)
    for step in range(3):
        x = jnp.asarray(rng.uniform(0, 500, (4, 8, D)), jnp.float16)  # raw readings, not normalised
        y = jnp.asarray(rng.normal(size=(4,)), jnp.float32)
        params, loss = train_step(params, x, y)
        print(step, float(loss))
