"""A training step of a 24-layer residual MLP whose loss turns NaN: hundreds of operations, one bad one.

Layer 17 uses a "soft gate" `log1p(g)` where g = x @ w_g can drop below -1, which gives NaN, and the NaN
then spreads through the rest of the forward pass, the loss and every gradient. The script does not
check for NaN; it prints `loss nan` and carries on, as real training loops do.
"""
import jax
import jax.numpy as jnp
import numpy as np

DEPTH, WIDTH, BATCH = 24, 32, 8


def init_params(rng):
    layers = []
    for i in range(DEPTH):
        w = rng.standard_normal((WIDTH, WIDTH)).astype(np.float32) / np.sqrt(WIDTH)
        g = rng.standard_normal((WIDTH, WIDTH)).astype(np.float32) * (3.0 if i == 17 else 0.1)
        layers.append({"w": jnp.asarray(w), "b": jnp.zeros(WIDTH), "g": jnp.asarray(g)})
    return {"layers": layers, "out": jnp.asarray(rng.standard_normal((WIDTH, 1)).astype(np.float32))}


def rms_norm(x, eps=1e-6):
    return x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)


def layer(p, x):
    h = jax.nn.silu(rms_norm(x) @ p["w"] + p["b"])
    gate = jnp.log1p(x @ p["g"])  # NaN where x @ g < -1
    return x + 0.1 * h * gate


def loss_fn(params, x, y):
    for p in params["layers"]:
        x = layer(p, x)
    pred = x @ params["out"]
    return jnp.mean((pred - y) ** 2)


@jax.jit
def train_step(params, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    params = jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params, grads)
    return params, loss


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    params = init_params(rng)
    x = jnp.asarray(rng.uniform(0.0, 1.0, (BATCH, WIDTH)).astype(np.float32))
    y = jnp.asarray(rng.standard_normal((BATCH, 1)).astype(np.float32))
    for step in range(3):
        params, loss = train_step(params, x, y)
        print(f"step {step} loss {float(loss):.4f}")
