"""A Flax Linen text classifier trained with `flax.training.train_state.TrainState`, the way Flax's examples
train (TrainState.create, a jitted `train_step(state, batch)` that returns `state.apply_gradients(...)`).
Synthetic sentences of 5 to 60 tokens.

The recompiles: the collate function pads each batch to its longest sentence, so `train_step` compiles
again for every new longest length (`batch['tokens']` and `batch['mask']` change shape). `state.step` starts
as the Python int 0 and comes back from the first step as an int32 array: jax sees both as a weakly typed
int32 scalar, so that change never causes a compile.
"""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state


class TextClassifier(nn.Module):
    vocab_size: int
    num_classes: int
    features: int = 64

    @nn.compact
    def __call__(self, tokens, mask):
        x = nn.Embed(self.vocab_size, self.features)(tokens)
        x = (x * mask[..., None]).sum(axis=1) / jnp.maximum(mask.sum(axis=1, keepdims=True), 1.0)
        x = nn.relu(nn.Dense(self.features)(x))
        return nn.Dense(self.num_classes)(x)


def create_train_state(rng, model, learning_rate):
    tokens = jnp.ones((1, 8), jnp.int32)
    params = model.init(rng, tokens, jnp.ones((1, 8)))["params"]
    return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(learning_rate))


@jax.jit
def train_step(state, batch):
    def loss_fn(params):
        logits = state.apply_fn({"params": params}, batch["tokens"], batch["mask"])
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
        return loss, logits

    (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    state = state.apply_gradients(grads=grads)
    accuracy = jnp.mean(jnp.argmax(logits, -1) == batch["label"])
    return state, {"loss": loss, "accuracy": accuracy}


def collate(sentences, labels):
    longest = max(len(s) for s in sentences)  # pad to the longest sentence of this batch
    tokens = np.zeros((len(sentences), longest), np.int32)
    mask = np.zeros((len(sentences), longest), np.float32)
    for i, sentence in enumerate(sentences):
        tokens[i, :len(sentence)] = sentence
        mask[i, :len(sentence)] = 1.0
    return {"tokens": tokens, "mask": mask, "label": np.asarray(labels, np.int32)}


def synthetic_corpus(rng, count, vocab_size):
    lengths = rng.integers(5, 61, count)
    labels = rng.integers(0, 4, count)
    sentences = [rng.integers(1 + 10 * label, 11 + 10 * label, n) % vocab_size for n, label in zip(lengths, labels)]
    return sentences, labels


if __name__ == "__main__":
    vocab_size, batch_size = 100, 16
    sentences, labels = synthetic_corpus(np.random.default_rng(4), 96, vocab_size)
    state = create_train_state(jax.random.PRNGKey(0), TextClassifier(vocab_size, num_classes=4), 1e-2)
    for epoch in range(2):
        for start in range(0, len(sentences), batch_size):
            batch = collate(sentences[start:start + batch_size], labels[start:start + batch_size])
            state, metrics = train_step(state, batch)
        print(f"epoch {epoch} step {int(state.step)} loss {float(metrics['loss']):.3f} "
              f"accuracy {float(metrics['accuracy']):.2f}")
