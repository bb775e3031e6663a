"""nan-hunt's replay keeps no values alive past their last use: what it records about an origin is statistics, not
arrays, and a deep step's residuals die as its backward pass uses them, however the step is written."""

from __future__ import annotations

import weakref

import jax
import jax.numpy as jnp
import pytest

from jaxdbg.jaxpr import Interpreter, Stop
from jaxdbg.nan.localise import NanHunter

SOURCES = 8


def many_infs(x):
    """Every exp makes an Inf from finite inputs (an Inf origin); the last log makes the NaN."""
    total = 0.0
    for i in range(SOURCES):
        total = total + jnp.exp(x + 100.0 * (i + 1))
    return jnp.log(-total)


class Tracked(NanHunter):
    """The hunter, plus weak references to the inputs of every exp (each one an Inf origin's input)."""

    def __init__(self) -> None:
        super().__init__("many_infs")
        self.exp_inputs: list = []

    def after(self, site, invals, outvals, in_tags, out_tags, descended):
        if site.primitive == "exp":
            self.exp_inputs.extend(weakref.ref(v) for v in invals)
        return super().after(site, invals, outvals, in_tags, out_tags, descended)


def test_origins_keep_no_values_once_the_replay_is_over() -> None:
    x = jnp.linspace(-1.0, 1.0, 256)
    hunter = Tracked()
    closed = jax.make_jaxpr(many_infs)(x)
    with pytest.raises(Stop):  # at the NaN, as nan-hunt's replay does
        Interpreter(hunter).run(closed, [x], root="jit(many_infs)", tags=hunter.input_tags([x], ["x"]))
    assert [r.origin.kind for r in hunter.records] == ["inf"] * SOURCES + ["nan"]
    assert len(hunter.exp_inputs) == SOURCES
    assert [i for i, ref in enumerate(hunter.exp_inputs) if ref() is not None] == []  # none still alive
    assert hunter.records[0].origin.inputs[0].shape == (256,)  # what was seen is still reported


DEPTH, WIDTH, BATCH = 12, 32, 16


def _forward(params, x):
    z = x @ params["in"]
    h = z / (1.0 + jnp.linalg.norm(z, axis=-1, keepdims=True))  # the norm's gradient at the zero rows is NaN
    for w1, w2 in params["blocks"]:
        h = h + jnp.tanh(h @ w1) @ w2
    return h @ params["out"]


def _loss(params, x):
    return jnp.mean(_forward(params, x) ** 2)


def _step(loss):
    def train_step(params, x):
        grads = jax.grad(loss)(params, x)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)

    return train_step


class Held(NanHunter):
    """The hunter, plus the most bytes that the values the replay computed held at once (weak references)."""

    def __init__(self) -> None:
        super().__init__("train_step")
        self.made: list[tuple[weakref.ref, int]] = []
        self.peak = 0

    def after(self, site, invals, outvals, in_tags, out_tags, descended):
        tags = super().after(site, invals, outvals, in_tags, out_tags, descended)
        if not descended:
            self.made += [(weakref.ref(v), v.nbytes) for v in outvals if isinstance(v, jax.Array)]
            self.peak = max(self.peak, sum(n for ref, n in self.made if ref() is not None))
        return tags


def _replay_peak(step) -> tuple[int, str]:
    keys = jax.random.split(jax.random.key(0), 2 * DEPTH + 3)
    params = {"in": jax.random.normal(keys[0], (WIDTH, WIDTH)), "out": jax.random.normal(keys[1], (WIDTH, WIDTH)),
              "blocks": [(jax.random.normal(keys[2 * i + 2], (WIDTH, WIDTH)) * 0.1,
                          jax.random.normal(keys[2 * i + 3], (WIDTH, WIDTH)) * 0.01) for i in range(DEPTH)]}
    x = jax.random.normal(keys[-1], (BATCH, WIDTH)).at[-4:].set(0.0)  # zero padding rows
    leaves = jax.tree.leaves((params, x))
    hunter = Held()
    with pytest.raises(Stop):
        Interpreter(hunter).run(jax.make_jaxpr(step)(params, x), leaves, root="jit(train_step)",
                                tags=hunter.input_tags(leaves, [f"leaf{i}" for i in range(len(leaves))]))
    return hunter.peak, hunter.records[hunter.first_nan].origin.pass_


def test_a_backward_pass_in_its_own_jit_drops_each_residual_after_its_use() -> None:
    """The loss jitted on its own: the step's backward pass is one inner jit that takes every residual of the
    forward pass. The replay holds no more than for the same step written flat (before: every residual until
    the backward pass ended, on top of the gradients it made, 1.7x)."""
    flat, flat_pass = _replay_peak(_step(_loss))
    nested, nested_pass = _replay_peak(_step(jax.jit(_loss)))
    assert flat_pass == nested_pass == "backward"  # the NaN at the end of the backward pass, both ways
    assert nested <= 1.1 * flat
