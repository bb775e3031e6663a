"""while_loop / fori_loop: spectral normalisation by power iteration (as Equinox's SpectralNorm and Flax's
SpectralNorm layers do), with a traced number of iterations, so fori_loop becomes a while_loop. The bug:
the weight is nilpotent (strictly upper triangular), so A^3 v is exactly zero and its normalisation 0 / 0."""
import jax
import jax.numpy as jnp
import numpy as np


def spectral_norm(a, iters):
    def body(i, v):
        u = a @ v
        return u / jnp.sqrt(jnp.sum(u * u))  # NaN: the iterate vanished

    v = jax.lax.fori_loop(0, iters, body, jnp.ones(a.shape[1]) / np.sqrt(a.shape[1]))
    return jnp.sqrt(jnp.sum((a @ v) ** 2))


@jax.jit
def normalise(a, iters):
    return a / spectral_norm(a, iters)


def main(steps=3):
    layers = [jnp.asarray(np.random.default_rng(i).normal(size=(3, 3)), jnp.float32) for i in range(steps)]
    layers[1] = jnp.triu(layers[1], k=1)  # a nilpotent weight
    for a in layers:
        out = normalise(a, jnp.int32(5))
    return float(out.sum())


if __name__ == "__main__":
    print(main())
