"""A negative-binomial count regression written with jax.scipy.special (gammaln, xlogy), fit by gradient
descent. The mean rate is clamped at 0 with a ReLU instead of an exp link: for the rows where x @ beta < 0
the rate is exactly 0, and xlogy(y, mu) is y * log(0) = -inf for every such row with a count y > 0, so the
negative log-likelihood is +inf. xlogy itself computes 0 * log(0) = NaN where y = 0 and selects 0 there:
that NaN is jax's own and reaches nothing; the answer is the log(0) inside xlogy."""
import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import gammaln, xlogy


def nb_loglik(params, x, y):
    mu = jax.nn.relu(x @ params["beta"])  # a mean rate clamped at 0
    r = jnp.exp(params["log_r"])
    ll = (gammaln(y + r) - gammaln(r) - gammaln(y + 1)
          + xlogy(r, r) - xlogy(r, r + mu)
          + xlogy(y, mu) - xlogy(y, r + mu))  # the Inf: log(0) inside xlogy where the rate is 0
    return -jnp.mean(ll)


@jax.jit
def update(params, x, y):
    loss, g = jax.value_and_grad(nb_loglik)(params, x, y)
    return jax.tree.map(lambda p, gp: p - 0.05 * gp, params, g), loss


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 5)).astype(np.float32)
    y = rng.poisson(3.0, size=64).astype(np.float32)
    params = {"beta": jnp.full(5, 0.1), "log_r": jnp.zeros(())}
    for it in range(2):
        params, loss = update(params, jnp.asarray(x), jnp.asarray(y))
        print(it, float(loss))
