"""nan-hunt on the real-program corpus (tests/corpus/): what it must answer for Flax NNX and Linen, Equinox and
Optax programs as their users write them (op, line, pass, call, loop iteration, chain, growth, hints), and
the rules behind those answers on small cases.

Each program runs once per session, in this process (as tests/test_nan_recipes.py runs the recipes); every
expected line is found by a marker comment on it, so editing a program does not silently move its answer.
"""

from __future__ import annotations

import dataclasses
import os
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdbg.nan import HuntOptions
from jaxdbg.nan.explain import BOUND, CLIP, ITERATED_MATMUL, explain
from jaxdbg.nan.growth import GrowthTracker
from jaxdbg.nan.result import GrowthEntry, Origin, ValueStats
from jaxdbg.nan.watch import NonFiniteFound, Watch
from jaxdbg.report import to_jsonable
from jaxdbg.target import parse_target

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
DIVERGENCE = ("diverg", "clip gradients")  # words of a divergence claim, in the text or the hints


def _line(program: str, marker: str) -> int:
    with open(os.path.join(CORPUS, program, "train.py")) as handle:
        lines = [i for i, text in enumerate(handle, start=1) if marker in text]
    assert len(lines) == 1, f"{program}: the marker {marker!r} must be on exactly one line"
    return lines[0]


@pytest.fixture(scope="module")
def hunted(tmp_path_factory):
    """``hunted(program)``: the nan-hunt result of a corpus program as JSON-ready data (run once)."""
    pytest.importorskip("flax")
    pytest.importorskip("equinox")
    from jaxdbg.nan.session import hunt_here

    results: dict[str, dict] = {}

    def run(program: str) -> dict:
        if program not in results:
            out = tmp_path_factory.mktemp(program)
            result, _ = hunt_here(parse_target(os.path.join(CORPUS, program, "train.py")),
                                  HuntOptions(out_dir=str(out)))
            results[program] = to_jsonable(result)
        return results[program]

    return run


def _where(origin: dict) -> tuple:
    return origin["kind"], origin["primitive"], origin["pass"], origin["source"]["line"], origin["call_index"]


def _said(result: dict) -> str:
    return (result["explanation"] + " " + " ".join(result["hints"])).lower()


# -- item 4a: an Optax loop whose update runs eagerly, diverging ---------------------------------------------


def test_eager_optax_divergence_reports_the_nan_the_inf_turned_into(hunted) -> None:
    program = "optax_eager_lr_nan"
    got = hunted(program)
    update = _line(program, "# the NaN: applied eagerly")
    # The NaN is made by the eager update (inf + -inf), not the loss overflow 17 calls before it.
    assert _where(got["first"]) == ("nan", "add", "forward", update, 0) and got["first"]["path"] == ["eager"]
    assert got["strategy"] == "eager check"
    # Its infinities came from the jitted gradient of the prediction, which overflowed in call 32.
    assert [(*_where(c), c["function"]) for c in got["chain"]] == [
        ("inf", "dot_general", "backward", _line(program, "# its gradient overflows"), 32, "value_and_grad(mse)")]
    # The parameters were only ever made by eager code: their growth is seen as arguments of the jitted call.
    params = {g["name"]: g for g in got["growth"] if g["name"].startswith("params")}
    assert set(params) == {"params['w']", "params['b']"}
    assert all(g["ratio"] > 1e30 and g["source"]["line"] == update and g["function"] == "value_and_grad(mse)"
               for g in params.values())
    assert "diverging" in got["explanation"] and got["hints"][0] == CLIP
    assert any("reduce_sum" in n and "call 15" in n and "did not feed" in n for n in got["notes"])


# -- item 4b: 0/0 on an all-padding batch, a bias grown from 1e-6 --------------------------------------------


def test_padding_zero_division_is_not_called_divergence(hunted) -> None:
    program = "linen_masked_mean_nan"
    got = hunted(program)
    assert _where(got["first"]) == ("nan", "div", "forward", _line(program, "# the bug: 0 / 0"), 3)
    assert got["chain"] == []
    assert got["growth"] == []  # the bias grew 2.6e3x from its 1e-6 initialisation, to 2.6e-3: ordinary
    said = _said(got)
    assert not any(word in said for word in DIVERGENCE)
    assert "jnp.maximum(mask.sum(), 1)" in got["hints"][0]


# -- item 4c: name the derivative, suggest the log-space function --------------------------------------------


def test_sqrt_derivative_is_named_and_fixed_at_the_sqrt(hunted) -> None:
    program = "eqx_pairwise_nan"
    got = hunted(program)
    line = _line(program, "# includes each point")
    assert _where(got["first"]) == ("nan", "mul", "backward", line, 0)
    assert [_where(c) for c in got["chain"]] == [("inf", "div", "backward", line, 0)]
    assert "the derivative of sqrt at 0 is infinite" in got["explanation"]
    assert "jnp.sqrt(x + 1e-12)" in got["hints"][0] and any("double-where" in h for h in got["hints"])
    assert "clip gradients" not in _said(got) and "0 * inf" in got["explanation"]


def test_log_of_softmax_suggests_log_softmax(hunted) -> None:
    program = "nnx_mnist_nan"
    got = hunted(program)
    assert _where(got["first"]) == ("nan", "mul", "forward", _line(program, "# the bug"), 2)
    assert "jax.nn.log_softmax" in got["hints"][0] and "optax.softmax_cross_entropy" in got["hints"][0]
    assert not any("subtract the maximum" in h for h in got["hints"])
    assert "its input is a softmax" in got["explanation"]
    assert got["growth"] == []  # Adam's moments growing from ~1e-6 to ~1e-2 are not divergence


def test_a_loop_without_jit_shows_the_growth_of_the_array_it_updates(hunted) -> None:
    """No jitted call at all: the parameters (one array) are rebound eagerly each step; their growth is seen at
    the line that updates them, step by step (it was empty)."""
    program = "optax_eager_sgd_growth"
    got = hunted(program)
    update = _line(program, "# the NaN: inf + (-inf)")
    assert _where(got["first"])[:4] == ("nan", "add", "forward", update) and got["first"]["path"] == ["eager"]
    [grew] = got["growth"]
    assert (grew["name"], grew["source"]["line"], grew["function"]) == ("w", update, "<module>")
    assert grew["ratio"] > 1e30 and grew["peak"] > 1e30 and grew["first_call"] < 10  # from the first steps on
    assert "`w` grew" in got["explanation"] and "diverging" in got["explanation"]


def test_inside_shard_map_the_origin_names_its_device_and_shard(hunted) -> None:
    """The shard_map body calls jnp.linalg.norm (itself jitted); the replay descends into it per device (it
    failed on the manual axes' types), and the origin names the device whose shard held the padding row."""
    program = "shmap_dp_normalise_nan"
    first = hunted(program)["first"]
    assert _where(first)[:4] == ("nan", "div", "forward", _line(program, "# the bug"))
    assert first["path"] == ["jit(train_step)", "shard_map"]
    rows, features = 8, 16  # ROWS_PER_DEVICE, FEATURES: the padding row is row 2 of device 1's shard
    assert (first["device"], first["shard"]) == ("cpu:1", [[rows, 2 * rows], [0, features]])


def test_inside_pmap_the_origin_names_its_device_and_mapped_index(hunted) -> None:
    program = "pmap_poisson_nan"
    first = hunted(program)["first"]
    assert _where(first)[:4] == ("nan", "log", "forward", _line(program, "# the NaN"))
    assert first["path"] == ["pmap", "shard_map"] and first["function"] == "loss_fn"
    assert (first["device"], first["shard"]) == ("cpu:2", [[2, 3]])  # the third device: index 2 of the pmap


def test_a_float16_matmul_overflow_is_named_as_the_root_cause_with_fixes_that_fit(hunted) -> None:
    """Unscaled f16 attention logits overflow 65504; softmax's inf - inf is the NaN. The report names the matmul
    where the value left float16's range, and the fixes are float32 for that matmul and scaled inputs (not
    clipping gradients at step 0, not an epsilon)."""
    program = "f16_attention_overflow"
    got = hunted(program)
    assert _where(got["first"])[:4] == ("nan", "sub", "forward", _line(program, "# the NaN"))
    overflow = got["overflow"]
    assert _where(overflow["origin"])[:4] == ("inf", "dot_general", "forward", _line(program, "# the bug"))
    assert (overflow["dtype"], overflow["max"]) == ("f16", 65504.0) and overflow["reach"] > 65504.0
    assert "float16 overflow" in got["explanation"] and "max 65504" in got["explanation"]
    assert "preferred_element_type=jnp.float32" in got["hints"][0] and "1/sqrt" in got["hints"][1]
    assert not any(word in " ".join(got["hints"]) for word in ("epsilon", "clip gradients", "loss scaling"))


def test_a_float16_overflow_that_turned_into_zeros_is_still_the_root_cause(hunted) -> None:
    """x * x overflows in a hand-written layer norm; rsqrt(inf + eps) = 0 zeroes the embeddings and the L2
    normalisation's 0 / 0 is the NaN, whose inputs hold no Inf (no chain). The overflow is found by data flow,
    and the hint is float32 for x * x, not 'keep the denominator away from zero'."""
    program = "f16_layernorm_overflow"
    got = hunted(program)
    assert _where(got["first"])[:4] == ("nan", "div", "forward", _line(program, "# the NaN")) and got["chain"] == []
    assert _where(got["overflow"]["origin"])[:4] == ("inf", "mul", "forward", _line(program, "# the bug"))
    assert "float16 overflow" in got["explanation"] and "`mul`" in got["explanation"]
    assert "x.astype(jnp.float32) * x" in got["hints"][0]
    assert not any("denominator away from zero" in h or "epsilon inside" in h for h in got["hints"])


# -- item 1: NNX transforms, the NNX optimiser, Equinox filter_grad ------------------------------------------


def test_nnx_scan_origin_is_the_iteration_that_made_it(hunted) -> None:
    program = "nnx_scan_rnn_nan"
    got = hunted(program)
    first = got["first"]
    assert _where(first) == ("nan", "dot_general", "backward", _line(program, "# the NaN: gradient"), 2)
    assert first["path"] == ["jit(train_step)", "scan[iteration=6]"]
    # The backward scan's input at iteration 6 is day 7's +inf (p / 0), not day 6's -inf (log 0).
    chain = got["chain"]
    assert [_where(c) for c in chain] == [("inf", "div", "forward", _line(program, "# the bug: a missing day"), 2)]
    assert chain[0]["path"] == ["jit(train_step)", "scan[iteration=6]"]
    assert "division by zero" in got["explanation"] and "clip gradients" not in _said(got)


def test_nnx_vmap_origin_is_inside_the_vmap(hunted) -> None:
    program = "nnx_vmap_ensemble_nan"
    got = hunted(program)
    line = _line(program, "# the NaN: log(0)")
    assert _where(got["first"]) == ("nan", "add", "forward", line, 0)
    assert got["first"]["path"] == ["jit(train_step)", "vmap"]
    assert [_where(c) for c in got["chain"]] == [("inf", "log", "forward", line, 0), ("inf", "div", "forward", line, 0)]
    assert "log(0) is -inf" in got["explanation"] and "jnp.log(jnp.maximum(x, 1e-12))" in got["hints"][0]
    assert "clip gradients" not in _said(got)


def test_nnx_optimizer_update_origin_is_the_schedule(hunted) -> None:
    program = "nnx_schedule_nan"
    got = hunted(program)
    assert _where(got["first"]) == ("nan", "mul", "forward", _line(program, "# the NaN: inf learning rate"), 0)
    assert [_where(c) for c in got["chain"]] == [("inf", "div", "forward", _line(program, "# the bug: optax"), 0)]
    assert got["chain"][0]["source"]["function"] == "rsqrt_schedule"
    assert "division by zero" in got["explanation"] and "denominator away from zero" in got["hints"][0]
    assert "clip gradients" not in _said(got)


def test_equinox_filter_grad_backward_origin(hunted) -> None:
    program = "eqx_rnn_poisson_nan"
    got = hunted(program)
    assert _where(got["first"]) == ("nan", "div", "backward", _line(program, "# forward-safe"), 0)
    assert got["first"]["path"] == ["jit(make_step)"] and got["chain"] == []
    assert any("double-where" in h for h in got["hints"])


# -- plain JAX + Optax: a fori_loop VAE and optax.MultiSteps ---------------------------------------------------


def test_vae_zero_times_log_zero_names_the_bias_that_made_the_inf(hunted) -> None:
    program = "vae_fori_nan"
    got = hunted(program)
    line = _line(program, "# the NaN: 0 * log(0)")
    assert _where(got["first"]) == ("nan", "mul", "forward", line, 0) and got["first"]["path"] == ["jit(train_step)"]
    # The -inf was made when the parameters were built (a log-odds bias of a pixel never on), then log(p = 0).
    assert [_where(c) for c in got["chain"]] == [
        ("inf", "log", "forward", _line(program, "# the bug: -inf where"), 0), ("inf", "log", "forward", line, 0)]
    assert got["chain"][0]["source"]["function"] == "init_params" and got["growth"] == []
    assert "0 * inf is NaN" in got["explanation"] and "jnp.log(jnp.maximum(x, 1e-12))" in got["hints"][0]


def test_multisteps_l2sp_norm_derivative_at_zero_is_the_backward_pass(hunted) -> None:
    program = "optax_multisteps_l2sp_nan"
    got = hunted(program)
    line = _line(program, "# the NaN: d sqrt at 0")
    assert _where(got["first"]) == ("nan", "mul", "backward", line, 0) and got["first"]["path"] == ["jit(train_step)"]
    assert [_where(c) for c in got["chain"]] == [("inf", "div", "backward", line, 0)]
    assert "derivative of a norm at the zero vector" in got["explanation"] and got["growth"] == []
    assert "optax.tree.norm(t, squared=True) + 1e-12" in got["hints"][0] and "clip gradients" not in _said(got)


# -- the rules behind the answers -----------------------------------------------------------------------------


def _stats(*values: float, shape: tuple = (4,)) -> ValueStats:
    array = np.array(values, np.float32)
    finite = array[~np.isnan(array)]
    return ValueStats(shape, "f32", float(finite.min()), float(finite.max()), int(np.isnan(array).sum()),
                      int(np.isinf(array).sum()), int((array == 0).sum()), int((array < 0).sum()))


def _growth(baseline: float, peak: float) -> GrowthEntry:
    return GrowthEntry("params['w']", None, 1, peak / baseline, "step", baseline, peak)


def test_growth_to_a_small_magnitude_is_not_reported() -> None:
    tracker = GrowthTracker(factor=100.0)
    for call, mags in enumerate([[1e-6, 0.5, 2.0], [1e-4, 0.5, 40.0], [2e-3, 0.6, 9e3]]):
        tracker.update("step", ["bias", "w", "loss"], np.array(mags), call)
    assert [(g.name, g.ratio) for g in tracker.report()] == [("loss", 4500.0)]


def test_divergence_needs_a_large_magnitude_and_a_cause_growth_can_have() -> None:
    zero_div = Origin("nan", "div", "forward", None, "step", 3, ("jit(step)",), (_stats(0, 0), _stats(0, 0)))
    overflow = Origin("inf", "mul", "forward", None, "step", 3, ("jit(step)",), (_stats(3e30, 1), _stats(2e9, 1)))
    moderate, large = _growth(1.0, 500.0), _growth(1.0, 1e30)
    text, hints = explain(zero_div, (), [moderate])
    assert "grew" in text and not any(w in (text + " ".join(hints)).lower() for w in DIVERGENCE)
    text, hints = explain(overflow, (), [moderate])
    assert "starting to diverge" in text and CLIP in hints
    text, hints = explain(overflow, (), [large])
    assert "the run was diverging" in text and hints[0] == CLIP


def test_a_call_that_computes_no_gradient_gets_no_gradient_advice() -> None:
    """An ODE solve or a simulation that overflows: clipping gradients or lowering a learning rate means
    nothing there; the hint says to bound what grows."""
    overflow = Origin("inf", "mul", "forward", None, "solve", 0, ("jit(solve)",), (_stats(3e30, 1), _stats(2e9, 1)))
    _, hints = explain(overflow, (), [_growth(1.0, 1e30)], trains=False)
    assert BOUND in hints and not any("gradient" in h or "learning rate" in h for h in hints)
    assert CLIP in explain(overflow, (), [_growth(1.0, 1e30)])[1]
    # an HMC step: its only gradients drive the leapfrog scan, so the step size is named beside the learning rate
    _, hints = explain(overflow, (), [_growth(1.0, 1e30)], trains="in loops")
    assert CLIP not in hints and any(h.startswith(CLIP) and "smaller step size" in h for h in hints)


def test_a_matrix_multiplied_by_itself_in_a_loop_is_told_to_be_normalised_first() -> None:
    """Newton-Schulz on a matrix not normalised first: inside the unrolled loop X @ X.T overflows (both inputs
    huge) and inf + (-inf) is NaN one iteration later; the fix is to normalise before iterating, not to clip. A
    matmul of ordinary activations by one grown matrix gets no such hint."""
    loop = ("jit(train_step)", "scan[iteration=3]")
    matmul = Origin("inf", "dot_general", "forward", None, "train_step", 2, loop,
                    (_stats(-3.01e30, 3.01e30, shape=(64, 64)), _stats(-1.48e30, 1.48e30, shape=(64, 64))))
    nan = Origin("nan", "add", "forward", None, "train_step", 2, ("jit(train_step)", "scan[iteration=4]"),
                 (_stats(-np.inf, np.inf), _stats(np.inf, -np.inf)))
    text, hints = explain(nan, (matmul,), [_growth(1.0, 1e30)])
    assert "multiplied by itself each iteration" in text and "scan[iteration=3]" in text
    assert hints[0] == ITERATED_MATMUL and CLIP in hints
    _, hints = explain(dataclasses.replace(matmul, inputs=(_stats(-3.01e30, 3e30), _stats(-2.0, 2.0))))
    assert ITERATED_MATMUL not in hints
    _, hints = explain(dataclasses.replace(matmul, path=("jit(train_step)",)))  # no loop
    assert ITERATED_MATMUL not in hints


def test_a_matmul_that_overflows_is_explained_the_same_whichever_op_makes_the_nan() -> None:
    """A matmul of huge finite values: on one CPU its own sums make the NaN (+inf meets -inf inside it), on
    another it returns Inf and the log-softmax's `x - max(x)` makes the NaN. Both say it overflowed, and the
    second is not a 'fully masked' row (that is a maximum of -inf, not +inf)."""
    inf = float("inf")
    nan_inside = Origin("nan", "dot_general", "forward", None, "step", 13, ("jit(step)",),
                        (_stats(0, 2.1e35, shape=(128, 128)), _stats(-4.5e34, 6.6e34, shape=(128, 10))))
    text, hints = explain(nan_inside)
    assert "overflow f32" in text and "2.1e+35 and 6.6e+34" in text and hints == (CLIP,)
    matmul = Origin("inf", "dot_general", "forward", None, "step", 13, ("jit(step)",),
                    (_stats(0, 2.1e35, shape=(128, 128)), _stats(-4.5e34, 6.6e34, shape=(128, 10))))
    in_softmax = Origin("nan", "sub", "forward", None, "step", 13, ("jit(step)",),
                        (_stats(-inf, 3.0, inf, shape=(128, 10)), _stats(2.0, inf, shape=(128, 1))))
    text, hints = explain(in_softmax, (matmul,))
    assert "masked" not in text and "same sign" in text and "dot_general overflowed f32" in text
    assert "products exceed" in text and CLIP in hints
    masked = Origin("nan", "sub", "forward", None, "step", 0, ("jit(step)",),
                    (_stats(-inf, -inf, 1.0, shape=(3, 3)), _stats(-inf, 1.0, shape=(3, 1))))
    assert "fully masked" in explain(masked)[0]


def test_comments_on_the_line_do_not_choose_the_hints(tmp_path) -> None:
    path = tmp_path / "step.py"
    path.write_text("y = probs * scores  # after the softmax, exp of the logits\n")
    from jaxdbg._source import SourceLocation

    first = Origin("nan", "mul", "forward", SourceLocation(str(path), 1, "step"), "step", 0, ("jit(step)",),
                   (_stats(0, 1), _stats(float("inf"), 1)))
    _, hints = explain(first)
    assert not any("subtract the maximum" in h for h in hints)


def test_after_an_inf_the_nan_it_turns_into_is_the_answer(tmp_path) -> None:
    from jaxdbg.nan.session import hunt_here

    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        import jax, jax.numpy as jnp
        grow = jax.jit(lambda w: w * 1e20)  # overflows
        cancel = jax.jit(lambda w, total: (w - w, total + 1))  # w - w: inf - inf
        total = grow(jnp.float32(1e30))  # an Inf nothing downstream uses
        w = jnp.array([1.0, 2.0])
        for _ in range(3):
            w = grow(w)
        print(cancel(w, total))
    """))
    result = to_jsonable(hunt_here(parse_target(str(script)), HuntOptions())[0])
    first, chain = result["first"], result["chain"]
    assert (first["kind"], first["primitive"], first["source"]["line"], first["call_index"]) == ("nan", "sub", 3, 0)
    # w's Inf, born in call 2 of grow, came in through the argument w; total's Inf did not feed the NaN.
    assert [(c["kind"], c["primitive"], c["call_index"], c["argument"]) for c in chain] == [
        ("inf", "mul", 2, None), ("input", None, 0, "w")]
    assert any("did not feed" in n and "call 0" in n for n in result["notes"])


def test_an_inf_without_a_nan_ends_the_run_when_the_budget_is_spent() -> None:
    with pytest.raises(NonFiniteFound) as stop, Watch(after_inf=3) as watch:
        step = jax.jit(lambda x: x * 1e30)
        x = jnp.float32(1e10)
        for _ in range(100):
            x = step(x)
    assert stop.value.finding is watch.inf_findings[0] and stop.value.finding.call.call_index == 0
    assert watch.calls == 4  # the Inf's call and three more


# -- unseen programs: library code between the bug and the NaN (optax clipping, xlogy, jnp.take, WeightNorm) ---


def test_an_inf_gradient_clipped_by_optax_is_named_with_a_fix_other_than_clipping(hunted) -> None:
    """exp overflows on an outlier row; clip_by_global_norm rescales the Inf gradient by 1 / inf: inf / inf.
    The program already clips: "clip gradients" is no answer, skipping non-finite updates is."""
    program = "optax_clip_inf_grad"
    got = hunted(program)
    assert _where(got["first"]) == ("nan", "div", "forward", _line(program, "# the NaN: clipping"), 2)
    assert [_where(c) for c in got["chain"]] == [("inf", "exp", "forward", _line(program, "# the bug"), 2)]
    assert "inside `optax.clip_by_global_norm`" in got["explanation"]
    assert any("optax.apply_if_finite" in h for h in got["hints"]) and "clip gradients" not in " ".join(got["hints"])


def test_a_nan_jax_scipy_xlogy_leaves_behind_is_not_the_answer_to_an_inf_loss(hunted) -> None:
    """xlogy(y, 0) is -inf for y > 0 (the loss is Inf, never NaN); xlogy's own 0 * log(0), selected away where
    y = 0, reaches nothing. The answer is the log(0) inside xlogy, and no hint says to use xlogy."""
    program = "jsp_negbin_xlogy_inf"
    got = hunted(program)
    assert _where(got["first"]) == ("inf", "log", "forward", _line(program, "# the Inf: log(0)"), 0)
    assert got["first"]["path"] == ["jit(update)", "custom_jvp(xlogy)"] and "NaN" not in got["explanation"]
    assert not any("xlogy" in h for h in got["hints"])


def test_an_embedding_id_past_the_table_is_named_as_an_out_of_range_index(hunted) -> None:
    """jnp.take (mode "fill") gives NaN rows for the end-of-text id == vocab size: the gather, its indices' range
    against the table's shape, and a hint about the id, not a bare 'gather produced it'."""
    program = "linen_take_eot_nan"
    got = hunted(program)
    assert _where(got["first"]) == ("nan", "gather", "forward", _line(program, "# the NaN"), 1)
    assert "indices run from 0 to 64" in got["explanation"] and "(64, 32)" in got["explanation"]
    assert "embedding table" in got["hints"][0]
