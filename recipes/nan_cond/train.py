"""A layer whose activation is picked by lax.cond; the log branch (branch 1) gets negative inputs."""
import jax
import jax.numpy as jnp


def activation(h, use_log):
    return jax.lax.cond(use_log, lambda v: jnp.log(v), lambda v: jnp.tanh(v), h)  # <- origin


@jax.jit
def forward(w, x, use_log):
    return activation(x @ w, use_log)


w = jnp.array([[1.0, -1.0], [0.5, 2.0]])
x = jnp.array([[1.0, 0.5], [2.0, 0.1]])
for use_log in (False, True):
    print(f"use_log={use_log}:", forward(w, x, use_log))
