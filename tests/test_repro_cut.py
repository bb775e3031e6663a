"""Computation reduction: a failing jaxpr cut down with recorded values, emitted, and the emitted code fails."""

import contextlib
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdbg.repro.cut import CutCheck, Cutter
from jaxdbg.repro.graph import as_function, flatten, record
from jaxdbg.repro.program import build_program, can_emit, count_lines, program_fails, write_program
from jaxdbg.repro.signature import Criterion

NAN = CutCheck(Criterion.nonfinite("NaN"))
MISMATCH = CutCheck(Criterion.mismatch())


def _deep_nan(x, w):
    h = x
    for i in range(40):
        h = jnp.tanh(h @ w) * 0.9 + 0.1 * jnp.sin(h)
        if i == 23:
            h = h + jnp.sqrt(h - 2.0)  # h < 2 everywhere: NaN, then it spreads
        h = h / (1.0 + jnp.abs(h).mean())
    return h.sum(), h


def _snap(y):
    return jnp.sort((jnp.tanh(y) * 4.0 + 1e8) - 1e8), jnp.cos(y).sum()


def _cut(fn, args, check):
    graph, consts = flatten(jax.make_jaxpr(fn)(*args))
    cutter = Cutter(graph, record(graph, args, consts), check, emittable=lambda c: can_emit(graph, c))
    return graph, cutter, cutter.run()


@pytest.fixture(scope="module")
def nan_cut():
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((4, 8)).astype(np.float32), (rng.standard_normal((8, 8)) * 0.3).astype(np.float32)]
    return _cut(_deep_nan, args, NAN)


def test_the_capture_keeps_every_array_argument_whatever_the_static_ones():
    """A static argument passed by keyword right after the positional ones (``step(params, x, act=...)`` with
    ``static_argnames=("act",)``: its position is len(args)), or given by a negative position: the capture traces
    over every array argument, in order."""
    from jaxdbg.repro.watch import trace_flat

    def step(params, x, act):
        return act(params["w"] * x)

    params, x = {"w": jnp.full(3, 2.0)}, jnp.arange(3.0)
    closed, flat = trace_flat(step, {"static_argnames": ("act",)}, (params, x), {"act": jnp.tanh})
    assert [a.shape for a in closed.in_avals] == [(3,), (3,)] and np.allclose(flat[1], [0.0, 1.0, 2.0])
    closed, flat = trace_flat(step, {"static_argnums": (-1,)}, (params, x, jnp.tanh), {})
    assert len(flat) == 2 and np.allclose(flat[0], 2.0)


def test_a_call_that_donates_its_inputs_is_captured_from_copies_made_before_it():
    """The failing call deletes the parameters it donates: repro's capture (after the call) traces and keeps
    copies made before it, so the cut starts from the inputs the call really had."""
    from functools import partial

    from jaxdbg.repro.watch import JitWatch, StopRun, WatchConfig

    class Channel(list):
        send = list.append

    watch = JitWatch(WatchConfig(capture="nonfinite"), Channel())
    with watch.installed(), pytest.raises(StopRun):
        @partial(jax.jit, donate_argnums=(0,), static_argnames=("scale",))
        def step(params, x, scale):
            return {"w": params["w"] - scale * jnp.log(x)}

        params = {"w": jnp.ones(4)}
        for x in (2.0, 1.0, -1.0):
            params = step(params, jnp.full(4, x), scale=0.5)
    assert watch.capture_error is None and watch.captured.failure.call == 2
    assert np.allclose(watch.captured.args[0], 1.0 - 0.5 * np.log(2.0)) and np.allclose(watch.captured.args[1], -1.0)


def test_a_bfloat16_model_that_rounds_differently_under_jit_is_no_failure_unless_a_mismatch_was_asked_for():
    """A GRU-like gate computed in bfloat16 and read back in float32: XLA keeps the fused intermediate in float32
    under jit, op by op rounds it to bfloat16, so they differ by about one bfloat16 rounding. Looking for any
    failure, repro does not call that a mismatch (the program does not fail); asked for a mismatch, it still sees
    it. A float16 accumulation far beyond one rounding is a mismatch either way."""
    from jaxdbg.repro.watch import JitWatch, WatchConfig

    class Channel(list):
        send = list.append

    def mismatches(slack, fun, *args):
        watch = JitWatch(WatchConfig(nonfinite=False, mismatch_calls=1, rounding_slack=slack), Channel())
        with watch.installed():
            jax.jit(fun)(*args)
        return [m.kind for m in watch.channel if getattr(m, "kind", None) == "mismatch"]

    def gate(x, w):
        return jax.nn.sigmoid((x @ w).astype(jnp.bfloat16)).astype(jnp.float32)

    x, w = jnp.linspace(-2.0, 2.0, 64).reshape(8, 8), jnp.eye(8) * 0.7
    assert mismatches(False, gate, x, w) == ["mismatch"] and mismatches(True, gate, x, w) == []

    def accumulate(x):  # an offset that cancels, 16 times in float16: each addition drops up to 16 units
        total = jnp.zeros((), jnp.float16)
        for i in range(16):
            total = total + x[i].astype(jnp.float16) + 30000.0 - 30000.0
        return total.astype(jnp.float32)

    assert mismatches(True, accumulate, jnp.full(16, 70.3)) == ["mismatch"]


def test_flatten_inlines_calls_and_keeps_primitives():
    graph, _ = flatten(jax.make_jaxpr(lambda x: jax.nn.relu(jax.jit(jnp.sin)(x)) * 2)(1.0))
    assert [n.name for n in graph.nodes] == ["sin", "max", "mul"]


def test_nan_in_hundreds_of_equations_is_cut_to_the_one_that_makes_it(nan_cut):
    graph, cutter, best = nan_cut
    assert cutter.stats.original_equations > 400
    assert [graph.nodes[i].name for i in best.nodes] == ["sqrt"]
    assert cutter.stats.checks < 40  # recorded values let it jump straight to the origin
    (value,) = best.values.values()
    assert np.ndim(value) == 0 and value < 0  # shrunk to the failing element, still finite


def test_emitted_nan_reproducer_fails_with_an_assertion(nan_cut, tmp_path):
    graph, _, best = nan_cut
    program = build_program(graph, best, NAN, "jit(_deep_nan)", len(graph.nodes))
    path = tmp_path / "repro.py"
    path.write_text(program.source)
    assert program_fails(str(path), NAN.criterion)
    assert "lax.sqrt(" in program.source and "jax.jit(f)" in program.source
    assert count_lines(program.source) <= 10 and not program.arrays


def test_jit_vs_op_by_op_mismatch_is_cut_to_the_folded_arithmetic(tmp_path):
    y = np.linspace(-1, 1, 6, dtype=np.float32)
    graph, _, best = _cut(_snap, [y], MISMATCH)
    assert [graph.nodes[i].name for i in best.nodes] == ["add", "sub"]
    fn = as_function([graph.nodes[i] for i in best.nodes], best.inputs(graph), best.outvars)
    args = [best.values[v] for v in best.inputs(graph)]
    jitted, eager = np.asarray(jax.jit(fn)(*args)[0]), None
    with jax.disable_jit():
        eager = np.asarray(fn(*args)[0])
    assert not np.allclose(jitted, eager)  # the cut computation still disagrees
    program = build_program(graph, best, MISMATCH, "jit(_snap)", len(graph.nodes))
    path = tmp_path / "repro.py"
    path.write_text(program.source)
    assert program_fails(str(path), MISMATCH.criterion)


def test_a_candidate_that_computes_nothing_never_counts():
    # With every equation cut away the NaN would come in through an input: rejected, not "reproduced".
    x = np.array([-1.0, 2.0], np.float32)
    _, _, best = _cut(lambda v: jnp.log(v) + 1.0, [x], NAN)
    assert len(best.nodes) >= 1
    assert all(np.isfinite(v).all() for v in best.values.values())


def test_inputs_of_a_scan_keep_their_shapes_so_the_written_scan_still_runs(tmp_path):
    """A scan's length is its inputs' leading size: shrinking them would be accepted when the primitive is
    bound here and rejected by lax.scan in the written reproducer."""
    def layers(x, w):
        def body(h, wi):
            h = h @ wi
            return h / jnp.sqrt(jnp.mean(h * h) - 1.0), None  # negative under the root: NaN
        return jax.lax.scan(body, x, w)[0].sum()

    args = [np.full((2, 4), 0.1, np.float32), np.full((3, 4, 4), 0.1, np.float32)]
    graph, cutter, best = _cut(layers, args, NAN)
    scans = [i for i in best.nodes if graph.nodes[i].name == "scan"]
    assert scans and all(np.shape(best.values[v]) == np.shape(cutter.recorded[v])
                         for v in graph.nodes[scans[0]].invars if v in best.values)
    program = build_program(graph, best, NAN, "jit(layers)", len(graph.nodes))
    path = tmp_path / "repro.py"
    path.write_text(program.source)
    assert program_fails(str(path), NAN.criterion)


def test_a_nan_birth_may_start_from_the_programs_inf_but_never_from_a_nan():
    """Where the program's own inputs hold Inf (a -inf bias), a cut may start from an Inf (0 * -inf is the
    birth) but not from a NaN it would only pass on."""
    check = CutCheck(Criterion.nonfinite("NaN"), allow_nonfinite_inputs=True)
    assert check.failing_index(lambda a, b: [a * b], [np.float32(0.0), np.float32(-np.inf)]) == ()
    assert check.failing_index(lambda a: [a + 1.0], [np.float32(np.nan)]) is None
    strict = NAN
    assert strict.failing_index(lambda a, b: [a * b], [np.float32(0.0), np.float32(-np.inf)]) is None


def test_a_nan_made_from_an_inf_is_cut_to_the_chain_from_finite_inputs():
    """The gradient of a norm at 0: 0.5 / sqrt(0) = inf (a div), then times a zero (a mul) is NaN. Neither
    alone fails from finite inputs; the chain of the two does, with nothing of the rest of the gradient."""
    def loss(w, w0, x):
        return jnp.tanh(x @ w).sum() + 0.1 * jnp.sqrt(jnp.sum((w - w0) ** 2))

    w = np.ones((4, 4), np.float32)
    args = [w, w.copy(), np.ones((2, 4), np.float32)]
    graph, _, best = _cut(jax.grad(loss), args, NAN)
    assert [graph.nodes[i].name for i in best.nodes][:2] == ["div", "mul"] and len(best.nodes) <= 4


def _dropout_log(key, x):
    keep = jax.random.bernoulli(key, 0.5, x.shape)  # a typed PRNG key among the inputs (nnx.Rngs, Dropout)
    return jnp.log(jnp.where(keep, x, -1.0)) + x  # dropped entries become log(-1)


def test_a_typed_prng_key_among_the_inputs_is_cut_and_written_with_its_key_data(tmp_path):
    """The key is recorded as a key (numpy has no form for it) and, when the cut keeps it, the reproducer loads
    its key data and wraps it back (jax.random.wrap_key_data)."""
    args = [jax.random.key(0), jnp.arange(1.0, 9.0)]
    graph, cutter, best = _cut(_dropout_log, args, NAN)
    assert [graph.nodes[i].name for i in best.nodes] == ["log"]
    keep_key = cutter.make(range(len(graph.nodes) - 1), best.outvars)  # the log with the draw of its mask
    program = build_program(graph, keep_key, NAN, "jit(f)", len(graph.nodes))
    assert "jax.random.wrap_key_data(_inputs[" in program.source and "impl='threefry2x32'" in program.source
    assert program_fails(write_program(program, str(tmp_path))["repro"], NAN.criterion)


# ----------------------------------------------------------------------------------------------------------
# Inside loops: a failure born in a loop body is cut to that body, once, at its first failing iteration
# ----------------------------------------------------------------------------------------------------------


def _drain(level, xs):
    """h = 7.5 - 0.25 k (exact in float32): log(h) is -inf at k = 30 and NaN from k = 31 on, of 50."""
    def body(h, x):
        g = jnp.tanh(h) * 2.0 + jnp.cos(x).sum()
        return h - 0.25, (jnp.log(h) + g, g * 0.5)
    carry, (ys, gs) = jax.lax.scan(body, level, xs)
    return ys.sum() + gs.mean() + carry


def _shrink(x, n):
    """A while loop (fori_loop with a traced bound): x = 4 - 0.5 k; sqrt(x) is NaN from iteration 9 on."""
    def body(i, state):
        x, total = state
        return x - 0.5, total + jnp.sqrt(x).sum() * jnp.exp(-x * x).mean()
    return jax.lax.fori_loop(0, n, body, (x, jnp.float32(0.0)))[1]


def _enter(fn, args, check):
    from jaxdbg.repro.loops import enter_loops

    graph, cutter, best = _cut(fn, args, check)
    inside = enter_loops(graph, cutter.recorded, best, check, emittable=can_emit)
    assert inside is not None
    return graph, best, inside


@pytest.mark.parametrize("fn, args, loop, iteration, trips, primitive", [
    (_drain, [np.float32(7.5), np.zeros((50, 3), np.float32)], "scan", 31, 50, "log"),
    (_shrink, [np.full((4,), 4.0, np.float32), np.int32(40)], "while", 9, None, "sqrt"),
], ids=["scan", "while"])
def test_a_nan_born_late_in_a_loop_is_cut_to_its_body_once_at_the_first_failing_iteration(
        fn, args, loop, iteration, trips, primitive, tmp_path):
    """The cut alone keeps the loop whole (every equation of its body, every iteration); inside it, the body
    runs once on that iteration's carry (and slice), cut to the one equation that makes the NaN."""
    from jaxdbg.repro.graph import equation_count

    graph, best, inside = _enter(fn, args, NAN)
    assert [graph.nodes[i].name for i in best.nodes] == [loop]
    (entered,) = inside.entered
    assert (entered.primitive, entered.iteration, entered.trips) == (loop, iteration, trips)
    assert [inside.graph.nodes[i].name for i in inside.best.nodes] == [primitive]
    whole = equation_count(graph.nodes[i] for i in best.nodes)
    assert whole > 5 and equation_count(inside.graph.nodes[i] for i in inside.best.nodes) == 1
    program = build_program(inside.graph, inside.best, NAN, "jit(f)", equation_count(graph.nodes),
                            context=f"The failure is born in {entered.describe()}.")
    code = program.source[program.source.index("def f"):]
    assert "lax.scan" not in code and "lax.while_loop" not in code
    assert f"iteration {iteration}" in program.source and program.equations == 1
    assert program_fails(write_program(program, str(tmp_path))["repro"], NAN.criterion)


def _backward_rnn(xs):
    """A reversed scan over 6 elements, the 5th of them (index 4) negative: its log is met at iteration 1."""
    return jax.lax.scan(lambda h, x: (h + jnp.log(x), h), 0.0, xs, reverse=True)[0]


def test_a_reversed_scan_is_entered_at_its_iteration_and_says_the_element_that_fails():
    """nan-hunt's path names a scan's element (``scan[iteration=4]``); the entered loop counts iterations in
    execution order, so for a reversed scan it says the element too, or the two answers would disagree."""
    xs = np.full((6,), 2.0, np.float32)
    xs[4] = -1.0
    _, _, inside = _enter(_backward_rnn, [xs], NAN)
    (entered,) = inside.entered
    assert (entered.iteration, entered.trips, entered.reverse) == (1, 6, True)
    assert "iteration 1 of 6" in entered.describe() and "in reverse: element 4 of its xs" in entered.describe()


def test_jit_vs_op_by_op_mismatch_inside_a_scan_is_cut_to_the_bodys_folded_arithmetic(tmp_path):
    """Op by op, a loop runs its body op by op (as lax.scan under jax.disable_jit does): the replayed scan
    disagrees with the jitted one as the program did, and its body once is cut to the folded arithmetic."""
    def features(ys):
        return jax.lax.scan(lambda c, y: (c + 1.0, _snap(y + c)[0]), jnp.float32(0.0), ys)[1]

    ys = np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6)
    graph, best, inside = _enter(features, [ys], MISMATCH)
    assert [graph.nodes[i].name for i in best.nodes] == ["scan"]
    assert [inside.graph.nodes[i].name for i in inside.best.nodes] == ["add", "sub"]
    program = build_program(inside.graph, inside.best, MISMATCH, "jit(features)", len(graph.nodes))
    assert program_fails(write_program(program, str(tmp_path))["repro"], MISMATCH.criterion)


def _kalman_nll(noise, ys):
    """A Kalman filter's likelihood: jnp.linalg.solve (a custom_linear_solve: matvec, LU solve and its transpose
    as jaxprs in its parameters) on the innovation covariance, singular from a zero prior and a zero noise."""
    def step(carry, y):
        mean, cov = carry
        s = cov[:2, :2] + noise
        gain = jnp.linalg.solve(s, cov[:2])
        innovation = y - mean[:2]
        return (mean + gain.T @ innovation, cov - gain.T @ cov[:2]), innovation @ jnp.linalg.solve(s, innovation)
    return jax.lax.scan(step, (jnp.zeros(3), jnp.zeros((3, 3))), ys)[1].sum()


def test_a_solve_in_a_scan_is_cut_and_written_as_the_solve_it_computes(tmp_path):
    """A custom_linear_solve is replayed and written as its solve jaxpr (the matvec and the transposes serve
    differentiation only): flattened, it is the LU solve's primitives; inside the scan that makes the NaN, it is
    written out, and the scan fails alone."""
    graph, _ = flatten(jax.make_jaxpr(jax.grad(lambda a, b: jnp.linalg.solve(a, b).sum()))(jnp.eye(2), jnp.ones(2)))
    names = {node.name for node in graph.nodes}
    assert "custom_linear_solve" not in names and {"lu", "triangular_solve"} <= names
    args = [np.diag(np.float32([1.0, 0.0])), np.ones((4, 2), np.float32)]
    graph, _, best = _cut(_kalman_nll, args, NAN)
    assert [graph.nodes[i].name for i in best.nodes] == ["scan"]
    program = build_program(graph, best, NAN, "jit(_kalman_nll)", len(graph.nodes))
    assert "linear_solve" not in program.source
    assert program_fails(write_program(program, str(tmp_path))["repro"], NAN.criterion)


def test_a_loop_whose_iterations_never_fail_alone_is_left_whole():
    """An Inf the loop makes in one iteration (1e10 ** 4 overflows) turns NaN in the next (inf - inf): no
    iteration makes the NaN from finite inputs, so the loop stays whole (and still fails, as the cut found)."""
    from jaxdbg.repro.loops import enter_loops

    def blowup(h):
        return jax.lax.scan(lambda c, _: (c * 1e10, c - c), h, None, length=6)[1]

    graph, cutter, best = _cut(blowup, [np.float32(1.0)], NAN)
    assert [graph.nodes[i].name for i in best.nodes] == ["scan"]
    assert enter_loops(graph, cutter.recorded, best, NAN) is None


def test_a_vmapped_while_loop_with_a_condition_per_element_is_replayed_and_left_whole():
    """vmap over a while loop whose condition differs between elements: jax loops while any element does, and an
    element done keeps its carry. Op by op the replay does the same (it equals the jitted loop), and the loop is
    kept whole (its body alone is no iteration)."""
    from jaxdbg.repro.graph import as_function
    from jaxdbg.repro.loops import enter_loops

    def accumulate(c):  # halves c until it is below 1, a different number of steps per element; log(x - 2) < 0
        return jax.lax.while_loop(lambda s: s[0] > 1.0, lambda s: (s[0] * 0.5, s[1] + jnp.log(s[0] - 2.0)),
                                  (c, jnp.float32(0.0)))[1]

    batched = jax.vmap(accumulate)
    c = np.array([10.0, 3.0, 40.0], np.float32)
    graph, consts = flatten(jax.make_jaxpr(batched)(c))
    with jax.disable_jit():
        replayed = as_function(graph.nodes, graph.invars, graph.outvars)(c, *consts.values())[0]
    np.testing.assert_allclose(replayed, jax.jit(batched)(c), rtol=1e-6)
    graph, cutter, best = _cut(batched, [c], NAN)
    assert "while" in [graph.nodes[i].name for i in best.nodes]
    assert enter_loops(graph, cutter.recorded, best, NAN) is None


def test_plainer_values_never_replace_what_sets_a_while_loops_trip_count():
    """An adaptive solver's tolerance made 0 (a 'plainer value') keeps its while_loop running for ever: one
    candidate would run past the deadline and the cut found so far be lost with it (an odeint program)."""
    def newton(a, tol, shift):
        def cond(c):
            return (jnp.abs(c[0] * c[0] - a).max() > tol) & (c[1] < 40)
        y, _ = jax.lax.while_loop(cond, lambda c: (0.5 * (c[0] + a / c[0]), c[1] + 1), (a, 0))
        return jnp.log(y - shift).sum()  # sqrt(a) < shift: NaN

    class Recording(CutCheck):
        def failing_index(self, fn, args):
            tried.append([np.asarray(v) for v in args])
            return super().failing_index(fn, args)

    tried: list = []
    args = [np.full((3,), 4.0, np.float32), np.float32(1e-3), np.float32(10.0)]
    graph, consts = flatten(jax.make_jaxpr(newton)(*args))
    cutter = Cutter(graph, record(graph, args, consts), Recording(NAN.criterion), emittable=lambda c: True)
    whole = cutter.test(cutter.make(range(len(graph.nodes)), graph.outvars))
    loop = next(i for i in whole.nodes if graph.nodes[i].name == "while")
    feeding = [v for v in graph.nodes[loop].invars if v in whole.values]
    tried.clear()
    cutter.simplify(whole)
    assert tried, "simplify tried no plainer value at all"
    order = whole.inputs(graph)
    for values in tried:
        for var in feeding:
            if var in order:
                assert np.array_equal(values[order.index(var)], whole.values[var])


def test_plainer_values_keep_the_nan_born_where_it_was():
    """x / sqrt(ab) with ab = 0 is inf, and inf - inf in a matmul is the NaN: a numerator made 0 would make the
    NaN at the division (0 / 0) instead, with the rest of the chain still there."""
    def x0_loss(x, ab, w):
        x0 = x / jnp.sqrt(ab)
        return x0 @ w

    args = [np.array([[0.7, -1.3]], np.float32), np.array([[0.0]], np.float32), np.array([[1.0], [1.0]], np.float32)]
    graph, cutter, best = _cut(x0_loss, args, NAN)
    names = [graph.nodes[i].name for i in best.nodes]
    assert names[-1] == "dot_general" and cutter.birth(best) == best.nodes[-1], names
    numerator = next(v for v in best.inputs(graph) if np.shape(best.values[v]) == (1, 2))
    assert np.any(best.values[numerator] != 0)


def test_a_candidate_still_running_past_the_deadline_leaves_the_best_cut_so_far_written(tmp_path):
    """One candidate is one XLA execution and cannot be stopped: past the deadline the guard writes the best cut
    found by then, checks that it fails, and sends it; the parent would otherwise kill the child and lose it."""
    import threading
    import time
    from types import SimpleNamespace

    from jaxdbg.repro.cut import CutError
    from jaxdbg.repro.cutting import OverrunGuard, best_so_far
    from jaxdbg.repro.graph import equation_count
    from jaxdbg.repro.messages import CutFinished

    release, calls = threading.Event(), []

    class Stuck(CutCheck):  # from the 4th candidate on, a check runs until the guard is done (a long execution)
        def failing_index(self, fn, args):
            calls.append(1)
            if len(calls) > 3:
                release.wait(60)
            return super().failing_index(fn, args)

    rng = np.random.default_rng(0)
    args = [rng.standard_normal((4, 8)).astype(np.float32), (rng.standard_normal((8, 8)) * 0.3).astype(np.float32)]
    graph, consts = flatten(jax.make_jaxpr(_deep_nan)(*args))
    cutter = Cutter(graph, record(graph, args, consts), Stuck(NAN.criterion), deadline=time.perf_counter() + 60,
                    emittable=lambda c: can_emit(graph, c))
    sent, ended = [], []

    def end(code):  # in the child: os._exit; here the stuck check is let go and the cut stopped
        ended.append(code)
        cutter.deadline = 0.0
        release.set()

    guard = OverrunGuard(time.perf_counter() + 2.0, sent.append, end=end)
    original = equation_count(graph.nodes)
    guard.arm(lambda: best_so_far(cutter, SimpleNamespace(function="_deep_nan", failure=None), "jit(_deep_nan)",
                                  original, str(tmp_path), time.perf_counter()))
    with contextlib.suppress(CutError):
        cutter.run()
    guard.deliver(CutFinished(True, reason="the cut's own summary"))  # too late: the guard has sent
    assert ended == [0] and len(sent) == 1
    late = sent[0]
    assert late.ok and late.self_check and "deadline" in late.reason and 0 < late.equations <= original
    assert os.path.exists(late.files["repro"])
