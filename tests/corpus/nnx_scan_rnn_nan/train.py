"""An NNX recurrent forecaster over daily prices: the cell is stepped over time with ``nnx.scan`` inside an
``nnx.jit`` train step (``nnx.value_and_grad``, ``nnx.Optimizer``). Each step feeds the cell the log-return
``log(price_t / price_{t-1})``. The bug: in the third batch day 6 is missing and was stored as price 0, so
day 6's log-return is log(0) = -inf and day 7's divides by that 0: +inf. tanh saturates, so the loss stays
finite, but the gradient of the input projection multiplies the infinite input by tanh's zero slope: NaN, in
the backward pass at scan iteration 6 (day 7; the backward pass runs the days in reverse, so it comes first)."""
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx


class ReturnCell(nnx.Module):
    def __init__(self, hidden: int, *, rngs: nnx.Rngs):
        self.inp = nnx.Linear(1, hidden, rngs=rngs)
        self.rec = nnx.Linear(hidden, hidden, rngs=rngs)

    def __call__(self, carry, price):
        h, previous = carry
        log_return = jnp.log(price / previous)  # the bug: a missing day stored as 0 gives log(0), then p/0
        h = jnp.tanh(self.inp(log_return[:, None]) + self.rec(h))  # the NaN: gradient inf * tanh'(inf) = inf * 0
        return (h, price), h


class Forecaster(nnx.Module):
    def __init__(self, hidden: int, *, rngs: nnx.Rngs):
        self.cell = ReturnCell(hidden, rngs=rngs)
        self.head = nnx.Linear(hidden, 1, rngs=rngs)
        self.hidden = hidden

    def __call__(self, prices):  # prices: (batch, days)
        @nnx.scan(in_axes=(nnx.Carry, None, 1), out_axes=(nnx.Carry, 1))
        def step(carry, cell, price):
            return cell(carry, price)

        h0 = jnp.zeros((prices.shape[0], self.hidden))
        (h, _), _ = step((h0, prices[:, 0]), self.cell, prices[:, 1:])
        return self.head(h)[:, 0]


def loss_fn(model, prices, target):
    return jnp.mean((model(prices) - target) ** 2)


@nnx.jit
def train_step(model, optimizer, prices, target):
    loss, grads = nnx.value_and_grad(loss_fn)(model, prices, target)
    optimizer.update(model, grads)
    return loss


def batches(rng, count, size=8, days=12):
    for i in range(count):
        walk = 100 * np.exp(np.cumsum(rng.normal(0, 0.02, (size, days + 1)), axis=1))
        prices = walk[:, :days].astype(np.float32)
        if i == 2:
            prices[:, 6] = 0.0  # a missing day, zero-filled upstream
        yield jnp.asarray(prices), jnp.asarray(np.log(walk[:, days] / walk[:, days - 1]), jnp.float32)


if __name__ == "__main__":
    model = Forecaster(16, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    for step, (prices, target) in enumerate(batches(np.random.default_rng(0), 4)):
        print(step, float(train_step(model, optimizer, prices, target)))
