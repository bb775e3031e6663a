"""Zero padding masked with a single where: the loss is finite, the gradient is NaN (backward pass only)."""
import jax
import jax.numpy as jnp


def loss_fn(w, x, mask):
    z = x * w
    log_likelihood = jnp.where(mask, jnp.log(z), 0.0)  # <- origin
    return -jnp.sum(log_likelihood) / jnp.sum(mask)


@jax.jit
def train_step(w, x, mask):
    loss, grad = jax.value_and_grad(loss_fn)(w, x, mask)
    return w - 0.1 * grad, loss


x = jnp.array([0.5, 2.0, 0.0, 0.0])  # the last two entries are padding
mask = x > 0
w = jnp.ones(4)
for step in range(3):
    w, loss = train_step(w, x, mask)
    print(f"step {step}: loss {float(loss):.4f}, w {w}")
