"""profile's building blocks on real jax values and real compiled HLO: signatures and recompile reasons,
budgets, HLO reading, span unions, self times, comparisons, peaks. Fast: no contained runs here."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdbg._errors import UsageError
from jaxdbg.profile.assemble import execute_stats
from jaxdbg.profile.budget import check_budget, parse_budget
from jaxdbg.profile.compare import compare, load_baseline
from jaxdbg.profile.hints import hints_for
from jaxdbg.profile.hlo import loop_note, module_name, named_scope, parse_hlo
from jaxdbg.profile.messages import CallTiming
from jaxdbg.profile.model import CompileTimes, ExecuteStats, FunctionProfile, Recompile, Totals, Transfer
from jaxdbg.profile.ops import OpTotal, _self_times, op_table, scope_table
from jaxdbg.profile.peaks import Peak, achieved_rates, calibrate_cpu, table_peak
from jaxdbg.profile.signature import call_signature, explain
from jaxdbg.profile.spans import span_times

from conftest import line_of


def _sig(fun, *args, static=(), **kwargs):
    return call_signature(fun, args, kwargs, static)


def step(params, batch, n):
    return params, batch, n


def test_recompile_reasons_name_the_argument_and_the_change():
    params = {"w": jnp.ones((4, 2)), "b": jnp.zeros(2)}
    base = _sig(step, params, jnp.ones((8, 32)), 3, static=(2,))
    cases = {
        "shape": (_sig(step, params, jnp.ones((9, 32)), 3, static=(2,)),
                  "argument 'batch' shape changed (8, 32) -> (9, 32)"),
        "dtype": (_sig(step, params, jnp.ones((8, 32), jnp.bfloat16), 3, static=(2,)), "dtype changed f32 -> bf16"),
        "static": (_sig(step, params, jnp.ones((8, 32)), 4, static=(2,)), "static argument 'n' changed 3 -> 4"),
        "structure": (_sig(step, {**params, "c": jnp.ones(1)}, jnp.ones((8, 32)), 3, static=(2,)), "params['c']"),
    }
    for kind, (new, text) in cases.items():
        why = explain([base], new, same_callable=True, call_index=5)
        assert why.call_index == 5 and text in why.reason, (kind, why.reason)
        assert {c.kind for c in why.changes} == {kind}
    # a checkify'd step: jax's wrapper takes *args; the reason names step's own parameter
    from jax.experimental import checkify

    checked = checkify.checkify(step)
    why = explain([_sig(checked, params, jnp.ones((8, 32)), 3)], _sig(checked, params, jnp.ones((9, 32)), 3),
                  same_callable=True)
    assert "argument 'batch' shape changed" in why.reason, why.reason


def test_a_static_keyword_passed_or_left_to_its_default_is_a_static_change():
    def update(buf, mode="add"):
        return buf

    default = call_signature(update, (jnp.ones(2),), {}, (), ("mode",))
    passed = call_signature(update, (jnp.ones(2),), {"mode": "mul"}, (), ("mode",))
    why = explain([default], passed, same_callable=True)
    assert [c.kind for c in why.changes] == ["static"]  # once a "pytree structure" change, with its wrong fix
    assert "static argument 'mode' changed its default (not passed) -> 'mul'" in why.reason
    back = explain([passed], default, same_callable=True)
    assert "static argument 'mode' changed 'mul' -> its default (not passed)" in back.reason


def test_a_typed_key_after_a_raw_one_is_a_change_of_kind_not_of_shape():
    typed = _sig(lambda key: key, jax.random.key(0))
    raw = _sig(lambda key: key, jax.random.PRNGKey(0))
    why = explain([typed], raw, same_callable=True)
    assert [c.kind for c in why.changes] == ["type"]  # once "shape changed () -> (2,)", fixed by bucketing
    assert "a typed PRNG key key<fry>[] -> a raw key array u32[2]" in why.reason


class _Scaled:  # a static self: hashable by its field, printed as <... object> by default
    def __init__(self, scale):
        self.scale = scale

    def __hash__(self):
        return hash(self.scale)

    def __eq__(self, other):
        return isinstance(other, _Scaled) and other.scale == self.scale


def test_static_objects_that_print_alike_name_the_field_that_differs():
    def apply(self, x):
        return x

    one, two = (call_signature(apply, (_Scaled(s), jnp.ones(2)), {}, (0,)) for s in (1.0, 2.0))
    why = explain([one], two, same_callable=True)
    # Once "static argument 'self' changed <...object> -> <...object>": the same text on both sides.
    assert why.reason == "static value 'self.scale' changed 1.0 -> 2.0"


def test_weak_type_and_python_scalar_changes():
    weak = _sig(lambda lr: lr, jnp.asarray(0.1))  # weakly typed (from a Python float)
    strong = _sig(lambda lr: lr, jnp.asarray(0.1, jnp.float32))
    assert weak.leaves[0][1].weak_type and not strong.leaves[0][1].weak_type
    why = explain([weak], strong, same_callable=True)
    assert why.changes[0].kind == "weak_type" and "weakly typed f32 -> strongly typed f32" in why.reason
    scalar = _sig(lambda lr: lr, 0.1)  # to jax a weakly typed f32[]: only the weak type differs
    why = explain([scalar], strong, same_callable=True)
    assert why.changes[0].kind == "weak_type"
    assert "a Python float (weakly typed f32) -> strongly typed f32" in why.reason


def test_new_callable_and_unexplained_recompiles():
    sig = _sig(lambda x: x, jnp.ones(3))
    fresh = explain([sig], sig, same_callable=False, callable_site="train.py:9")
    assert fresh.changes[0].kind == "callable"
    assert "fresh function object (defined at train.py:9)" in fresh.reason and "outside the loop" in fresh.reason
    same = explain([sig], sig, same_callable=True)
    assert same.changes == () and "caches were cleared" in same.reason


def test_explain_diffs_against_the_closest_earlier_signature():
    a = _sig(step, jnp.ones(2), jnp.ones((8, 4)), jnp.ones(1))
    b = _sig(step, jnp.ones(3), jnp.ones((9, 4)), jnp.ones(1))
    new = _sig(step, jnp.ones(3), jnp.ones((10, 4)), jnp.ones(1))
    why = explain([a, b], new, same_callable=True)
    assert [c.argument for c in why.changes] == ["batch"] and "(9, 4) -> (10, 4)" in why.reason


@pytest.mark.parametrize("text, violations", [
    ("compile_s<=2", []),
    ("compile_s<=0.5", ["compile_s 1.5 > 0.5"]),
    ("execute_median_ms<=5", ["train_step.execute_median_ms 20 > 5", "eval_step.execute_median_ms 6 > 5"]),
    ("recompiles<=0", ["recompiles 2 > 0"]),
    ("train_step.compile_s<1,eval_step.calls>=10", ["train_step.compile_s 1.2 >= 1"]),
    ("missing.compile_s<=1", ["missing.compile_s<=1: no jitted function 'missing' ran (ran: eval_step, train_step)"]),
    ("wall_ms<20000, transfer_us<1e6", []),
])
def test_budget_rules_and_violations(text, violations):
    def fn(name, compile_s, median_s, calls, recompiles):
        return FunctionProfile(name, None, 1 + recompiles, tuple(Recompile(i, "x") for i in range(recompiles)),
                               CompileTimes(total_s=compile_s), ExecuteStats(calls=calls, median_s=median_s))
    functions = (fn("train_step", 1.2, 0.020, 100, 2), fn("eval_step", 0.3, 0.006, 10, 0))
    result = check_budget(parse_budget(text), functions, Totals(10.0, 1.5, 3.0, 0.1, 5.4))
    assert list(result.violations) == violations and result.ok == (not violations)


@pytest.mark.parametrize("text, fragment", [
    ("compile<=2", "unknown metric 'compile'"), ("compile_s<=", "cannot read"),
    ("compile_s<1,,recompiles<0", "empty rule"),
    ("f.wall_s<1", "whole run only"), ("compile_s<=2x", "cannot read"), ("execute_median_min<1", "unknown metric"),
])
def test_unparsable_budgets_are_usage_errors(text, fragment):
    with pytest.raises(UsageError, match=fragment):
        parse_budget(text)


def _compiled_text(fun, *args):
    return jax.jit(fun).lower(*args).compile().as_text()


def scores(q, k):
    s = q @ k.T  # marker: matmul line
    return jax.nn.sigmoid(s).sum() + jnp.sin(q).mean()


def test_hlo_ops_get_categories_and_user_lines():
    q = jnp.ones((64, 32))
    module = parse_hlo(_compiled_text(scores, q, q))
    assert module.name == "jit_scores" == module_name(_compiled_text(scores, q, q))
    line = line_of(__file__, "marker: matmul line")
    matmuls = [op for op in module.ops.values() if op.category == "matmul"]
    assert matmuls and all(op.source is not None and op.source.line == line and op.source.function == "scores"
                           for op in matmuls)
    assert all(op.source is None or op.source.file == __file__ for op in module.ops.values())


def test_loop_note_and_trip_counts():
    def loop(a):
        return jax.lax.fori_loop(0, 7, lambda i, v: a @ v, a)
    text = _compiled_text(loop, jnp.ones((8, 8)))
    assert "trip counts 7" in loop_note(text) and loop_note(_compiled_text(jnp.sin, jnp.ones(3))) is None


def test_span_union_does_not_count_nested_traces_twice():
    spans = [("trace", 0.0, 1.0), ("trace", 0.2, 0.6), ("lower", 1.0, 1.5), ("compile", 1.5, 3.5)]
    assert span_times(spans) == {"trace_s": 1.0, "lower_s": 0.5, "compile_s": 2.0, "total_s": 3.5}


def test_self_times_subtract_nested_events():
    events = [(0.0, 100.0, "m", "while.1", 1), (10.0, 30.0, "m", "dot.1", 1), (50.0, 20.0, "m", "add.1", 1),
              (200.0, 5.0, "m", "add.1", 2)]
    totals = {}
    for _, op, _, self_ns in _self_times(events):
        totals[op] = totals.get(op, 0.0) + self_ns
    assert totals == {"while.1": 50.0, "dot.1": 30.0, "add.1": 25.0}


def test_op_table_ranks_and_shares():
    ops = {"dot.1": OpTotal(4, 0.8), "add.2": OpTotal(4, 0.2)}
    rows = op_table(ops, None, top=1, module_name="jit_f")
    assert len(rows) == 1 and rows[0].name == "dot.1" and rows[0].fraction == pytest.approx(0.8)
    assert rows[0].category == "matmul" and rows[0].module == "jit_f"


@jax.named_scope("head")
def _scoped(w, x):
    with jax.named_scope("proj"):
        h = jnp.tanh(x @ w)
    return jnp.sum(h * h)


def test_op_time_is_summed_by_the_scopes_the_user_named_through_grad_and_remat():
    """jax.named_scope's names come through jvp/transpose, remat, loops and jnp's own jits; the primitive and the
    function's jit do not count, and a backward op counts under the scope of the code it differentiates."""
    assert named_scope("jit(step)/transpose(jvp(attention))/jit(_where)/select_n") == "attention"
    assert named_scope("jit(step)/jvp()/while/body/cond/branch_1_fun/checkpoint/rematted_computation/a/b/sin") == "a/b"
    assert named_scope("jit(step)/jvp(vmap())/while/body/add") == named_scope("add") == ""
    grad = jax.jit(jax.grad(jax.checkpoint(_scoped)))
    module = parse_hlo(grad.lower(jnp.ones((8, 8)), jnp.ones((4, 8))).compile().as_text())
    scopes = {named_scope(op.op_name) for op in module.ops.values()}
    assert "head/proj" in scopes and "jit" not in " ".join(scopes)
    ops = {name: OpTotal(1, 1.0 if named_scope(op.op_name) == "head/proj" else 0.0) for name, op in module.ops.items()}
    rows = scope_table(ops, module)
    assert rows[0].scope == "head/proj" and rows[0].fraction == pytest.approx(1.0)
    assert scope_table({name: OpTotal(1, 1.0) for name in module.ops}, None) == ()


def test_compare_reports_per_function_deltas(tmp_path):
    old = {"command": "profile", "result": {
        "functions": [{"name": "f", "compile": {"total_s": 2.0, "compile_s": 1.5},
                       "execute": {"median_s": 0.01, "calls": 5}, "compiles": 1},
                      {"name": "gone_fn", "compile": {}, "execute": {}}],
        "totals": {"wall_s": 4.0, "compile_s": 2.0}}}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    new = FunctionProfile("f", None, 1, (), CompileTimes(total_s=1.0), ExecuteStats(calls=5, median_s=0.02))
    deltas = {d.name: d for d in compare(load_baseline(str(path)), (new,), Totals(3.0, 1.0, 1.0, 0.0, 1.0))}
    assert deltas["f"].metrics["compile_s"]["ratio"] == 0.5 and deltas["f"].metrics["execute_median_s"]["ratio"] == 2.0
    assert deltas["gone_fn"].status == "gone" and deltas["<totals>"].metrics["wall_s"]["delta"] == -1.0
    path.write_text(json.dumps({"command": "doctor", "result": {}}))
    with pytest.raises(UsageError, match="not a jaxdbg profile report"):
        load_baseline(str(path))
    with pytest.raises(UsageError, match="no such file"):
        load_baseline(str(tmp_path / "nope.json"))


def test_functions_of_one_name_are_told_apart_by_their_line(tmp_path):
    # jax.jit(loss) beside jax.jit(jax.value_and_grad(loss)): both 'loss'. A budget on 'loss' holds for both, each
    # named with its line; --compare pairs each with the earlier report's at its line, whatever the order.
    from jaxdbg._source import SourceLocation

    def fn(line, compile_s):
        return FunctionProfile("loss", SourceLocation("/w/train.py", line, "<module>"), 1, (),
                               CompileTimes(total_s=compile_s), ExecuteStats(calls=4, median_s=0.001))
    functions = (fn(12, 0.2), fn(20, 0.9))
    result = check_budget(parse_budget("loss.compile_s<=0.5"), functions, Totals(1.0, 1.1, 0.1, 0.0, 0.0))
    assert list(result.violations) == ["loss (train.py:20).compile_s 0.9 > 0.5"]
    old = [{"name": "loss", "source": {"file": "/w/train.py", "line": line, "function": "<module>"},
            "compile": {"total_s": total}, "execute": {}} for line, total in ((20, 3.0), (12, 0.4), (30, 1.0))]
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"command": "profile", "result": {"functions": old, "totals": {}}}))
    deltas = {d.name: d for d in compare(load_baseline(str(path)), functions, Totals(1.0, 1.1, 0.1, 0.0, 0.0))}
    assert deltas["loss (train.py:12)"].metrics["compile_s"]["ratio"] == pytest.approx(0.5)
    assert deltas["loss (train.py:20)"].metrics["compile_s"]["ratio"] == pytest.approx(0.3)
    assert deltas["loss"].status == "gone"  # the third, alone of its name among the gone


def test_peaks_from_table_and_calibration():
    assert table_peak("NVIDIA H100 80GB HBM3", "bf16").flops_per_s == 989e12
    assert table_peak("TPU v5 lite").source.startswith("table: TPU v5e")
    assert table_peak("cpu") is None
    calibrated = calibrate_cpu(size=128, repeats=2)  # a measurement: its size depends on the machine's load
    assert calibrated.flops_per_s > 0 and calibrated.bytes_per_s > 0 and "128x128" in calibrated.source
    peak = Peak(1e10, 1e9, calibrated.source)  # ridge point: 10 FLOPs per byte
    rates = achieved_rates({"flops": 2e9, "bytes_accessed": 1e6}, 0.1, peak)
    assert rates.flops_per_s == pytest.approx(2e10) and rates.arithmetic_intensity == 2000.0
    assert rates.flops_fraction == pytest.approx(2.0) and rates.bytes_fraction == pytest.approx(1e-2)
    assert rates.bound == "compute" and rates.peak_source.startswith("calibrated")
    assert achieved_rates({"flops": 1e6, "bytes_accessed": 1e6}, 0.1, peak).bound == "memory"  # 1 FLOP per byte


def _call(index, exec_s, compile_s=0.0, captured=False, timed=True):
    """A call record as the instrumentation sends it (its wall time holds its compile)."""
    return CallTiming(index, exec_s + compile_s, exec_s, compile_s, captured=captured, timed=timed)


def test_execute_statistics_leave_out_compiling_calls():
    calls = [_call(0, 0.01, compile_s=2.0), _call(1, 0.01), _call(2, 0.03), _call(3, 0.02, compile_s=1.0),
             _call(4, 0.02), _call(5, 0.04)]
    stats = execute_stats(calls, "script", warmup=0)
    assert stats.first_s == pytest.approx(2.01)  # the first call's wall time, its compile included
    assert (stats.min_s, stats.median_s, stats.max_s) == pytest.approx((0.01, 0.025, 0.04))  # calls 1, 2, 4, 5
    assert stats.total_s == pytest.approx(0.13) and stats.calls == stats.timed_calls == 6  # execute time only


def test_execute_statistics_estimate_the_calls_that_ran_ahead_untimed():
    # --sync-every 4: calls 0-2 and every 4th are waited for and timed; the others' wall is their dispatch.
    calls = [_call(i, 0.02 if i in (0, 1, 2, 4, 8) else 1e-5, compile_s=0.5 if i == 0 else 0.0,
                   timed=i in (0, 1, 2, 4, 8)) for i in range(10)]
    stats = execute_stats(calls, "script", warmup=0)
    assert stats.calls == 10 and stats.timed_calls == 5
    assert stats.median_s == pytest.approx(0.02) and stats.max_s == pytest.approx(0.02)  # no dispatch-only call
    assert stats.total_s == pytest.approx(5 * 0.02 + 5 * 0.02)  # the 5 untimed at the timed calls' mean


def test_execute_statistics_of_function_mode_skip_the_warmup():
    calls = [_call(0, 0.5), _call(1, 0.02), _call(2, 0.04), _call(3, 0.03)]
    stats = execute_stats(calls, "function", warmup=1)
    assert (stats.calls, stats.min_s, stats.median_s, stats.max_s) == pytest.approx((3, 0.02, 0.03, 0.04))
    assert stats.total_s == pytest.approx(0.09)


def test_transfer_hints_follow_their_share_of_the_run():
    implicit = Transfer("implicit_args", 12, 0.6, 12 * 8 * 2**20)
    reads = Transfer("to_host", 12, 0.2, 12 * 4)
    heavy = hints_for([], Totals(2.0, 0.5, 0.2, 0.8, 0.5), [implicit, reads])
    assert any("host<->device copies take 40% of the run" in h for h in heavy)
    assert any("numpy arrays were passed to jitted functions 12 times" in h and "100.7 MB" in h for h in heavy)
    assert any("device values were read on the host 12 times" in h for h in heavy)
    light = hints_for([], Totals(100.0, 0.5, 98.0, 0.7, 0.8), [implicit, reads])  # under 5% of a long run
    assert not any("copies" in h or "numpy arrays" in h or "read on the host" in h for h in light)


def test_numpy_host_arrays_and_scalars_have_signatures():
    sig = _sig(lambda x, y, z: 0, np.zeros((2, 3), np.float32), 3, True)
    kinds = [(path, leaf.kind, leaf.dtype) for path, leaf in sig.leaves]
    assert kinds == [("x", "array", "f32"), ("y", "scalar", "i32"), ("z", "scalar", "bool")]


def test_command_buffers_off_only_when_a_capture_is_taken_and_the_user_left_the_flag_alone():
    from jaxdbg.profile.run import ProfileOptions, child_xla_flags

    flags, off = child_xla_flags("--xla_force_host_platform_device_count=2", ProfileOptions(), None)
    assert off and flags == "--xla_gpu_enable_command_buffer="  # only what jaxdbg adds: the child appends it
    assert child_xla_flags("", ProfileOptions(trace_calls=0), None) == ("", False)
    assert child_xla_flags("", ProfileOptions(command_buffers=True), None) == ("", False)
    mine = "--xla_gpu_enable_command_buffer=FUSION"
    assert child_xla_flags(mine, ProfileOptions(), None) == ("", False)
    flags, _ = child_xla_flags("", ProfileOptions(), "/tmp/d")
    assert flags.endswith("--xla_dump_to=/tmp/d --xla_dump_hlo_as_text")


def test_an_exception_raised_inside_jaxdbg_is_not_blamed_on_the_target(tmp_path, monkeypatch):
    import os

    import jaxdbg
    from jaxdbg._source import SourceLocation
    from jaxdbg.outcomes import raise_internal_failure
    from jaxdbg.profile.run import ProfileOptions
    from jaxdbg.runner import ExceptionInfo, Outcome
    from jaxdbg.target import parse_target

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("step(x)\n")
    ours = os.path.join(os.path.dirname(jaxdbg.__file__), "profile", "instrument.py")
    user = os.path.abspath("train.py")
    trace = (f'Traceback (most recent call last):\n  File "{user}", line 5, in <module>\n    step(x)\n'
             f'  File "{ours}", line 190, in call\n    timed = TIMED\nNameError: name \'TIMED\' is not defined\n')
    info = ExceptionInfo("NameError", "NameError", "name 'TIMED' is not defined", trace,
                         SourceLocation(user, 5, "<module>"))
    outcome = Outcome("exception", 1, None, info, "", "", 1.0, (), None)
    with pytest.raises(RuntimeError, match="instrumentation failed"):
        raise_internal_failure(outcome, parse_target("train.py"), ProfileOptions())
    in_user_code = trace.replace(ours, user)  # the same error raised by the user's own line: the target's
    raise_internal_failure(Outcome("exception", 1, None, ExceptionInfo(
        "NameError", "NameError", "x", in_user_code, SourceLocation(user, 5, "<module>")), "", "", 1.0, (), None),
        parse_target("train.py"), ProfileOptions())
    # an XLA runtime error out of the user's jitted call (JAX hides its frames: the jit layer's call is the last
    # one), e.g. a collective whose peer process left the job: the target's failure, its profile kept
    layer = os.path.join(os.path.dirname(jaxdbg.__file__), "jit_layer.py")
    runtime = (f'Traceback (most recent call last):\n  File "{user}", line 5, in <module>\n    step(x)\n'
               f'  File "{layer}", line 253, in run\n    return run(*self.args, **self.kwargs) if self.kwargs '
               'else run(*self.args)\nValueError: UNKNOWN: Gloo all-reduce failed: Connection closed by peer\n')
    raise_internal_failure(Outcome("exception", 1, None, ExceptionInfo(
        "ValueError", "ValueError", "UNKNOWN: Gloo all-reduce failed", runtime, SourceLocation(user, 5, "<module>")),
        "", "", 1.0, (), None), parse_target("train.py"), ProfileOptions())


def test_compare_against_another_programs_report_is_noted(tmp_path):
    from jaxdbg.profile.compare import other_target_note

    path = tmp_path / "old.json"
    path.write_text(json.dumps({"command": "profile", "target": "a/train.py", "result": {"functions": []}}))
    baseline = load_baseline(str(path))
    assert other_target_note(baseline, "b/train.py") is None  # the same script, elsewhere: fine
    assert "profiled 'a/train.py'" in other_target_note(baseline, "serve.py")


def test_op_expressions_name_arguments_as_the_user_does():
    """jax names entry parameters after mangled argument paths (%params__w1__.1); the op table writes the
    path the parameter's metadata keeps (params['w1'])."""
    from jaxdbg.profile.hlo import parse_hlo

    def step(params, x):
        return (jnp.tanh(x @ params["w1"]) @ params["w2"]).sum()

    params = {"w1": jnp.ones((16, 32)), "w2": jnp.ones((32, 8))}
    module = parse_hlo(jax.jit(step).lower(params, jnp.ones((4, 16))).compile().as_text())
    assert set(module.arguments.values()) == {"params['w1']", "params['w2']", "x"}
    expressions = " ".join(op.expression for op in module.ops.values())
    assert "params['w1']" in expressions and "params__w1__" not in expressions


def test_a_process_whose_program_raised_is_named_in_the_jobs_hints():
    """Process 1 of a job raises (a corrupt shard); process 0 then fails in its all-reduce (its peer left): process
    0's report, which speaks for the job, names process 1's error as the one to fix."""
    from jaxdbg.profile.processes import ProcessFigures, failure_hints
    from jaxdbg.protocol import failure_summary as _failed

    def raised(err):
        try:
            raise err
        except BaseException as caught:  # noqa: BLE001 - any error a program raises
            return _failed(caught)

    assert raised(ValueError("corrupt record in shard 1\nmore")).startswith("ValueError: corrupt record in shard 1")
    assert _failed(None) == "" and raised(SystemExit(0)) == "" and raised(SystemExit(2)).startswith("SystemExit")
    rows = [ProcessFigures(0, 9.0, 1.0, 0.1, 0.0, 8.0, 0.0, 4, 0.01, failed="ValueError: UNKNOWN: Gloo failed"),
            ProcessFigures(1, 1.0, 1.0, 0.1, 0.0, 0.1, 0.0, 3, 0.01, failed="ValueError: corrupt record at a.py:20"),
            ProcessFigures(2, 9.0, 1.0, 0.1, 0.0, 8.0, 0.0, 4, 0.01)]
    (hint,) = failure_hints(rows)
    assert hint.startswith("process 1 raised ValueError: corrupt record at a.py:20; fix that first")
    assert rows[1].as_message()["failed"].startswith("ValueError")


def test_a_train_eval_flag_compiling_once_per_mode_is_not_told_to_become_an_array():
    """A Linen step jitted with `train` static, called for training and every 4 steps for evaluation: two compiles
    by design. The fix said for a static lr (pass it as an array) does not fit a bool that switches code paths."""
    from jaxdbg.profile.hints import recompile_fix
    from jaxdbg.profile.model import ArgChange

    flag = [Recompile(4, "", (ArgChange("train", "static", "True", "False"),))]
    kind, count, fix = recompile_fix(flag)
    assert (kind, count) == ("static", 1) and "train/eval flag" in fix and "array" not in fix
    lr = [Recompile(4, "", (ArgChange("lr", "static", "0.1", "0.05"),))]
    assert "pass it as an array" in recompile_fix(lr)[2]
