"""An Equinox MLP trained with optax on a batch sharded over the devices (data parallelism on one host), with
filter_jit and no donation: each step holds the old model and optimizer state beside the new ones.

What memory must show: figures per device (the batch a quarter on each of 4 devices), the model and optimizer
state held across the call (the loop passes the outputs back in) and the donation spelled for filter_jit,
which donates by argument groups: x and y are passed again every step, so they must stay out of it. Then a
jax.pmap'd evaluation over the same batch, a block per device: memory follows it as a function of its own, with its
compiled program's figures per device and its largest buffers."""
import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

mesh = Mesh(np.array(jax.devices()), ("data",))
rows = NamedSharding(mesh, P("data"))
model = eqx.nn.MLP(64, 64, 128, depth=2, key=jax.random.PRNGKey(0))
optimizer = optax.adam(1e-3)
opt_state = optimizer.init(eqx.filter(model, eqx.is_array))


@eqx.filter_jit
def train_step(model, opt_state, x, y):
    loss, grads = eqx.filter_value_and_grad(lambda m: jnp.mean((jax.vmap(m)(x) - y) ** 2))(model)
    updates, opt_state = optimizer.update(grads, opt_state, eqx.filter(model, eqx.is_array))
    return eqx.apply_updates(model, updates), opt_state, loss


x = jax.device_put(jnp.ones((1024, 64)), rows)
y = jax.device_put(jnp.zeros((1024, 64)), rows)
for step in range(5):
    model, opt_state, loss = train_step(model, opt_state, x, y)


@functools.partial(jax.pmap, axis_name="data")
def evaluate(xs, ys):
    return jax.lax.pmean(jnp.mean((xs - ys) ** 2), "data")


errors = evaluate(x.reshape(len(jax.devices()), -1, 64), y.reshape(len(jax.devices()), -1, 64))
print(f"loss {float(loss):.4f} eval {float(errors[0]):.4f}")
