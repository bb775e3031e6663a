"""An Equinox embedding model trained with a pairwise-distance (contrastive) loss, written the way
Equinox's examples write training loops (eqx.filter_jit, eqx.filter_value_and_grad, optax).
The bug: the distance of a point to itself is sqrt(0); its value is fine, but the derivative of sqrt at 0
is infinite, so the gradient turns NaN."""
import equinox as eqx
import jax
import jax.numpy as jnp
import optax


class Embed(eqx.Module):
    layers: list
    temperature: float = eqx.field(static=True)

    def __init__(self, key, temperature=0.5):
        k1, k2 = jax.random.split(key)
        self.layers = [eqx.nn.Linear(8, 16, key=k1), eqx.nn.Linear(16, 4, key=k2)]
        self.temperature = temperature

    def __call__(self, x):
        return self.layers[1](jax.nn.tanh(self.layers[0](x)))


def pairwise_distance(z):
    diff = z[:, None, :] - z[None, :, :]
    return jnp.sqrt(jnp.sum(diff ** 2, axis=-1))  # includes each point's distance to itself: sqrt(0)


def loss_fn(model, x, same):
    z = jax.vmap(model)(x)
    d = pairwise_distance(z) / model.temperature
    return jnp.mean(same * d ** 2 + (1 - same) * jax.nn.relu(1.0 - d) ** 2)


@eqx.filter_jit
def make_step(model, opt_state, x, same, optim):
    loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, same)
    updates, opt_state = optim.update(grads, opt_state, eqx.filter(model, eqx.is_array))
    model = eqx.apply_updates(model, updates)
    return loss, model, opt_state


if __name__ == "__main__":
    key = jax.random.PRNGKey(0)
    model = Embed(key)
    optim = optax.adam(1e-2)
    opt_state = optim.init(eqx.filter(model, eqx.is_array))
    x = jax.random.normal(jax.random.PRNGKey(1), (6, 8))
    labels = jnp.array([0, 0, 1, 1, 2, 2])
    same = (labels[:, None] == labels[None, :]).astype(jnp.float32)
    for step in range(3):
        loss, model, opt_state = make_step(model, opt_state, x, same, optim)
        print(step, float(loss))
