"""lax.associative_scan: a linear recurrent unit (LRU, S5-style diagonal recurrence) computed as a parallel
scan, the pattern of the LRU and S5 papers' JAX code, here in continuous time for irregularly sampled
series: the decay over a gap dt is a = exp(-rate * dt), and the input is normalised by sqrt(1 - a**2). The
bug: the timestamps of one batch are out of order, a gap is negative, a > 1 and the normalisation is
sqrt of a negative value."""
import jax
import jax.numpy as jnp
import numpy as np


def combine(left, right):
    a_l, b_l = left
    a_r, b_r = right
    return a_r * a_l, a_r * b_l + b_r


def lru(params, x, times):
    dt = jnp.diff(times, prepend=times[:1] - 1.0)[:, None]
    a = jnp.exp(-jax.nn.softplus(params["log_rate"]) * dt)
    b = jnp.sqrt(1.0 - a ** 2) * (x @ params["w_in"])  # NaN: sqrt(1 - a**2) of a decay above 1
    _, h = jax.lax.associative_scan(combine, (a, b))
    return h @ params["w_out"]


@jax.jit
def train_step(params, x, times, y):
    def loss_fn(p):
        return ((lru(p, x, times) - y) ** 2).mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return jax.tree.map(lambda p, g: p - 0.05 * g, params, grads), loss


def main(steps=4):
    rng = np.random.default_rng(0)
    params = {"log_rate": jnp.zeros(4), "w_in": jnp.asarray(rng.normal(size=(2, 4)), jnp.float32) / 2,
              "w_out": jnp.asarray(rng.normal(size=(4, 1)), jnp.float32) / 2}
    for step in range(steps):
        times = np.sort(rng.uniform(0.0, 10.0, size=8)).astype(np.float32)
        if step == 2:
            times[[3, 4]] = times[[4, 3]]  # two records swapped in the log
        x = rng.normal(size=(8, 2)).astype(np.float32)
        params, loss = train_step(params, jnp.asarray(x), jnp.asarray(times), jnp.asarray(np.sin(times)[:, None]))
    return float(loss)


if __name__ == "__main__":
    print(main())
