"""profile on the real-program corpus (tests/corpus/): each recompile is explained by the difference jax
compiled for, named as the user names it (a Flax TrainState's step, an Equinox argument, an NNX module's
field), and the main cause is counted in recompiles. The fast checks below pin the same rules on values."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdbg import jit_layer
from jaxdbg.cli import main
from jaxdbg.profile.model import ArgChange, Recompile
from jaxdbg.profile.signature import call_signature, explain, main_cause

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def _line_of(path: str, marker: str) -> int:
    with open(path) as handle:
        return next(i for i, text in enumerate(handle, start=1) if marker in text)


def _profile(program: str, tmp_path, capsys, needs: str = "") -> dict:
    if needs:
        pytest.importorskip(needs)
    code = main(["profile", os.path.join(CORPUS, program), "--trace-calls", "0", "--json", "-",
                 "--out", str(tmp_path / "out")])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report["result"].get("error")
    return report["result"]


def _function(result: dict, name: str) -> dict:
    return next(f for f in result["functions"] if f["name"] == name)


def _changes(function: dict) -> dict[int, set[tuple]]:
    return {r["call_index"]: {(c["argument"], c["kind"], c["before"], c["after"]) for c in r["changes"]}
            for r in function["recompiles"]}


def _main_cause_hint(result: dict, name: str) -> str:
    return next(h for h in result["hints"] if h.startswith(f"{name} compiled"))


def test_mnist_from_scratch_recompiles_for_the_ragged_batch_not_for_float64_params(tmp_path, capsys):
    # numpy float64 params at call 0 and the float32 arrays update returns share one compile (no x64).
    result = _profile("mnist_ragged_batch/train.py", tmp_path, capsys)
    update = _function(result, "update")
    assert update["compiles"] == 2 and update["execute"]["calls"] == 24
    assert _changes(update) == {7: {("batch[0]", "shape", "(128, 784)", "(104, 784)"),
                                    ("batch[1]", "shape", "(128, 10)", "(104, 10)")}}
    assert "params[0][0]: f32[784, 256]" in update["compilations"][0]["signature"]
    assert "on 1 of 1 recompiles: shape changes" in _main_cause_hint(result, "update")


def test_trainstate_step_from_python_int_to_array_is_no_cause(tmp_path, capsys):
    result = _profile("linen_trainstate_padding/train.py", tmp_path, capsys, "flax")
    step = _function(result, "train_step")
    changes = _changes(step)
    assert sorted(changes) == [1, 3]  # the batches' longest sentences: 59, 60, 59, 58, 60, 60
    assert changes[1] == {("batch['mask']", "shape", "(16, 59)", "(16, 60)"),
                          ("batch['tokens']", "shape", "(16, 59)", "(16, 60)")}
    assert {arg for arg, *_ in changes[3]} == {"batch['mask']", "batch['tokens']"}
    assert not any("step" in r["reason"] for r in step["recompiles"])
    assert "on 2 of 2 recompiles: shape changes" in _main_cause_hint(result, "train_step")


def test_equinox_filter_jit_is_named_as_the_user_wrote_it(tmp_path, capsys):
    program = os.path.join(CORPUS, "eqx_annealed_temperature/train.py")
    result = _profile(program, tmp_path, capsys, "equinox")
    step = _function(result, "make_step")
    assert step["source"]["file"] == program and step["source"]["line"] == _line_of(program, "@eqx.filter_jit")
    assert [(r["call_index"], r["reason"]) for r in step["recompiles"]] == [
        (4, "static argument 'temperature' changed 2.0 -> 1.0"),
        (8, "static argument 'temperature' changed 1.0 -> 0.5")]
    signature = step["compilations"][0]["signature"]
    assert signature.startswith("model.layers[0].weight: f32[32, 16], model.layers[0].bias: f32[32]")
    assert "dynamic_nodonate" not in signature and "0x" not in signature
    assert "on 2 of 2 recompiles: static changes" in _main_cause_hint(result, "make_step")
    # filter_jit's own wait on each call, at the calling line: once a "block_until_ready" the program never wrote.
    syncs = {(s["kind"], s["source"]["line"]) for s in result["syncs"]}
    assert ("eqx.filter_jit's own wait", _line_of(program, "= make_step(")) in syncs
    assert not any(kind == "block_until_ready" for kind, _ in syncs)


def test_nnx_module_fields_name_the_forgotten_train_mode(tmp_path, capsys):
    result = _profile("nnx_forgot_train_mode/train.py", tmp_path, capsys, "flax")
    train, evaluate = _function(result, "train_step"), _function(result, "eval_step")
    assert _changes(train) == {4: {("model.bn.use_running_average", "static", "False", "True"),
                                   ("model.dropout.deterministic", "static", "False", "True")}}
    assert _changes(evaluate) == {2: {("batch['image']", "shape", "(32, 64)", "(16, 64)"),
                                      ("batch['label']", "shape", "(32,)", "(16,)")}}
    signature = train["compilations"][0]["signature"]
    assert "model.bn.bias: f32[128]" in signature and "states[" not in signature


# ---- the same rules on values, fast ------------------------------------------------------------------------


def step(params, batch):
    return params


def test_signatures_are_what_jax_keys_on():
    host = call_signature(step, ({"w": np.zeros((3, 2))}, 1), {}, ())  # float64 numpy, a Python int
    device = call_signature(step, ({"w": jnp.zeros((3, 2))}, jnp.asarray(1)), {}, ())  # f32, weak i32[]
    assert explain([host], device, same_callable=True).changes == ()
    strong = call_signature(step, ({"w": jnp.zeros((3, 2))}, jnp.asarray(1, jnp.int32)), {}, ())
    why = explain([host], strong, same_callable=True)
    assert [(c.argument, c.kind) for c in why.changes] == [("batch", "weak_type")]
    assert "a Python int (weakly typed i32) -> strongly typed i32" in why.reason


def test_main_cause_counts_recompiles_not_leaves():
    dtype = tuple(ArgChange(f"params[{i}]", "dtype", "f32", "bf16") for i in range(8))
    shape = (ArgChange("batch", "shape", "(8, 4)", "(9, 4)"),)
    assert main_cause([Recompile(1, "", dtype), Recompile(2, "", shape), Recompile(3, "", shape)]) == ("shape", 2)
    assert main_cause([Recompile(1, "")]) == ("unknown", 1)


def test_filter_jit_functions_are_the_users_own():
    # equinox jits one inner function of its own per user function, named after it: two `step`s defined on
    # different lines are two functions, each at its own definition line.
    eqx = pytest.importorskip("equinox")
    records = []

    class Seen(jit_layer.JitHook):
        def before(self, call):
            records.append(call.function.record)

    with jit_layer.installed(Seen()):
        def step(x, scale):  # a second `step`, as if from another module
            return x * scale

        first = eqx.filter_jit(step)

        def step(x, scale):
            return x + scale

        second = eqx.filter_jit(step)
        first(jnp.ones(2), 2.0), second(jnp.ones(2), 2.0)
    assert [r.name for r in records] == ["step", "step"] and records[0] is not records[1]
    here = os.path.abspath(__file__)
    assert [(r.source.file, r.source.line) for r in records] == [
        (here, _line_of(here, "return x * scale") - 1), (here, _line_of(here, "return x + scale") - 1)]


def test_static_values_are_short_and_free_of_addresses():
    eqx = pytest.importorskip("equinox")

    class Head(eqx.Module):
        weight: jax.Array
        activation: object = eqx.field(static=True)

    sig = call_signature(lambda model, hook: 0, (Head(jnp.ones(2), jax.nn.gelu), lambda x: x), {}, (1,))
    described = {path: leaf.describe() for path, leaf in sig.leaves}
    assert described == {"model.weight": "f32[2]", "model.activation": "static gelu",
                         "hook": "static test_static_values_are_short_and_free_of_addresses.<lambda>"}


JIT_PARTIAL = """import jax.numpy as jnp
import optax
from flax import nnx

model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)


def train_step(model, optimizer, x, y):
    loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
    optimizer.update(model, grads)
    return loss


step = nnx.jit_partial(train_step, model, optimizer, graph=False)
for batch in (4, 4, 3):
    step(jnp.ones((batch, 2)), jnp.ones((batch, 3)))
"""


def test_nnx_jit_partial_arguments_are_named_as_the_user_bound_and_passed_them(tmp_path, capsys):
    """jax.jit sees (flat list of the bound model's and optimizer's variables, x, y) behind a wrapper with the
    user's signature: names were one parameter off ('optimizer' for x) before they were mapped back."""
    pytest.importorskip("flax")
    from flax import nnx

    if not hasattr(nnx, "jit_partial"):
        pytest.skip("this flax has no nnx.jit_partial")
    program = tmp_path / "train.py"
    program.write_text(JIT_PARTIAL)
    step = _function(_profile(str(program), tmp_path, capsys), "train_step")
    assert _changes(step) == {2: {("x", "shape", "(4, 2)", "(3, 2)"), ("y", "shape", "(4, 3)", "(3, 3)")}}
    signature = step["compilations"][0]["signature"]
    assert signature.startswith("model.bias: f32[3], model.kernel: f32[2, 3], optimizer.opt_state[0].count: i32[]")


@pytest.fixture(scope="module")
def pmap_run(tmp_path_factory):
    from jaxdbg.profile import ProfileOptions, profile
    from jaxdbg.target import parse_target

    program = os.path.join(CORPUS, "pmap_data_parallel/train.py")
    run = profile(parse_target(program), ProfileOptions(trace_calls=3, calibrate=False),
                  str(tmp_path_factory.mktemp("pmap")))
    return program, run


def test_pmap_is_profiled_as_a_function_compiled_twice_for_a_sharding_change(pmap_run):
    # On jax 0.10 and 0.11 pmap is a jax.jit of a shard_map built inside jax: before, its compile was an
    # eager jit(_fun), its calls went uncounted, and the hint blamed setup work outside jit.
    program, run = pmap_run
    update = next(f for f in run.result.functions if f.name == "update")
    assert run.exit_code == 0 and update.kind == "pmap" and update.source.file == program
    assert update.source.line in (_line_of(program, "@functools.partial(jax.pmap"), _line_of(program, "def update"))
    assert update.compiles == 2 and update.execute.calls == 16 and update.execute.timed_calls >= 3
    assert update.execute.median_s > 0
    (recompile,) = update.recompiles
    kinds = {(c.argument, c.kind) for c in recompile.changes}
    assert recompile.call_index == 1 and ("params[0][0]", "sharding") in kinds  # replicated on one device first
    hint = next(h for h in run.result.hints if h.startswith("update compiled"))
    assert "sharding changes" in hint and "NamedSharding" in hint
    assert not any("_fun" in entry["name"] for entry in run.result.eager_compile["top"])


def test_pmap_executions_per_device_ops_and_transfers(pmap_run):
    _, run = pmap_run
    update = next(f for f in run.result.functions if f.name == "update")
    assert [d.device for d in update.devices] == ["cpu:0", "cpu:1", "cpu:2", "cpu:3"]
    assert all(d.executions == 3 and d.median_s > 0 for d in update.devices)  # the captured calls
    assert any(op.category == "collective" for op in update.ops)  # lax.pmean's all-reduce
    implicit = next(t for t in run.result.transfers if t.kind == "implicit_args")  # the numpy batches
    assert implicit.count == 16 and implicit.bytes == 16 * 256 * (16 + 1) * 4


def test_a_gnn_step_is_gather_and_scatter_bound_not_its_first_matmul_run(tmp_path, capsys):
    """XLA:CPU's first run of a program sets up its kernels (a dot's first run took 75 ms, its next ones 0.06 ms):
    counted, it made a 2000x16 @ 16x16 matmul the hot op of a step whose gathers and scatter-adds over 150000 edges
    take its time. The table leaves each program's first run out, and says so."""
    program = os.path.join(CORPUS, "gnn_segment_sum", "train.py")
    code = main(["profile", program, "--json", "-", "--out", str(tmp_path / "out")])
    result = json.loads(capsys.readouterr().out)["result"]
    assert code == 0, result.get("error")
    ops = _function(result, "train_step")["ops"]
    lines = {_line_of(program, "# <- the gather"), _line_of(program, "# <- the scatter-add")}
    assert ops[0]["category"] == "gather/scatter" and ops[0]["source"]["line"] in lines
    assert all(op["fraction"] < 0.2 for op in ops if op["category"] == "matmul"), ops
    assert all(op["count"] == 5 for op in ops)  # 6 calls, the first left out
    assert any("first run(s) of a program" in note for note in result["notes"])
