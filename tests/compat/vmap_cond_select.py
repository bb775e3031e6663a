"""vmap of cond: a per-example loss that picks a branch with lax.cond (a log-space error for targets
flagged as multiplicative, a squared error for the rest), vmapped with in_axes given as dicts (params
shared, every field of the batch mapped), as per-example code built from a single-example function does.
Under vmap the cond becomes a select and both branches run on every example. The bug: one flagged example
has a negative prediction, and its log-ratio is log of a negative."""
import jax
import jax.numpy as jnp
import numpy as np


def example_loss(params, example):
    pred = example["x"] @ params["w"] + params["b"]
    return jax.lax.cond(example["log_space"],
                        lambda: jnp.log(pred / example["y"]) ** 2,  # NaN: log of a negative ratio
                        lambda: (pred - example["y"]) ** 2)


@jax.jit
def train_step(params, batch):
    def loss_fn(params):
        in_axes = ({"w": None, "b": None}, {"x": 0, "y": 0, "log_space": 0})
        return jax.vmap(example_loss, in_axes=in_axes)(params, batch).mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), loss


def main(steps=4):
    rng = np.random.default_rng(0)
    params = {"w": jnp.full((3,), 0.1, jnp.float32), "b": jnp.float32(1.0)}
    for step in range(steps):
        x = rng.uniform(0.0, 1.0, size=(8, 3)).astype(np.float32)
        y = rng.uniform(1.0, 2.0, size=(8,)).astype(np.float32)
        log_space = np.arange(8) % 2 == 0
        if step == 2:
            x[4] = -50.0  # an outlier among the log-space examples: its prediction is negative
        batch = {"x": jnp.asarray(x), "y": jnp.asarray(y), "log_space": jnp.asarray(log_space)}
        params, loss = train_step(params, batch)
    return float(loss)


if __name__ == "__main__":
    print(main())
