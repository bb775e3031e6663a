"""Mixed precision: logits cast to bf16 (or f16 with --dtype f16) and a hand-written softmax overflows in exp.

bf16 keeps float32's exponent range, so exp(100) overflows in float32 too; f16 overflows above 65504,
so exp(12) is inf in f16 but fine in float32 (try `jaxdbg nan-hunt ... --precision` on both).
"""
import argparse

import jax
import jax.numpy as jnp

parser = argparse.ArgumentParser()
parser.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
low = {"bf16": jnp.bfloat16, "f16": jnp.float16}[parser.parse_args().dtype]
scale = 100.0 if low is jnp.bfloat16 else 12.0


@jax.jit
def classify(w, x):
    logits = (x @ w).astype(low)
    e = jnp.exp(logits)  # <- chain
    return e / jnp.sum(e, axis=-1, keepdims=True)  # <- origin


w = jnp.eye(3) * scale
for step, x in enumerate([jnp.array([[0.1, 0.2, 0.3]]), jnp.array([[1.0, 0.0, 0.5]])]):
    print(f"step {step}:", classify(w, x))
