"""The watch: first non-finite call, eager ops, exact replay (donation), jit's API kept, nothing left patched."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdbg.jit_layer import InstrumentedJit
from jaxdbg.nan.explain import explain
from jaxdbg.nan.localise import localise_call
from jaxdbg.nan.watch import EagerFinding, JitFinding, NonFiniteFound, Watch


def _eval_process_primitive():
    from jax._src import core

    return core.EvalTrace.process_primitive


def test_hooks_are_removed_afterwards_even_on_error() -> None:
    real_jit, real_eval = jax.jit, _eval_process_primitive()
    with pytest.raises(NonFiniteFound), Watch():
        assert jax.jit is not real_jit and _eval_process_primitive() is not real_eval
        jax.jit(jnp.log)(jnp.array(-1.0))
    assert jax.jit is real_jit and _eval_process_primitive() is real_eval
    with pytest.raises(ZeroDivisionError), Watch():
        1 / 0  # noqa: B018 - raises on purpose
    assert jax.jit is real_jit and _eval_process_primitive() is real_eval


def test_first_failing_call_and_its_index() -> None:
    with pytest.raises(NonFiniteFound) as stop, Watch() as watch:
        step = jax.jit(lambda x: jnp.sqrt(2.0 - x))
        for k in range(5):
            step(jnp.float32(k + 0.5))
    finding = stop.value.finding
    assert isinstance(finding, JitFinding) and watch.finding is finding
    assert finding.call.call_index == 2 and watch.calls == 3


def test_nan_only_ignores_inf() -> None:
    with Watch(nan_only=True) as watch:
        out = jax.jit(lambda x: 1.0 / x)(jnp.array([0.0, 1.0]))
    assert np.isinf(out[0]) and watch.finding is None


def test_donated_inputs_are_kept_for_an_exact_replay() -> None:
    with pytest.raises(NonFiniteFound) as stop, Watch():
        update = jax.jit(lambda w, g: w - 10.0 * g * w, donate_argnums=0)
        w = jnp.array([1.0, 2.0])
        for _ in range(100):
            w = update(w, jnp.float32(3.0))
    call = stop.value.finding.call
    assert not call.args[0].is_deleted()
    found = localise_call(call)
    assert found.first is not None and found.first.kind == "inf" and found.first.primitive in ("mul", "sub")


def test_keeps_jit_api_statics_methods_and_nesting() -> None:
    class Scaler:
        factor = 2.0

        @functools.partial(jax.jit, static_argnums=0)
        def apply(self, x):
            return x * self.factor

    with Watch() as watch:
        @functools.partial(jax.jit, static_argnames=("power",))
        def powered(x, power):
            return x ** power

        inner = jax.jit(lambda v: v + 1.0)
        outer = jax.jit(lambda v: inner(v) * 2.0)
        assert isinstance(powered, InstrumentedJit)
        assert float(powered(jnp.float32(3.0), power=2)) == 9.0
        # .lower reaches the real jitted function, the static power folded in (x ** 2 is x * x)
        assert "stablehlo.multiply %arg0, %arg0" in powered.lower(jnp.float32(3.0), power=2).as_text()
        assert float(outer(jnp.float32(1.0))) == 4.0
        assert float(Scaler().apply(jnp.float32(1.5))) == 3.0
    assert inner.record.calls == 0 and outer.record.calls == 1  # inner only ran inside outer's trace
    assert watch.calls == 2 and watch.finding is None


def test_lowering_goes_to_the_real_jit() -> None:
    with Watch():
        f = jax.jit(lambda x: x * 2.0)
        text = f.lower(jnp.ones(3)).as_text()
    assert "multiply" in text


def test_eager_operation_that_creates_a_nan() -> None:
    with pytest.raises(NonFiniteFound) as stop, Watch():
        x = jnp.array([1.0, -4.0])
        y = x * 2.0
        jnp.sqrt(y)  # the eager origin
    finding = stop.value.finding
    assert isinstance(finding, EagerFinding)
    origin = finding.origin
    assert origin.primitive == "sqrt" and origin.kind == "nan" and origin.path == ("eager",)
    assert origin.source.function == "test_eager_operation_that_creates_a_nan"
    assert origin.inputs[0].negative == 1
    assert origin.call_index == 0  # the first (and only) call of this test function
    text, _ = explain(origin)
    assert "call 0 (run eagerly, outside jit)" in text


def test_eager_origin_counts_calls_of_the_function_that_ran_it() -> None:
    def step(x):
        y = x - 3.0
        return jnp.log(y)  # log(0) on the third call

    with pytest.raises(NonFiniteFound) as stop, Watch():
        for value in (5.0, 4.0, 3.0, 2.0):
            step(jnp.float32(value))
    origin = stop.value.finding.origin
    assert (origin.primitive, origin.function.split(".")[-1], origin.call_index) == ("log", "step", 2)


def _loss_sqrt(w, x):
    return jnp.sum(jnp.sqrt(w - x))  # NaN once w - x goes negative


def _hunt_gradient_descent(transform, through_a_function: bool = False):
    """A jitted loss driven by ``transform`` applied outside jit (``jax.grad(loss)``), w going negative at step 4."""

    def update(w, x):
        return w - 0.1 * transform(loss)(w, x)

    step = update if through_a_function else None
    w, x = jnp.array([1.0, 2.0, 0.35]), jnp.zeros(3)
    with pytest.raises(NonFiniteFound) as stop, Watch():
        loss = jax.jit(_loss_sqrt)  # jitted while watched, as in a script under nan-hunt
        grad = transform(loss)
        for _ in range(6):
            w = step(w, x) if step is not None else w - 0.1 * grad(w, x)
    return stop.value.finding.origin


@pytest.mark.parametrize("through_a_function", [False, True])
def test_grad_applied_outside_jit_names_the_op_in_the_jitted_function_and_its_call(through_a_function) -> None:
    origin = _hunt_gradient_descent(jax.grad, through_a_function)
    # The op's own line in the jitted loss, not the line calling grad; the 5th call of loss through jax.grad.
    assert (origin.kind, origin.primitive, origin.pass_) == ("nan", "sqrt", "forward")
    assert origin.source.function == "_loss_sqrt" and "NaN once" in _source_line(origin)
    assert (origin.function, origin.call_index, origin.path) == ("_loss_sqrt", 4, ("jax.grad(_loss_sqrt)",))
    assert origin.transformed_by == "jax.grad"
    assert "call 4 (through `jax.grad`, applied outside jit)" in explain(origin)[0]


def test_grad_of_a_plain_loss_that_calls_a_jitted_layer_twice_names_both_in_the_path() -> None:
    """``jax.grad(loss)`` where the plain ``loss`` calls the jitted ``layer`` twice a step: layer's calls count
    one by one (step 3's first call is call 6), and the path is the user's ``jax.grad(loss)``, then layer."""

    def loss(w, x, s):
        return jnp.sum(layer(w, layer(w, x, s), s))

    w, x = jnp.array([[1.0, 0.5], [0.3, 0.2]]), jnp.array([[1.0, 0.1]])
    with pytest.raises(NonFiniteFound) as stop, Watch():
        layer = jax.jit(lambda w, x, s: jnp.sqrt(x @ w - s))
        for i in range(5):
            w = w - 0.01 * jax.grad(loss)(w, x, 10.0 if i == 3 else 0.0)
    origin = stop.value.finding.origin
    assert (origin.primitive, origin.call_index, origin.path) == ("sqrt", 6, ("jax.grad(loss)", "jit(<lambda>)"))
    assert origin.transformed_by == "jax.grad"


def test_vmap_applied_outside_jit_counts_the_calls_through_it() -> None:
    with pytest.raises(NonFiniteFound) as stop, Watch():
        loss = jax.jit(lambda w, x: jnp.sum(jnp.log(w - x)))  # log of a negative entry at the 4th call
        loss(jnp.ones(2), jnp.zeros(2))  # a plain call: not one of those through jax.vmap
        for i in range(5):
            jax.vmap(loss, in_axes=(0, None))(jnp.array([[1.0, 2.0], [3.0, 0.5 - 0.2 * i]]), jnp.zeros(2))
    origin = stop.value.finding.origin
    assert (origin.primitive, origin.pass_, origin.function, origin.call_index) == ("log", "forward", "<lambda>", 3)
    assert origin.path == ("jax.vmap(<lambda>)",) and origin.source.function.endswith("<lambda>")


def test_a_residual_computed_eagerly_for_jax_grad_is_in_the_backward_pass() -> None:
    def loss(w):
        return jnp.sum(jnp.sqrt(w))  # d/dw sqrt(0) = 0.5 / sqrt(0) = inf, computed with the forward pass

    with Watch(after_inf=4) as watch:
        loss = jax.jit(loss)
        jax.value_and_grad(loss)(jnp.ones(2))  # counted: the next call is call 1
        jax.value_and_grad(loss)(jnp.array([0.0, 1.0]))
    origin = watch.finding.origin
    assert (origin.kind, origin.primitive, origin.pass_, origin.call_index) == ("inf", "div", "backward", 1)
    assert origin.source.function.endswith("loss")


def _source_line(origin) -> str:
    import linecache

    return linecache.getline(origin.source.file, origin.source.line)


def test_eager_operation_on_bad_data_is_not_an_origin() -> None:
    with Watch() as watch:
        data = jnp.asarray(np.array([1.0, np.nan], np.float32))
        doubled = data * 2.0
    assert np.isnan(doubled[1]) and watch.finding is None


def test_output_names_come_from_the_assignment() -> None:
    with pytest.raises(NonFiniteFound), Watch(growth_factor=10.0) as watch:
        step = jax.jit(lambda p: ({"w": p["w"] * 100.0, "b": p["b"]}, jnp.sum(p["w"])))
        params = {"w": jnp.ones(2), "b": jnp.ones(1)}
        for _ in range(30):
            params, total = step(params)  # noqa: RUF059 - growth is reported by these names
    names = [g.name for g in watch.growth.report()]
    assert set(names[:2]) == {"params['w']", "total"}  # both grow 100x per call: either may be first
    assert "params['b']" not in names


def test_one_bad_update_shows_as_the_growth_of_the_failing_calls_argument() -> None:
    """A step that sends a parameter from 0.5 to -739 and fails on the next call: the parameter's growth is
    seen on its way into the failing call (its only earlier value was an argument made outside)."""
    with pytest.raises(NonFiniteFound), Watch() as watch:
        step = jax.jit(lambda w, x: (w - 1479.0 * x, jnp.log(w + 800.0) * x))
        w = jnp.float32(0.5)
        for _ in range(3):
            w, _ = step(w, jnp.float32(1.0))
    grown = [(g.name, g.first_call, g.function) for g in watch.growth.report()]
    assert grown == [("w", 1, "<lambda>")], grown


def test_read_late_keeps_program_order_and_the_exact_replay() -> None:
    """With ``read_late`` (nan-hunt on scripts, jaxdbg.watch) a call's flags are read after it returned: the
    first bad call is still the finding when the block ends (here: the script fails first), when an eager
    operation makes a NaN before it was read, and when a donating call is replayed from its kept copies."""

    def unread_nan_then(ending):
        step = jax.jit(lambda w, x: (w * 0.5 + x, jnp.log(w).sum()), donate_argnums=0)
        w = jnp.ones(3)
        for v in (1.0, -4.0, 1.0):  # w < 0 from call 1: log NaN at call 2
            w, _ = step(w, jnp.full((3,), v))
        ending()

    def fail():
        raise ValueError("the script's own failure, after the NaN")

    for ending in (fail, lambda: jnp.log(jnp.float32(-1.0)), lambda: None):
        with pytest.raises(NonFiniteFound) as stop, Watch(read_late=True) as watch:
            unread_nan_then(ending)
        finding = stop.value.finding
        assert isinstance(finding, JitFinding) and finding.call.call_index == 2, ending
        first = localise_call(finding.call, closed=finding.closed_jaxpr).first  # inputs kept despite donation
        assert (first.primitive, first.call_index) == ("log", 2)
        assert watch.calls == 3 and not watch._pending


def test_the_replay_does_not_keep_the_ended_scripts_arrays(tmp_path, monkeypatch) -> None:
    """What the script held when it ended (its latest parameters) is no input of the replay: dropped before it,
    so that nan-hunt's peak is not one model copy higher than the program's. The failing call's own inputs stay."""
    import textwrap

    import jaxdbg.nan.session as session
    from jaxdbg.nan.api import HuntOptions
    from jaxdbg.target import parse_target

    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        import jax, jax.numpy as jnp
        step = jax.jit(lambda w, x: (w * 2.0, jnp.log(x).sum()))
        w, unused = jnp.ones((123, 7)), {"kept": [jnp.zeros((5, 3))]}
        for x in (1.0, 2.0, -1.0, 3.0):
            w, loss = step(w, jnp.full((4,), x))
    """))
    seen = {}
    original = session._analyse

    def analyse(finding, *args, **kwargs):
        shapes = [a.shape for a in jax.live_arrays()]
        seen["held"] = (shapes.count((123, 7)), shapes.count((5, 3)))
        return original(finding, *args, **kwargs)

    monkeypatch.setattr(session, "_analyse", analyse)
    result, _ = session.hunt_here(parse_target(str(script)), HuntOptions())
    assert (result.first.primitive, result.first.call_index) == ("log", 2)
    assert seen["held"] == (1, 0)  # the failing call's input w; not the script's latest w, nor its other arrays


def test_unread_calls_keep_inputs_of_bounded_size(monkeypatch) -> None:
    """Unread calls each keep their inputs for an exact replay: past MAX_KEPT_BYTES kept by the calls before the
    latest, the oldest is read (and its inputs let go), so a large model is not kept once per unread step."""
    import jaxdbg.nan.watch as watch_module

    monkeypatch.setattr(watch_module, "READ_EVERY_S", 1e9)  # no read by the clock: only the bounds read
    monkeypatch.setattr(watch_module, "MAX_KEPT_BYTES", 6000)  # one call's 4000 bytes fit, two do not
    most = 0
    with Watch(read_late=True) as watch:
        step = jax.jit(lambda w: w * 0.5)
        w = jnp.ones(1000, jnp.float32)
        for _ in range(12):
            w = step(w)
            most = max(most, len(watch._pending))
    assert most == 2 and watch.calls == 12 and not watch._pending


def test_a_program_ahead_of_its_device_is_read_a_batch_at_a_time(monkeypatch) -> None:
    """A program that runs ahead of its device has many unread calls, of which one more has finished at each call:
    they are read once READ_BATCH have finished, not the one finished call at every call (a whole read each)."""
    import jaxdbg.nan.watch as watch_module

    monkeypatch.setattr(watch_module, "READ_EVERY_S", 1e9)  # no read by the clock
    monkeypatch.setattr(watch_module, "READ_BATCH", 4)
    ahead, made, finished = 10, [], set()  # the device finishes call k while the program makes call k + ahead
    monkeypatch.setattr(watch_module, "_finished", lambda magnitudes: id(magnitudes) in finished)
    with Watch(read_late=True) as watch:
        reads, read_batch = [], watch._read_batch
        watch._read_batch = lambda count: reads.append(count) or read_batch(count)  # type: ignore[method-assign]
        step = jax.jit(lambda w: w * 0.5)
        w = jnp.ones(8, jnp.float32)
        for _ in range(42):
            finished.update(id(m) for m in made[:-ahead])
            w = step(w)
            made.append(watch._pending[-1].magnitudes)
        during = list(reads)
    assert during == [4] * 7, during  # calls 0-30 finished before the last call: 7 batches of 4, none of 1
    assert watch.calls == 42 and not watch._pending


def test_off_cpu_unread_vectors_reach_the_host_a_batch_at_a_time(monkeypatch) -> None:
    """The accelerator's path, forced on CPU: the unread calls' vectors are stacked on the device READ_BATCH at a
    time and copied in one transfer (not one copy per call: ~30-50 us each on a GPU); vectors that do not stack
    (another function's, of another length) are copied one by one; the NaN's call is still named exactly."""
    import jaxdbg.nan.watch as watch_module

    monkeypatch.setattr(watch_module, "COPY_AHEAD", True)
    monkeypatch.setattr(watch_module, "READ_EVERY_S", 1e9)  # no read or copy by the clock: only by batches
    monkeypatch.setattr(watch_module, "COPY_AFTER_S", 1e9)
    stacked, real = [], watch_module._CopiedRows
    monkeypatch.setattr(watch_module, "_CopiedRows", lambda vectors: stacked.append(len(vectors)) or real(vectors))
    for mixed in (False, True):
        stacked.clear()
        with pytest.raises(NonFiniteFound) as stop, Watch(read_late=True):
            step = jax.jit(lambda w, i: w * 0.5 + jnp.where(i == 37, jnp.nan, 0.0))
            other = jax.jit(lambda w: (w.sum(), w[:3]))  # outputs of another length: its vector has 2 rows
            w = jnp.ones(8, jnp.float32)
            for i in range(40):
                w = step(w, i)
                if mixed:
                    other(w)
        assert "call 37 of" in str(stop.value), str(stop.value)
        # 16 a batch, the last 8 when read (all finished: stacking waits for nothing); mixed, 8 of each function
        assert stacked == ([16, 16, 8] if not mixed else [8, 8] * 5), stacked


def test_a_function_and_its_gradient_jitted_apart_are_two_functions_with_their_own_growth() -> None:
    """``jax.jit(loss)`` beside ``jax.jit(jax.value_and_grad(loss))`` and ``jax.jit(jax.grad(loss))``: three programs
    of one Python function, with outputs of different widths. Taken as one (one record, one growth series), each
    call restarted the series: nothing could grow, every call was read alone, and nan-hunt's growth tracker
    crashed. Each has its own now, named as written (``value_and_grad(loss)``): the loss's growth and the
    gradient's show."""
    with pytest.raises(NonFiniteFound), Watch(read_late=True) as watch:
        def loss(x):
            return jnp.sum(x ** 2)

        value = jax.jit(loss)
        step = jax.jit(jax.value_and_grad(loss))
        gradient = jax.jit(jax.grad(loss))  # the same wrapper around loss as value_and_grad's: jax's traceback filter
        x = jnp.ones(4, jnp.float32)
        for i in range(12):
            value(x)
            _, grad = step(x)
            x = (x * 3.0 if i < 10 else x * jnp.nan) + 0.0 * grad + 0.0 * gradient(x)  # grows 3x a step, then NaN
    ids = {f.name: f.record.id for f in watch.functions}
    assert ids.keys() == {"loss", "value_and_grad(loss)", "grad(loss)"} and len(set(ids.values())) == 3
    grew = {g.function for g in watch.growth.report()}
    assert grew >= {"loss", "value_and_grad(loss)"}, grew  # the value's and the step's


def test_nan_hunts_watch_trims_after_letting_go_of_kept_inputs(tmp_path, monkeypatch) -> None:
    """nan-hunt's watch gives glibc's free memory back once the calls it read have let go of TRIM_AFTER_BYTES of
    kept inputs (not at every read; never without ``trim``), and once more before the replay."""
    import textwrap

    import jaxdbg._malloc as malloc
    import jaxdbg.nan.session as session
    import jaxdbg.nan.watch as watch_module
    from jaxdbg.nan.api import HuntOptions
    from jaxdbg.target import parse_target

    trims = []
    monkeypatch.setattr(malloc, "trim", lambda: trims.append(len(trims)) or True)
    monkeypatch.setattr(watch_module, "READ_EVERY_S", 1e9)  # no read by the clock: only the bounds read
    monkeypatch.setattr(watch_module, "MAX_KEPT_BYTES", 6000)  # each call's 4000 bytes are read at the next
    monkeypatch.setattr(watch_module, "TRIM_AFTER_BYTES", 10000)  # three calls' inputs
    for trim in (False, True):
        with Watch(read_late=True, trim=trim) as watch:
            step = jax.jit(lambda w: w * 0.5)
            w = jnp.ones(1000, jnp.float32)
            for _ in range(12):
                w = step(w)
        assert watch.calls == 12 and len(trims) == (4 if trim else 0), trim  # 12 calls let go: every third

    trims.clear()
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        import jax, jax.numpy as jnp
        step = jax.jit(lambda w, x: (w * 2.0, jnp.log(x).sum()))
        w = jnp.ones(1000)
        for x in (1.0, 2.0, 3.0, 4.0, -1.0):
            w, loss = step(w, jnp.full((4,), x))
    """))
    result, _ = session.hunt_here(parse_target(str(script)), HuntOptions())
    assert result.first.primitive == "log" and len(trims) >= 2  # in the run, and before the replay
