"""bfloat16: attention computed in bf16 with a padding mask, the mixed-precision setup of Flax's
dtype=jnp.bfloat16 models. The bug: masked scores are set to -inf, and a query whose keys are all padding
gets softmax(-inf, ..., -inf): -inf - (-inf) is NaN."""
import jax
import jax.numpy as jnp
import numpy as np


def attention(q, k, v, mask):
    scores = (q @ k.T) / jnp.sqrt(jnp.bfloat16(q.shape[-1]))
    scores = jnp.where(mask, scores, -jnp.inf)  # padding: -inf
    weights = jax.nn.softmax(scores, axis=-1)  # NaN: a row with every key masked
    return weights @ v


@jax.jit
def train_step(w, x, mask):
    def loss_fn(w):
        h = (x @ w).astype(jnp.bfloat16)
        out = attention(h, h, h, mask)
        return (out.astype(jnp.float32) ** 2).mean()

    loss, grad = jax.value_and_grad(loss_fn)(w)
    return w - 0.01 * grad, loss


def main(steps=4):
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.normal(size=(8, 8)) * 0.3, jnp.float32)
    for step in range(steps):
        x = rng.normal(size=(5, 8)).astype(np.float32)
        mask = np.ones((5, 5), bool)
        if step == 2:
            mask[:, 3:] = False
            mask[3:, :] = False  # padding queries: nothing to attend to
        w, loss = train_step(w, x, jnp.asarray(mask))
    return float(loss)


if __name__ == "__main__":
    print(main())
