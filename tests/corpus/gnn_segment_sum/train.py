"""Graph message passing in plain JAX, as GNN tutorials write it: node features gathered along a large edge
list (`h[senders]`) and summed back per receiving node with `jax.ops.segment_sum` (a scatter-add), then a small
dense layer. The edge lists are device arrays the jitted step closes over.

What jaxdbg must answer (tests/test_corpus_profile.py; memory's from this program's samples in tests/test_memory.py):
- profile: the gathers and scatter-adds take the step's time (the 2000x16 @ 16x16 matmuls do not, although a
  matmul's first run, XLA:CPU's one-time kernel setup, once made one of them the "hot op");
- memory: no leak. The first call leaves ~1.2 MB more live outside jitted calls (jax keeps its own copies of
  the closed-over edge lists with the executable) and nothing grows after that (once told as a leak "kept by an
  unnamed list", exit 1)."""
import jax
import jax.numpy as jnp
import numpy as np

N, E, F = 2000, 150_000, 16
rng = np.random.default_rng(0)
senders = jnp.asarray(rng.integers(0, N, size=E), jnp.int32)
receivers = jnp.asarray(rng.integers(0, N, size=E), jnp.int32)


def layer(w, h):
    messages = h[senders]  # <- the gather
    summed = jax.ops.segment_sum(messages, receivers, num_segments=N)  # <- the scatter-add
    return jax.nn.relu(summed @ w)


@jax.jit
def train_step(ws, h, target):
    def loss(ws):
        x = h
        for w in ws:
            x = layer(w, x)
        return jnp.mean((x - target) ** 2)
    value, grads = jax.value_and_grad(loss)(ws)
    return [w - 1e-4 * g for w, g in zip(ws, grads)], value


ws = [jnp.asarray(rng.normal(size=(F, F)) * 0.1, jnp.float32) for _ in range(2)]
h = jnp.asarray(rng.normal(size=(N, F)), jnp.float32)
target = jnp.zeros((N, F))
for _ in range(6):
    ws, value = train_step(ws, h, target)
print(float(value))
