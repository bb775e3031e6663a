"""An Equinox MLP regressor trained with Optax (filter_jit, filter_value_and_grad), logging its metrics from
inside the jitted step through `jax.debug.callback` to a host logger, as the Equinox FAQ suggests for
printing inside jit. The bug is in the user's logger, not in JAX: every `summary_every` steps it summarises
the history by a name the step never logs ('accuracy'; the step logs 'loss' and 'grad_norm'), so the
callback raises KeyError on step 5, after five good steps."""
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax


class MetricLogger:
    def __init__(self, names, summary_every):
        self.history = {name: [] for name in names}
        self.summary_every = summary_every

    def __call__(self, step, metrics):
        step = int(step)
        for name, value in metrics.items():
            self.history[name].append(float(value))
        if step > 0 and step % self.summary_every == 0:
            recent = {name: np.mean(values[-self.summary_every:]) for name, values in self.history.items()}
            print(f"step {step}: loss {recent['loss']:.4f} accuracy {recent['accuracy']:.3f}")  # the bug


logger = MetricLogger(["loss", "grad_norm"], summary_every=5)
optim = optax.adamw(3e-3)


def loss_fn(model, x, y):
    pred = jax.vmap(model)(x)
    return jnp.mean((pred - y) ** 2)


@eqx.filter_jit
def make_step(model, opt_state, x, y, step):
    loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
    updates, opt_state = optim.update(grads, opt_state, eqx.filter(model, eqx.is_array))
    model = eqx.apply_updates(model, updates)
    jax.debug.callback(logger, step, {"loss": loss, "grad_norm": optax.global_norm(grads)})
    return model, opt_state


def dataloader(rng, size=32):
    while True:
        x = rng.uniform(-1, 1, size=(size, 2)).astype(np.float32)
        yield x, np.sin(3 * x[:, :1]) * x[:, 1:]


if __name__ == "__main__":
    model = eqx.nn.MLP(2, 1, width_size=32, depth=2, key=jax.random.PRNGKey(0))
    opt_state = optim.init(eqx.filter(model, eqx.is_array))
    for step, (x, y) in zip(range(20), dataloader(np.random.default_rng(0))):
        model, opt_state = make_step(model, opt_state, x, y, step)  # raises at step 5, from the logger
