"""A NaN only the compiled program makes: XLA folds (y + 1e8) - 1e8 to y; op by op it is 0 in float32."""
import jax
import jax.numpy as jnp


@jax.jit
def stabilised_log(y):
    shifted = (y + 1e8) - 1e8  # op by op: rounds to 0; compiled: folded back to y
    return jnp.log(shifted + 0.1)  # <- origin


print(stabilised_log(jnp.array([-0.5, 0.3])))
