"""A small decoder-only Transformer language model in Flax NNX, trained the way Flax's examples train one:
a config dataclass, bf16 compute with float32 parameters, padding masks, an Optax warmup-cosine schedule with
gradient clipping, nnx.Optimizer and an nnx.jit train step over a synthetic token dataloader.

The bug: like Flax's lm1b config, the attention width (qkv_dim) differs from the embedding width (emb_dim),
but the attention output projection was declared emb_dim -> emb_dim. The first train step fails while
tracing with a dot_general shape error in that projection."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    vocab_size: int = 512
    emb_dim: int = 64
    qkv_dim: int = 48
    num_heads: int = 4
    mlp_dim: int = 128
    num_layers: int = 2
    max_len: int = 32
    dropout_rate: float = 0.1
    dtype: jnp.dtype = jnp.bfloat16


class Attention(nnx.Module):
    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.head_dim = config.qkv_dim // config.num_heads
        linear = lambda i, o: nnx.Linear(i, o, dtype=config.dtype, use_bias=False, rngs=rngs)  # noqa: E731
        self.query = linear(config.emb_dim, config.qkv_dim)
        self.key = linear(config.emb_dim, config.qkv_dim)
        self.value = linear(config.emb_dim, config.qkv_dim)
        self.out = linear(config.emb_dim, config.emb_dim)  # the bug: its input is qkv_dim wide

    def split_heads(self, x):
        batch, length, _ = x.shape
        return x.reshape(batch, length, self.config.num_heads, self.head_dim)

    def __call__(self, x, mask):
        q, k, v = self.split_heads(self.query(x)), self.split_heads(self.key(x)), self.split_heads(self.value(x))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(self.head_dim).astype(self.config.dtype)
        scores = jnp.where(mask, scores, jnp.finfo(self.config.dtype).min)
        weights = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(self.config.dtype)
        mixed = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
        mixed = mixed.reshape(x.shape[0], x.shape[1], self.config.qkv_dim)
        return self.out(mixed)  # attention output projection


class MlpBlock(nnx.Module):
    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.fc1 = nnx.Linear(config.emb_dim, config.mlp_dim, dtype=config.dtype, rngs=rngs)
        self.fc2 = nnx.Linear(config.mlp_dim, config.emb_dim, dtype=config.dtype, rngs=rngs)
        self.dropout = nnx.Dropout(config.dropout_rate, rngs=rngs)

    def __call__(self, x):
        return self.fc2(self.dropout(nnx.gelu(self.fc1(x))))


class DecoderBlock(nnx.Module):
    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.ln1 = nnx.LayerNorm(config.emb_dim, dtype=config.dtype, rngs=rngs)
        self.attention = Attention(config, rngs=rngs)
        self.ln2 = nnx.LayerNorm(config.emb_dim, dtype=config.dtype, rngs=rngs)
        self.mlp = MlpBlock(config, rngs=rngs)

    def __call__(self, x, mask):
        x = x + self.attention(self.ln1(x), mask)
        return x + self.mlp(self.ln2(x))


class TransformerLM(nnx.Module):
    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.embed = nnx.Embed(config.vocab_size, config.emb_dim, dtype=config.dtype, rngs=rngs)
        self.pos_embed = nnx.Param(jax.random.normal(rngs.params(), (config.max_len, config.emb_dim)) * 0.02)
        self.blocks = nnx.List([DecoderBlock(config, rngs=rngs) for _ in range(config.num_layers)])
        self.ln_f = nnx.LayerNorm(config.emb_dim, dtype=config.dtype, rngs=rngs)

    def __call__(self, tokens):
        length = tokens.shape[1]
        causal = jnp.tril(jnp.ones((length, length), dtype=bool))
        padding = tokens != 0
        mask = causal[None, None] & padding[:, None, None, :]
        x = self.embed(tokens) + self.pos_embed[:length].astype(self.config.dtype)
        for block in self.blocks:
            x = block(x, mask)
        return self.embed.attend(self.ln_f(x)).astype(jnp.float32)


def loss_fn(model: TransformerLM, batch):
    inputs, targets = batch[:, :-1], batch[:, 1:]
    logits = model(inputs)
    weights = (targets != 0).astype(jnp.float32)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    return (losses * weights).sum() / jnp.maximum(weights.sum(), 1.0)


@nnx.jit
def train_step(model: TransformerLM, optimizer: nnx.Optimizer, batch):
    loss, grads = nnx.value_and_grad(loss_fn)(model, batch)
    optimizer.update(model, grads)
    return loss


def synthetic_batches(rng, config: TransformerConfig, batch_size: int, steps: int):
    """Random token sequences of random lengths, right-padded with 0 (the padding token)."""
    for _ in range(steps):
        lengths = rng.integers(config.max_len // 2, config.max_len + 1, size=batch_size)
        tokens = rng.integers(1, config.vocab_size, size=(batch_size, config.max_len + 1))
        tokens[np.arange(config.max_len + 1)[None, :] >= lengths[:, None]] = 0
        yield jnp.asarray(tokens, dtype=jnp.int32)


def make_optimizer(model, total_steps: int, peak_lr: float = 3e-3):
    schedule = optax.warmup_cosine_decay_schedule(0.0, peak_lr, warmup_steps=total_steps // 10,
                                                  decay_steps=total_steps, end_value=peak_lr / 10)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, b2=0.98, weight_decay=0.1))
    return nnx.Optimizer(model, tx, wrt=nnx.Param)


def main():
    config = TransformerConfig()
    model = TransformerLM(config, rngs=nnx.Rngs(params=0, dropout=1))
    steps = 20
    optimizer = make_optimizer(model, steps)
    for step, batch in enumerate(synthetic_batches(np.random.default_rng(0), config, 8, steps)):
        loss = train_step(model, optimizer, batch)
        if step % 5 == 0:
            print(f"step {step}: loss {float(loss):.4f}")


if __name__ == "__main__":
    main()
