"""A training loop that keeps every step's activations on the device (a list filled for a plot at the end),
and does not donate its parameters although each step replaces them."""
import jax
import jax.numpy as jnp

WIDTH, BATCH, STEPS = 256, 512, 24


def loss_fn(params, x):
    hidden = jnp.tanh(x @ params["w1"])
    return jnp.mean((hidden @ params["w2"] - x) ** 2), hidden


@jax.jit
def train_step(params, x):
    (loss, hidden), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, x)
    params = jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params, grads)
    return params, loss, hidden


key_1, key_2, key_x = jax.random.split(jax.random.PRNGKey(0), 3)
params = {"w1": jax.random.normal(key_1, (WIDTH, WIDTH)) / WIDTH ** 0.5,
          "w2": jax.random.normal(key_2, (WIDTH, WIDTH)) / WIDTH ** 0.5}
x = jax.random.normal(key_x, (BATCH, WIDTH))
activations = []
for step in range(STEPS):
    params, loss, hidden = train_step(params, x)  # <- call
    activations.append(hidden)  # <- keeps every step's activations on the device
print(f"loss {float(loss):.4f}, kept {len(activations)} activations")
