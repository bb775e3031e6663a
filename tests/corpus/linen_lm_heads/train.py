"""A small decoder-only Transformer language model in Flax Linen, written the way Flax's lm1b example writes
it: a config dataclass, bf16 compute (``dtype=jnp.bfloat16``) with float32 parameters, causal and padding
masks combined with ``nn.combine_masks``, ``jax.jit(model.init)``, a ``TrainState`` and an AdamW optimiser
with a warmup and cosine decay.

The bug: the embedding was widened from 96 to 100 to match a pretrained embedding, but 100 is not a
multiple of ``num_heads`` (8): ``head_dim = emb_dim // num_heads`` is 12, and splitting the 100 features
into 8 heads of 12 fails in ``jnp.reshape`` (a TypeError raised by jax.numpy itself, before any JAX
primitive runs), inside ``jax.jit(model.init)``."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn
from flax.training import train_state

PAD = 0


@dataclasses.dataclass(frozen=True)
class Config:
    vocab_size: int = 64
    emb_dim: int = 100  # was 96
    num_heads: int = 8
    num_layers: int = 2
    mlp_dim: int = 256
    max_len: int = 16
    dtype: jnp.dtype = jnp.bfloat16


class SelfAttention(nn.Module):
    config: Config

    @nn.compact
    def __call__(self, x, mask):
        cfg = self.config
        batch, length, _ = x.shape
        head_dim = cfg.emb_dim // cfg.num_heads

        def split_heads(y):
            return y.reshape(batch, length, cfg.num_heads, head_dim)  # split into heads

        q, k, v = (split_heads(nn.Dense(cfg.emb_dim, dtype=cfg.dtype, name=n)(x)) for n in ("query", "key", "value"))
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(head_dim).astype(cfg.dtype)
        logits = jnp.where(mask, logits, jnp.finfo(cfg.dtype).min)
        weights = jax.nn.softmax(logits.astype(jnp.float32)).astype(cfg.dtype)
        out = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(batch, length, cfg.num_heads * head_dim)
        return nn.Dense(cfg.emb_dim, dtype=cfg.dtype, name="out")(out)


class DecoderBlock(nn.Module):
    config: Config

    @nn.compact
    def __call__(self, x, mask):
        cfg = self.config
        x = x + SelfAttention(cfg)(nn.LayerNorm(dtype=cfg.dtype)(x), mask)
        y = nn.LayerNorm(dtype=cfg.dtype)(x)
        y = nn.Dense(cfg.mlp_dim, dtype=cfg.dtype)(y)
        return x + nn.Dense(cfg.emb_dim, dtype=cfg.dtype)(nn.gelu(y))


class TransformerLM(nn.Module):
    config: Config

    @nn.compact
    def __call__(self, tokens):
        cfg = self.config
        mask = nn.combine_masks(nn.make_attention_mask(tokens > PAD, tokens > PAD),
                                nn.make_causal_mask(tokens))
        x = nn.Embed(cfg.vocab_size, cfg.emb_dim)(tokens).astype(cfg.dtype)
        x = x + self.param("pos", nn.initializers.normal(0.02), (1, cfg.max_len, cfg.emb_dim)).astype(cfg.dtype)
        for _ in range(cfg.num_layers):
            x = DecoderBlock(cfg)(x, mask)
        return nn.Dense(cfg.vocab_size, dtype=jnp.float32)(nn.LayerNorm(dtype=cfg.dtype)(x))


def loss_fn(params, state, tokens):
    logits = state.apply_fn({"params": params}, tokens[:, :-1])
    targets = tokens[:, 1:]
    weights = (targets > PAD).astype(jnp.float32)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    return jnp.sum(losses * weights) / jnp.maximum(jnp.sum(weights), 1.0)


@jax.jit
def train_step(state, tokens):
    loss, grads = jax.value_and_grad(loss_fn)(state.params, state, tokens)
    return state.apply_gradients(grads=grads), loss


def sentences(rng, count, length):
    """Padded token sequences with a learnable pattern (each token follows from the previous one)."""
    tokens = np.zeros((count, length), np.int32)
    for row in tokens:
        n = rng.integers(length // 2, length + 1)
        row[0] = rng.integers(1, 64)
        for i in range(1, n):
            row[i] = 1 + (row[i - 1] * 7) % 63
    return tokens


if __name__ == "__main__":
    config = Config()
    rng = np.random.default_rng(0)
    data = sentences(rng, 256, config.max_len + 1)
    model = TransformerLM(config)
    variables = jax.jit(model.init)(jax.random.PRNGKey(0), jnp.ones((1, config.max_len), jnp.int32))
    schedule = optax.warmup_cosine_decay_schedule(0.0, 3e-3, warmup_steps=20, decay_steps=200)
    state = train_state.TrainState.create(apply_fn=model.apply, params=variables["params"],
                                          tx=optax.adamw(schedule, weight_decay=0.01))
    for step in range(40):
        batch = data[rng.integers(0, len(data), 16)]
        state, loss = train_step(state, jnp.asarray(batch))
        if step % 10 == 0:
            print(step, float(loss))
