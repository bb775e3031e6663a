"""An iteration run by lax.while_loop for a dynamic number of steps; sqrt(x - 1) goes NaN at iteration 3."""
import jax
import jax.numpy as jnp


def iterate(x0, steps):
    def body(state):
        i, x = state
        return i + 1, jnp.sqrt(x - 1.0)  # <- origin
    return jax.lax.while_loop(lambda state: state[0] < steps, body, (0, x0))[1]


@jax.jit
def solve(x0, steps):
    return iterate(x0, steps)


print("2 steps:", solve(jnp.float32(10.0), 2))
print("6 steps:", solve(jnp.float32(10.0), 6))
