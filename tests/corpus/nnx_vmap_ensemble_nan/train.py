"""A deep ensemble for regression with uncertainty, written the way Flax's NNX guides build ensembles:
the members are created with ``nnx.vmap`` over split RNG streams and evaluated with ``nnx.vmap`` inside an
``nnx.jit`` train step. Each member predicts a mean and a variance and is trained with the Gaussian
negative log-likelihood. The bug: the variance head uses ReLU instead of softplus, so wherever its
pre-activation is negative the variance is exactly 0: log(0) = -inf, the squared error divided by 0 is
+inf, and their sum -inf + inf is NaN."""
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx


class Member(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(4, 32, rngs=rngs)
        self.mean = nnx.Linear(32, 1, rngs=rngs)
        self.raw_var = nnx.Linear(32, 1, rngs=rngs)

    def __call__(self, x):
        h = nnx.gelu(self.hidden(x))
        return self.mean(h)[:, 0], nnx.relu(self.raw_var(h))[:, 0]  # the bug: relu lets the variance be 0


@nnx.split_rngs(splits=5)
@nnx.vmap(in_axes=(0,), out_axes=0)
def make_ensemble(rngs: nnx.Rngs):
    return Member(rngs=rngs)


def gaussian_nll(mean, var, y):
    return 0.5 * jnp.log(var) + 0.5 * (y - mean) ** 2 / var  # the NaN: log(0) + (y - mean)^2 / 0


def loss_fn(ensemble, x, y):
    @nnx.vmap(in_axes=(0, None, None), out_axes=0)
    def member_loss(member, x, y):
        mean, var = member(x)
        return jnp.mean(gaussian_nll(mean, var, y))

    return jnp.sum(member_loss(ensemble, x, y))


@nnx.jit
def train_step(ensemble, optimizer, x, y):
    loss, grads = nnx.value_and_grad(loss_fn)(ensemble, x, y)
    optimizer.update(ensemble, grads)
    return loss


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    ensemble = make_ensemble(nnx.Rngs(0))
    optimizer = nnx.Optimizer(ensemble, optax.adam(1e-3), wrt=nnx.Param)
    for step in range(3):
        x = rng.normal(size=(64, 4)).astype(np.float32)
        y = np.sin(x.sum(1)) + 0.1 * rng.normal(size=64).astype(np.float32)
        print(step, float(train_step(ensemble, optimizer, jnp.asarray(x), jnp.asarray(y))))
