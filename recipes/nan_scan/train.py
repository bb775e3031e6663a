"""A scan that drains a reservoir; sqrt of the level goes NaN once it turns negative (scan iteration 3)."""
import jax
import jax.numpy as jnp


def simulate(level, outflows):
    def body(h, out):
        h = h - out
        return h, jnp.sqrt(h)  # <- origin
    return jax.lax.scan(body, level, outflows)


@jax.jit
def rollout(level):
    final, gauges = simulate(level, jnp.ones(6))
    return final, jnp.sum(gauges)


for start in (6.5, 3.5):  # the second rollout runs dry at its fourth step
    final, total = rollout(jnp.float32(start))
    print(f"start {start}: final {float(final)}, gauge total {float(total)}")
