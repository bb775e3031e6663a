"""Integer arrays: a bag-of-words classifier over int32 token ids (an embedding lookup, integer counts of
real tokens), as text models in Flax's and Equinox's examples batch padded sequences. The bug: the mean
embedding divides by the number of non-padding tokens, 0 for an empty sequence."""
import jax
import jax.numpy as jnp
import numpy as np

PAD = 0


@jax.jit
def train_step(table, tokens, labels):
    def loss_fn(table):
        counts = (tokens != PAD).sum(-1)
        summed = jnp.where((tokens != PAD)[..., None], table[tokens], 0.0).sum(1)
        mean = summed / counts[:, None].astype(jnp.float32)  # NaN: 0 / 0 for an empty sequence
        logits = mean.sum(-1)
        return ((logits - labels) ** 2).mean()

    loss, grad = jax.value_and_grad(loss_fn)(table)
    return table - 0.1 * grad, loss


def main(steps=4):
    rng = np.random.default_rng(0)
    table = jnp.asarray(rng.normal(size=(20, 4)), jnp.float32)
    for step in range(steps):
        tokens = rng.integers(1, 20, size=(3, 6)).astype(np.int32)
        if step == 2:
            tokens[1] = PAD  # an empty document
        table, loss = train_step(table, jnp.asarray(tokens), jnp.ones(3))
    return float(loss)


if __name__ == "__main__":
    print(main())
