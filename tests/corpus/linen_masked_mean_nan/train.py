"""A Flax Linen token tagger trained with a ``TrainState`` the way Flax's Linen examples do (``jax.jit``
train step, ``state.apply_gradients``, Adam with a warmup from 0), on padded batches: the loss is the mean
over real tokens only, ``sum(loss * mask) / sum(mask)``. The output bias is initialised to 1e-6 and, as
usual, grows by orders of magnitude once the warmup starts (to ~1e-3: normal training, not divergence). The bug: the data loader's loop
over batches is off by one, so when the number of sentences is a multiple of the batch size the last batch
holds no sentence at all, only padding, and the masked mean is 0 / 0 = NaN."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn
from flax.training import train_state

PAD = 0


class Tagger(nn.Module):
    vocab: int = 50
    tags: int = 5

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(self.vocab, 32)(tokens)
        x = nn.relu(nn.Dense(64)(x))
        return nn.Dense(self.tags, bias_init=nn.initializers.constant(1e-6))(x)


@jax.jit
def train_step(state, tokens, tags):
    def loss_fn(params):
        logits = state.apply_fn({"params": params}, tokens)
        mask = (tokens != PAD).astype(jnp.float32)
        per_token = optax.softmax_cross_entropy_with_integer_labels(logits, tags)
        return jnp.sum(per_token * mask) / jnp.sum(mask)  # the bug: 0 / 0 on an all-padding batch

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss


def epoch(rng, sentences=48, batch=16, length=12):
    """Batches of sentences padded to ``length``; a short last batch is filled up with padding rows."""
    lengths = rng.integers(3, length, sentences)
    for start in range(0, sentences + 1, batch):  # off by one: a 4th, empty batch when 48 % 16 == 0
        tokens = np.full((batch, length), PAD, np.int32)
        tags = np.zeros((batch, length), np.int32)
        for row, n in enumerate(lengths[start:start + batch]):
            tokens[row, :n] = rng.integers(1, 50, n)
            tags[row, :n] = tokens[row, :n] % 5
        yield jnp.asarray(tokens), jnp.asarray(tags)


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    model = Tagger()
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 12), jnp.int32))["params"]
    tx = optax.adam(optax.warmup_cosine_decay_schedule(0.0, 1e-2, warmup_steps=10, decay_steps=200))
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)
    for step, (tokens, tags) in enumerate(epoch(rng)):
        state, loss = train_step(state, tokens, tags)
        print(step, float(loss))
