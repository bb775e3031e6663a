"""An Equinox GRU that reads a sequence of daily sensor readings and predicts the next day's event count,
written the way Equinox's RNN example writes it (``eqx.nn.GRUCell`` stepped with ``lax.scan``, trained with
``eqx.filter_jit``, ``eqx.filter_grad`` and optax). The rate must be non-negative, so the head clamps it at 0,
and the Poisson log-likelihood guards log(0) with a ``jnp.where``. The forward value is finite, but the
gradient of the unselected ``log(rate)`` branch is 1/0 = inf where the rate is 0, and the where multiplies
it by 0: the gradient is NaN from the first step."""
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax


class CountRNN(eqx.Module):
    cell: eqx.nn.GRUCell
    head: eqx.nn.Linear

    def __init__(self, features, hidden, *, key):
        k1, k2 = jax.random.split(key)
        self.cell = eqx.nn.GRUCell(features, hidden, key=k1)
        self.head = eqx.nn.Linear(hidden, 1, key=k2)

    def __call__(self, xs):
        def step(h, x):
            return self.cell(x, h), None

        h, _ = jax.lax.scan(step, jnp.zeros(self.cell.hidden_size), xs)
        return jnp.maximum(self.head(h)[0], 0.0)  # a rate cannot be negative


def poisson_nll(rate, count):
    return rate - count * jnp.where(rate > 0, jnp.log(rate), 0.0)  # forward-safe, gradient NaN at rate 0


def loss(model, xs, counts):
    rates = jax.vmap(model)(xs)
    return jnp.mean(poisson_nll(rates, counts))


@eqx.filter_jit
def make_step(model, opt_state, xs, counts, optim):
    grads = eqx.filter_grad(loss)(model, xs, counts)
    updates, opt_state = optim.update(grads, opt_state, eqx.filter(model, eqx.is_array))
    return eqx.apply_updates(model, updates), opt_state


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    model = CountRNN(3, 16, key=jax.random.PRNGKey(5))
    optim = optax.adam(3e-3)
    opt_state = optim.init(eqx.filter(model, eqx.is_array))
    for step in range(3):
        xs = jnp.asarray(rng.normal(size=(32, 10, 3)), jnp.float32)
        counts = jnp.asarray(rng.poisson(2.0, size=32), jnp.float32)
        model, opt_state = make_step(model, opt_state, xs, counts, optim)
        print(step, float(loss(model, xs, counts)))
