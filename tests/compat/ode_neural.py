"""jax.experimental.ode: a hybrid neural ODE fitted with odeint (adaptive Dopri5 forward, the adjoint ODE
backward), as the neural-ODE examples of JAX and Diffrax write one: Torricelli's law for a draining tank,
dh/dt = -k sqrt(h), plus a small MLP for what the law misses. The bug: a level sensor reports a negative
initial level for one tank, and sqrt(h) of it is NaN at the first evaluation of the dynamics."""
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.ode import odeint


def dynamics(h, t, params):
    correction = jnp.tanh(h[:, None] * params["w1"] + params["b1"]) @ params["w2"]
    return -jnp.exp(params["log_k"]) * jnp.sqrt(h) + 0.1 * correction[:, 0]  # NaN: sqrt of a negative level


@jax.jit
def train_step(params, h0, ts, observed):
    def loss_fn(p):
        return ((odeint(dynamics, h0, ts, p, rtol=1e-4, atol=1e-4) - observed) ** 2).mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss


def main(steps=3):
    rng = np.random.default_rng(0)
    params = {"log_k": jnp.float32(-1.0), "w1": jnp.asarray(rng.normal(size=(1, 8)), jnp.float32),
              "b1": jnp.zeros(8), "w2": jnp.asarray(rng.normal(size=(8, 1)) / 8, jnp.float32)}
    ts = jnp.linspace(0.0, 1.0, 4)
    for step in range(steps):
        h0 = rng.uniform(1.0, 2.0, size=4).astype(np.float32)
        observed = (np.sqrt(h0)[None, :] - 0.2 * np.asarray(ts)[:, None]) ** 2  # the law's exact solution, k=0.4
        if step == 2:
            h0[1] = -h0[1]  # a sensor with its sign flipped
        params, loss = train_step(params, jnp.asarray(h0), ts, jnp.asarray(observed, jnp.float32))
    return float(loss)


if __name__ == "__main__":
    print(main())
