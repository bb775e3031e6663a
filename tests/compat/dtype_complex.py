"""complex64: phase correlation for image registration (FFT, cross-power spectrum normalised by its
magnitude), as scikit-image's phase_cross_correlation computes it, in jnp.fft. The bug: a blank frame has an
all-zero spectrum, and the normalisation divides 0 by |0|."""
import jax
import jax.numpy as jnp
import numpy as np


@jax.jit
def phase_correlation(a, b):
    fa, fb = jnp.fft.fft2(a), jnp.fft.fft2(b)
    cross = fa * jnp.conj(fb)
    normalised = cross / jnp.abs(cross)  # NaN: 0 / 0 on a blank frame
    return jnp.abs(jnp.fft.ifft2(normalised))


def main(steps=3):
    rng = np.random.default_rng(0)
    reference = rng.normal(size=(8, 8)).astype(np.float32)
    for step in range(steps):
        frame = np.roll(reference, step, axis=0)
        if step == 1:
            frame = np.zeros_like(frame)  # the camera dropped a frame
        peak = phase_correlation(jnp.asarray(reference), jnp.asarray(frame))
    return float(peak.max())


if __name__ == "__main__":
    print(main())
