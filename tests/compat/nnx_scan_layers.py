"""Flax NNX scan over layers: a stack of residual blocks made with nnx.vmap (one set of parameters per layer,
stacked) and applied with nnx.scan, the "scan over layers" pattern of Flax's NNX guides for deep models. The
bug: each block normalises by its input's standard deviation with no epsilon; the third step feeds a batch of
constant rows, whose standard deviation is 0, so the first block divides 0 by 0."""
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

LAYERS, WIDTH = 4, 8


class Block(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.linear = nnx.Linear(WIDTH, WIDTH, rngs=rngs)

    def __call__(self, x):
        centred = x - x.mean(axis=-1, keepdims=True)
        normed = centred / x.std(axis=-1, keepdims=True)  # NaN: 0 / 0 on a constant row
        return x + nnx.tanh(self.linear(normed))


class Stack(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        @nnx.split_rngs(splits=LAYERS)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def make(rngs):
            return Block(rngs)
        self.blocks = make(rngs)
        self.head = nnx.Linear(WIDTH, 1, rngs=rngs)

    def __call__(self, x):
        @nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry)
        def run(block, x):
            return block(x)
        return self.head(run(self.blocks, x))


@nnx.jit
def train_step(model, optimizer, x, y):
    def loss_fn(model):
        return jnp.mean((model(x) - y) ** 2)
    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


def main(steps=4):
    model = Stack(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    rng = np.random.default_rng(0)
    for step in range(steps):
        x = rng.normal(size=(16, WIDTH)).astype(np.float32)
        if step == 2:
            x[5] = 1.0  # a constant row
        loss = train_step(model, optimizer, jnp.asarray(x), jnp.asarray(rng.normal(size=(16, 1)), jnp.float32))
    return float(loss)


if __name__ == "__main__":
    print(main())
