"""float64 (x64): a maximum-likelihood fit in double precision, as scientific JAX code enables x64 for
(here with the jax.enable_x64 context, so the rest of a process keeps float32). The bug: the correlation
parameter is taken from the data unclipped, and sqrt(1 - r**2) of |r| > 1 is NaN."""
import jax
import jax.numpy as jnp
import numpy as np


@jax.jit
def neg_log_likelihood(params, xy):
    sx, sy, r = params["sx"], params["sy"], params["r"]
    det = sx * sy * jnp.sqrt(1.0 - r ** 2)  # NaN: a correlation outside [-1, 1]
    x, y = xy[:, 0] / sx, xy[:, 1] / sy
    quad = (x ** 2 - 2 * r * x * y + y ** 2) / (1.0 - r ** 2)
    return (jnp.log(det) + 0.5 * quad).mean()


def main(steps=3):
    with jax.enable_x64(True):
        rng = np.random.default_rng(0)
        for step in range(steps):
            xy = rng.normal(size=(16, 2))
            r = np.corrcoef(xy.T)[0, 1] + (1.5 if step == 1 else 0.0)  # an off-by-one-sign update
            params = {"sx": jnp.float64(xy[:, 0].std()), "sy": jnp.float64(xy[:, 1].std()), "r": jnp.float64(r)}
            nll = neg_log_likelihood(params, jnp.asarray(xy))
        return float(nll)


if __name__ == "__main__":
    print(main())
