"""Attention over a padded batch: a padding query masks every key, so its softmax row is -inf - (-inf) = NaN."""
import jax
import jax.numpy as jnp


def attention(q, k, v, key_mask):
    scores = q @ k.T / jnp.sqrt(q.shape[-1])
    scores = jnp.where(key_mask, scores, -jnp.inf)  # <- chain
    weights = jax.nn.softmax(scores, axis=-1)  # <- origin
    return weights @ v


@jax.jit
def layer(q, k, v, key_mask):
    return attention(q, k, v, key_mask)


q = jnp.ones((3, 4))
k = jnp.ones((3, 4))
v = jnp.arange(12.0).reshape(3, 4)
key_mask = jnp.array([[True, True, False], [True, False, False], [False, False, False]])  # row 2: all padding
print(layer(q, k, v, key_mask))
