"""nan-hunt's replay keeps no values alive: what it records about an origin is statistics, not arrays."""

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
