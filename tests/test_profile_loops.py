"""Matmul FLOPs of loops, read from real optimised HLO: XLA's cost analysis counts a loop body once."""

import os

import jax
import jax.numpy as jnp
import pytest

from jaxdbg.profile.loops import LoopFlops, loop_matmul_flops

H200_HLO = os.path.join(os.path.dirname(__file__), "data", "h200_power_iterations", "optimized.hlo.txt")


def _compiled(fun, *args):
    compiled = jax.jit(fun).lower(*args).compile()
    cost = compiled.cost_analysis()
    return compiled.as_text(), (cost[0] if isinstance(cost, list) else cost)["flops"]


def test_nested_loops_multiply_their_trip_counts():
    def layers(x, w):  # 3 steps of a scan over 4 layers: 12 matmuls of [16,32] x [32,32]
        def step(x, _):
            return jax.lax.scan(lambda h, wi: (jnp.tanh(h @ wi), None), x, w)[0], None
        return jax.lax.scan(step, x, None, length=3)[0].sum()

    text, reported = _compiled(layers, jnp.ones((16, 32)), jnp.ones((4, 32, 32)))
    flops = loop_matmul_flops(text)
    one = 2 * 16 * 32 * 32
    assert flops.executed == 12 * one and flops.counted_once == one and flops.unknown_loops == 0
    assert flops.corrected(reported) == pytest.approx(reported + 11 * one)


def test_no_loop_no_correction():
    text, _ = _compiled(lambda a, b: a @ b, jnp.ones((8, 8)), jnp.ones((8, 8)))
    assert loop_matmul_flops(text) is None


def test_cublas_gemm_in_a_loop_on_an_h200():
    """Recorded on an H200: cost analysis there left the cuBLAS call out entirely (1.34e8 FLOPs reported)."""
    with open(H200_HLO) as handle:
        flops = loop_matmul_flops(handle.read())
    one = 2 * 4096**3
    assert (flops.executed, flops.counted_once, flops.library_once) == (40 * one, one, one)
    assert flops.corrected(1.34e8) == pytest.approx(1.34e8 + 40 * one)


def test_correction_never_lowers_what_xla_reported():
    assert LoopFlops(0.0, 0.0, 0.0, 1).corrected(5.0) == 5.0
    assert LoopFlops(40.0, 4.0, 0.0, 0).corrected(10.0) == 46.0  # dots counted once by XLA: add the rest
