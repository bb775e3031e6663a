"""pure_callback / io_callback / debug.callback: a jitted step that computes a metric on the host with NumPy
(jax.pure_callback), appends to a host-side log (io_callback, ordered) and prints with
jax.debug.callback, as JAX's external callbacks guide shows. The bug: the host metric takes np.log of a
value that a corrupt batch makes negative, so the callback itself returns NaN."""
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

HISTORY = []


def host_log_metric(x):
    return np.log(x).astype(np.float32)  # the host's log of a negative value


def record(loss):
    HISTORY.append(float(loss))
    return np.int32(len(HISTORY))


@jax.jit
def train_step(w, x):
    pred = x @ w
    loss = ((pred - 1.0) ** 2).mean()
    metric = jax.pure_callback(host_log_metric, jax.ShapeDtypeStruct((), jnp.float32), pred.mean())  # NaN
    count = io_callback(record, jax.ShapeDtypeStruct((), jnp.int32), loss, ordered=True)
    jax.debug.callback(lambda m, c: None, metric, count)
    return w - 0.01 * x.T @ (pred - 1.0), loss + metric


def main(steps=4):
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.uniform(0.1, 0.5, size=(3,)), jnp.float32)
    for step in range(steps):
        x = rng.uniform(0.5, 1.5, size=(4, 3)).astype(np.float32)
        if step == 2:
            x = -x  # a corrupt batch
        w, loss = train_step(w, x)
    return float(loss)


if __name__ == "__main__":
    print(main())
