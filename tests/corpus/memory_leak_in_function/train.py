"""A trainer object keeps every step's logits in a dict attribute; it lives in main()'s locals, so it is freed
when main() returns, before the run's last sample: the growth during the run is still a leak."""
import jax
import jax.numpy as jnp


class Trainer:
    def __init__(self):
        self.w = jnp.ones((128, 128)) * 0.01
        self.cache = {}
        self.step = jax.jit(lambda w, x: (w - 0.001 * (x.T @ (x @ w)), x @ w))

    def train(self, steps):
        x = jnp.ones((512, 128))
        for i in range(steps):
            self.w, logits = self.step(self.w, x)
            self.cache[i] = logits  # <- kept


def main():
    trainer = Trainer()
    trainer.train(12)
    print(len(trainer.cache))


main()
