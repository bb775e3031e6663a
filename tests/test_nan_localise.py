"""Localising inside one call: the contract's origin and chain, passes, fidelity fallback, precision, words."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdbg.nan.calls import Call
from jaxdbg.nan.explain import NORM_EPSILON_ZERO, constant_nan_note, explain, nested_derivative
from jaxdbg.nan.fidelity import bisect_compiled
from jaxdbg.nan.growth import GrowthTracker
from jaxdbg.nan.localise import localise_call
from jaxdbg.nan.passes import classify
from jaxdbg.nan.precision import check_precision
from jaxdbg.nan.result import GrowthEntry
from jaxdbg.nan.stats import nonfinite_flags, value_stats


def _line_of(fn, text: str) -> int:
    import inspect

    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


def hunt(fn, *args, nan_only=False):
    return localise_call(Call(getattr(fn, "__name__", "f"), fn, args, {}), nan_only=nan_only)


# -- values ------------------------------------------------------------------------------------------------


def test_stats_and_flags_on_host_and_device() -> None:
    big = jnp.zeros(100_000).at[7].set(jnp.inf)  # large: reduced on the device, not copied
    assert nonfinite_flags(big) == (False, True)
    assert nonfinite_flags(jnp.arange(3)) == (False, False)
    stats = value_stats(jnp.array([0.0, -2.0, jnp.nan, jnp.inf], jnp.bfloat16))
    assert (stats.dtype, stats.nan, stats.inf, stats.zero, stats.negative) == ("bf16", 1, 1, 1, 1)
    assert (stats.min, stats.max) == (-2.0, float("inf"))


# -- passes ------------------------------------------------------------------------------------------------


def test_backward_by_data_flow_and_name_stack() -> None:
    closed = jax.make_jaxpr(jax.value_and_grad(lambda x: jnp.sqrt(x)))(1.0)
    assert [(e.primitive.name, b) for e, b in classify(closed.jaxpr)] == [
        ("sqrt", False), ("div", True), ("mul", True)]  # the residual div is backward though it is jvp()


def test_grad_without_primal_keeps_forward_work_forward() -> None:
    closed = jax.make_jaxpr(jax.grad(lambda w, x: jnp.sum(jnp.log(x) * w)))(jnp.ones(2), jnp.ones(2))
    passes = {e.primitive.name: b for e, b in classify(closed.jaxpr)}
    assert passes["log"] is False


# -- origins -----------------------------------------------------------------------------------------------


def sqrt_loss(x):
    return jnp.sum(jnp.sqrt(x))  # sqrt line


def test_gradient_of_sqrt_at_zero_is_a_backward_inf_at_the_forward_line() -> None:
    found = hunt(jax.grad(sqrt_loss), jnp.array([1.0, 0.0]))
    first = found.first
    assert (first.kind, first.primitive, first.pass_) == ("inf", "div", "backward")
    assert first.source.line == _line_of(sqrt_loss, "# sqrt line")
    assert first.inputs[1].zero == 1 and found.strategy == "op-by-op replay"


def overflow(x):
    big = jnp.exp(x)  # exp line
    return big - big


def test_nan_from_infinities_has_a_chain() -> None:
    found = hunt(overflow, jnp.float32(100.0))
    assert (found.first.kind, found.first.primitive) == ("nan", "sub")
    chain = [(c.kind, c.primitive, c.source.line) for c in found.chain]
    assert chain == [("inf", "exp", _line_of(overflow, "# exp line"))]


def test_nan_only_skips_inf_but_still_finds_nan() -> None:
    assert hunt(lambda x: 1.0 / x, jnp.array([0.0, 1.0]), nan_only=True).first is None
    assert hunt(overflow, jnp.float32(100.0), nan_only=True).first.primitive == "sub"


def test_input_origin_names_the_argument() -> None:
    def step(params, batch):
        return params["w"] * batch[1]

    found = localise_call(Call("step", step, ({"w": jnp.ones(2)}, (jnp.ones(2), jnp.array([1.0, np.nan]))), {}))
    assert (found.first.kind, found.first.argument, found.strategy) == ("input", "batch[1]", "input check")


def test_input_nan_does_not_hide_a_nan_made_inside() -> None:
    found = hunt(lambda x, y: jnp.log(y) + x, jnp.array([np.nan]), jnp.array([-1.0]))
    assert found.first.kind == "nan" and found.first.primitive == "log"


def test_a_masked_inf_is_not_the_answer() -> None:
    # log(0) = -inf is masked away and the outputs stay finite: no origin made them non-finite
    found = hunt(lambda x: jnp.where(x > 0, jnp.log(x), 0.0), jnp.array([0.0, 2.0]))
    assert found.first is None and not found.reproduced


def test_the_earliest_nan_is_the_origin_and_if_discarded_the_one_that_reaches_the_outputs_is_named() -> None:
    """The contract's origin is the first NaN in execution order, masked or not; when a select discards it (it
    reaches no output), the replay goes on to the first NaN that does, and names it."""
    from jaxdbg.nan.localise import replay

    # masked away by a where, then a NaN that reaches the outputs
    found = hunt(lambda x: (jnp.where(x > 0, jnp.log(x), 0.0), jnp.sqrt(x - 5.0)), jnp.array([-1.0, 2.0]))
    assert (found.first.primitive, found.reaching.primitive) == ("log", "sqrt") and found.reproduced
    (dropped,) = found.discarded
    assert dropped.origin == found.first and dropped.dropped_at_select and not dropped.cond
    assert "`log`" in found.notes[0] and "reaches no output" in found.notes[0]
    assert "the NaN in the outputs is made later, by `sqrt`" in found.notes[0]
    text, _ = explain(found.first, discarded=found.discarded, reaching=found.reaching)
    assert "This NaN reaches no output" in text and "made later, by `sqrt`" in text
    # one select, two NaNs: it keeps the sqrt's (x <= 0 takes it) and discards the log's, made first
    found = hunt(lambda x: jnp.where(x > 0, jnp.log(x - 3.0), jnp.sqrt(x)), jnp.array([-1.0, 4.0]))
    assert (found.first.primitive, found.reaching.primitive) == ("log", "sqrt")
    # discarded in one lane, kept in another: it reaches the outputs
    found = hunt(lambda x: jnp.where(x > -2, jnp.log(x), 0.0), jnp.array([-1.0, -3.0]))
    assert found.first.primitive == "log" and not found.discarded and found.reaching is None
    # discarded by the select, but it reaches the outputs another way
    def both(x):
        y = jnp.log(x)
        return jnp.where(x > 0, y, 0.0), y.sum()

    found = hunt(both, jnp.array([-1.0, 2.0]))
    assert found.first.primitive == "log" and not found.discarded
    # a NaN that surely reaches the outputs ends the replay at once; one a select may discard, not
    assert replay(Call("f", lambda x: (jnp.log(x) * 2.0).sum(), (jnp.array([-1.0]),), {}))[1] == []
    assert replay(Call("f", lambda x: jnp.where(x > 0, jnp.log(x), 0.0), (jnp.array([-1.0]),), {}))[1] != []
    # the same line in a while_loop's cond (its NaN only tested) and then its body (carried out): the body's is
    # named with its place, not as if it were the same operation
    def residual(x):
        return x * x + 0.0 * x  # the cond and the body both compute it

    found = hunt(lambda x: jax.lax.while_loop(lambda c: (c[1] < 3) | jnp.any(jnp.abs(residual(c[0])) > 1.0),
                                              lambda c: (residual(c[0]) / 0.0, c[1] + 1), (x, 0))[0],
                 jnp.array([2.0]))
    assert found.first.path[-1].startswith("while[cond") and found.reaching.path[-1].startswith("while[iteration")
    assert f"inside {found.reaching.path[-1]} (forward pass)" in found.notes[0], found.notes
    text, _ = explain(found.first, discarded=found.discarded, reaching=found.reaching)
    assert f"inside {found.reaching.path[-1]} in the forward pass" in text


def test_a_nan_constant_a_select_discards_is_no_origin() -> None:
    """jnp.var selects its own `jnp.nan` for an empty reduction and discards it (jax turns debug_nans off there):
    the origin is the fully masked softmax row after it, with nothing said about the constant."""
    def attention(x, mask):
        x = (x - x.mean(-1, keepdims=True)) / jnp.sqrt(x.var(-1, keepdims=True) + 1e-5)
        return jax.nn.softmax(jnp.where(mask, x, -jnp.inf), axis=-1)

    found = hunt(attention, jnp.ones((2, 3)) * jnp.arange(3.0), jnp.array([[True, True, False], [False] * 3]))
    assert found.first.primitive == "sub" and not found.first.constant_input
    assert found.first.source.line == _line_of(attention, "softmax")
    assert not found.discarded and found.reaching is None and not found.notes
    assert "fully masked) was normalised (1 of the 2 rows)" in explain(found.first)[0]
    # a NaN constant that the code passes on to the outputs stays the origin
    found = hunt(lambda x: jnp.where(x > 0, x, jnp.nan) * 2.0, jnp.array([-1.0, 2.0]))
    assert found.first.constant_input and found.first.source is not None
    # under jax.grad, jax hoists jnp.var's NaN constant out of a scan over layers (a scan const): still a constant
    # there, discarded by the select inside, and the origin is the 0 / 0 of the layer's normalisation
    def layers(ws, x):
        def block(x, w):
            return x + jnp.tanh((x - x.mean(-1, keepdims=True)) / x.std(-1, keepdims=True) @ w), None
        return jax.lax.scan(block, x, ws)[0].sum()

    found = hunt(jax.jit(jax.grad(layers)), jnp.full((3, 4, 4), 0.1), jnp.ones((2, 4)).at[0].set(jnp.arange(4.0)))
    assert (found.first.primitive, found.first.constant_input) == ("div", False), found.first
    assert found.first.path[-1] == "scan[iteration=0]"


@jax.custom_vjp
def clipped_log(x):
    return jnp.log(jnp.maximum(x, 1e-6))


def _clipped_log_fwd(x):
    return clipped_log(x), x


def _clipped_log_bwd(x, g):
    return (g / x,)  # bwd line: forgets the clip, so x = 0 gives an infinite gradient


clipped_log.defvjp(_clipped_log_fwd, _clipped_log_bwd)


def test_custom_vjp_backward_rule_keeps_its_own_line() -> None:
    found = hunt(jax.jit(jax.grad(lambda x: jnp.sum(clipped_log(x)))), jnp.array([1.0, 0.0]))
    first = found.first
    assert (first.kind, first.primitive, first.pass_) == ("inf", "div", "backward")
    assert first.source.line == _line_of(_clipped_log_bwd, "# bwd line")
    assert "custom_vjp_bwd(_clipped_log_bwd)" in first.path


@jax.custom_jvp
def floored_log(x):
    return jnp.log(jnp.maximum(x, 1e-6))


@floored_log.defjvp
def _floored_log_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return floored_log(x), t / x  # jvp line: forgets the floor, so x = 0 gives an infinite gradient


@pytest.mark.parametrize("remat", [False, True])
def test_custom_jvp_rule_keeps_its_own_line_also_under_checkpoint(remat) -> None:
    loss = lambda x: jnp.sum(floored_log(x))  # noqa: E731
    found = hunt(jax.jit(jax.grad(jax.checkpoint(loss) if remat else loss)), jnp.array([1.0, 0.0]))
    first = found.first
    assert (first.kind, first.primitive, first.pass_) == ("inf", "div", "backward")
    assert first.source.line == _line_of(_floored_log_jvp, "# jvp line")
    assert ("checkpoint" in first.path) == remat


def test_origin_inside_the_second_of_two_loops() -> None:
    def two_loops(x):
        clean = jax.lax.scan(lambda c, a: (c + a, c), 0.0, x)[0]
        return clean, jax.lax.scan(lambda c, a: (c, jnp.log(c - 2.5 * a)), clean, x)[1]

    found = hunt(two_loops, jnp.arange(4.0))
    assert found.first.path[-1] == "scan[iteration=3]" and found.first.primitive == "log"


def _masked_softmax_kernel(x_ref, o_ref):
    x = x_ref[...]
    shifted = x - jnp.max(x, axis=-1, keepdims=True)  # kernel sub line
    o_ref[...] = jnp.exp(shifted) / jnp.sum(jnp.exp(shifted), axis=-1, keepdims=True)


def _log_kernel(x_ref, o_ref):
    from jax.experimental import pallas as pl

    o_ref[...] = jnp.log(x_ref[...] - pl.program_id(0))  # kernel log line: NaN in program 1 only


def test_a_pallas_kernel_is_replayed_inside_whole_or_program_by_program_over_its_grid() -> None:
    from jax.experimental import pallas as pl

    scores = jnp.ones((4, 8)).at[2].set(-jnp.inf)  # a fully masked row
    whole = jax.jit(lambda x: pl.pallas_call(_masked_softmax_kernel, jax.ShapeDtypeStruct(x.shape, x.dtype),
                                             interpret=True)(x))
    found = hunt(whole, scores)
    assert (found.first.kind, found.first.primitive) == ("nan", "sub")
    assert found.first.source.line == _line_of(_masked_softmax_kernel, "# kernel sub line")
    assert found.first.path[-1] == "pallas(_masked_softmax_kernel)" and not found.notes
    block = pl.BlockSpec((2, 8), lambda i: (i, 0))
    grid = jax.jit(lambda x: pl.pallas_call(_log_kernel, jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(2,),
                                            in_specs=[block], out_specs=block, interpret=True)(x))
    found = hunt(grid, jnp.full((4, 8), 0.5))
    assert (found.first.primitive, found.first.path[-1]) == ("log", "pallas(_log_kernel)[program=1]")
    assert found.first.source.line == _line_of(_log_kernel, "# kernel log line") and not found.notes
    # an in-place update (the output aliases its input) in blocks wider than the rows (each runs past the edge),
    # over more programs than are replayed one by one: the first program that makes a non-finite value is found
    # compiled, then replayed op by op
    row = pl.BlockSpec((1, 8), lambda i: (i, 0))
    many = jax.jit(lambda x: pl.pallas_call(_log_kernel, jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(1100,),
                                            in_specs=[row], out_specs=row, input_output_aliases={0: 0},
                                            interpret=True)(x))
    rows = jnp.broadcast_to(jnp.arange(1100.0)[:, None] + 0.5, (1100, 6))  # log(x - program id) of 0.5
    found = hunt(many, rows.at[1037, 3].set(1036.5))  # in program 1037 only: log(-0.5)
    assert (found.first.primitive, found.first.path[-1]) == ("log", "pallas(_log_kernel)[program=1037]")
    # a kernel that sums a row past the array's edge reads interpret mode's NaN padding: it is said so
    wide = pl.BlockSpec((4, 8), lambda i, j: (i, j))
    padded = jax.jit(lambda x: pl.pallas_call(_row_sum_kernel, jax.ShapeDtypeStruct((4, 1), x.dtype), grid=(1, 2),
                                              in_specs=[wide], out_specs=pl.BlockSpec((4, 1), lambda i, j: (i, 0)),
                                              interpret=True)(x))
    found = hunt(padded, jnp.ones((4, 12)))
    assert found.first.primitive == "pallas_call" and "reads memory interpret mode fills with NaN" in found.notes[0]


def _row_sum_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...].sum(-1, keepdims=True)


# -- fidelity ----------------------------------------------------------------------------------------------


def fused(y):
    shifted = jax.jit(lambda v: (v + 1e8) - 1e8)(y)
    return jnp.log(shifted + 0.1)  # fused log line


def test_compiled_prefix_bisection_when_op_by_op_stays_finite() -> None:
    y = jnp.array([-0.5, 0.3])
    assert np.isnan(jax.jit(fused)(y)[0])
    found = hunt(fused, y)
    assert found.first is None and not found.reproduced
    result = bisect_compiled(found.closed_jaxpr, [y], "fused")
    assert result.origin.primitive == "log" and result.origin.kind == "nan"
    assert result.origin.source.line == _line_of(fused, "# fused log line")
    assert result.origin.inputs[0].negative == 1 and 0 < result.probes <= 6


def test_bisection_reports_nothing_when_compiled_prefixes_stay_finite() -> None:
    closed = jax.make_jaxpr(lambda x: x * 2.0)(1.0)
    assert bisect_compiled(closed, [jnp.float32(1.0)], "f") is None


# -- precision ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,value,removes", [(jnp.float16, 12.0, True), (jnp.bfloat16, 100.0, False)])
def test_precision_check_for_low_precision_origins(dtype, value, removes) -> None:
    call = Call("softmax", lambda x: jnp.exp(x) / jnp.sum(jnp.exp(x)), (jnp.array([1.0, value], dtype),), {})
    found = localise_call(call)
    check = check_precision(found, call)
    assert check.f32_removes_origin is removes and check.dtype in ("f16", "bf16")


def test_precision_check_cures_bf16_rounding() -> None:
    call = Call("bce", lambda z: -jnp.log(1.0 - jax.nn.sigmoid(z)), (jnp.array([1.0, 8.0], jnp.bfloat16),), {})
    found = localise_call(call)
    assert found.first.primitive == "log" and check_precision(found, call).f32_removes_origin


def test_precision_check_replays_random_float16_draws() -> None:
    """f16 random numbers are made by bitcasting uint16 bits: those stay 16-bit, the result is widened."""
    def noisy(key, x):
        return jnp.exp(x * 12.0 + jax.random.normal(key, x.shape, dtype=x.dtype) * 0.0)
    call = Call("noisy", noisy, (jax.random.PRNGKey(0), jnp.ones(4, jnp.float16)), {})
    check = check_precision(localise_call(call), call)
    assert check.dtype == "f16" and check.f32_removes_origin and "could not replay" not in check.detail


def test_precision_check_is_skipped_for_float32() -> None:
    call = Call("f", jnp.log, (jnp.array([-1.0]),), {})
    assert check_precision(localise_call(call), call) is None


# -- words and growth --------------------------------------------------------------------------------------


def _rms_norm(x, eps=0.0):
    return x * jax.lax.rsqrt(jnp.mean(x ** 2, axis=-1, keepdims=True) + eps)


def _layer_norm(x, eps=0.0):
    var = ((x - x.mean(-1, keepdims=True)) ** 2).mean(-1, keepdims=True)
    return (x - x.mean(-1, keepdims=True)) / jnp.sqrt(var + eps)


def test_explanations_fit_the_pattern() -> None:
    grad_masked = hunt(jax.grad(lambda x: jnp.sum(jnp.where(x > 0, jnp.log(x), 0.0))), jnp.array([1.0, 0.0]))
    text, hints = explain(grad_masked.first)
    assert "masked" in text and any("double-where" in h for h in hints)
    text, hints = explain(hunt(overflow, jnp.float32(100.0)).first, hunt(overflow, jnp.float32(100.0)).chain)
    assert "inf - inf" in text and "exp" in text
    assert explain(None) == ("", ())
    # the gradient of eigh at repeated eigenvalues: 1 / (λi - λj) with λi = λj, not an overflow
    degenerate = hunt(jax.jit(jax.grad(lambda m: jnp.linalg.eigh(m)[0][1] + 0.0 * jnp.sum(jnp.linalg.eigh(m)[1]))),
                      jnp.ones((4, 4)) - 4 * jnp.eye(4))
    text, hints = explain(degenerate.first, degenerate.chain)
    assert "derivative of `eigh`" in text and "degenerate" in text and "overflow" not in text, text
    assert "eigvalsh" in " ".join(hints) and not any("clip gradients" in h for h in hints)
    text, hints = explain(hunt(lambda x: x ** -2, jnp.array([0.0, 1.0])).first)
    assert "negative power of 0" in text and "overflow" not in text
    # a norm with eps = 0 on a row of zeros (a padded token): the epsilon is the fix, not "a division by zero"
    padded = jnp.array([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0], [3.0, 1.0, 2.0]])
    for norm, primitive in ((_rms_norm, "mul"), (_layer_norm, "div")):
        found = hunt(jax.jit(norm), padded)
        text, hints = explain(found.first, found.chain, input_sources=found.input_sources)
        assert found.first.primitive == primitive and "variance (mean square) is 0 in 1 of its 3 rows" in text, text
        assert "the epsilon added to it is 0" in text and hints == (NORM_EPSILON_ZERO,), hints
    found = hunt(jax.jit(lambda x, d: x * jax.lax.rsqrt(d)), padded, padded[1])
    text, hints = explain(found.first, found.chain)
    assert text.endswith("rsqrt(0) is inf.") and NORM_EPSILON_ZERO not in hints, text  # no norm here


def test_explanations_of_poles_signed_logsumexp_singular_solves_and_inverse_softplus() -> None:
    from jax.scipy.special import gammaln

    pole = hunt(jax.jit(lambda a: jnp.sum(gammaln(jax.nn.relu(a)))), jnp.array([1.0, -0.5]))
    text, hints = explain(pole.first)
    assert (pole.first.kind, pole.first.primitive) == ("inf", "lgamma")
    assert "poles at 0" in text and "overflow" not in text and "softplus" in hints[0]
    signed = hunt(jax.jit(lambda a, w: jax.nn.logsumexp(a, b=w)), jnp.array([1.0, 2.0]), jnp.array([1.0, -1.0]))
    text, hints = explain(signed.first)
    assert "sum(b * exp(a)) is negative" in text and "return_sign=True" in hints[0]
    # the operation is jax's select of its own NaN constant: the header says the user's logsumexp returned it
    assert "`jax.nn.logsumexp` at line" in constant_nan_note(signed.first) and constant_nan_note(pole.first) == ""
    singular = hunt(jax.jit(jax.grad(lambda s: jnp.linalg.slogdet(jnp.diag(s))[1])), jnp.array([1.0, 2.0, 0.0]))
    text, hints = explain(singular.first)
    assert singular.first.pass_ == "backward" and "singular matrix" in text and "gradient of `slogdet`" in text
    # the vmap is jax's own, inside jnp.linalg.solve: no batch elements to speak of; a vmap of the user's is said
    assert singular.first.path[-1] == "jit(solve)" and "vmap" not in text, (singular.first.path, text)
    # jnp.linalg.inv of a matrix that became 0 (a Kalman filter's innovation covariance, its noise through a ReLU)
    # is inf, then 0 * inf in the gain: the infinity is a zero pivot, not an overflow, and no gradient is taken
    gain = hunt(jax.jit(lambda p, r: p @ jnp.linalg.inv(jax.nn.relu(r) * jnp.eye(1))), jnp.zeros((2, 1)),
                jnp.float32(-0.5))
    text, hints = explain(gain.first, gain.chain)
    assert gain.chain[0].primitive == "custom_linear_solve" and gain.chain[0].kind == "inf"
    assert "singular matrix" in text and "overflowed" not in text and "invertible" in hints[0], (text, hints)
    assert not any("clip gradients" in h for h in hints)
    mapped = hunt(jax.jit(jax.grad(lambda s: jax.vmap(lambda r: jnp.linalg.slogdet(jnp.diag(r))[1])(s).sum())),
                  jnp.array([[1.0, 2.0, 0.0], [1.0, 2.0, 3.0]]))
    # the vmap stands where it was written: around the call of slogdet (and a scan), not after what it maps
    assert mapped.first.path[-3:] == ("vmap", "jit(slogdet)", "jit(solve)"), mapped.first.path
    assert "only some batch elements" in explain(mapped.first)[0]
    looped = hunt(jax.jit(jax.vmap(lambda r: jax.lax.scan(lambda c, x: (c + 1 / x, c - 1 / x), 0.0, r)[1])),
                  jnp.array([[1.0, 2.0, 0.0], [1.0, 2.0, 3.0]]))
    assert looped.first.path[-2:] == ("vmap", "scan[iteration=2]"), looped.first.path
    # the gradient of jnp.linalg.norm at the zero vector: the fix is a norm with its epsilon inside the square root
    norm = hunt(jax.jit(jax.grad(lambda w: jnp.linalg.norm(w))), jnp.zeros(3))
    assert explain(norm.first, norm.chain)[1][0].startswith("take the norm with an epsilon inside its square root")
    every = hunt(jax.jit(jax.vmap(lambda r: r / r.sum())), jnp.zeros((3, 2)))  # every row sums to 0
    assert "every batch element is affected" in explain(every.first)[0], explain(every.first)[0]
    inverse = hunt(jax.jit(lambda y: jnp.log(jnp.expm1(y))), jnp.array([0.5, -0.01]))
    text, hints = explain(inverse.first)
    assert "inverse softplus" in text and "expm1(-y)" in hints[0] and not any("logsumexp" in h for h in hints)
    angle = hunt(jax.jit(jax.grad(lambda p: jnp.sum(jnp.arctan2(p[:, 1], p[:, 0])))), jnp.array([[1.0, 1.0], [0, 0]]))
    text, hints = explain(angle.first)
    assert angle.first.pass_ == "backward" and "derivative of arctan2" in text and "origin" in hints[0]


def _radial(w, p):
    return jnp.tanh(w * jnp.sqrt(jnp.sum(p * p)))  # the radius as a feature: d sqrt is infinite at the centre


def test_a_derivative_the_loss_takes_itself_is_explained_as_the_derivative_of_sqrt_at_0() -> None:
    """A physics-informed loss takes the Laplacian with jax.hessian under vmap; at the point (0, 0) the derivative
    of sqrt is infinite. Its equations are in the outer gradient's forward pass, yet they are a derivative: the
    explanation says so, with the sqrt fix, not a bare division by zero."""
    def lap(w, pts):
        return jnp.mean(jax.vmap(lambda p: jnp.trace(jax.hessian(_radial, argnums=1)(w, p)))(pts) ** 2)
    found = hunt(jax.jit(jax.value_and_grad(lap)), 0.7, jnp.array([[0.5, 0.1], [0.0, 0.0]]))
    (root,) = found.chain
    assert root.primitive == "div" and nested_derivative(dataclasses.replace(root, pass_="forward"))
    # data flow calls it backward here; in a PINN whose radius also feeds the network's value it is forward
    for origin in (root, dataclasses.replace(root, pass_="forward")):
        text, hints = explain(origin)
        assert "the derivative of sqrt at 0 is infinite" in text, text
        assert hints[0].startswith("add an epsilon inside: `jnp.sqrt(x + 1e-12)`"), hints
    assert "jax.hessian" in explain(dataclasses.replace(root, pass_="forward"))[0]


def _gp_like(x, log_scale):
    scale = jnp.exp(log_scale)  # exp line
    return x / scale ** 2


def _responsibilities(x, means):
    dens = jnp.exp(-0.5 * (x[:, None] - means[None, :]) ** 2)  # density line
    return dens / dens.sum(axis=1, keepdims=True)  # EM's E-step written with plain exp


def _masked_mean(loss, tokens):
    mask = (tokens != 0).astype(jnp.float32)  # mask line
    return jnp.sum(loss * mask) / jnp.sum(mask)


def _spread(a, b, c, d, s):
    return (a + b + c + d) / jnp.exp(s + a + b + c + d)


def _mean_aggregate(messages, receivers):
    summed = jax.ops.segment_sum(messages, receivers, num_segments=4)
    degree = jax.ops.segment_sum(jnp.ones_like(messages), receivers, num_segments=4)  # degree line
    return summed / degree


_ALPHAS_BAR = jnp.array([1.0, 0.5, 0.0])  # a schedule whose last entry is 0


def _x0_from_noise(x, t):
    ab = _ALPHAS_BAR[t][:, None]
    x0 = x / jnp.sqrt(ab)  # the division: inf where ab is 0
    return x0 @ jnp.array([1.0, -1.0])  # inf - inf: the NaN


def _sinkhorn_step(cost, v):
    kernel = jnp.exp(-cost / 0.01)  # kernel line

    def body(carry):
        i, v = carry
        u = 1.0 / (kernel @ v)
        return i + 1, 1.0 / (kernel.T @ u)

    return jax.lax.while_loop(lambda c: c[0] < 2, body, (0, v))[1]


def test_a_row_of_minus_inf_that_overflowed_is_not_called_masked() -> None:
    """x - max(x) over a row that is all -inf is a fully masked row when a mask wrote the -inf, but an overflow
    when an operation computed it from finite values (blown-up weights): the explanation names the overflow."""
    def scores(a, b):
        logits = -(a * b)  # every entry overflows to -inf
        return logits - jnp.max(logits, axis=-1, keepdims=True)

    found = hunt(scores, jnp.full((2, 3), 1e30, jnp.float32), jnp.full((2, 3), 1e30, jnp.float32))
    text, _ = explain(found.first, found.chain)
    assert found.first.primitive == "sub" and "fully masked" not in text
    assert "The infinity came from `mul`" in text and "overflowed" in text


def test_log_of_an_iteration_that_blew_up_is_explained_by_the_overflow_not_by_a_clamp() -> None:
    """An explicit integrator in lax.scan with an unstable rate grows until a product overflows to -inf, then the
    log-likelihood takes its log: the NaN is the log's, but the -inf it was fed is the blow-up's, so that is what
    the explanation names (its iteration and line), with the bound-what-grows hint; no epsilon, and no
    log-sum-exp hint for a line that sums logs."""
    def loglik(rate, observed):
        def step(y, _):
            y = y + 0.1 * rate * y * jnp.abs(y)  # the product that overflows
            return y, y
        path = jax.lax.scan(step, jnp.float32(-1.0), None, length=40)[1]
        return jnp.sum(observed * jnp.log(path))

    found = hunt(jax.jit(loglik), jnp.float32(3.0), jnp.ones(40))
    text, hints = explain(found.first, found.chain, trains=False)
    assert found.first.primitive == "log" and found.chain, found.first
    assert "The infinity came from `mul`" in text and "scan[iteration=" in text and "overflowed" in text, text
    assert hints[0].startswith("bound or rescale what grows") and not any("logsumexp" in h or "1e-12" in h
                                                                          for h in hints), hints


def test_an_infinity_passed_in_as_an_argument_is_named_by_the_argument() -> None:
    """inf * 0 where the infinity was an argument of the call: the explanation names that argument (it came in,
    no operation of the call made it)."""
    def scaled(x, scale):
        return (x * scale) @ jnp.ones((3, 2))  # +inf and -inf rows summed: inf - inf

    found = hunt(scaled, jnp.array([[1.0, -1.0, 2.0]]), jnp.float32(jnp.inf))
    text, _ = explain(found.first, found.chain)
    assert [link.kind for link in found.chain] == ["input"] and found.chain[0].argument == "scale"
    assert "came in through the argument `scale` of `scaled`" in text and "None" not in text, text
    assert "inf + (-inf) inside its sum" in text and "zeros" not in text, text  # the weights hold no zero


_WARMUP = 0


def _focal_grad(logits, labels):
    def loss(logits):
        log_p = jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(labels, 2), axis=-1)
        return -jnp.mean((1 - jnp.exp(log_p)) ** 0.5 * log_p)
    return jax.grad(loss)(logits)


def _binary_nll(logits, labels):
    probs = jax.nn.sigmoid(logits)
    return -jnp.mean(labels * jnp.log(probs) + (1 - labels) * jnp.log(1 - probs))


def _focal_nll(logits, labels):
    probs = jax.nn.softmax(logits)  # softmax line
    p = jnp.take_along_axis(probs, labels[:, None], axis=1)[:, 0]
    return -jnp.mean((1 - p) ** 2 * jnp.log(p))


def _warmup_lr(step):
    return 1e-2 * jnp.minimum(1.0, step / _WARMUP)


def test_the_zero_a_division_by_zero_divided_by_is_traced_to_where_it_was_made() -> None:
    from jaxdbg.nan import zero_source
    from jaxdbg.nan.analyses import Findings

    def traced(fn, *args):
        call = Call(fn.__name__, jax.jit(fn), args, {})
        found = localise_call(call)
        findings = Findings(found.first, chain=list(found.chain), call=call, localisation=found)
        zero_source.analyse(findings)
        return findings.zero_source, explain(found.first, found.chain, input_sources=found.input_sources,
                                             zero=findings.zero_source)

    # a parameter sent far negative: exp underflows, the denominator is 0, 0 / 0 is NaN
    zero, (text, hints) = traced(_gp_like, jnp.zeros(3), jnp.float32(-377.0))
    assert (zero.primitive, zero.how, zero.arguments) == ("exp", "underflow", ("log_scale",))
    assert zero.source.line == _line_of(_gp_like, "# exp line") and zero.inputs[0].max == -377.0
    assert f"made by `exp` at line {zero.source.line}" in text and "underflow" in hints[0]
    # of many arguments, the one that grew before the call is named first, not left among "and 2 more"
    zero, (text, _) = traced(_spread, *[jnp.float32(0.0)] * 4, jnp.float32(-377.0))
    assert zero.arguments == ("a", "b", "c", "d", "s") and "computed from a, b, c and 2 more." in text
    first = localise_call(Call("_spread", jax.jit(_spread), (*[jnp.float32(0.0)] * 4, jnp.float32(-377.0)), {})).first
    grew = GrowthEntry("s", None, 1, 400.0, "_spread", 1.0, 400.0)
    assert "computed from s, a, b and 2 more." in explain(first, growth=[grew], zero=zero)[0]
    # exponentials normalised by their own sum (EM's responsibilities) for a point far from every mean: every term
    # underflowed, and the fix is the log-space softmax, not a clamp of the exponent
    zero, (text, hints) = traced(_responsibilities, jnp.array([0.0, 60.0]), jnp.array([-1.0, 1.0]))
    assert (zero.primitive, zero.how) == ("exp", "underflow") and zero.source.line == _line_of(_responsibilities,
                                                                                               "# density line")
    assert "Every term of the sum it divides by underflowed" in text and "jax.nn.softmax(a)" in hints[0], hints
    # a batch of padding only: the mask's comparison made the zeros; no underflow hint
    zero, (text, hints) = traced(_masked_mean, jnp.ones(4), jnp.zeros(4, jnp.int32))
    assert (zero.primitive, zero.how, zero.arguments) == ("ne", "made", ("tokens",))
    assert zero.source.line == _line_of(_masked_mean, "# mask line") and "underflow" not in " ".join(hints)
    # x - x: a cancellation; and a zero that comes in as an argument
    zero, _ = traced(lambda x, y: jnp.log(x - y), jnp.float32(2.0), jnp.float32(2.0))
    assert (zero.primitive, zero.how) == ("sub", "cancellation")
    zero, (text, _) = traced(lambda x, d: x / d, jnp.float32(0.0), jnp.float32(0.0))
    assert (zero.primitive, zero.how, zero.arguments) == (None, "argument", ("d",))
    assert "came in with the argument d" in text
    # a denominator made outside the inner function the division is in
    zero, (text, _) = traced(lambda x, s: jax.jit(lambda a, b: a / b)(x, jnp.exp(s)), jnp.float32(0.0),
                             jnp.float32(-377.0))
    assert (zero.primitive, zero.how, zero.arguments) == ("exp", "underflow", ("s",)), zero
    # followed out of a while_loop through its constant: the kernel computed once before it underflowed
    zero, (text, hints) = traced(_sinkhorn_step, jnp.array([[0.1, 9.0], [8.0, 9.5]]), jnp.ones(2))
    assert (zero.primitive, zero.how) == ("exp", "underflow") and "underflow" in hints[0]
    assert zero.source.line == _line_of(_sinkhorn_step, "# kernel line")
    # segment_sum of ones over a receiver list that misses a node: its degree is 0, nothing was added there
    zero, (text, hints) = traced(_mean_aggregate, jnp.ones(3), jnp.array([0, 1, 1]))
    assert (zero.primitive, zero.how, zero.zeros, zero.size) == ("scatter-add", "empty", 2, 4), zero
    assert zero.source.line == _line_of(_mean_aggregate, "# degree line") and "2 of its 4 entries" in text
    assert "jnp.maximum(count, 1)" in hints[0]
    # inf - inf made of a division's inf: its zero is followed, to the global schedule the function captured
    zero, (text, hints) = traced(_x0_from_noise, jnp.ones((2, 2)), jnp.array([0, 2]))
    assert (zero.how, zero.name, zero.index, zero.of.primitive) == ("captured", "_ALPHAS_BAR", (2,), "div"), zero
    assert "The zero denominator comes from `_ALPHAS_BAR`" in text and "element [2] is 0" in text, text
    assert "`_ALPHAS_BAR` holds a 0" in hints[0]
    # inside a shard_map, a device given padding only (its weights all 0) divides by its block's sum: the zero is
    # followed out of the body through the map's operand to the argument (it read 'computed before shard_map')
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:2]), ("d",))  # 2 CPU devices here; 1 where the backend has 1 (a GPU)

    def weighted_mean(x, weight):
        per_device = jax.shard_map(lambda a, b: jax.lax.pmean(jnp.sum(a * b) / jnp.sum(b), "d"), mesh=mesh,
                                   in_specs=(P("d"), P("d")), out_specs=P())
        return per_device(x, weight)

    weight = jnp.ones(2 * mesh.size).at[-2:].set(0.0)  # the last device's block: [1, 1, 0, 0] on 2 devices
    zero, (text, hints) = traced(weighted_mean, jnp.ones(2 * mesh.size), weight)
    assert (zero.primitive, zero.how, zero.arguments) == (None, "argument", ("weight",)), zero
    assert "came in with the argument weight" in text, text
    assert hints[0].startswith("every weight summed into the denominator is 0"), hints  # not only the generic epsilon
    # a warmup length of 0 written into the code: a literal of the traced program, named from the line
    zero, (text, hints) = traced(_warmup_lr, jnp.float32(0.0))
    assert (zero.how, zero.name) == ("literal", "_WARMUP") and "written into the traced code (`_WARMUP`)" in text
    assert "`_WARMUP` is 0" in hints[0]
    # log of a softmax probability that underflowed: the zero is exp's (not the x - max(x) that is 0 at the
    # maximum, exp(0) being 1), said as the softmax's, with the log-space fix first
    zero, (text, hints) = traced(_focal_nll, jnp.array([[0.0, 150.0], [2.0, 1.0]]), jnp.array([0, 1]))
    assert (zero.primitive, zero.how) == ("exp", "underflow"), zero
    assert zero.source.line == _line_of(_focal_nll, "# softmax line"), zero
    assert "from finite inputs" in text and "as a softmax does" in text and hints[0].startswith("use `jax.nn.log"), text
    # log(1 - sigmoid) on one line, the sigmoid on the line before: the log is told it is a sigmoid's (the lines fed
    # through its own line are its inputs' too), and the 1 - p that rounds to 0 is a cancellation (1 is a literal)
    zero, (text, hints) = traced(_binary_nll, jnp.array([30.0, 0.5]), jnp.array([0.0, 1.0]))
    assert (zero.primitive, zero.how) == ("sub", "cancellation"), zero
    assert "its input is a sigmoid" in text and "log_sigmoid" in hints[0], (text, hints)
    # (1 - p) ** 0.5 at p = 1 (its gradient is 0 * inf): the zero is 1 - p's cancellation, not an exp that underflowed
    # to 0 for the other classes (that input holds zeros, but not where the result does)
    zero, (text, hints) = traced(_focal_grad, jnp.array([[0.0, 120.0], [0.0, 120.0]]), jnp.array([1, 0]))
    assert (zero.primitive, zero.how) == ("sub", "cancellation"), zero
    assert "where none of its inputs is 0" in text and "base of the power" in hints[0], (text, hints)
    # a constant feature standardised: the zero is made inside jnp.std (a jitted function of jax's), by x - mean
    # cancelling, said at the line that called it, not as "made by `jit`"
    zero, (text, _) = traced(_standardise, jnp.array([[1.0, 2.0], [1.0, 3.0], [1.0, 5.0]]))
    assert (zero.primitive, zero.how, zero.arguments) == ("sub", "cancellation", ("x",)), zero
    assert zero.source.line == _line_of(_standardise, "# std line") and "made by `sub`" in text, text
    # a carry that is 0 in a loop's first iteration: its initial value, followed out to the argument
    for reverse in (False, True):
        zero, (text, _) = traced(lambda x0, reverse=reverse: jax.lax.scan(
            lambda x, _: (1.0 / x - 1.0 / x, None), x0, None, length=3, reverse=reverse)[0], jnp.float32(0.0))
        assert (zero.how, zero.arguments) == ("argument", ("x0",)) and "earlier iteration" not in text, text


def _standardise(x):
    return (x - x.mean(axis=0)) / x.std(axis=0)  # std line


def test_the_one_line_of_a_nan_made_of_infinities_names_where_the_inf_came_from() -> None:
    """What -q and a CI check print: the NaN's operation, and the division that made its infinity (the line to
    fix); a check's finding is that line."""
    from jaxdbg.check.findings import finding
    from jaxdbg.nan.result import NanHuntResult
    from jaxdbg.report import Report

    found = hunt(jax.jit(_x0_from_noise), jnp.ones((2, 2)), jnp.array([0, 2]))
    result = NanHuntResult(True, found.first, found.chain)
    line = result.essential_line()
    assert line.startswith("nan first made by dot_general (forward pass)"), line
    assert line.endswith(f"; the inf came from div (forward pass) at test_nan_localise.py:"
                         f"{_line_of(_x0_from_noise, 'the division')}"), line
    report = Report("nan-hunt", "t.py", result, 1, {}, {"process_index": 0})
    assert finding(report.to_dict())[0] == line
    assert NanHuntResult(True, found.chain[0]).essential_line() == found.chain[0].describe()


def test_an_exp_overflow_is_told_to_bound_a_value_of_its_own_and_to_subtract_the_max_in_a_softmax() -> None:
    def reparameterise(mu, logvar):
        return mu + jnp.exp(0.5 * logvar)  # a VAE's standard deviation

    def softmax(x):
        return jnp.exp(x) / jnp.exp(x).sum()

    found = hunt(reparameterise, jnp.zeros(2), jnp.array([1.0, 400.0]))
    text, hints = explain(found.first)
    assert "exp overflows in f32" in text and "jnp.clip(x, -20.0, 20.0)" in hints[0], hints
    _, hints = explain(hunt(softmax, jnp.array([1.0, 400.0])).first)
    assert hints[0].startswith("subtract the maximum"), hints


def test_a_weighted_log_of_zero_is_told_to_use_xlogy_after_the_fix_of_a_sigmoid_that_reached_zero() -> None:
    """p * log(p) with p 0 somewhere (an entropy): 0 * -inf is no bug of p, xlogy/entr give the term its 0; a binary
    cross-entropy whose sigmoid rounded to 0 keeps log_sigmoid first."""
    from jaxdbg.nan.explain import LOG_SIGMOID, XLOGY

    def entropy(counts):
        frac = counts / counts.sum()
        return -(frac * jnp.log(frac)).sum()

    def bce(x, logits):
        p = jax.nn.sigmoid(logits)
        return -jnp.sum(x * jnp.log(p) + (1 - x) * jnp.log(1 - p))

    found = hunt(jax.jit(entropy), jnp.array([3.0, 0.0, 1.0]))
    _, hints = explain(found.first, found.chain, input_sources=found.input_sources)
    assert hints[0] == XLOGY, hints
    found = hunt(jax.jit(bce), jnp.array([0.0, 1.0]), jnp.array([-200.0, 3.0]))
    _, hints = explain(found.first, found.chain, input_sources=found.input_sources)
    assert hints[:2] == (LOG_SIGMOID, XLOGY), hints


def test_a_pmap_whose_body_calls_a_jitted_helper_with_constants_is_replayed_to_the_device() -> None:
    """jax.random.normal calls its jitted _uniform with the constants -1 and 1: inside a pmap's shard_map body
    those literals are stacked per device like every other value (the localisation failed on them)."""
    def noisy_log(x, key):
        return jnp.log(x) + 0.1 * jax.random.normal(key, x.shape)

    bad = jax.local_devices()[-1]  # a row per device (4 CPU ones here): the last one's holds a negative
    x = jnp.ones((jax.local_device_count(), 3)).at[-1, 1].set(-1.0)
    found = hunt(jax.pmap(noisy_log), x, jax.random.split(jax.random.key(0), len(x)))
    assert (found.first.primitive, found.first.device, found.first.path[-1]) == (
        "log", f"{bad.platform}:{bad.id}", "shard_map")


def test_a_float16_matmul_whose_sum_overflows_is_not_said_to_overflow_in_its_products() -> None:
    from jaxdbg.nan import overflow
    from jaxdbg.nan.analyses import Findings

    def scores(x, w):
        y = x @ w
        return y - y

    found = hunt(jax.jit(scores), jnp.full((1, 128), 100.0, jnp.float16), jnp.full((128, 1), 10.0, jnp.float16))
    findings = Findings(found.first, localisation=found, chain=list(found.chain))
    overflow.analyse(findings)
    text, _ = explain(found.first, found.chain, overflow=findings.overflow)
    assert "each product of its inputs, at most 1e+03, stays within it: the sum over the contracted" in text, text


def test_growth_tracker_waits_for_a_nonzero_baseline() -> None:
    tracker = GrowthTracker(factor=10.0)
    for call, mags in enumerate([[0.0, 1.0], [0.5, 1.0], [2.0, 1.0], [50.0, np.inf]]):
        tracker.update("f", ["m", "v"], np.array(mags), call)
    (entry,) = tracker.report()
    assert (entry.name, entry.first_call, entry.ratio) == ("m", 3, 100.0)


def test_a_captured_array_with_nan_is_an_input() -> None:
    table = jnp.array([1.0, np.nan, 3.0])
    found = hunt(lambda i: table[i] * 2.0, 1)
    assert found.first.kind == "input" and found.first.argument.startswith("captured array")
    assert found.first.describe().startswith("nan came in with argument captured array")  # the one-line answer


def test_a_sparse_argument_is_named_by_its_fields() -> None:
    """A BCOO adjacency (a pytree class keyed by position) once read `adj[<flat index 0>]` in the report's
    naming of the zero denominator; its leaves are its attributes: `adj.data`, `adj.indices`."""
    from jax.experimental import sparse

    from jaxdbg.nan.calls import output_leaf_names

    adj = sparse.BCOO.fromdense(jnp.eye(3))

    def layer(w, adj, batch):
        return adj @ (batch["x"] * w)

    call = Call("layer", layer, (jnp.ones(()), adj, {"x": jnp.ones((3,))}), {})
    assert call.leaf_names() == ["w", "adj.data", "adj.indices", "batch['x']"]
    assert output_leaf_names(({"adj": adj}, 1.0), ["state", "loss"], "step") == [
        "state['adj'].data", "state['adj'].indices", "loss"]
    # the gradient norms of --grad name the same leaves the same way
    from jaxdbg.nan.session import _grad_norms

    grads = sparse.BCOO((jnp.ones(3), adj.indices), shape=adj.shape)  # a BCOO's gradient is a BCOO: its data
    assert [g.name for g in _grad_norms(lambda adj: None, (grads,), (0,))] == ["adj.data"]


def _per_example(v, flag):
    return jax.lax.cond(flag, lambda: jnp.log(v) ** 2, lambda: (v - 1.0) ** 2)  # branches line


def test_a_cond_that_vmap_made_a_select_says_whether_it_kept_the_nan() -> None:
    """Under vmap a cond with a per-element predicate computes both branches and selects: the explanation says
    so, and whether the NaN is in a selected result (the branch's own) or only in a discarded one (then it is
    not what made the outputs non-finite: jax drops it from the values and the gradient)."""
    from jaxdbg.nan import cond_select
    from jaxdbg.nan.analyses import Findings

    def analysed(fn, *args):
        call = Call("step", jax.jit(fn), args, {})
        found = localise_call(call)
        findings = Findings(found.first, call=call, localisation=found)
        cond_select.analyse(findings)
        return findings.cond_select, explain(found.first, cond_select=findings.cond_select, discarded=found.discarded,
                                             reaching=found.reaching)

    def loss(x, flags):
        return jax.grad(lambda x: jax.vmap(_per_example)(x, flags).sum())(x)

    # the flagged element's own log of a negative value: a result the select kept
    select, (text, hints) = analysed(loss, jnp.array([2.0, -3.0, 0.5]), jnp.array([True, True, False]))
    assert (select.branches, select.branch, select.kept, select.discarded) == (2, 1, 1, 0)
    assert select.source.line == _line_of(_per_example, "# branches line")
    assert f"turned the `lax.cond` at line {select.source.line} into a select" in text
    assert "computes both branches" in text and "in a result that was selected" in text
    assert "clamp the input" in hints[0]
    # an unflagged element's log, discarded, and a NaN made later that reached the outputs, which is named (jax
    # keeps the discarded one out of the gradient: the gradient is finite)
    flags = jnp.array([True, False])
    assert np.isfinite(np.asarray(jax.jit(loss)(jnp.array([2.0, -3.0]), flags))).all()
    select, (text, hints) = analysed(lambda x, flags: (loss(x, flags), jnp.sqrt(x - 5.0)), jnp.array([2.0, -3.0]),
                                     flags)
    assert (select.branch, select.kept, select.discarded) == (1, 0, 1)
    assert "born in the branch whose result was not selected" in text and "double-where" in hints[0]
    assert "not what made the outputs non-finite" in text and "This NaN reaches no output" not in text  # said once
    assert "The NaN in the outputs is made later, by `sqrt`" in text
    # the NaN made inside a jit in the branch (its path says no vmap) is followed out to the select
    doubled_log = jax.jit(lambda v: jnp.log(v) * 2)
    select, _ = analysed(jax.vmap(lambda v, flag: jax.lax.cond(flag, doubled_log, jnp.zeros_like, v)),
                         jnp.array([-1.0, 2.0, -3.0]), jnp.array([False, True, True]))
    assert (select.branch, select.kept, select.discarded) == (1, 1, 1)
    # lax.switch: every branch computed
    select, (text, _) = analysed(jax.vmap(lambda i, v: jax.lax.switch(i, [jnp.log, jnp.sqrt, jnp.exp], v)),
                                 jnp.array([0, 1, 2]), jnp.array([-1.0, 4.0, 1.0]))
    assert (select.branches, select.branch, select.kept) == (3, 0, 1) and "`lax.switch`" in text
    assert "computes all 3 branches" in text
    # a predicate vmap does not map stays a cond (path cond[branch=1]); a jnp.where is no cond
    assert analysed(lambda x: jax.vmap(_per_example, in_axes=(0, None))(x, True), jnp.array([-1.0]))[0] is None
    assert analysed(jax.vmap(lambda v: jnp.where(v > 0, v, jnp.log(v))), jnp.array([-1.0]))[0] is None


def test_a_where_keeps_no_nan_out_of_a_gradient() -> None:
    """Unlike the select vmap makes of a cond, a jnp.where sends the NaN it discards into the gradient (0 * NaN):
    jax's gradient holds it, the origin is the forward operation, and the explanation says how it got there."""
    from jaxdbg.nan import cond_select
    from jaxdbg.nan.analyses import Findings

    def step(x):  # where line
        return jax.grad(lambda x: jnp.where(x > 0, jnp.sqrt(x), 0.0).sum())(x)

    x = jnp.array([4.0, -1.0])
    assert np.isnan(np.asarray(jax.jit(step)(x))[1])
    call = Call("step", jax.jit(step), (x,), {})
    found = localise_call(call)
    assert (found.first.primitive, found.first.pass_, found.discarded) == ("sqrt", "forward", ())
    findings = Findings(found.first, call=call, localisation=found)
    cond_select.analyse(findings)
    select = findings.cond_select
    assert (select.cond, select.kept, select.discarded) == (False, 0, 1)
    assert select.source.line == _line_of(step, "return jax.grad")
    text, hints = explain(found.first, cond_select=select)
    assert f"The select at line {select.source.line}" in text and "0 * NaN is NaN" in text
    assert "double-where" in hints[0]


def test_a_nan_that_reaches_the_loss_is_not_said_to_be_masked_by_the_gradients_own_select() -> None:
    """A fully masked row's softmax is NaN in the forward values (the loss): the select the gradient runs for the
    mask's where (its transpose) discards NaN cotangents, but no select masked the NaN from the values."""
    from jaxdbg.nan import cond_select
    from jaxdbg.nan.analyses import Findings

    def step(scores, mask):
        return jax.value_and_grad(lambda s: jax.nn.softmax(jnp.where(mask, s, -jnp.inf), axis=-1).sum())(scores)

    mask = jnp.array([[True, False, True], [False, False, False]])
    call = Call("step", jax.jit(step), (jnp.ones((2, 3)), mask), {})
    found = localise_call(call)
    assert found.first.primitive == "sub" and found.first.pass_ == "forward"
    findings = Findings(found.first, call=call, localisation=found)
    cond_select.analyse(findings)
    assert findings.cond_select is None


def test_a_cholesky_of_a_matrix_that_is_not_positive_definite_is_explained() -> None:
    """jnp.linalg.cholesky returns NaN (it does not raise) for a matrix with a negative eigenvalue."""
    found = hunt(lambda k: jnp.linalg.cholesky(k).sum(), jnp.array([[1.0, 2.0], [2.0, 1.0]]))
    text, hints = explain(found.first, found.chain)
    assert found.first.primitive == "cholesky" and "not positive definite" in text and "jitter" in hints[0]


def test_an_operation_run_whole_is_noted_only_where_the_answer_stops_at_it() -> None:
    """A scatter-add (an equation with a jaxpr inside that no rule opens) in the gradient of take_along_axis has
    nothing to do with a log of a negative later: no note. One that adds -inf to inf itself makes the NaN: the
    note says the answer cannot look inside it."""

    def gathered_log(x, idx):
        picked = jax.grad(lambda v: jnp.take_along_axis(v, idx, axis=0).sum())(x)
        return jnp.log(picked - 2.0)  # log of a negative

    found = hunt(jax.jit(gathered_log), jnp.ones(4), jnp.array([0, 2]))
    assert found.first.primitive == "log"
    assert not [n for n in found.notes if "no rule looks inside" in n]

    def scattered(x, v):
        return x.at[jnp.array([1])].add(v)  # inf + -inf inside the scatter-add

    found = hunt(jax.jit(scattered), jnp.array([0.0, jnp.inf]), jnp.array([-jnp.inf]))
    assert found.first.primitive.startswith("scatter")
    assert [n for n in found.notes if "no rule looks inside 'scatter" in n]


def test_a_sparse_matmul_of_an_inf_by_a_stored_zero_is_explained_as_0_times_inf() -> None:
    """A BCOO matmul's operands are its values, its integer indices (zeros there multiply nothing) and a dense
    array: an inf met by a stored 0 is 0 * inf; with no stored 0 it is inf + (-inf) inside the sum."""
    from jax.experimental import sparse

    def propagate(values, h, rows):
        adj = sparse.BCOO((values, jnp.stack([rows, jnp.array([0, 1])], axis=1)), shape=(2, 2))
        return adj @ (1.0 / h)  # an inf where h is 0

    found = hunt(jax.jit(propagate), jnp.array([0.0, 1.0]), jnp.array([0.0, 1.0]), jnp.array([0, 1]))
    assert found.first.primitive == "bcoo_dot_general"
    assert explain(found.first, found.chain)[0].count("0 * inf is NaN") == 1
    found = hunt(jax.jit(propagate), jnp.array([2.0, 1.0]), jnp.array([0.0, -0.0]), jnp.array([0, 0]))
    assert found.first.primitive == "bcoo_dot_general"
    assert "0 * inf" not in explain(found.first, found.chain)[0]


def _optax_step(optimizer):
    import optax

    def step(params, opt_state, x):
        grads = jax.grad(lambda p: jnp.sum((x @ p) ** 2))(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return jax.jit(step)


def test_a_step_that_already_warms_its_learning_rate_up_is_told_to_lower_the_peak_not_to_add_warmup() -> None:
    import optax

    from jaxdbg.nan import explain as explain_module
    from jaxdbg.nan import schedule
    from jaxdbg.nan.analyses import Findings
    from jaxdbg.nan.localise import Localisation

    warmup = optax.warmup_cosine_decay_schedule(0.0, 1e30, warmup_steps=40, decay_steps=400)
    params, x = jnp.full((4, 1), 1e20), jnp.full((8, 4), 3.0)  # grown by earlier steps: (x @ p) ** 2 overflows

    def at_step(optimizer, count):
        state = jax.tree.map(lambda v: jnp.int32(count) if v.dtype == jnp.int32 else v, optimizer.init(params))
        return params, state, x

    sgd = optax.sgd(warmup)
    call = Call("step", _optax_step(sgd), at_step(sgd, 7), {})
    found = localise_call(call)
    findings = Findings(found.first, call=call, localisation=found, chain=list(found.chain))
    explain_module.analyse(findings)
    said = " ".join(findings.hints)
    assert "schedule that warms up (from 0 to a peak of 1e+30 by step 40; at this call's step 7" in said, said
    assert "add warmup" not in said
    # Adam's bias corrections depend on the step too, but divide the updates: only the schedule multiplies them
    for optimizer, peak in ((optax.adam(warmup), 1e30), (optax.adam(1e30), None)):
        args = at_step(optimizer, 50)
        curves = schedule.curves(jax.make_jaxpr(_optax_step(optimizer))(*args), jax.tree.leaves(args))
        found_schedule = schedule.warmup(curves)
        assert (found_schedule and (found_schedule.peak_step, round(found_schedule.peak / 1e30, 3))) == (
            peak and (40, 1.0))
        assert schedule.sign_flip(curves) is None
    # a decay written to end at -1e30 instead of 0: negative from step 51 on, so the updates climb the loss (the
    # same step on the same values: the origin is the one found above, the jaxpr this optimiser's)
    sgd = optax.sgd(optax.linear_schedule(1e30, -1e30, 100))
    call = Call("step", _optax_step(sgd), at_step(sgd, 70), {})
    replayed = Localisation(found.first, (), None, True, closed_jaxpr=jax.make_jaxpr(call.fun)(*call.args))
    grew = GrowthEntry("params", None, 60, 1e9, "step", 1e20, 1e29)
    for growth in ((grew,), ()):  # what grew is the ascent; without growth a sign change is no such cause
        findings = Findings(found.first, call=call, localisation=replayed, growth=growth)
        explain_module.analyse(findings)
        said = "is negative from step 51 on (at this call's step 70 it is -4e+29)" in findings.explanation
        assert said == bool(growth) and ("what grew is that ascent" in findings.explanation) == bool(growth)
        assert findings.hints[0].startswith("keep the learning-rate schedule at or above 0") == bool(growth)
    # a rate computed on the host and passed in: negative where the update is written p - lr * g (descent)
    def sgd(params, x, lr):
        grads = jax.grad(lambda p: jnp.sum((x @ p["w"]) ** 2))(params)
        return jax.tree.map(lambda p, g: p - lr * g, params, grads)

    def ascend(params, x, lr):  # a negative rate added: descent, as written
        return params["w"] + lr * jax.grad(lambda w: jnp.sum((x @ w) ** 2))(params["w"])

    for update, lr, named in ((sgd, -0.1, "lr"), (sgd, 0.1, None), (ascend, -0.1, None)):
        call = Call("update", update, ({"w": params}, x, lr), {})
        said = schedule.negative_step(jax.make_jaxpr(update)(*call.args), call.leaves(), call.leaf_names())
        assert (said and (said.name, said.parameter)) == (named and (named, "params['w']")), said



# -- unseen programs (jax.scipy.special, jnp.take, optax clipping, complex spectra, weight norm) ----------------


def _lognormal_nll(y, mu, s):
    return jnp.sum((jnp.log(y) - mu) / jnp.exp(s))  # log line: an exp elsewhere on it, not inside the log


def _picked(probs, labels):
    return jnp.sum(probs * jax.nn.one_hot(labels, 5), axis=-1)  # picked line


def test_library_nans_left_behind_fill_indices_clipped_infinities_and_complex_zeros() -> None:
    """What unseen programs showed: xlogy's own 0 * log(0) (selected away) is no origin when the outputs hold only
    Inf; a NaN filled in by jnp.take for an index past the end says so; a NaN made inside optax's clipping of an
    Inf gradient is not answered with "clip gradients"; a complex zero counts once; two opaque solves on one
    path are noted once; a layer's zero weight under weight normalisation is no weighted mean."""
    from jax.scipy.special import xlogy

    from jaxdbg._source import SourceLocation
    from jaxdbg.nan.analyses import Findings
    from jaxdbg.nan.explain import CLIP, SKIP_NONFINITE, analyse
    from jaxdbg.nan.localise import _telling_opaque_notes
    from jaxdbg.nan.result import Origin, ValueStats
    from jaxdbg.nan.zero_source import ZeroSource

    # xlogy(0, 0) = 0 by a select over 0 * -inf: the outputs hold -inf (y = 2 at mu = 0), born by its log
    found = hunt(jax.jit(lambda y, mu: xlogy(y, mu).sum()), jnp.array([0.0, 2.0]), jnp.array([0.0, 0.0]))
    assert (found.first.kind, found.first.primitive) == ("inf", "log") and not found.discarded and found.reproduced
    # a call whose compiled outputs held Inf and no NaN (XLA computed g * one_hot as a select; op by op it is
    # 0 * inf): the origin is the Inf, not the replay's NaN
    found = localise_call(Call("f", jax.jit(lambda x: (jnp.log(x), jnp.log(x) * 0.0)), (jnp.zeros(2),), {}),
                          infs_only=True)
    assert (found.first.kind, found.first.primitive) == ("inf", "log") and not found.discarded
    # an embedding id equal to the table's size: jnp.take fills its row with NaN
    found = hunt(jax.jit(lambda t, i: jnp.take(t, i, axis=0).sum()), jnp.ones((4, 3)), jnp.array([0, 4]))
    text, hints = explain(found.first)
    assert found.first.primitive == "gather" and "indices run from 0 to 4" in text and "(4, 3)" in text, text
    assert "embedding table" in hints[0]
    # an Inf gradient through optax.clip_by_global_norm: its rescaling makes inf / inf
    optax = pytest.importorskip("optax")
    tx = optax.clip_by_global_norm(1.0)
    call = Call("step", jax.jit(lambda g: tx.update(g, tx.init(g))[0]), ({"w": jnp.array([jnp.inf, 1.0])},), {})
    found = localise_call(call)
    findings = Findings(found.first, chain=list(found.chain), call=call, localisation=found)
    analyse(findings)
    assert found.first.kind == "nan" and "inside `optax.clip_by_global_norm`" in findings.explanation
    assert SKIP_NONFINITE in findings.hints and CLIP not in findings.hints
    # the log's input is data (y): an exp elsewhere on its line is no log-sum-exp
    at = SourceLocation(__file__, _line_of(_lognormal_nll, "# log line"), "_lognormal_nll")
    y = ValueStats((2,), "f32", 0.0, 1.0, 0, 0, 1, 0)
    _, hints = explain(Origin("inf", "log", "forward", at, inputs=(y,), outputs=(y,)))
    assert "clamp the input away from zero" in hints[0] and not any("logsumexp" in h for h in hints), hints
    # log of a probability picked by one_hot of labels that hold an ignore index (255): mask those labels
    log = Origin("inf", "log", "forward", at, inputs=(y,), outputs=(y,))
    picked = SourceLocation(__file__, _line_of(_picked, "# picked line"), "_picked")
    _, hints = explain(log, input_sources={log: (picked,)},
                       zero=ZeroSource(None, None, "argument", (), ("labels",), log))
    assert hints[0].startswith("mask the labels outside [0, num_classes)"), hints
    # a complex zero is one zero (not one per part), and has no sign
    stats = value_stats(jnp.array([0j, 1 - 2j, -3 + 0j], jnp.complex64))
    assert (stats.zero, stats.negative, stats.nan) == (1, 0, 0)
    # two solves at one path (a Kalman filter's gain and innovation): the note that they ran whole is said once
    solve = "jit(f)/scan[iteration=41]/jit(solve): no rule looks inside 'custom_linear_solve'; it ran as one operation"
    assert _telling_opaque_notes([(None, solve), (None, solve)], ()) == [solve]
    # weight normalisation of a zero-initialised Equinox layer (every norm 0): its weight, not a weighted mean's
    # weights; an embedding whose padding row is 0 under a LayerNorm without eps (rsqrt(0)) is neither
    norms = ValueStats((64, 1), "f32", 0.0, 0.0, 0, 0, 64, 0)
    first = Origin("nan", "div", "forward", at, inputs=(norms, norms), outputs=(y,))
    _, hints = explain(first, zero=ZeroSource(None, None, "argument", (), ("model.res.layer.weight",), first))
    assert hints[0].startswith("initialise `model.res.layer.weight` with nonzero values"), hints
    variance = Origin("inf", "rsqrt", "forward", at, inputs=(norms,), outputs=(y,))
    _, hints = explain(variance, zero=ZeroSource(None, None, "argument", (), ("block.embed.weight",), variance))
    assert not any("initialise" in h or h.startswith("every weight summed") for h in hints), hints
