"""A variational autoencoder in plain JAX + Optax, the way JAX's own VAE example writes it (parameter
dicts, ``jax.random`` splits, a Bernoulli decoder, Adam). The reconstruction averages the decoder's output
over ``NUM_SAMPLES`` reparameterised samples in a ``lax.fori_loop`` (one sample's activations alive at a
time), and the decoder's output bias starts at the data's log-odds per pixel, a common trick that makes
the first reconstructions the mean image.

The bug: some pixels are never on in the training set (like MNIST's corners), so their mean is 0 and their
log-odds ``log(0 / 1)`` is -inf. The decoder then gives them probability exactly 0, ``log(p)`` is -inf,
and ``x * log(p)`` with x = 0 is NaN: born in the first ``train_step``, after the fori_loop, at the
log-likelihood line. (The fix: clip the mean to [1e-3, 1 - 1e-3], or work with logits.)"""
import jax
import jax.numpy as jnp
import numpy as np
import optax

IMAGE = 64
LATENT = 8
HIDDEN = 128
NUM_SAMPLES = 4


def init_params(key, data_mean):
    def dense(key, fan_in, fan_out):
        w = jax.random.normal(key, (fan_in, fan_out)) * jnp.sqrt(2.0 / fan_in)
        return {"w": w, "b": jnp.zeros(fan_out)}

    keys = jax.random.split(key, 5)
    params = {"enc": dense(keys[0], IMAGE, HIDDEN), "mu": dense(keys[1], HIDDEN, LATENT),
              "logvar": dense(keys[2], HIDDEN, LATENT), "dec1": dense(keys[3], LATENT, HIDDEN),
              "dec2": dense(keys[4], HIDDEN, IMAGE)}
    params["dec2"]["b"] = jnp.log(data_mean / (1.0 - data_mean))  # the bug: -inf where a pixel is never on
    return params


def apply_dense(layer, x):
    return x @ layer["w"] + layer["b"]


def encode(params, x):
    h = jax.nn.relu(apply_dense(params["enc"], x))
    return apply_dense(params["mu"], h), apply_dense(params["logvar"], h)


def decode(params, z):
    return jax.nn.sigmoid(apply_dense(params["dec2"], jax.nn.relu(apply_dense(params["dec1"], z))))


def bernoulli_log_likelihood(x, p):
    return jnp.sum(x * jnp.log(p) + (1.0 - x) * jnp.log1p(-p), axis=-1)  # the NaN: 0 * log(0)


def elbo(params, x, key):
    mu, logvar = encode(params, x)

    def add_sample(i, total):
        eps = jax.random.normal(jax.random.fold_in(key, i), mu.shape)
        return total + decode(params, mu + jnp.exp(0.5 * logvar) * eps)

    p = jax.lax.fori_loop(0, NUM_SAMPLES, add_sample, jnp.zeros_like(x)) / NUM_SAMPLES
    log_likelihood = bernoulli_log_likelihood(x, p)
    kl = 0.5 * jnp.sum(jnp.exp(logvar) + mu**2 - 1.0 - logvar, axis=-1)
    return jnp.mean(log_likelihood - kl)


@jax.jit
def train_step(params, opt_state, x, key):
    loss, grads = jax.value_and_grad(lambda p: -elbo(p, x, key))(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def binarised_digits(rng, count):
    """Strokes on an 8x8 grid, never touching the border: a stand-in for binarised MNIST."""
    images = np.zeros((count, 8, 8), np.float32)
    for image in images:
        row, col = rng.integers(1, 7, 2)
        image[row, 1:7] = 1.0
        image[1:7, col] = rng.random() < 0.5
    return images.reshape(count, IMAGE)


optimizer = optax.adam(1e-3)

if __name__ == "__main__":
    rng = np.random.default_rng(0)
    data = binarised_digits(rng, 512)
    key = jax.random.PRNGKey(0)
    params = init_params(key, jnp.asarray(data.mean(axis=0)))
    opt_state = optimizer.init(params)
    for step in range(20):
        key, sample_key = jax.random.split(key)
        batch = jnp.asarray(data[rng.integers(0, len(data), 32)])
        params, opt_state, loss = train_step(params, opt_state, batch, sample_key)
        print(step, float(loss))
