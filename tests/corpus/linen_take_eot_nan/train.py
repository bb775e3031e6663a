"""A small Linen language model whose token embedding is looked up with jnp.take (default mode "fill"). The
tokenizer appends an end-of-text id equal to the vocabulary size (an off-by-one: the table has vocab rows,
ids 0..vocab-1), and jnp.take fills that out-of-range row with NaN instead of raising."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state

VOCAB = 64


class LM(nn.Module):
    @nn.compact
    def __call__(self, tokens):
        table = self.param("embedding", nn.initializers.normal(0.02), (VOCAB, 32))
        x = jnp.take(table, tokens, axis=0)  # the NaN: an id == VOCAB is past the table
        x = nn.Dense(64)(x)
        x = nn.gelu(x)
        return nn.Dense(VOCAB)(x)


@jax.jit
def train_step(state, tokens):
    def loss_fn(params):
        logits = state.apply_fn({"params": params}, tokens[:, :-1])
        targets = jnp.clip(tokens[:, 1:], 0, VOCAB - 1)
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()
    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss


def encode(rng, n, length):
    body = rng.integers(0, VOCAB, size=(n, length - 1))
    eot = np.full((n, 1), VOCAB)  # the end-of-text id the tokenizer adds: one past the table
    return np.concatenate([body, eot], 1)


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    model = LM()
    params = model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adamw(1e-3))
    for step in range(3):
        tokens = encode(rng, 8, 17)
        if step >= 1:
            tokens = np.roll(tokens, 3, axis=1)  # packed sequences: the end-of-text id now lands in the inputs
        state, loss = train_step(state, jnp.asarray(tokens))
        print(step, float(loss))
