"""A small decoder-only Transformer language model in Flax NNX, trained the way Flax's lm1b/gemma examples
train one: token embedding, causal self-attention with a padding mask, bf16 compute over f32 parameters,
a weighted cross-entropy that ignores padding, optax AdamW with warmup, nnx.jit around the whole step.

What profile must show: the model is built eagerly (NNX initialises every parameter outside jit, so each
initialiser compiles on its own: seconds of compile time outside any jitted function), and the matmuls of
the step, made inside Flax's layers, are tied to the user's lines that call those layers. The eval function's
name is longer than an 80-column table leaves room for."""
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

VOCAB, WIDTH, HEADS, LAYERS, LENGTH, BATCH = 256, 64, 4, 2, 32, 8


class Block(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.norm1 = nnx.LayerNorm(WIDTH, dtype=jnp.bfloat16, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(HEADS, WIDTH, dtype=jnp.bfloat16, decode=False, rngs=rngs)
        self.norm2 = nnx.LayerNorm(WIDTH, dtype=jnp.bfloat16, rngs=rngs)
        self.up = nnx.Linear(WIDTH, 4 * WIDTH, dtype=jnp.bfloat16, rngs=rngs)
        self.down = nnx.Linear(4 * WIDTH, WIDTH, dtype=jnp.bfloat16, rngs=rngs)

    def __call__(self, x, mask):
        x = x + self.attn(self.norm1(x), mask=mask)  # matmul: attention
        return x + self.down(nnx.gelu(self.up(self.norm2(x))))  # matmul: MLP


class LM(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.embed = nnx.Embed(VOCAB, WIDTH, dtype=jnp.bfloat16, rngs=rngs)
        self.pos = nnx.Param(nnx.initializers.normal(0.02)(rngs.params(), (LENGTH, WIDTH)))
        self.blocks = nnx.List([Block(rngs=rngs) for _ in range(LAYERS)])
        self.norm = nnx.LayerNorm(WIDTH, dtype=jnp.bfloat16, rngs=rngs)

    def __call__(self, tokens):
        valid = tokens > 0  # token 0 is padding
        mask = nnx.combine_masks(nnx.make_attention_mask(valid, valid), nnx.make_causal_mask(tokens))
        x = self.embed(tokens) + self.pos[: tokens.shape[1]].astype(jnp.bfloat16)
        for block in self.blocks:
            x = block(x, mask)
        x = self.norm(x)
        return self.embed.attend(x).astype(jnp.float32)  # matmul: the output projection, the biggest one


def loss_fn(model: LM, inputs, targets):
    logits = model(inputs)
    weights = (targets > 0).astype(jnp.float32)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    return jnp.sum(losses * weights) / jnp.maximum(jnp.sum(weights), 1.0)


@nnx.jit
def train_step(model: LM, optimizer: nnx.Optimizer, batch):
    loss, grads = nnx.value_and_grad(loss_fn)(model, batch[:, :-1], batch[:, 1:])
    optimizer.update(model, grads)
    return loss


@nnx.jit
def compute_eval_metrics(model: LM, batch):
    logits = model(batch[:, :-1])
    weights = (batch[:, 1:] > 0).astype(jnp.float32)
    correct = (jnp.argmax(logits, -1) == batch[:, 1:]) * weights
    return {"loss": loss_fn(model, batch[:, :-1], batch[:, 1:]), "accuracy": correct.sum() / weights.sum()}


def batches(rng, steps):
    """Token rows of random length, right-padded with 0 (like a packed-free lm1b input pipeline)."""
    for _ in range(steps):
        rows = np.zeros((BATCH, LENGTH + 1), np.int32)
        for row, length in zip(rows, rng.integers(LENGTH // 4, LENGTH + 1, BATCH)):
            row[:length] = rng.integers(1, VOCAB, length)
        yield jnp.asarray(rows)


if __name__ == "__main__":
    model = LM(rngs=nnx.Rngs(0))
    schedule = optax.warmup_cosine_decay_schedule(0.0, 3e-3, warmup_steps=4, decay_steps=40)
    optimizer = nnx.Optimizer(model, optax.adamw(schedule, weight_decay=0.1), wrt=nnx.Param)
    rng = np.random.default_rng(0)
    held_out = next(batches(rng, 1))
    for step, batch in enumerate(batches(rng, 12)):
        loss = train_step(model, optimizer, batch)
        if step % 4 == 3:
            metrics = compute_eval_metrics(model, held_out)
            print(f"step {step} loss {float(loss):.3f} eval {float(metrics['loss']):.3f}")
