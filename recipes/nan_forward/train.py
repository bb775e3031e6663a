"""Features drift negative over the steps; the model's log sees a negative prediction: NaN in the forward pass."""
import jax
import jax.numpy as jnp


def loss_fn(w, x, y):
    pred = x @ w
    return jnp.mean((jnp.log(pred) - y) ** 2)  # <- origin


@jax.jit
def train_step(w, x, y):
    loss, grad = jax.value_and_grad(loss_fn)(w, x, y)
    return w - 0.01 * grad, loss


base_x = jnp.array([[1.0, 2.0], [2.0, 1.0], [0.5, 0.5]])
y = jnp.array([1.0, 1.0, 0.0])
w = jnp.array([1.0, 1.0])
for step in range(5):
    x = base_x * (1.0 - 0.4 * step)  # at step 3 the features turn negative
    w, loss = train_step(w, x, y)
    print(f"step {step}: loss {float(loss):.4f}")
