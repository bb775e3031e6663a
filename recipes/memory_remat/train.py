"""A deep MLP whose backward pass needs every layer's activation: the gradient program keeps all of them
alive at its peak, and the step does not fit an 8 MiB device."""
import jax
import jax.numpy as jnp

DEPTH, WIDTH, BATCH = 8, 256, 1024


def loss_fn(params, x):
    for w in params:
        x = jnp.tanh(x @ w)  # <- activation kept for the backward pass
    return jnp.mean(x ** 2)


@jax.jit
def train_step(params, x):
    grads = jax.grad(loss_fn)(params, x)
    return [w - 0.01 * g for w, g in zip(params, grads)]


params = [jax.random.normal(k, (WIDTH, WIDTH)) / WIDTH ** 0.5 for k in jax.random.split(jax.random.PRNGKey(0), DEPTH)]
x = jnp.ones((BATCH, WIDTH))
for step in range(3):
    params = train_step(params, x)
print(f"w[0][0, 0] = {float(params[0][0, 0]):.5f}")
