"""jaxdbg.watch in a running program: a Flax NNX loop that goes bad at a late step (the same origin nan-hunt
names, the report valid against the schema), a ragged loop that recompiles, action="log", live metrics."""

from __future__ import annotations

import gc
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import weakref
from pathlib import Path
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

import jaxdbg
import jaxdbg.jit_layer
import jaxdbg.nan.watch
from jaxdbg.nan.watch import MAX_PENDING
from jaxdbg.results import read_report
from jaxdbg.schema import schema

DATA = Path(__file__).resolve().parent / "data"
sys.path.insert(0, str(DATA))
import live_nnx_loop  # noqa: E402 - the loop lives in tests/data, shared with scripts/bench_watch.py

SPIKE_AT = 12
ORIGIN_LINE = next(i for i, text in enumerate((DATA / "live_nnx_loop.py").read_text().splitlines(), 1)
                   if "<- origin" in text)


def _check_schema(report: dict) -> None:
    """The report conforms to jaxdbg's schema. jsonschema is a test dependency a machine may lack (the device
    check's): there the test is skipped at this point, its own checks done, so each test calls this last."""
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(report, schema())


def test_nnx_loop_that_spikes_late_raises_with_nan_hunts_origin_and_report(tmp_path):
    with pytest.raises(jaxdbg.NonFiniteError) as raised, jaxdbg.watch(out=str(tmp_path / "w")):
        live_nnx_loop.train(SPIKE_AT + 5, spike_at=SPIKE_AT)
    result = raised.value.report
    first = result["first"]
    # The spike at step 12 blows the weights up; in call 13 (0-based) the output layer's matmul overflows. Which
    # operation then makes the NaN depends on the CPU's summation order (the matmul's own sums, +inf meeting
    # -inf; or, where it returns only Inf, the log-softmax's x - max): the matmul is the origin or in its chain.
    assert (first["kind"], first["pass"], first["function"], first["call_index"]) == (
        "nan", "forward", "train_step", SPIKE_AT + 1)
    matmul = [o for o in (first, *result["chain"]) if o["primitive"] == "dot_general"]
    where = [(Path(o["source"]["file"]).name, o["source"]["line"]) for o in matmul]
    assert where == [("live_nnx_loop.py", ORIGIN_LINE)]
    assert "overflow" in result["explanation"] and "masked" not in result["explanation"]
    assert str(raised.value).startswith("jaxdbg.watch: ") and f"call {SPIKE_AT + 1}" in str(raised.value)
    report = json.loads(Path(raised.value.path).read_text())
    assert (report["command"], report["exit_code"], report["result"]) == ("watch", 1, raised.value.report)
    assert report["artifacts"]["report"] == raised.value.path and Path(report["artifacts"]["inputs"]).exists()

    # The same program under `jaxdbg nan-hunt` names the same origin (the same analysis, run by the CLI).
    script = tmp_path / "spike.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(DATA)!r})\nimport live_nnx_loop\n"
                      f"live_nnx_loop.train({SPIKE_AT + 5}, spike_at={SPIKE_AT})\n")
    done = subprocess.run([sys.executable, "-m", "jaxdbg", "nan-hunt", str(script), "--json", "-", "-q",
                           "--out", str(tmp_path / "hunt")], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    hunted = json.loads(done.stdout)["result"]["first"]
    keys = ("kind", "primitive", "pass", "source", "function", "call_index", "path")
    assert {k: hunted[k] for k in keys} == {k: first[k] for k in keys}
    _check_schema(report)


def test_ragged_batches_with_max_compiles_1_raise_the_shape_cause(tmp_path):
    batches = [np.ones((8, 4), np.float32)] * 3 + [np.ones((5, 4), np.float32)]
    with pytest.raises(jaxdbg.RecompileError) as raised, jaxdbg.watch(out=str(tmp_path), max_compiles=1):
        step = jax.jit(lambda w, batch: jnp.tanh(batch @ w).mean())
        for batch in batches:
            step(jnp.ones((4, 2)), batch)
    result = raised.value.report
    assert (result["function"], result["compiles"], result["max_compiles"]) == ("<lambda>", 2, 1)
    assert result["recompiles"][0]["call_index"] == 3
    assert result["recompiles"][0]["reason"] == "argument 'batch' shape changed (8, 4) -> (5, 4)"
    assert "argument 'batch' shape changed (8, 4) -> (5, 4)" in str(raised.value)
    called_at = result["recompiles"][0]["source"]
    assert (Path(called_at["file"]).name, called_at["function"]) == (
        "test_live_watch.py", "test_ragged_batches_with_max_compiles_1_raise_the_shape_cause")
    assert result["hints"][0].startswith("pad inputs to a few fixed shapes") and "every call" not in str(raised.value)
    _check_schema(json.loads((tmp_path / "report.json").read_text()))


def test_the_programs_own_error_on_seeing_the_nan_keeps_its_place_and_gets_the_origin_as_a_note(tmp_path):
    """`if not isfinite(loss): raise` ends the block before the watch read the bad call's flags: the program's
    exception stays itself, the origin is analysed and written all the same, and its one line is a note on it."""
    here = sys._getframe().f_lineno
    with pytest.raises(RuntimeError) as raised, jaxdbg.watch(out=str(tmp_path)):
        step = jax.jit(lambda x: jnp.log(x).sum())
        if not np.isfinite(float(step(jnp.array([1.0, -1.0])))):
            raise RuntimeError("loss diverged")
    assert str(raised.value) == "loss diverged" and raised.traceback[-1].lineno + 1 == here + 4
    assert raised.value.__notes__ == [f"jaxdbg.watch: nan first made by log (forward pass) at test_live_watch.py:"
                                      f"{here + 2} in <lambda>, call 0 (report: {tmp_path / 'report.json'})"]


def test_a_decorated_step_with_a_static_value_new_at_every_call_names_it_and_the_fix(tmp_path):
    """A schedule's learning rate passed as a static argument recompiles at every call: the error says so, at the
    calling line, with the fix for a static argument."""
    @jaxdbg.watch(out=str(tmp_path), max_compiles=2)
    def train(w):
        step = jax.jit(lambda w, lr: w - lr * w, static_argnames="lr")
        for i in range(5):
            w = step(w, lr=0.1 / (i + 1))  # <- the call
        return w

    with pytest.raises(jaxdbg.RecompileError) as raised:
        train(jnp.ones(2))
    message = str(raised.value)
    assert "compiled 3 times (max_compiles=2, every call since call 1); call 2 at test_live_watch.py:" in message
    assert "static argument 'lr' changed" in message and "fix: each new value of a static argument" in message
    # raised from the call, without the frames of jaxdbg's reading and analysis that found it
    inside = [Path(entry.path).name for entry in raised.traceback if "jaxdbg" in Path(entry.path).parts]
    assert inside == ["jit_layer.py", "jit_layer.py", "hook.py"], inside


def test_log_action_goes_on_and_metrics_are_served(tmp_path, caplog):
    guard = jaxdbg.watch(out=str(tmp_path), max_compiles=1, action="log", metrics_port=0)
    with caplog.at_level(logging.WARNING, logger="jaxdbg"), guard:
        step = jax.jit(lambda x: (jnp.sqrt(x) + 1.0).sum())
        outs = [float(step(jnp.full((n,), v))) for n, v in ((2, 4.0), (2, -1.0), (2, 9.0), (3, -4.0))]
        kept = jax.device_put(jnp.ones((256, 256)), jax.devices()[-1])  # live on cpu:3 when scraped
        families = {f.name: f for f in text_string_to_metric_families(
            urllib.request.urlopen(guard.metrics_url, timeout=10).read().decode())}
    assert outs[0] == 6.0 and np.isnan(outs[1]) and outs[2] == 8.0 and np.isnan(outs[3])  # the run went on
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "sqrt" in lines[0] and "call 1" in lines[0]  # one line per finding
    assert "shape changed (2,) -> (3,)" in lines[1]
    assert [Path(p).name for p in guard.reports] == ["report.json", "report-2.json"]  # one report per finding
    assert json.loads(Path(guard.reports[1]).read_text())["result"]["kind"] == "recompiles"
    # the typed reader reads both findings' reports back (a watch report holds one of three result types)
    read = [read_report(json.loads(Path(path).read_text())).result for path in guard.reports]
    assert (type(read[0]).__name__, read[0].first.primitive) == ("NanHuntResult", "sqrt")
    assert (type(read[1]).__name__, read[1].compiles) == ("RecompileResult", 2)
    assert guard.metrics_url.startswith("http://127.0.0.1:")

    def value(name, sample_name):
        return next(s.value for s in families[name].samples if s.name == sample_name
                    and s.labels == {"function": "<lambda>", "process": "0"})

    assert value("jaxdbg_calls", "jaxdbg_calls_total") == 4
    assert value("jaxdbg_compiles", "jaxdbg_compiles_total") == 2
    assert value("jaxdbg_recompiles", "jaxdbg_recompiles_total") == 1
    assert value("jaxdbg_nonfinite", "jaxdbg_nonfinite_total") >= 1
    assert value("jaxdbg_step_seconds", "jaxdbg_step_seconds") > 0
    assert "jaxdbg_device_memory_bytes" in families or jax.default_backend() == "cpu"  # CPU devices keep no count
    memory = {(s.name, s.labels["device"]): s.value for name in ("jaxdbg_device_memory_live_bytes",
              "jaxdbg_device_memory_peak_bytes") for s in families[name].samples}  # live arrays: CPU too
    device = f"{kept.devices().pop().platform}:{kept.devices().pop().id}"
    assert memory[("jaxdbg_device_memory_live_bytes", device)] >= kept.nbytes
    assert memory[("jaxdbg_device_memory_peak_bytes", device)] >= memory[("jaxdbg_device_memory_live_bytes", device)]
    with pytest.raises(OSError):
        urllib.request.urlopen(guard.metrics_url, timeout=5)  # the server stopped with the watch


class _Trainer:
    """A trainer that jits its step in ``__init__``, as many do: made before the watch, held in a local."""

    def __init__(self):
        self.step = jax.jit(self._step)

    def _step(self, x):
        return jnp.log(x)  # <- the trainer's NaN


def test_a_step_jitted_on_an_instance_before_the_watch_is_watched_and_put_back(tmp_path):
    trainer = _Trainer()
    original = trainer.step
    with pytest.raises(jaxdbg.NonFiniteError) as found, jaxdbg.watch(out=str(tmp_path / "w")):
        trainer.step(jnp.ones(2))
        trainer.step(-jnp.ones(2))
    origin = found.value.report["first"]
    assert (origin["primitive"], origin["call_index"]) == ("log", 1)
    assert "the trainer's NaN" in Path(origin["source"]["file"]).read_text().splitlines()[origin["source"]["line"] - 1]
    assert trainer.step is original  # put back on exit


def test_a_nan_an_eager_grad_made_reaches_the_watch_as_an_argument_with_the_nan_hunt_hint(tmp_path):
    """jax.grad applied outside jit makes the NaN; the watch checks jitted calls only, so it sees it come in as
    the jitted update's argument, and says that nan-hunt (which checks eager operations) names its maker."""
    with pytest.raises(jaxdbg.NonFiniteError) as found, jaxdbg.watch(out=str(tmp_path / "w")):
        update = jax.jit(lambda w, g: w - 0.1 * g)
        w = jnp.zeros(2)
        update(w, jax.grad(lambda w: jnp.linalg.norm(w))(w))  # the norm's gradient at 0: 0 / 0
    report = found.value.report
    assert report["first"]["kind"] == "input" and report["first"]["argument"] == "g"
    assert any("run the script under `jaxdbg nan-hunt`" in hint for hint in report["hints"])


def test_a_watch_that_saw_no_jitted_call_says_what_happened_instead(caplog, tmp_path, monkeypatch):
    early = jax.jit(lambda x: jnp.log(x))
    with caplog.at_level(logging.WARNING, logger="jaxdbg"), jaxdbg.watch():
        early(jnp.array(-1.0))  # jitted before the watch and held in a local variable: not reachable
    assert "no jitted call was watched" in caplog.text and "held in a local variable" in caplog.text
    for transform in (jax.grad, jax.vmap):  # the jitted function is traced by a transformation applied outside jit
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="jaxdbg"), jaxdbg.watch():
            def loss(x):
                return jnp.log(x).sum()
            transform(jax.jit(loss))(jnp.ones(2) if transform is jax.grad else jnp.ones((2, 2)))
        name = f"jax.{transform.__name__}"
        assert f"loss ran only inside {name} applied outside jit" in caplog.text
        assert f"jax.jit({name}(loss))" in caplog.text and "jaxdbg nan-hunt" in caplog.text
    (tmp_path / "compiled_early.py").write_text(
        "import jax, jax.numpy as jnp\nstep = jax.jit(jnp.log).lower(jnp.ones(2)).compile()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import compiled_early

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="jaxdbg"), jaxdbg.watch():
        compiled_early.step(-jnp.ones(2))  # jax's Compiled, made before the watch: it holds no Python function
    assert "step: compiled ahead of time (jax.jit(f).lower(...).compile()) before the watch began" in caplog.text
    del sys.modules["compiled_early"]  # its global is searched by every later watch that sees no call


def test_calls_of_a_function_compiled_ahead_of_time_inside_the_watch_are_watched(tmp_path):
    def step(w, x, k):
        return jnp.sqrt(w - x).sum() * k  # <- origin

    with pytest.raises(jaxdbg.NonFiniteError) as raised, jaxdbg.watch(out=str(tmp_path / "w")):
        compiled = jax.jit(step, static_argnums=2).lower(jnp.ones(3), jnp.zeros(3), 2).compile()
        staged = jax.jit(step, static_argnums=2).trace(jnp.ones(3), jnp.zeros(3), 2).lower().compile()
        assert float(staged(jnp.ones(3), jnp.zeros(3))) == 6.0
        for i in range(4):
            compiled(jnp.ones(3), jnp.full(3, i / 2))
    first = raised.value.report["first"]
    assert (first["primitive"], first["function"], first["call_index"]) == ("sqrt", "step", 4)
    assert first["source"]["line"] == step.__code__.co_firstlineno + 1
    with pytest.raises(jaxdbg.RecompileError) as again, jaxdbg.watch(out=str(tmp_path / "r"), max_compiles=1):
        jax.jit(step, static_argnums=2).lower(jnp.ones(3), jnp.zeros(3), 2).compile()
        jax.jit(step, static_argnums=2).lower(jnp.ones(4), jnp.zeros(4), 2).compile()  # a compile all the same
    assert "argument 'w' shape changed (3,) -> (4,)" in str(again.value)


def test_nested_watches_each_report_what_ran_inside_them(tmp_path):
    """The outer watch read the inner block's NaN first (its hook runs outermost) and raised its own error, with
    its report, inside the inner block: the inner watch reported nothing. Each now reports it; the inner's error
    comes out of the inner block, the outer's at its next call after it."""
    with pytest.raises(jaxdbg.NonFiniteError) as outer_error, jaxdbg.watch(out=str(tmp_path / "outer")) as outer:
        step = jax.jit(lambda w, x: jnp.sqrt(w - x).sum())
        step(jnp.ones(3), jnp.zeros(3))
        with pytest.raises(jaxdbg.NonFiniteError) as inner_error, jaxdbg.watch(out=str(tmp_path / "inner")) as inner:
            for i in range(6):
                step(jnp.ones(3), jnp.full(3, i / 2))
                time.sleep(0.002)  # the earlier calls are read before the next one (the read's 1 ms batching)
        assert inner.reports == [str(tmp_path / "inner" / "report.json")] and not outer.reports[1:]
        step(jnp.ones(3), jnp.zeros(3))
    assert inner_error.value.path == inner.reports[0] and outer_error.value.path == outer.reports[0]
    assert outer.reports == [str(tmp_path / "outer" / "report.json")]
    assert inner_error.value.report["first"]["call_index"] == outer_error.value.report["first"]["call_index"] == 4


PMAPPED = """
from functools import partial

import jax
import jax.numpy as jnp


@partial(jax.pmap, axis_name="d", in_axes=(0, None), static_broadcasted_argnums=2)
def step(x, scale, mode):
    y = jnp.log(x * scale) if mode == "log" else x  # <- origin
    return {"y": y, "mean": jax.lax.pmean(y, "d")}


stuck = jax.pmap(lambda x, n: x * n, static_broadcasted_argnums=1, donate_argnums=0)
"""


def test_pmapped_functions_are_checked_per_device_and_replayed_to_the_device(tmp_path, monkeypatch, caplog):
    """A function pmap'd at module level (with a broadcast argument and a static one) is watched: its outputs are
    checked after each call, and the finding is replayed as jax built the pmap, naming the device whose block
    made the first NaN. One pmap'd with both static and donated arguments cannot be rebuilt: a warning names it."""
    (tmp_path / "pmapped_step.py").write_text(PMAPPED)
    monkeypatch.syspath_prepend(str(tmp_path))
    import pmapped_step

    original, x = pmapped_step.step, jnp.ones((jax.local_device_count(), 3))
    bad = jax.local_devices()[-1]  # cpu:3 here (tests/conftest.py), the one GPU on a 1-GPU machine
    with pytest.raises(jaxdbg.NonFiniteError) as raised, jaxdbg.watch(out=str(tmp_path / "w")):
        clean = pmapped_step.step(x, 2.0, "log")
        pmapped_step.step(x.at[-1, 1].set(-1.0), 2.0, "log")  # the last device's block: log of a negative
    np.testing.assert_allclose(clean["y"], np.log(2.0))  # the pmap's own result
    assert pmapped_step.step is original
    first = raised.value.report["first"]
    origin = next(i for i, text in enumerate(PMAPPED.splitlines(), 1) if "<- origin" in text)
    assert (first["primitive"], first["function"], first["call_index"], first["path"], first["device"]) == (
        "log", "step", 1, ["pmap", "shard_map"], f"{bad.platform}:{bad.id}")
    assert (Path(first["source"]["file"]).name, first["source"]["line"]) == ("pmapped_step.py", origin)
    with caplog.at_level(logging.WARNING, logger="jaxdbg"), jaxdbg.watch(out=str(tmp_path / "w2")):
        pmapped_step.stuck(jnp.ones((1, 2)), 3)
    assert "jax.pmap'd functions (stuck) made before the watch began" in caplog.text and "nan-hunt" in caplog.text


MODULE_LEVEL = """
import equinox as eqx
import jax
import jax.numpy as jnp
from flax import nnx


@jax.jit
def scale(x, factor):
    return x * factor


@eqx.filter_jit
def normalise(x, eps):
    return x / jnp.sqrt(jnp.sum(x * x) + eps)


class Linear(nnx.Module):
    def __init__(self):
        self.w = nnx.Param(jnp.ones((4, 4)))


@nnx.jit
def apply(model, x):
    return jnp.log(x @ model.w)  # <- origin
"""


def test_functions_jitted_at_module_level_before_the_watch_are_watched_and_put_back(tmp_path, monkeypatch):
    (tmp_path / "module_level.py").write_text(MODULE_LEVEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    import module_level  # jitted at import, before any watch: the usual way

    originals = (module_level.scale, module_level.normalise._cached, module_level.apply.jitted_fn)
    model = module_level.Linear()
    with pytest.raises(jaxdbg.NonFiniteError) as raised, jaxdbg.watch(out=str(tmp_path / "w")) as guard:
        x = module_level.normalise(module_level.scale(jnp.ones((2, 4)), 2.0), 0.0)
        module_level.apply(model, x)
        module_level.apply(model, -x)  # log of a negative: NaN at the origin line, call 1 of apply
    first = raised.value.report["first"]
    assert (first["primitive"], first["function"], first["call_index"]) == ("log", "apply", 1)
    origin = next(i for i, text in enumerate(MODULE_LEVEL.splitlines(), 1) if "<- origin" in text)
    assert (Path(first["source"]["file"]).name, first["source"]["line"]) == ("module_level.py", origin)
    assert (module_level.scale, module_level.normalise._cached, module_level.apply.jitted_fn) == originals
    assert not guard.reports[1:]


METHODS = """
import functools

import equinox as eqx
import jax
import jax.numpy as jnp
from flax import nnx


class Scaler:
    def __init__(self, w):
        self.w = w

    @functools.partial(jax.jit, static_argnums=0)
    def apply(self, x):
        return jnp.log(x * self.w)  # <- origin


class Halve(eqx.Module):
    w: jax.Array

    @eqx.filter_jit
    def __call__(self, x):
        return x * self.w


class Double(nnx.Module):
    @nnx.jit
    def __call__(self, x):
        return 2 * x
"""


def test_methods_jitted_at_class_level_before_the_watch_are_watched_and_put_back(tmp_path, monkeypatch):
    (tmp_path / "jitted_methods.py").write_text(METHODS)
    monkeypatch.syspath_prepend(str(tmp_path))
    import jitted_methods as m

    originals = (vars(m.Scaler)["apply"], m.Halve.__call__._cached, m.Double.__call__.jitted_fn)
    scaler, halve, double = m.Scaler(2.0), m.Halve(jnp.full(2, 0.5)), m.Double()
    with pytest.raises(jaxdbg.NonFiniteError) as raised, jaxdbg.watch(out=str(tmp_path / "w")):
        watched = (vars(m.Scaler)["apply"], m.Halve.__call__._cached, m.Double.__call__.jitted_fn)
        assert all(isinstance(f, jaxdbg.jit_layer.InstrumentedJit) for f in watched)
        np.testing.assert_allclose(double(halve(jnp.ones(2))), 1.0)
        scaler.apply(jnp.ones(2))
        scaler.apply(-jnp.ones(2))
    first = raised.value.report["first"]
    assert (first["primitive"], first["function"], first["call_index"]) == ("log", "apply", 1)
    assert (vars(m.Scaler)["apply"], m.Halve.__call__._cached, m.Double.__call__.jitted_fn) == originals


def _nnx_run() -> tuple:
    """An NNX step that updates its module's state and goes NaN at call 1 (log of a negative weight)."""
    from flax import nnx

    class Scale(nnx.Module):
        def __init__(self):
            self.w = nnx.Param(jnp.ones((3,)))
            self.count = nnx.Variable(jnp.zeros((), jnp.int32))

    @nnx.jit
    def step(model, x):
        model.count[...] += 1
        model.w[...] = model.w[...] * 0.5 + x
        return jnp.log(model.w[...]).sum()

    model = Scale()
    losses = [step(model, jnp.full((3,), v)) for v in (1.0, -5.0, 3.0, 2.0, 8.0)]  # no sync: read late
    return np.asarray(model.w[...]), int(model.count[...]), np.asarray(losses)


def test_an_nnx_finding_read_late_is_analysed_without_touching_the_run(tmp_path, caplog):
    """NNX calls are read late like any other (no sync per step): the finding is replayed in NNX's update
    context while later calls are under way or after the block, the program's module state ends as
    without the watch, and jaxdbg's own cache clearing is no recompile."""
    expected = _nnx_run()
    guard = jaxdbg.watch(out=str(tmp_path), max_compiles=1, action="log")
    with caplog.at_level(logging.WARNING, logger="jaxdbg"), guard:
        got = _nnx_run()
    np.testing.assert_array_equal(got[0], expected[0])
    assert got[1] == expected[1] == 5 and np.isnan(got[2][1])
    np.testing.assert_array_equal(got[2], expected[2])
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "log" in lines[0] and "call 1" in lines[0], lines  # no recompile finding
    first = json.loads(Path(guard.reports[0]).read_text())["result"]["first"]
    assert (first["primitive"], first["function"], first["call_index"]) == ("log", "step", 1)
    assert first["source"]["line"] == next(i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1)
                                           if "return jnp.log(model.w[...]).sum()" in text)


class _Tag:
    """Aux data made anew for every call and equal to the last, as Flax NNX's GraphDef is."""

    def __init__(self, name: str):
        self.name = name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Tag) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)


@jax.tree_util.register_pytree_node_class
class _Tagged:
    def __init__(self, value, tag: _Tag):
        self.value, self.tag = value, tag

    def tree_flatten(self):
        return (self.value,), self.tag

    @classmethod
    def tree_unflatten(cls, tag, children):
        return cls(children[0], tag)


def test_unread_calls_keep_their_arrays_but_not_a_fresh_structure_per_call(tmp_path):
    """The inputs of calls not read yet are kept for the replay, but the structure a framework builds anew each
    call is shared with the previous call's (kept, those objects set Python's GC off every few steps of an NNX
    loop); the bad call is still replayed exactly from its own arrays."""
    weights = jnp.full((1200, 1200), 1.0 / 1200)
    tags, unread = [], []
    with pytest.raises(jaxdbg.NonFiniteError) as raised, jaxdbg.watch(out=str(tmp_path)) as watcher:
        hook = watcher._states[-1].hook

        @jax.jit
        def step(tagged, shift):
            w = tagged.value
            return jnp.log(((w @ w) @ w).sum() - shift)

        for call, shift in enumerate([0.0, 1.0, 2.0, 1e9]):
            tag = _Tag("state")
            tags.append(weakref.ref(tag))
            step(_Tagged(weights, tag), shift)
            del tag
            gc.collect()
            unread.append(len(hook._pending))
            assert [ref() is not None for ref in tags] == [True] + [False] * call  # the first one is shared
    assert max(unread) >= 1, unread  # calls were kept unread (a matmul of 1200x1200 outlasts its dispatch)
    first = raised.value.report["first"]
    assert (first["primitive"], first["call_index"]) == ("log", 3)


class _CountingTag(_Tag):
    compares: ClassVar[list] = []

    def __eq__(self, other: object) -> bool:
        _CountingTag.compares.append(1)
        return super().__eq__(other)

    __hash__ = _Tag.__hash__


def test_the_watch_compares_no_structure_of_a_call_jax_did_not_trace(tmp_path, monkeypatch):
    """A framework's structure compares its own (slow) way; jax's dispatch compares it once per call. Kept for the
    replay, the watch shares it with the previous call's without comparing again when jax traced nothing."""
    monkeypatch.setattr(jaxdbg.nan.watch, "READ_EVERY_S", float("inf"))  # the 5 calls stay unread (< a batch)

    def compares(step):
        _CountingTag.compares = []
        for shift in range(5):
            step(_Tagged(jnp.ones(3), _CountingTag("state")), float(shift))
        return len(_CountingTag.compares)

    plain = compares(jax.jit(lambda tagged, shift: tagged.value + shift))
    with jaxdbg.watch(out=str(tmp_path)) as watcher:
        watched = compares(jax.jit(lambda tagged, shift: tagged.value + shift))
        hook = watcher._states[-1].hook
        kept = [call.notes["nan_inputs"].treedef for call in hook._pending]
    assert watched == plain, (watched, plain)
    assert len(kept) == 5 and all(treedef is kept[0] for treedef in kept)  # one structure, shared


def test_the_watch_lets_glibc_keep_freed_memory_while_it_watches_on_cpu(tmp_path, monkeypatch):
    """Kept inputs are freed a step late, at the heap's top, where glibc gave them back and the next step faulted
    them in again: while jaxdbg.watch watches on CPU, glibc keeps up to HOLD_FREED_BYTES; its default is set back
    when the watch ends. nan-hunt's watch (which trims on purpose) leaves the threshold alone, and so does any
    watch off CPU (the kept inputs are device memory there)."""
    import jaxdbg._malloc as malloc
    from jaxdbg.nan.watch import HOLD_FREED_BYTES, Watch

    assert malloc.set_trim_threshold(malloc.GLIBC_TRIM_THRESHOLD) == (sys.platform == "linux")  # glibc here
    thresholds, held = [], [HOLD_FREED_BYTES] if jax.default_backend() == "cpu" else []
    monkeypatch.setattr(malloc, "set_trim_threshold", lambda nbytes: thresholds.append(nbytes) or True)
    with jaxdbg.watch(out=str(tmp_path)):
        step = jax.jit(lambda w: w * 0.5)
        w = step(jnp.ones(8))
        assert thresholds == held  # from the first watched call on
        with jaxdbg.watch(out=str(tmp_path / "inner")):  # nested: the outer one's setting stays
            w = jax.jit(lambda w: w * 0.5)(w)
        assert thresholds == held
        w = step(w)
    assert thresholds == held + [malloc.GLIBC_TRIM_THRESHOLD] * len(held)
    with Watch(read_late=True, trim=True):
        jax.jit(lambda w: w + 1.0)(w)
    assert len(thresholds) == 2 * len(held)


def test_a_decorated_generator_is_watched_while_it_is_iterated(tmp_path):
    @jaxdbg.watch(out=str(tmp_path))
    def losses():
        step = jax.jit(lambda x: jnp.log(x))
        for value in (1.0, 2.0, -1.0, 3.0):
            yield step(jnp.float32(value))

    with pytest.raises(jaxdbg.NonFiniteError) as raised:
        list(losses())  # the watch once ended before the first value: nothing was checked
    assert raised.value.report["first"]["call_index"] == 2 and raised.value.report["first"]["primitive"] == "log"


def test_a_finding_is_raised_in_the_thread_whose_call_made_it(tmp_path):
    bad_done, good_done = threading.Event(), threading.Event()
    errors: dict[str, BaseException] = {}

    def worker(name, work):
        try:
            work()
        except Exception as err:  # noqa: BLE001 - which thread got it is the point
            errors[name] = err

    def bad():
        step(jnp.full((4,), -1.0)).block_until_ready()
        bad_done.set()
        good_done.wait(60)
        step(jnp.ones(4))  # its next call: the finding is raised here

    def good():
        bad_done.wait(60)
        try:
            for _ in range(2 * MAX_PENDING):  # enough calls to read the bad call's flags on this thread
                step(jnp.ones(4)).block_until_ready()
        finally:
            good_done.set()

    with jaxdbg.watch(out=str(tmp_path)):
        step = jax.jit(lambda x: jnp.sqrt(x))
        threads = [threading.Thread(target=worker, args=(name, work)) for name, work in (("bad", bad), ("good", good))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert list(errors) == ["bad"], errors  # it once stopped the healthy worker and left the bad one running
    assert isinstance(errors["bad"], jaxdbg.NonFiniteError) and errors["bad"].report["first"]["call_index"] == 0


def test_threads_calling_one_function_at_once_keep_the_watch_running(tmp_path, caplog):
    def worker(offset):
        for i in range(300):
            step(jnp.full((8,), float(i + offset)))

    with caplog.at_level(logging.WARNING, logger="jaxdbg"), jaxdbg.watch(out=str(tmp_path)) as guard:
        step = jax.jit(lambda x: jnp.tanh(x) * 2)
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        hook = guard._states[-1].hook
    # two threads once read the shared queue of unread calls at once (IndexError) and the watch stopped
    assert not hook.stopped and not [r for r in caplog.records if "stopped watching" in r.getMessage()]
    assert hook.figures.functions["<lambda>"].calls == 6 * 300


def test_an_equinox_step_that_donates_nothing_keeps_no_copies_and_is_replayed(tmp_path, monkeypatch):
    import equinox as eqx

    copied = []
    real_copies = jaxdbg.jit_layer.device_copies
    monkeypatch.setattr(jaxdbg.jit_layer, "device_copies", lambda tree: copied.append(1) or real_copies(tree))
    with pytest.raises(jaxdbg.NonFiniteError) as raised, jaxdbg.watch(out=str(tmp_path)):
        step = eqx.filter_jit(lambda w, x: jnp.log(w * x))  # jax.jit(donate_argnums=0) of an empty dict inside
        for value in (1.0, 2.0, -1.0, 3.0):
            step(jnp.ones(3), jnp.float32(value))
    assert copied == []  # every input of every call was copied: 3x the step time of a small Equinox loop
    assert raised.value.report["first"]["call_index"] == 2 and raised.value.report["first"]["primitive"] == "log"


def test_bad_options_are_one_clear_usage_error():
    with pytest.raises(jaxdbg.UsageError, match=r"action='stop'.*use 'raise' or 'log'"):
        jaxdbg.watch(action="stop")
    with pytest.raises(jaxdbg.UsageError, match="max_compiles=0"):
        jaxdbg.watch(max_compiles=0)
    with socket.socket() as taken:  # a port in use is named as the program gave it, not as a CLI option
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(jaxdbg.UsageError, match=rf"^jaxdbg\.watch\(metrics_port={port}\): cannot listen"):
            jaxdbg.watch(metrics_port=port).__enter__()


def test_each_process_of_a_job_watches_its_own_part(tmp_path):
    from jaxdbg.launch import free_port, task_environment

    port, out = free_port(), tmp_path / "job"
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([str(DATA.parent.parent), os.environ.get("PYTHONPATH", "")])}
    processes = [subprocess.Popen([sys.executable, str(DATA / "live_multiprocess.py"), str(out)],
                                  env=task_environment(i, 2, port, env), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for i in range(2)]
    finished = [p.communicate(timeout=240) for p in processes]
    assert [p.returncode for p in processes] == [0, 0], [err[-2000:] for _, err in finished]
    line = next(i for i, text in enumerate((DATA / "live_multiprocess.py").read_text().splitlines(), 1)
                if "<- origin" in text)
    for index, (stdout, _) in enumerate(finished):
        assert f"done {index}" in stdout  # action="log": every process ran to its end
        report = json.loads((out / f"process-{index}" / "report.json").read_text())
        first = report["result"]["first"]
        assert (report["environment"]["process_index"], report["environment"]["process_count"]) == (index, 2)
        assert (first["primitive"], first["call_index"], first["source"]["line"]) == ("log", 2, line)
    # Only process 1's own shard holds the bad example: it places the origin there, and so does process 0, whose
    # own shards stayed finite (its one line names the process).
    for index in range(2):
        first = json.loads((out / f"process-{index}" / "report.json").read_text())["result"]["first"]
        assert first["process"] == 1 and first["shard"] == [[12, 16], [0, 1]], first
    assert f"call 2 on process 1 ({first['device']})" in finished[0][1]
    for index, (_, stderr) in enumerate(finished):  # each process's one line names the process that says it
        assert f"jaxdbg.watch: process {index}: nan first made by log" in stderr, stderr[-2000:]
    # the shard_map's block on process 1's last device (the localisation once failed reading the stacked body
    # values, which span devices of both processes, and lost the answer)
    block = next(i for i, text in enumerate((DATA / "live_multiprocess.py").read_text().splitlines(), 1)
                 if "<- block origin" in text)
    for index in range(2):
        first = json.loads((tmp_path / "job-shard-map" / f"process-{index}" / "report.json").read_text())["result"][
            "first"]
        assert (first["primitive"], first["source"]["line"], first["process"]) == ("div", block, 1), first
        assert "shard_map" in first["path"] and first["shard"] == [[3, 4]], first
