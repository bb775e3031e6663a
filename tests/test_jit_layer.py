"""The instrumentation layer: the one patch of jax.jit, its hooks, and the one non-finite check."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdbg import jit_layer
from jaxdbg.jit_layer import InstrumentedJit, InstrumentedPmap, JitHook
from jaxdbg.nonfinite import kind_of, magnitudes


class Log(JitHook):
    def __init__(self, name, events, check=False):
        self.name, self.events, self.check_outputs = name, events, check

    def on_jit(self, function):
        self.events.append((self.name, "jit", function.name))

    def before(self, call):
        self.events.append((self.name, "before", call.function.name, call.index))

    def after(self, call, out):
        mags = call.host_magnitudes().tolist() if self.check_outputs else None
        self.events.append((self.name, "after", call.function.name, call.index, mags))

    def on_exception(self, call, err):
        self.events.append((self.name, "error", type(err).__name__))


def test_jax_jit_is_restored_when_the_last_hook_leaves_even_on_error():
    real = jax.jit
    with pytest.raises(ZeroDivisionError), jit_layer.installed(Log("a", [])), jit_layer.installed(Log("b", [])):
        assert jax.jit is not real
        1 / 0  # noqa: B018 - raises on purpose
    assert jax.jit is real


class SeesPmap(Log):
    sees_pmap = True


def test_pmap_reaches_only_the_hooks_that_see_it_and_is_restored():
    real_pmap, events, seen = jax.pmap, [], []
    with jit_layer.installed(Log("plain", events)):
        assert not isinstance(jax.pmap(lambda x: x), InstrumentedPmap)  # no hook wants pmap'd functions
        with jit_layer.installed(SeesPmap("pmap", seen)):
            def double(x):
                return 2.0 * jax.lax.psum(x, "i") / jax.lax.psum(1.0, "i")

            mapped = jax.pmap(double, "i")
            rows = jnp.arange(2.0 * jax.local_device_count()).reshape(-1, 2)  # a row per device of the backend
            out = mapped(rows)
            out = mapped(out)
    assert jax.pmap is real_pmap
    assert isinstance(mapped, InstrumentedPmap) and mapped.name == "double" and mapped.options["axis_name"] == "i"
    np.testing.assert_allclose(out, np.tile(4 * rows.mean(axis=0), (len(rows), 1)))  # the pmap's own result
    assert seen == [("pmap", "jit", "double"), ("pmap", "before", "double", 0), ("pmap", "after", "double", 0, None),
                    ("pmap", "before", "double", 1), ("pmap", "after", "double", 1, None)]
    assert not any(event[2] == "double" for event in events)  # a hook without sees_pmap never sees it


def test_a_pmapped_function_that_no_hook_left_sees_is_counted_and_dispatched():
    """A pmap'd function made while a hook that sees pmap was installed, called after that hook left: the hook
    still installed (without sees_pmap, though it checks outputs) sees none of its calls; they are counted and go
    straight to jax's dispatch."""
    events, seen = [], []
    with jit_layer.installed(Log("plain", events, check=True)):
        with jit_layer.installed(SeesPmap("pmap", seen)):
            mapped = jax.pmap(lambda x: 2.0 * x)
            ones = jnp.ones((jax.local_device_count(), 2))  # a row per device of the backend
            out = mapped(ones)
        out = mapped(mapped(out))
    np.testing.assert_allclose(out, np.full(ones.shape, 8.0))
    assert [event[1:] for event in seen] == [("jit", "<lambda>"), ("before", "<lambda>", 0),
                                             ("after", "<lambda>", 0, None)]
    assert events == [] and mapped.record.calls == 3 and mapped._plan.nobody


def test_hooks_nest_first_installed_outermost_and_see_the_same_call():
    events = []
    with jit_layer.installed(Log("outer", events)), jit_layer.installed(Log("inner", events, check=True)):
        step = jax.jit(lambda x: x * 2.0)
        step(jnp.array([1.0, -3.0]))
    assert events == [
        ("outer", "jit", "<lambda>"), ("inner", "jit", "<lambda>"),
        ("outer", "before", "<lambda>", 0), ("inner", "before", "<lambda>", 0),
        ("inner", "after", "<lambda>", 0, [6.0]), ("outer", "after", "<lambda>", 0, None),
    ]


def test_only_top_level_calls_reach_the_hooks():
    events = []
    with jit_layer.installed(Log("h", events)):
        inner = jax.jit(lambda v: v + 1.0)
        outer = jax.jit(lambda v: inner(v) * 2.0)
        assert float(outer(jnp.float32(1.0))) == 4.0  # inner runs only inside outer's trace
        jax.grad(lambda v: outer(v))(jnp.float32(1.0))  # under grad: not an execution of outer
        with jit_layer.internal():
            inner(jnp.float32(0.0))  # jaxdbg's own work
    calls = [e for e in events if e[1] == "before"]
    assert calls == [("h", "before", "<lambda>", 0)] and inner.record.calls == 0


def test_compiler_options_of_a_hook_reach_top_level_calls_only(tmp_path):
    """jax refuses compiler_options on a jit called inside another's trace (optax's own jitted helpers are):
    a hook's options go to the top-level calls, a nested call runs the user's own jit."""

    class Dumps(JitHook):
        def compiler_options(self):
            return {"xla_dump_to": str(tmp_path), "xla_dump_hlo_as_text": True}

    with jit_layer.installed(Dumps()):
        inner = jax.jit(lambda v: v * 3.0)
        outer = jax.jit(lambda v: inner(v) + 1.0)
        assert float(outer(jnp.float32(1.0))) == 4.0 and float(inner(jnp.float32(2.0))) == 6.0
    # outer (with inner inlined) and inner called on its own; no eager operation's module
    dumped = [p.name.split(".")[1] for p in tmp_path.glob("module_*buffer-assignment.txt")]
    assert dumped == ["jit__lambda", "jit__lambda"]


def test_re_jitting_the_same_code_counts_calls_of_one_function():
    def step(x):
        return x + 1.0

    with jit_layer.installed(Log("h", [])):
        for i in range(3):
            f = jax.jit(step)
            f(jnp.float32(i))
    assert f.record.calls == 3 and f.record.name == "step" and f.record.source.line > 0


def test_a_checkified_function_is_named_after_the_users_function():
    """jax.jit(checkify.checkify(step)) jits jax's own wrapper `checked_fun`: every report once named that, a
    function the user never wrote (and two checkified functions shared one record)."""
    from jax.experimental import checkify

    def step(x):
        checkify.check(x > 0, "x must be positive")
        return jnp.log(x)

    def other(x):
        return x * 2.0

    with jit_layer.installed(Log("h", [])):
        f, g = jax.jit(checkify.checkify(step)), jax.jit(checkify.checkify(other))
        f(jnp.float32(1.0)), g(jnp.float32(1.0)), f(jnp.float32(2.0))
    assert (f.record.name, f.record.calls, g.record.name) == ("checkify(step)", 2, "checkify(other)")
    assert f.record.source.line == step.__code__.co_firstlineno


def test_transformed_functions_are_named_as_written_and_kept_apart():
    """jax.jit(jax.grad(loss)) and jax.jit(jax.value_and_grad(loss)) are two programs: both behind jax's one
    traceback-filtering wrapper, they once shared a record (and every report called both 'loss')."""
    def loss(x):
        return jnp.sum(x ** 2)

    def scaled(x, scale):
        return loss(x * scale)

    with jit_layer.installed(Log("h", [])):
        jitted = [jax.jit(loss), jax.jit(jax.grad(loss)), jax.jit(jax.value_and_grad(loss)),
                  jax.jit(jax.vmap(jax.grad(loss))), jax.jit(jax.grad(loss)), jax.jit(jax.grad(loss, has_aux=False)),
                  jax.jit(jax.grad(scaled)), jax.jit(jax.grad(scaled, argnums=1))]
        for f in jitted[:4]:
            f(jnp.ones((2, 3)))
    names = [f.record.name for f in jitted[:6]]
    assert names == ["loss", "grad(loss)", "value_and_grad(loss)", "vmap(grad(loss))", "grad(loss)", "grad(loss)"]
    assert len({f.record.id for f in jitted}) == 6 and jitted[1].record is jitted[4].record is jitted[5].record
    assert jitted[6].record.name == jitted[7].record.name == "grad(scaled)"  # by argnums: two programs, two records
    assert {f.record.source.line for f in jitted[:6]} == {loss.__code__.co_firstlineno}


def test_behaves_like_the_jitted_function():
    class Scaler:
        factor = 2.0

        @functools.partial(jax.jit, static_argnums=0)
        def apply(self, x):
            return x * self.factor

    events = []
    with jit_layer.installed(Log("h", events)):
        @functools.partial(jax.jit, static_argnames=("power",))
        def powered(x, power):
            return x ** power

        method = Scaler.apply  # jitted before the hook: plain jax
        assert isinstance(powered, InstrumentedJit) and not isinstance(method, InstrumentedJit)
        assert powered.static_argnames == ("power",)
        assert float(powered(jnp.float32(3.0), power=2)) == 9.0
        # .lower reaches the real jitted function, the static power folded in (x ** 2 is x * x)
        assert "stablehlo.multiply %arg0, %arg0" in powered.lower(jnp.float32(3.0), power=2).as_text()
        assert powered.__name__ == "powered" and powered.__wrapped__.__name__ == "powered"

        class Model:
            @jax.jit
            def apply(self, x):
                return x * 3.0

        assert float(Model.apply(None, jnp.float32(2.0))) == 6.0
    assert [e[2] for e in events if e[1] == "before"] == ["powered", "apply"]


def test_exceptions_reach_the_hooks_and_the_caller():
    events = []
    with jit_layer.installed(Log("h", events)):
        bad = jax.jit(lambda x: x.reshape(7, 3))
        with pytest.raises(TypeError):
            bad(jnp.ones((4, 4)))
        assert not jit_layer.is_internal() and not jit_layer.in_user_call()  # the next call is watched again
    assert ("h", "error", "TypeError") in events


def test_output_check_runs_in_the_functions_own_program_with_out_shardings():
    events = []
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("d",))
    across = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
    with jit_layer.installed(Log("h", events, check=True)):
        fused = jax.jit(lambda x: (jnp.log(x), x.astype(jnp.int32)))
        out = fused(jnp.array([1.0, 0.0]))
        device = jax.devices()[0]
        sharded = jax.jit(lambda x: jnp.sqrt(x), out_shardings=jax.sharding.SingleDeviceSharding(device))
        sharded(jnp.array([-1.0]))
        nnx_like = jax.jit(lambda x: (x, jnp.sqrt(x)), out_shardings=(None, None))  # what nnx.jit passes
        nnx_like(jnp.array([4.0]))
        split = jax.jit(lambda x: jnp.log(x) * 0, out_shardings=across)  # a NaN in the second device's half
        split(jnp.array([1.0, 2.0, 3.0, -4.0]))
    after = [e for e in events if e[1] == "after"]
    assert after[0][4] == [np.inf]  # one floating output leaf: |log 0| = inf; the int leaf is not checked
    assert np.isnan(after[1][4][0]) and after[2][4] == [4.0, 2.0] and np.isnan(after[3][4][0])
    assert out[1].tolist() == [1, 0]  # the user's outputs come back untouched
    # The check is compiled into a companion of each function, with the function's own options (no separate
    # reductions): given out_shardings too, and named as jaxdbg's own.
    assert all(f._checked is not None for f in (fused, sharded, nnx_like, split))
    assert fused._checked.__name__.endswith(jit_layer.CHECKED_SUFFIX) and jit_layer.CHECKED_SUFFIX.endswith("_jaxdbg")


def test_a_call_no_hook_wants_keeps_jax_dispatch_and_its_index():
    events = []

    class EveryThird(Log):
        def wants(self, function, index):
            return index % 3 == 0

    with jit_layer.installed(EveryThird("h", events, check=True)):
        f = jax.jit(lambda x: x + 1.0)
        outs = [float(f(jnp.float32(i))) for i in range(7)]
    assert outs == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    assert [e[3] for e in events if e[1] == "after"] == [0, 3, 6]
    assert f.record.calls == 7


def test_a_declined_call_that_compiles_is_told_with_its_spans_and_plans_follow_the_hooks():
    """A sampling hook sees only the calls it wants; a declined call that compiles is still told (with the stages
    jax reported while it ran); a hook that watches nothing is never called; replan() asks again."""
    events, told = [], []

    class Sampler(Log):
        def wants(self, function, index):
            return index == 0

        def on_unwanted_compile(self, call, out):
            told.append((call.index, sorted({stage for stage, _, _ in call.spans}), float(out.sum())))

    class Blind(Log):
        seeing = False

        def watches(self, function):
            return self.seeing

    blind_events = []
    blind = Blind("blind", blind_events)
    with jit_layer.installed(Sampler("s", events)), jit_layer.installed(blind):
        f = jax.jit(lambda x: x * 2.0)
        for n in (2, 2, 3, 3):  # call 2 is declined and compiles (a new shape); call 3 compiles nothing
            f(jnp.ones(n))
        assert [e[3] for e in events if e[1] == "after"] == [0] and blind_events == [("blind", "jit", "<lambda>")]
        assert told == [(2, ["compile", "lower", "trace"], 6.0)]
        blind.seeing = True
        f(jnp.ones(3))
        assert len(blind_events) == 1  # the plan was made before: the hook is asked again only after replan()
        jit_layer.replan()
        f(jnp.ones(3))
    assert [e[1:] for e in blind_events[1:]] == [("before", "<lambda>", 5), ("after", "<lambda>", 5, None)]
    assert f.record.calls == 6


def test_every_call_carries_its_compile_spans():
    spans = []

    class Spans(JitHook):
        def after(self, call, out):
            spans.append(sorted({stage for stage, _, _ in call.spans}))

    with jit_layer.installed(Spans()):
        f = jax.jit(lambda x: x + 1.0)
        f(jnp.ones(2)), f(jnp.ones(2)), f(jnp.ones(4))
    assert spans == [["compile", "lower", "trace"], [], ["compile", "lower", "trace"]]


def test_a_nan_in_a_large_array_is_found_on_the_device():
    # XLA:CPU's fused max(|x|) drops NaN on large arrays (YNNPACK): the check must not rely on it.
    x = jnp.ones((512, 512)).at[3, 5].set(jnp.nan)
    assert kind_of(np.asarray(jax.jit(magnitudes)(x))) == "nan"
    assert kind_of(np.asarray(jax.jit(magnitudes)(jnp.full((256, 256), jnp.nan)))) == "nan"
    assert kind_of(np.asarray(jax.jit(magnitudes)(x.at[3, 5].set(jnp.inf)))) == "inf"
    assert kind_of(np.asarray(jax.jit(magnitudes)(x.at[3, 5].set(jnp.inf))), nan_only=True) is None
    # One pass per leaf (a variadic reduce): the largest magnitude of each dtype and shape, NaN over Inf.
    leaves = [jnp.float32(-3.0), jnp.zeros((0, 3)), jnp.array([1.0, -7.5], jnp.bfloat16), jnp.array([3 + 4j]),
              jnp.array([jnp.inf, jnp.nan]), jnp.full((128, 128), 2.0, jnp.float16).at[1, 1].set(jnp.nan)]
    got = np.asarray(jax.jit(magnitudes)(leaves))
    assert got[:4].tolist() == [3.0, 0.0, 7.5, 5.0] and np.isnan(got[4:]).all()


def test_magnitudes_keep_huge_finite_values_finite_and_every_nonfinite_visible():
    # The check fused into a step (outputs computed in the same program, as a watched call does): values near
    # the float32 maximum stay finite (no sum that could overflow), -Inf counts, NaN wins over Inf, 16-bit and
    # complex leaves are widened first, and a NaN anywhere in a big leaf (first, last, all) is seen.
    big = np.finfo(np.float32).max

    @jax.jit
    def step(x):
        return magnitudes([x * 1.0, -x, x.astype(jnp.bfloat16), jax.lax.complex(x, jnp.zeros_like(x))])

    def kinds(x):
        return [kind_of(np.asarray(m)[None]) for m in np.asarray(step(x))]

    huge = jnp.full((300, 300), big, jnp.float32)
    assert np.asarray(step(huge))[:2].tolist() == [float(big)] * 2 and kinds(huge)[:2] == [None, None]
    for at in ((0, 0), (299, 299)):
        assert kinds(huge.at[at].set(jnp.nan)) == ["nan"] * 4
        assert kinds(jnp.ones((300, 300)).at[at].set(-jnp.inf)) == ["inf"] * 4
    assert kinds(jnp.full((300, 300), jnp.nan)) == ["nan"] * 4
    assert kinds(jnp.ones((300, 300)).at[0, 0].set(jnp.inf).at[5, 5].set(jnp.nan)) == ["nan"] * 4
    half = np.asarray(jax.jit(magnitudes)([jnp.array([65504.0, -1.0], jnp.float16), jnp.zeros((0,), jnp.bfloat16)]))
    assert half.tolist() == [65504.0, 0.0]


def test_a_first_call_action_runs_once_per_installation_at_the_first_top_level_call():
    """The job layer's hook (multihost.agree_at_first_call): the layer itself knows nothing of jobs."""
    seen = []

    def action():
        seen.append(len(seen))

    jit_layer.on_first_call(action)
    jit_layer.on_first_call(action)  # installed twice: still once per installation
    try:
        double = jax.jit(lambda x: 2 * x)
        double(1.0)  # no hook installed: no first call of the layer's
        assert seen == []
        def installation():
            with jit_layer.installed(Log("a", [])):
                inner = jax.jit(lambda x: x + 1)
                outer = jax.jit(lambda x: inner(x) * 3)
                outer(1.0)
                outer(2.0)

        installation()
        installation()
        assert seen == [0, 1]
    finally:
        jit_layer._first_call_actions.remove(action)
