"""jaxpr -> plain jax/lax Python: the emitted code imports only jax and numpy and computes the same values."""

import ast

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jaxdbg.jaxpr.emit import EmitError, emit_jaxpr, param_expr


def _run_emitted(fn, *args):
    closed = jax.make_jaxpr(fn)(*args)
    emitted = emit_jaxpr(closed, name="f")
    namespace = {}
    exec(compile(emitted.module_source(), "<emitted>", "exec"), namespace)
    return emitted, namespace["f"](*args)


def _imports(source):
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add(node.module.split(".")[0])
    return names


@jax.custom_jvp
def _soft(x):
    return jnp.log1p(jnp.exp(x))


_soft.defjvp(lambda p, t: (_soft(p[0]), t[0] * jax.nn.sigmoid(p[0])))


PROGRAMS = {
    "elementwise": lambda x: jnp.tanh(x) * 2.0 + jnp.exp(-x) / (1.0 + x * x) - jnp.sqrt(jnp.abs(x)) ** 3,
    "matmul_reduce": lambda x: (x @ x.T).sum(axis=0) + jnp.max(x, axis=1) - x.mean(),
    "shapes": lambda x: jnp.concatenate([x.reshape(2, -1).T, x[:, 1:3].reshape(-1, 2)], axis=0)[::2],
    "indexing": lambda x: x.at[1, 2].add(5.0)[jnp.array([0, 2])] + jnp.argmax(x, axis=1)[:2, None],
    "control_flow": lambda x: (
        lax.scan(lambda c, r: (c + r.sum(), c * r), 0.0, x)[1]
        + lax.while_loop(lambda s: s[0] < 3, lambda s: (s[0] + 1, s[1] * 1.5), (0, x))[1]
        + lax.cond(x.sum() > 0, lambda y: y * 2, lambda y: -y, x)),
    "nested_jit_custom_jvp": lambda x: jax.jit(lambda y: _soft(y) * jax.nn.relu(y))(x).cumsum(axis=0),
    "sort_where_iota": lambda x: jnp.where(x > 0, jnp.sort(x, axis=1), jnp.arange(x.shape[1], dtype=x.dtype)),
    "grad": lambda x: jax.grad(lambda y: jnp.sum(jnp.sin(y) * y))(x),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_emitted_code_computes_the_same_values(name):
    x = jnp.asarray(np.random.default_rng(0).standard_normal((4, 4)), jnp.float32)
    emitted, got = _run_emitted(PROGRAMS[name], x)
    want = jax.jit(PROGRAMS[name])(x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    assert _imports(emitted.module_source()) <= {"jax", "numpy"}
    assert "pjit" not in emitted.source and "custom_jvp" not in emitted.source  # inlined


def test_emitted_source_reads_like_lax():
    emitted, _ = _run_emitted(lambda x: jnp.log(x) * 2.0, jnp.float32(3.0))
    assert emitted.source.splitlines() == [
        "def f(a):", "    b = lax.log(a)", "    c = lax.mul(b, np.float32(2.0))", "    return c"]


def test_host_callback_cannot_be_emitted():
    def with_callback(x):
        return jax.pure_callback(lambda v: np.asarray(v) * 2, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    with pytest.raises(EmitError):
        emit_jaxpr(jax.make_jaxpr(with_callback)(jnp.ones(3)))


def test_parameters_have_public_spellings():
    assert param_expr(lax.Precision.HIGHEST) == "lax.Precision.HIGHEST"
    assert param_expr(np.dtype("float32")) == "np.float32"
    assert param_expr((np.int64(2), 3)) == "(2, 3)"
    dims = lax.GatherDimensionNumbers(offset_dims=(1,), collapsed_slice_dims=(0,), start_index_map=(0,))
    assert eval(param_expr(dims), {"lax": lax}) == dims
    with pytest.raises(EmitError):
        param_expr(object())


def _bf16_dense(x, w):
    """Mixed precision as Flax writes it (dtype=bfloat16, param_dtype=float32): cast, matmul, cast back."""
    y = jnp.dot(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)) * jnp.asarray(0.125, jnp.bfloat16)
    return jax.nn.gelu(y + jnp.arange(y.shape[-1], dtype=jnp.bfloat16)).astype(jnp.float32)


def _bf16_constant(x):
    """A bf16 constant array closed over by the jitted function, and low-precision casts (float8, int4)."""
    table = jnp.asarray([0.5, -1.25, 2.0, 3.5], jnp.bfloat16)
    scaled = x.astype(jnp.float8_e4m3fn).astype(jnp.bfloat16) * table + jnp.bfloat16(jnp.inf)
    return scaled.astype(jnp.float32) + x.astype(jnp.int4).astype(jnp.float32)


@pytest.mark.parametrize("fn", [_bf16_dense, _bf16_constant], ids=["cast", "constant"])
def test_ml_dtypes_in_parameters_and_constants_are_written(fn):
    rng = np.random.default_rng(1)
    args = [jnp.asarray(rng.standard_normal((3, 4)), jnp.float32)]
    if fn is _bf16_dense:
        args.append(jnp.asarray(rng.standard_normal((4, 4)), jnp.float32))
    emitted = emit_jaxpr(jax.make_jaxpr(fn)(*args), name="f")
    namespace = {}
    exec(compile(emitted.module_source(), "<emitted>", "exec"), namespace)
    assert "jnp.bfloat16" in emitted.source and _imports(emitted.module_source()) <= {"jax", "numpy"}
    # both jitted: XLA computes bf16 elementwise chains in f32 when it fuses them, op-by-op rounds each step
    np.testing.assert_array_equal(np.asarray(jax.jit(namespace["f"])(*args)), np.asarray(jax.jit(fn)(*args)))


def test_a_collective_over_a_named_axis_is_written_as_lax():
    """A psum whose axis no vmap/shard_map binds (a BatchNorm's axis_name left unbound) reads as lax.psum and
    fails the same way when run."""
    closed = jax.make_jaxpr(lambda x: lax.psum(x, "batch") + lax.pmax(x, "batch"), axis_env=[("batch", 4)])(
        jnp.ones(3))
    emitted = emit_jaxpr(closed, name="f")
    assert "lax.psum(a, ('batch',))" in emitted.source and "lax.pmax(a, ('batch',))" in emitted.source
    assert not emitted.uses_prims
    namespace = {}
    exec(compile(emitted.module_source(), "<emitted>", "exec"), namespace)
    with pytest.raises(NameError, match="unbound axis name: batch"):
        jax.jit(namespace["f"])(jnp.ones(3))
