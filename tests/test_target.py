"""TARGET parsing, function loading, --args/--inputs, and scripts run as __main__."""

import os
import sys

import numpy as np
import pytest

from jaxdbg._errors import TargetFailedError, UsageError
from jaxdbg.target import (
    check_inputs,
    load_function,
    load_inputs,
    load_npz_inputs,
    parse_args_spec,
    parse_target,
    random_inputs,
    run_script,
    short_dtype,
)


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(
        "import jax.numpy as jnp\n"
        "def loss(x, y):\n    return jnp.sum(x * y)\n"
        "class Net:\n    @staticmethod\n    def apply(x):\n        return x + 1\n"
        "def make_inputs():\n    return (jnp.ones(3), jnp.ones(3))\n"
        "def make_one():\n    return jnp.ones(2)\n"
    )
    return path


def test_parse_script_with_args(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    spec = parse_target(str(script), ["--steps", "3"])
    assert spec.kind == "script" and spec.path == str(script) and spec.script_args == ("--steps", "3")


def test_parse_file_function_and_module_function(model_file):
    spec = parse_target(f"{model_file}::loss")
    assert (spec.kind, spec.path, spec.function) == ("function", str(model_file), "loss")
    spec = parse_target("os.path:join")
    assert (spec.module, spec.function) == ("os.path", "join")


@pytest.mark.parametrize("text, fragment", [
    ("missing.py", "no such file"),
    ("missing.py::f", "no such file"),
    ("not a target", "is not a script"),
    ("", "no TARGET"),
])
def test_parse_rejects_bad_targets(text, fragment):
    with pytest.raises(UsageError, match=fragment) as info:
        parse_target(text)
    assert "\n" not in info.value.message


def test_parse_rejects_folder_and_non_python(tmp_path):
    with pytest.raises(UsageError, match="is a folder"):
        parse_target(str(tmp_path) + "/")
    data = tmp_path / "data.txt"
    data.write_text("x")
    with pytest.raises(UsageError, match="not a Python file"):
        parse_target(f"{data}::f")


def test_load_function_forms(model_file):
    assert load_function(parse_target(f"{model_file}::loss"))(np.ones(2), np.ones(2)) == 2.0
    assert load_function(parse_target(f"{model_file}::Net.apply"))(1) == 2
    assert load_function(parse_target("os.path:join"))("a", "b") == os.path.join("a", "b")


def test_unknown_function_lists_callables(model_file):
    with pytest.raises(UsageError, match=r"no function 'lost'.*loss"):
        load_function(parse_target(f"{model_file}::lost"))


def test_unknown_module():
    with pytest.raises(UsageError, match=r"cannot import module 'no_such_pkg_xyz\.mod'"):
        load_function(parse_target("no_such_pkg_xyz.mod:f"))


def test_syntax_error_is_usage_error(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(:\n    pass\n")
    with pytest.raises(UsageError, match="syntax error at line 1"):
        load_function(parse_target(f"{bad}::f"))


def test_import_failure_is_target_failure(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom at import')\ndef f():\n    pass\n")
    with pytest.raises(TargetFailedError, match="RuntimeError: boom at import"):
        load_function(parse_target(f"{broken}::f"))


def test_args_spec_all_dtypes_and_scalars():
    specs = parse_args_spec("bool[2] i8[2] i16[2] i32[8] i64[1] u8[3] u32[2] f16[2] bf16[4] f32[8,128] f64[] f32[]")
    arrays = random_inputs(specs, seed=1)
    assert [short_dtype(a.dtype) for a in arrays] == [
        "bool", "i8", "i16", "i32", "i64", "u8", "u32", "f16", "bf16", "f32", "f64", "f32"]
    assert arrays[9].shape == (8, 128) and arrays[10].shape == () and arrays[11].shape == ()
    assert (arrays[5] >= 0).all()


def test_args_spell_prng_keys():
    import jax

    specs = parse_args_spec("key key:7 key[3] KEY:7[2,2] PRNGKey prngkey:7[4] f32[2]")
    assert [str(s) for s in specs] == ["key[]", "key:7[]", "key[3]", "key:7[2,2]", "PRNGKey[]", "PRNGKey:7[4]",
                                       "f32[2]"]
    keys = random_inputs(specs, seed=5)
    same = jax.random.key_data
    assert keys[0].dtype == jax.random.key(0).dtype and keys[0].shape == () and keys[2].shape == (3,)
    np.testing.assert_array_equal(same(keys[0]), same(jax.random.key(5)))  # a bare key comes from --seed
    np.testing.assert_array_equal(same(keys[1]), same(jax.random.key(7)))
    np.testing.assert_array_equal(same(keys[3]).reshape(4, -1), same(jax.random.split(jax.random.key(7), 4)))
    np.testing.assert_array_equal(keys[4], jax.random.PRNGKey(5))  # raw: uint32 key data, as PRNGKey gives
    assert isinstance(keys[5], np.ndarray) and keys[5].shape == (4, 2) and keys[6].shape == (2,)


def test_args_are_seeded():
    spec = parse_args_spec("f32[4,4]")
    np.testing.assert_array_equal(random_inputs(spec, seed=3)[0], random_inputs(spec, seed=3)[0])
    assert not np.array_equal(random_inputs(spec, seed=3)[0], random_inputs(spec, seed=4)[0])


@pytest.mark.parametrize("text, fragment", [
    ("f33[2]", "unknown dtype 'f33'"),
    ("f32[2", "cannot read"),
    ("f32[a,b]", "cannot read"),
    ("", "--args is empty"),
    ("key:x", "cannot read"),
    ("key:-1", "cannot read"),
])
def test_bad_args_spec(text, fragment):
    with pytest.raises(UsageError, match=fragment):
        parse_args_spec(text)


def test_npz_positional_order(tmp_path):
    path = tmp_path / "in.npz"
    np.savez(path, arg1=np.zeros(2), arg0=np.ones(3), arg10=np.ones(1), arg2=np.ones(4))
    shapes = [a.shape for a in load_npz_inputs(str(path))]
    assert shapes == [(3,), (2,), (4,), (1,)]
    default = tmp_path / "default.npz"
    np.savez(default, np.ones(1), np.zeros(2))
    assert [a.shape for a in load_npz_inputs(str(default))] == [(1,), (2,)]


def test_npz_with_objects_is_refused(tmp_path):
    path = tmp_path / "objects.npz"
    np.savez(path, arg0=np.array([{"a": 1}], dtype=object))
    with pytest.raises(UsageError, match="Python objects"):
        load_npz_inputs(str(path))


def test_npz_unreadable_or_misnamed(tmp_path):
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip file")
    with pytest.raises(UsageError, match="not a readable npz"):
        load_npz_inputs(str(junk))
    named = tmp_path / "named.npz"
    np.savez(named, weights=np.ones(2))
    with pytest.raises(UsageError, match="named arg0, arg1"):
        load_npz_inputs(str(named))
    with pytest.raises(UsageError, match="no such file"):
        load_npz_inputs(str(tmp_path / "absent.npz"))


def test_load_inputs_from_maker(model_file):
    assert len(load_inputs(f"{model_file}::make_inputs", None)) == 2
    assert len(load_inputs(f"{model_file}::make_one", None)) == 1  # a lone value becomes a 1-tuple
    with pytest.raises(UsageError, match="either --args or --inputs"):
        load_inputs(f"{model_file}::make_inputs", "f32[2]")
    assert load_inputs(None, None) == ()  # a function that takes none (check_inputs lets only those through)


def test_a_function_that_takes_nothing_needs_no_inputs(tmp_path):
    module = tmp_path / "nullary.py"
    module.write_text("import jax\n\n@jax.jit\ndef f(scale=2.0, *, shift=0.0):\n    return scale + shift\n\n"
                      "def g(x, y=1):\n    return x\n\ndef h(*, x):\n    return x\n")
    check_inputs(parse_target(f"{module}::f"), None, None)  # no --args: nothing to say
    for name in ("g", "h"):  # a required parameter, positional or keyword-only
        with pytest.raises(UsageError, match="needs inputs"):
            check_inputs(parse_target(f"{module}::{name}"), None, None)
    sys.path.insert(0, str(tmp_path))  # module:function, found on sys.path without importing it
    try:
        check_inputs(parse_target("nullary:f"), None, None)
        with pytest.raises(UsageError, match="needs inputs"):
            check_inputs(parse_target("nullary:g"), None, None)
    finally:
        sys.path.remove(str(tmp_path))


def test_run_script_as_main_restores_state(tmp_path):
    (tmp_path / "helper_mod_for_test.py").write_text("VALUE = 7\n")
    script = tmp_path / "main_script.py"
    script.write_text(
        "import sys\nimport helper_mod_for_test\n"
        "ARGV = list(sys.argv)\nNAME = __name__\nV = helper_mod_for_test.VALUE\n"
    )
    before_argv, before_path = sys.argv[:], sys.path[:]
    spec = parse_target(str(script), ["--lr", "0.1"])
    result = run_script(spec)
    assert result["NAME"] == "__main__" and result["V"] == 7
    assert result["ARGV"] == [str(script), "--lr", "0.1"]
    assert sys.argv == before_argv and sys.path == before_path
    sys.modules.pop("helper_mod_for_test", None)


def test_check_target_without_running_user_code(tmp_path, model_file):
    from jaxdbg.target import check_target

    check_target(parse_target(f"{model_file}::Net.apply"))
    with pytest.raises(UsageError, match="no function 'lost' there; names defined: Net, jnp, loss"):
        check_target(parse_target(f"{model_file}::lost"))
    side_effect = tmp_path / "side.py"
    side_effect.write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\ndef f():\n    pass\n")
    with pytest.raises(UsageError):
        check_target(parse_target(f"{side_effect}::g"))
    assert not (tmp_path / "ran").exists()
