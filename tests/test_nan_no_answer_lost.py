"""No answer lost: a step of nan-hunt after the origin that fails is a warning in the report (its traceback with
-v), and under jaxdbg.watch a failure of jaxdbg's own never replaces the user's exception nor stops the program.
Every failure here is real, made through a real program (a folder where the bundle's file should go, an input
the program deleted, a donated array used again); and typed PRNG keys among a call's inputs (an NNX model with
Dropout holding nnx.Rngs) are analysed, saved in the bundle and loaded back."""

from __future__ import annotations

import json
import logging
import os

import jax
import jax.numpy as jnp
import jsonschema
import numpy as np
import pytest
from typer.testing import CliRunner

import jaxdbg
from jaxdbg.cli import app
from jaxdbg.schema import schema
from jaxdbg.target import load_npz_inputs

HERE = os.path.dirname(os.path.abspath(__file__))
FOCAL = os.path.join(HERE, "corpus", "nnx_dropout_focal_nan", "train.py")
FORWARD = os.path.join(os.path.dirname(HERE), "recipes", "nan_forward", "train.py")


def _line(path: str, marker: str) -> int:
    with open(path) as handle:
        return next(i for i, text in enumerate(handle, start=1) if marker in text)


# -- typed PRNG keys: an NNX model with Dropout (nnx.Rngs) ----------------------------------------------------


@pytest.fixture(scope="module")
def focal(tmp_path_factory):
    """The NNX Dropout program run once under jaxdbg.watch (nan-hunt's own analysis, in this process): the
    NonFiniteError it raised, and the report it wrote."""
    pytest.importorskip("flax")
    import runpy

    out = tmp_path_factory.mktemp("focal")
    with pytest.raises(jaxdbg.NonFiniteError) as raised, jaxdbg.watch(out=str(out)):
        runpy.run_path(FOCAL, run_name="__main__")
    return raised.value, json.loads((out / "report.json").read_text())


def test_typed_keys_among_the_inputs_do_not_cost_the_answer(focal) -> None:
    """nan-hunt's analysis (which jaxdbg.watch runs) used to die saving the keys; the user's program then died
    with jaxdbg's TypeError instead of NonFiniteError, and no report was written."""
    error, report = focal
    jsonschema.validate(report, schema())
    result = report["result"]
    assert result == error.report and error.path is not None
    first = result["first"]
    # The NaN is the gradient's 0 * inf at the focal loss line (the factor's derivative at p = 1 is infinite).
    assert (first["kind"], first["primitive"], first["pass"], first["function"], first["call_index"]) == (
        "nan", "mul", "backward", "train_step", 0)
    assert first["source"]["line"] == _line(FOCAL, "# the bug")
    assert [c["primitive"] for c in result["chain"]] == ["pow"] and result["warnings"] == []
    assert "base of the power away from zero" in result["hints"][0]  # not a denominator's epsilon
    assert {"inputs", "jaxpr", "stablehlo", "bundle"} <= set(report["artifacts"])


def test_keys_are_saved_as_key_data_and_load_back_as_keys(focal) -> None:
    artifacts = focal[1]["artifacts"]
    with open(artifacts["bundle"]) as handle:
        manifest = json.load(handle)
    keys = [entry for entry in manifest["inputs"] if entry["dtype"].startswith("key<")]
    assert keys and {entry["dtype"] for entry in keys} == {"key<threefry2x32>"}
    with np.load(artifacts["inputs"]) as saved:  # plain numpy reads the key data: uint32, one more dimension
        data = saved[keys[0]["key"]]
    assert data.dtype == np.uint32 and list(data.shape) == [*keys[0]["shape"], 2]
    loaded = load_npz_inputs(artifacts["inputs"])  # what `--inputs nan_inputs.npz` gives: keys again
    index = int(keys[0]["key"][3:])
    assert jax.dtypes.issubdtype(loaded[index].dtype, jax.dtypes.prng_key)
    assert np.array_equal(jax.random.key_data(loaded[index]), data)


# -- a step after the origin fails: a warning, the answer stays -------------------------------------------------


def test_a_bundle_or_metrics_that_cannot_be_written_are_warnings_and_v_prints_the_traceback(tmp_path) -> None:
    out = tmp_path / "out"
    (out / "nan_inputs.npz").mkdir(parents=True)  # where the bundle's inputs go: np.savez really fails
    done = CliRunner().invoke(app, ["nan-hunt", FORWARD, "--out", str(out), "--json", str(tmp_path / "r.json"),
                                    "-v", "--metrics", str(tmp_path / "no-such-folder" / "m.prom")])
    assert done.exit_code == 1, done.output
    report = json.loads((tmp_path / "r.json").read_text())
    jsonschema.validate(report, schema())
    result = report["result"]
    assert (result["first"]["primitive"], result["first"]["source"]["line"]) == ("log", _line(FORWARD, "<- origin"))
    assert result["explanation"].startswith("A NaN was first made by `log`") and result["hints"]
    warning, metrics = result["warnings"]
    assert warning["step"] == "bundle" and warning["message"].startswith("IsADirectoryError")
    assert set(warning) == {"step", "message"}  # the traceback is for -v, not the JSON
    assert metrics["step"] == "metrics" and "cannot write there" in metrics["message"]  # and exit 1 all the same
    assert "warning: the bundle step failed (IsADirectoryError" in done.output
    assert "Traceback (most recent call last)" in done.output and "np.savez" in done.output  # -v: where it failed


# -- jaxdbg.watch: jaxdbg's own failures never replace the user's exception, never stop the program -----------


def test_watch_raises_with_a_report_when_the_replay_fails(tmp_path, caplog) -> None:
    """The step is guarded by Equinox's `assert_max_traces(max_traces=1)` (a recompile check users write): the
    replay must trace it again, which the guard refuses. The origin is then the call itself, the report says
    why, and NonFiniteError is still raised."""
    eqx = pytest.importorskip("equinox")
    with caplog.at_level(logging.WARNING, logger="jaxdbg"), pytest.raises(jaxdbg.NonFiniteError) as raised, \
            jaxdbg.watch(out=str(tmp_path)):
        step = jax.jit(eqx.debug.assert_max_traces(lambda w, batch: jnp.log(batch @ w).sum(), max_traces=1))
        w = jnp.ones((3,))
        for sign in (1.0, -1.0):
            step(w, jnp.full((4, 3), sign))
    result = raised.value.report
    assert (result["first"]["primitive"], result["first"]["function"], result["first"]["call_index"]) == (
        None, "<lambda>", 1)
    [warning] = result["warnings"]
    assert warning["step"] == "localise" and "traced" in warning["message"]
    assert "is in the outputs of `<lambda>`, call 1" in result["explanation"]
    jsonschema.validate(json.loads((tmp_path / "report.json").read_text()), schema())
    assert any("the localise step failed" in r.getMessage() for r in caplog.records)


def test_watch_raises_without_a_report_when_out_cannot_be_a_folder(tmp_path, caplog) -> None:
    taken = tmp_path / "taken"
    taken.write_text("a file where the report folder should be\n")
    with caplog.at_level(logging.WARNING, logger="jaxdbg"), pytest.raises(jaxdbg.NonFiniteError) as raised, \
            jaxdbg.watch(out=str(taken)):
        jax.jit(lambda x: jnp.log(x))(jnp.array([-1.0]))
    assert raised.value.path is None and raised.value.report["first"]["primitive"] == "log"
    assert "no report could be written" in str(raised.value)
    assert [w["step"] for w in raised.value.report["warnings"]] == ["bundle"]
    assert any("could not write the report" in r.getMessage() for r in caplog.records)


def test_a_failure_of_the_watch_stops_watching_and_the_program_gets_its_own_error(tmp_path, caplog) -> None:
    """A donated array used again (a classic bug): the watch's copy of the call's inputs fails first. The watch
    says so in one line and stops; the program's own call then raises jax's error, and the run goes on."""
    with caplog.at_level(logging.WARNING, logger="jaxdbg"), jaxdbg.watch(out=str(tmp_path)) as watching:
        step = jax.jit(lambda state: state * 2, donate_argnums=0)
        state = jnp.ones(3)
        new = step(state)
        with pytest.raises((ValueError, RuntimeError), match="deleted") as raised:  # jax 0.10 / 0.11's words
            step(state)
        assert not any(entry.name == "copy_tree" for entry in raised.traceback)  # jax's, from the call itself
        assert float(step(new).sum()) == 12.0  # unwatched from here on: the program runs as without jaxdbg
        log = jax.jit(lambda x: jnp.log(x))
        assert log(jnp.array([-1.0])).shape == (1,)  # a NaN no longer raises
        # Planned again at their next call: both only counted and sent straight to jax's dispatch.
        assert step._plan.nobody and log._plan.nobody and step.record.calls == 3
    stopped = [r.getMessage() for r in caplog.records if "stopped watching" in r.getMessage()]
    assert len(stopped) == 1 and "deleted" in stopped[0]
    assert watching.reports == []

