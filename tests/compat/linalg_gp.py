"""linalg: Gaussian-process regression fitted through a Cholesky (jnp.linalg.cholesky, cho_solve), the
marginal-likelihood fit of the GP examples of JAX and tinygp. Each step also reports, for a batch of query
points, the normalised kernel weights k / sum(k) (how much each training point counts). The bug: a query
given in metres where the data are in kilometres lies so far away that every exp(-d**2 / 2l**2) underflows
to exactly 0, and its weights are 0 / 0."""
import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import cho_solve


def rbf(xa, xb, lengthscale):
    d2 = jnp.sum((xa[:, None, :] - xb[None, :, :]) ** 2, axis=-1)
    return jnp.exp(-0.5 * d2 / lengthscale ** 2)


def neg_log_marginal(params, x, y):
    k = jnp.exp(2 * params["log_amp"]) * rbf(x, x, jnp.exp(params["log_ls"]))
    k = k + (jnp.exp(2 * params["log_noise"]) + 1e-6) * jnp.eye(x.shape[0])
    chol = jnp.linalg.cholesky(k)
    alpha = cho_solve((chol, True), y)
    return 0.5 * y @ alpha + jnp.sum(jnp.log(jnp.diag(chol))) + 0.5 * x.shape[0] * jnp.log(2 * jnp.pi)


@jax.jit
def fit_step(params, x, y, queries):
    nll, grads = jax.value_and_grad(neg_log_marginal)(params, x, y)
    params = jax.tree.map(lambda p, g: p - 0.05 * g, params, grads)
    k_star = rbf(queries, x, jnp.exp(params["log_ls"]))
    weights = k_star / k_star.sum(axis=-1, keepdims=True)  # NaN: 0 / 0 for a query far from every point
    return params, nll, weights


def main(steps=4):
    rng = np.random.default_rng(0)
    params = {"log_amp": jnp.float32(0.0), "log_ls": jnp.float32(0.0), "log_noise": jnp.float32(-2.0)}
    x = rng.uniform(0.0, 5.0, size=(12, 1)).astype(np.float32)
    y = (np.sin(x[:, 0]) + 0.1 * rng.normal(size=12)).astype(np.float32)
    for step in range(steps):
        queries = rng.uniform(0.0, 5.0, size=(3, 1)).astype(np.float32)
        if step == 2:
            queries[1] *= 1000.0  # metres, not kilometres
        params, nll, weights = fit_step(params, jnp.asarray(x), jnp.asarray(y), jnp.asarray(queries))
    return float(nll), np.asarray(weights)


if __name__ == "__main__":
    print(main())
