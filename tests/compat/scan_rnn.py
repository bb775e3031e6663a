"""scan: an RNN over a sequence with lax.scan, the loop of Equinox's RNN example and JAX's scan docs. The
bug: each step feeds the log-return log(p[t] / p[t-1]) of a price series; a glitch at t=3 makes a price
negative."""
import jax
import jax.numpy as jnp
import numpy as np


def rnn(params, prices):
    def cell(carry, pair):
        h, prev = carry
        ret = jnp.log(pair / prev)  # NaN: log of a negative ratio
        h = jnp.tanh(params["wh"] * h + params["wx"] * ret)
        return (h, pair), h

    (_, _), hs = jax.lax.scan(cell, (jnp.zeros(()), prices[0]), prices[1:])
    return hs


@jax.jit
def train_step(params, prices, target):
    def loss_fn(p):
        return ((rnn(p, prices)[-1] - target) ** 2).sum()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss


def main(steps=3):
    rng = np.random.default_rng(0)
    params = {"wh": jnp.float32(0.5), "wx": jnp.float32(1.0)}
    for step in range(steps):
        prices = (100.0 + rng.normal(size=8).cumsum()).astype(np.float32)
        if step == 1:
            prices[4] = -prices[4]  # a glitch in the feed: step t=3 of the scan sees it
        params, loss = train_step(params, jnp.asarray(prices), jnp.float32(0.0))
    return float(loss)


if __name__ == "__main__":
    print(main())
