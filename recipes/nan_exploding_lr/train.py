"""Linear regression with a learning rate far too large: the weights grow every step until they overflow."""
import jax
import jax.numpy as jnp


def loss_fn(params, x, y):
    pred = x @ params["w"] + params["b"]  # <- origin
    return jnp.mean((pred - y) ** 2)


@jax.jit
def train_step(params, x, y, lr):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    params = jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads)
    return params, loss


x = jax.random.normal(jax.random.PRNGKey(0), (16, 4)) * 3.0
y = x @ jnp.array([1.0, -2.0, 0.5, 3.0])
params = {"w": jnp.zeros(4), "b": jnp.zeros(())}
for step in range(60):
    params, loss = train_step(params, x, y, 1.5)
    if step % 5 == 0:
        print(f"step {step}: loss {float(loss):.3g}")
