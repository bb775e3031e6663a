"""Per-example angles computed under vmap; one example's value is outside arcsin's domain."""
import jax
import jax.numpy as jnp


def per_example_angle(v):
    return jnp.arcsin(v[0] / v[1])  # <- origin


@jax.jit
def batch_angles(batch):
    return jax.vmap(per_example_angle)(batch)


batch = jnp.array([[0.5, 1.0], [0.2, 2.0], [3.0, 2.0], [0.0, 1.0]])  # example 2: 3/2 > 1
print(batch_angles(batch))
