"""A small training loop. ``python live_train.py PORT SECONDS`` serves jax.profiler on PORT and trains for
SECONDS (for ``jaxdbg profile --attach``); without arguments it runs 40 steps (for ``jaxdbg profile``)."""

import sys
import time

import jax
import jax.numpy as jnp


def loss(w, x):
    return jnp.mean(jnp.tanh(x @ w) ** 2)  # hot: the matmuls, forward and backward


@jax.jit
def train_step(w, x):
    return w - 0.01 * jax.grad(loss)(w, x)


def main():
    serve = len(sys.argv) > 2
    if serve:
        jax.profiler.start_server(int(sys.argv[1]))
    w, x = jnp.ones((384, 384)) * 0.01, jnp.ones((256, 384))
    w = train_step(w, x).block_until_ready()
    print("ready", flush=True)
    end = time.monotonic() + float(sys.argv[2]) if serve else None
    step = 0
    while (time.monotonic() < end) if end is not None else step < 40:
        with jax.profiler.StepTraceAnnotation("train", step_num=step):
            w = train_step(w, x).block_until_ready()
        step += 1


if __name__ == "__main__":
    main()
