"""A healthy training loop: nothing to find (nan-hunt exits 0)."""
import jax
import jax.numpy as jnp


def loss_fn(w, x, y):
    return jnp.mean((jnp.tanh(x @ w) - y) ** 2)


@jax.jit
def train_step(w, x, y):
    loss, grad = jax.value_and_grad(loss_fn)(w, x, y)
    return w - 0.1 * grad, loss


x = jax.random.normal(jax.random.PRNGKey(0), (32, 4))
y = jnp.tanh(x @ jnp.array([0.5, -0.5, 0.25, 1.0]))
w = jnp.zeros(4)
for step in range(5):
    w, loss = train_step(w, x, y)
print(f"final loss {float(loss):.5f}")
