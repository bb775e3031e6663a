"""An MLP classifier in Flax NNX trained the way Flax's NNX MNIST tutorial trains one (nnx.Optimizer, an
nnx.jit step that updates the model and optimizer in place, metrics per step), on synthetic data.

The bug: for a confusion plot at the end, the loop keeps every step's logits in a Python list, so each step's
[BATCH, CLASSES] logits stay on the device until the end of the run. And the step does not donate the model
and optimizer that NNX threads through every call. `jaxdbg memory train.py` must name the list and the line
that fills it, and spell the donation hint as nnx.jit takes it."""
import jax
import jax.numpy as jnp
import optax
from flax import nnx

FEATURES, HIDDEN, CLASSES, BATCH, STEPS = 64, 128, 512, 256, 12


class MLP(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(FEATURES, HIDDEN, rngs=rngs)
        self.out = nnx.Linear(HIDDEN, CLASSES, rngs=rngs)

    def __call__(self, x):
        return self.out(nnx.relu(self.hidden(x)))


@nnx.jit
def train_step(model: MLP, optimizer: nnx.Optimizer, x, labels):
    def loss_fn(model):
        logits = model(x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(), logits

    (loss, logits), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
    optimizer.update(model, grads)
    return loss, logits


model = MLP(rngs=nnx.Rngs(0))
optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
key_x, key_y = jax.random.split(jax.random.key(1))
x = jax.random.normal(key_x, (BATCH, FEATURES))
labels = jax.random.randint(key_y, (BATCH,), 0, CLASSES)
history = []
for step in range(STEPS):
    loss, logits = train_step(model, optimizer, x, labels)  # <- call
    history.append(logits)  # <- keeps every step's logits for the plot
print(f"loss {float(loss):.4f}, kept {len(history)} logits")
