"""The shared jaxpr interpreter: same values as jax, the right paths, hooks, tags and the explicit default."""

from __future__ import annotations

import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from jaxdbg import _compat
from jaxdbg.jaxpr import RULES, Hooks, Interpreter, Stop, interpret


@jax.custom_vjp
def _scaled_sin(x):
    return jnp.sin(x)


def _scaled_sin_fwd(x):
    return jnp.sin(x), x


def _scaled_sin_bwd(x, g):
    return (2.0 * g * jnp.cos(x),)


_scaled_sin.defvjp(_scaled_sin_fwd, _scaled_sin_bwd)


@jax.custom_jvp
def _softplus(x):
    return jnp.log1p(jnp.exp(x))


@_softplus.defjvp
def _softplus_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return _softplus(x), t * jax.nn.sigmoid(x)


def everything(x):
    """Uses every higher-order primitive the interpreter descends into (except shard_map)."""
    y = jax.checkpoint(lambda z: jnp.sqrt(z + 1.0))(x)
    carry, ys = jax.lax.scan(lambda c, a: (c + jnp.log(a + 2.0), c * a), 0.0, x)
    back, _ = jax.lax.scan(lambda c, a: (c * 0.5 + a, c), 1.0, x, reverse=True)
    branch = jax.lax.cond(carry > 0, lambda v: v + 1.0, lambda v: v - 1.0, back)
    inner = jax.jit(lambda v: jnp.tanh(v) * 3.0)(branch)
    return (jnp.sum(_scaled_sin(x)) + jnp.sum(_softplus(y)) + inner + ys.sum()
            + jax.vmap(jnp.cos)(x).sum())


def looped(x, n):
    return jax.lax.while_loop(lambda s: s[0] < n, lambda s: (s[0] + 1, s[1] * 1.5 + 1.0), (0, x))[1]


class Recorder(Hooks):
    def __init__(self) -> None:
        self.seen: list[tuple[tuple[str, ...], str, bool]] = []
        self.opaque_calls: list[str] = []

    def after(self, site, invals, outvals, in_tags, out_tags, descended):
        self.seen.append((site.path, site.primitive, descended))

    def opaque(self, site, reason):
        self.opaque_calls.append(site.primitive)


X = jnp.array([0.5, 1.0, 2.0])


@pytest.mark.parametrize("fn", [everything, jax.grad(everything)], ids=["forward", "gradient"])
def test_values_match_compiled_jax(fn) -> None:
    closed = jax.make_jaxpr(fn)(X)
    hooks = Recorder()
    (out,) = interpret(closed, [X], hooks=hooks)
    np.testing.assert_allclose(out, jax.jit(fn)(X), rtol=1e-5)
    assert hooks.opaque_calls == []
    paths = {path for path, _, _ in hooks.seen}
    assert ("jit(f)", "checkpoint") in paths
    assert ("jit(f)", "scan[iteration=2]") in paths


def test_paths_name_each_structure() -> None:
    hooks = Recorder()
    interpret(jax.make_jaxpr(everything)(X), [X], hooks=hooks, root="jit(everything)")
    paths = [path for path, _, _ in hooks.seen]
    assert ("jit(everything)", "custom_vjp(_scaled_sin)") in paths
    assert ("jit(everything)", "custom_jvp(_softplus)") in paths
    assert ("jit(everything)", "jit(<lambda>)") in paths
    # carry = sum(log(x + 2)) > 0 on X: only the true branch (index 1) runs
    assert ("jit(everything)", "cond[branch=1]") in paths and ("jit(everything)", "cond[branch=0]") not in paths
    # the higher-order equations themselves are reported as descended
    assert ((("jit(everything)",), "scan", True)) in hooks.seen


def test_reverse_scan_visits_elements_last_to_first() -> None:
    hooks = Recorder()
    fn = lambda x: jax.lax.scan(lambda c, a: (c * 0.5 + jnp.exp(a), c), 1.0, x, reverse=True)  # noqa: E731
    interpret(jax.make_jaxpr(fn)(X), [X], hooks=hooks)
    order = [path[-1] for path, prim, _ in hooks.seen if prim == "exp"]
    assert order == ["scan[iteration=2]", "scan[iteration=1]", "scan[iteration=0]"]


def _cube_root(a):
    """a ** (1/3) by bisection under lax.custom_root; its gradient divides by the derivative 3 x**2."""
    def bisect(f, x0):
        lo, hi = jax.lax.fori_loop(0, 30, lambda _, b: jax.lax.cond(f(0.5 * (b[0] + b[1])) > 0,
                                                                    lambda b: (b[0], 0.5 * (b[0] + b[1])),
                                                                    lambda b: (0.5 * (b[0] + b[1]), b[1]), b),
                                   (x0 - 4.0, x0 + 4.0))
        return 0.5 * (lo + hi)
    return jax.lax.custom_root(lambda x: x ** 3 - a, 0.0, bisect, lambda g, y: y / g(1.0))


def test_the_gradient_of_a_custom_root_is_replayed_inside_its_calls() -> None:
    """jax 0.11 writes custom_root's transpose as an ``eval_jaxpr`` equation: the replay goes into it, so the
    tangent solve's division is an equation of its own (nan-hunt names it, not the whole custom_root line)."""
    hooks = Recorder()
    closed = jax.make_jaxpr(jax.grad(_cube_root))(8.0)
    (out,) = interpret(closed, [8.0], hooks=hooks)
    assert float(out) == pytest.approx(float(jax.grad(_cube_root)(8.0)), rel=1e-4)
    assert not hooks.opaque_calls and all(descended for _, prim, descended in hooks.seen if prim == "eval_jaxpr")
    assert "div" in {prim for _, prim, _ in hooks.seen}


def test_while_iterations_and_cond() -> None:
    hooks = Recorder()
    (out,) = interpret(jax.make_jaxpr(looped)(1.0, 3), [1.0, 3], hooks=hooks, root="jit(looped)")
    assert float(out) == pytest.approx(float(jax.jit(looped)(1.0, 3)))
    body = sorted({p[-1] for p, _, _ in hooks.seen if p[-1].startswith("while[iteration")})
    assert body == ["while[iteration=0]", "while[iteration=1]", "while[iteration=2]"]
    assert any(p[-1] == "while[cond, iteration=3]" for p, _, _ in hooks.seen)


def test_no_rule_means_run_whole_and_say_so() -> None:
    hooks = Recorder()
    closed = jax.make_jaxpr(everything)(X)
    (out,), _ = Interpreter(hooks, rules={}).run(closed, [X])
    np.testing.assert_allclose(out, jax.jit(everything)(X), rtol=1e-5)
    assert {"scan", "cond", "jit", "custom_vjp_call", "custom_jvp_call", "remat2"} <= set(hooks.opaque_calls)
    assert all(path == ("jit(f)",) for path, _, _ in hooks.seen)


def test_before_can_replace_an_equation() -> None:
    class ZeroLogs(Hooks):
        def before(self, site, invals, in_tags):
            return [jnp.zeros_like(invals[0])] if site.primitive == "log" else None

    closed = jax.make_jaxpr(lambda x: jnp.log(x) + 1.0)(X)
    (out,) = interpret(closed, [X], hooks=ZeroLogs())
    np.testing.assert_array_equal(out, np.ones(3))


def test_tags_flow_through_loops_and_calls() -> None:
    class Taint(Hooks):
        def after(self, site, invals, outvals, in_tags, out_tags, descended):
            if descended:
                return None
            tainted = any(t for t in in_tags)
            return [tainted or None] * len(outvals)

    def f(x, y):
        c, _ = jax.lax.scan(lambda c, a: (c + a, None), 0.0, x)
        return jax.jit(lambda v: v * 2.0)(c), y + 1.0

    closed = jax.make_jaxpr(f)(X, 1.0)
    _, tags = Interpreter(Taint()).run(closed, [X, 1.0], tags=[True, None])
    assert tags == [True, None]


def test_stop_reaches_the_caller() -> None:
    class StopAtLog(Hooks):
        def after(self, site, invals, outvals, in_tags, out_tags, descended):
            if site.primitive == "log":
                raise Stop()

    with pytest.raises(Stop):
        interpret(jax.make_jaxpr(everything)(X), [X], hooks=StopAtLog())


def test_shard_map_body_runs_per_device_in_lockstep() -> None:
    if len(jax.devices()) < 4:
        pytest.skip("needs 4 devices")
    mesh = jax.make_mesh((2, 2), ("a", "b"), axis_types=(jax.sharding.AxisType.Auto,) * 2)

    clip = jax.jit(lambda v, low: (jnp.maximum(v, low), 0.5))  # called with a constant; returns one

    def body(block):
        i = jax.lax.axis_index("a")
        gathered = jax.lax.all_gather(block, "b", tiled=True)
        clipped, half = clip(block, 2.0)  # literals in and out of a call: stacked per device like the rest
        return jax.lax.psum(jnp.log(block) * i, "b") + jax.lax.pmax(block, "a") + gathered[2:] + clipped * half

    fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("a", "b"), out_specs=P(None, "b"), check_vma=False))
    x = jnp.arange(1.0, 17.0).reshape(4, 4)
    hooks = Recorder()
    (out,) = interpret(jax.make_jaxpr(fn)(x), [x], hooks=hooks)
    np.testing.assert_allclose(out, fn(x), rtol=1e-6)
    log_sites = [path for path, prim, _ in hooks.seen if prim == "log"]
    assert log_sites and log_sites[0][-1] == "shard_map"
    assert hooks.opaque_calls == []


def test_retrace_keeps_user_source_lines() -> None:
    def f(x):
        return jnp.log(x) * 2.0  # the line the retraced equation must still point at

    closed = jax.make_jaxpr(f)(X)
    interp = Interpreter(keep_source=True)
    retraced = jax.make_jaxpr(lambda x: interp.run(closed, [x])[0])(X)
    sources = {_compat.eqn_source(e) for e in retraced.jaxpr.eqns}
    assert any(s is not None and s.function.endswith("retrace_keeps_user_source_lines.<locals>.f") for s in sources)


CHAIN = 25


def _chain(x):
    for _ in range(CHAIN):
        x = jnp.sin(x)
    return x


_chain_jvp = jax.custom_jvp(_chain)
_chain_jvp.defjvp(lambda primals, tangents: (_chain(*primals), tangents[0]))
_chain_vjp = jax.custom_vjp(_chain)
_chain_vjp.defvjp(lambda x: (_chain(x), None), lambda _, g: (g,))


def chains(x):
    """A chain of CHAIN sin equations at the top and inside every structure the interpreter descends into."""
    looped, _ = jax.lax.scan(lambda c, a: (_chain(c + a), None), x, jnp.stack([x, x]))
    counted = jax.lax.while_loop(lambda s: s[0] < 2, lambda s: (s[0] + 1, _chain(s[1])), (0, x))[1]
    branch = jax.lax.cond(x.sum() > 0, _chain, lambda v: v, x)
    called = jax.jit(_chain)(x) + jax.checkpoint(_chain)(x) + _chain_jvp(x) + _chain_vjp(x)
    return _chain(x) + looped + counted + branch + called


class Liveness(Hooks):
    """Weak references to every sin output; at each sin, how many earlier ones of the same jaxpr still live."""

    def __init__(self) -> None:
        self.refs: dict[tuple[str, ...], list] = {}
        self.most_alive: dict[tuple[str, ...], int] = {}

    def after(self, site, invals, outvals, in_tags, out_tags, descended):
        if site.primitive == "sin":
            refs = self.refs.setdefault(site.path, [])
            alive = sum(ref() is not None for ref in refs)
            self.most_alive[site.path] = max(self.most_alive.get(site.path, 0), alive)
            refs.extend(weakref.ref(v) for v in outvals)


def test_values_are_freed_after_their_last_use() -> None:
    """Only the sin being evaluated keeps its input alive: the rest of the chain is gone, in every structure."""
    x = jnp.linspace(0.5, 1.5, 64)
    hooks = Liveness()
    (out,) = interpret(jax.make_jaxpr(chains)(x), [x], hooks=hooks, root="jit(chains)")
    np.testing.assert_allclose(out, jax.jit(chains)(x), rtol=1e-5)
    kinds = {path[-1].split("(")[0].split("[")[0] for path in hooks.most_alive}
    assert kinds == {"jit", "scan", "while", "cond", "checkpoint", "custom_jvp", "custom_vjp"}
    assert all(len(refs) == CHAIN for refs in hooks.refs.values())
    assert hooks.most_alive == dict.fromkeys(hooks.most_alive, 1)


def test_default_rule_table_covers_the_higher_order_primitives() -> None:
    for name in ("jit", "scan", "while", "cond", "custom_jvp_call", "custom_vjp_call", "remat2", "shard_map"):
        assert name in RULES


class CallInputs(Hooks):
    """The inputs ``after`` sees for each nested jit; ``keep`` asks for them."""

    def __init__(self, keep: bool) -> None:
        self.keep, self.seen = keep, []

    def keeps_inputs(self, site):
        return self.keep

    def after(self, site, invals, outvals, in_tags, out_tags, descended):
        if descended:
            self.seen.append(len(invals))


@pytest.mark.parametrize("keep", [False, True])
def test_a_nested_call_hands_its_inputs_over_unless_a_hook_keeps_them(keep) -> None:
    """A nested jit's inputs go to its own jaxpr, which frees each after its last use inside; ``after`` then sees
    none, unless the hook asked to keep them (and the call's inputs live until it is done)."""
    x = jnp.linspace(0.5, 1.5, 8)
    hooks = CallInputs(keep)
    (out,) = interpret(jax.make_jaxpr(lambda v: jax.jit(lambda a, b: a * b)(v, v + 1.0))(x), [x], hooks=hooks)
    np.testing.assert_allclose(out, x * (x + 1.0), rtol=1e-6)
    assert hooks.seen == [2 if keep else 0]


def test_glibcs_free_memory_is_given_back_after_every_so_many_bytes_made(monkeypatch) -> None:
    """A trim per TRIM_AFTER_BYTES of arrays the equations made (inner jaxprs' equations counted, the call
    around them not twice); a retrace on tracers makes no arrays and never trims."""
    import jaxdbg._malloc as malloc
    import jaxdbg.jaxpr.interpreter as interpreter

    trims: list[int] = []
    monkeypatch.setattr(malloc, "trim", lambda: trims.append(1) or True)
    monkeypatch.setattr(interpreter, "TRIM_AFTER_BYTES", 3 * 4000)

    def f(x):  # six equations each making 4000 bytes, two of them inside a nested jit
        y = jax.jit(lambda v: jnp.sin(v) * 2.0)(x + 1.0)
        return jnp.exp(y) - x, y * 3.0

    x = jnp.ones(1000, jnp.float32)
    closed = jax.make_jaxpr(f)(x)
    outs = interpret(closed, [x])
    np.testing.assert_allclose(outs[0], f(x)[0], rtol=1e-6)
    assert len(trims) == 2
    trims.clear()
    jax.make_jaxpr(lambda v: interpret(closed, [v]))(x)
    assert trims == []
