"""``jaxdbg nan-hunt`` through the command line: contained runs, the contract's JSON, exit codes 0/1/2/3."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from jaxdbg.cli import main
from jaxdbg.nan import HuntOptions
from jaxdbg.nan.session import hunt_here
from jaxdbg.target import parse_target

from conftest import RECIPES


def _run(argv: list[str], capsys) -> tuple[int, dict | None, str]:
    code = main(argv)
    captured = capsys.readouterr()
    report = json.loads(captured.out) if "--json" in argv and captured.out.strip() else None
    return code, report, captured.err


def test_script_found_contract_json_and_bundle(tmp_path, capsys) -> None:
    out = tmp_path / "scan"
    code, report, err = _run(["nan-hunt", os.path.join(RECIPES, "nan_scan", "train.py"), "--json", "-",
                              "--out", str(out)], capsys)
    assert code == 1 and report["exit_code"] == 1 and report["command"] == "nan-hunt"
    result = report["result"]
    first = result["first"]
    assert set(first) >= {"kind", "primitive", "pass", "source", "function", "call_index", "path", "inputs",
                          "argument"}
    assert (first["primitive"], first["pass"], first["call_index"]) == ("sqrt", "forward", 1)
    assert first["path"] == ["jit(rollout)", "scan[iteration=3]"]
    assert set(first["source"]) == {"file", "line", "function"}
    assert set(first["inputs"][0]) >= {"shape", "dtype", "min", "max", "nan", "inf", "zero", "negative"}
    assert result["explanation"] and result["hints"] and isinstance(result["chain"], list)
    assert "sqrt" in err  # the human report went to stderr because stdout carries the JSON
    with np.load(report["artifacts"]["inputs"]) as inputs:
        assert float(inputs["arg0"]) == 3.5  # the failing call's own input
    assert "scan" in Path(report["artifacts"]["jaxpr"]).read_text()
    bundle = json.loads(Path(report["artifacts"]["bundle"]).read_text())
    assert bundle["function"] == "rollout" and bundle["call_index"] == 1
    assert os.path.exists(out / "report.json")


def test_clean_script_exits_0(tmp_path, capsys) -> None:
    code, report, _ = _run(["nan-hunt", os.path.join(RECIPES, "nan_clean", "train.py"), "--json", "-",
                            "--out", str(tmp_path / "clean")], capsys)
    assert code == 0 and report["result"]["found"] is False and report["result"]["calls_watched"] == 5


def test_a_relative_out_stays_where_jaxdbg_started_when_the_script_changes_its_folder(tmp_path, capsys,
                                                                                       monkeypatch) -> None:
    """A script that first changes into its run folder (as launchers do): a relative --out is jaxdbg's folder's,
    so every artifact lands there and nothing in the folder the script moved to."""
    elsewhere = tmp_path / "run"
    elsewhere.mkdir()
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import os
        import jax, jax.numpy as jnp
        os.chdir({str(elsewhere)!r})
        print(float(jax.jit(lambda w: jnp.log(w).sum())(jnp.array([1.0, -2.0]))))
    """))
    monkeypatch.chdir(tmp_path)
    code, report, _ = _run(["nan-hunt", "train.py", "--json", "-", "--out", "out"], capsys)
    assert code == 1 and report["result"]["first"]["primitive"] == "log"
    assert {"inputs", "jaxpr", "bundle"} <= set(report["artifacts"])
    for path in report["artifacts"].values():
        assert Path(path).is_absolute() and Path(path).parent == tmp_path / "out" and Path(path).exists(), path
    assert list(elsewhere.iterdir()) == []


def test_script_arguments_after_double_dash(tmp_path, capsys) -> None:
    code, report, _ = _run(["nan-hunt", os.path.join(RECIPES, "nan_bf16_overflow", "train.py"), "--precision",
                            "--json", "-", "--out", str(tmp_path / "f16"), "--", "--dtype", "f16"], capsys)
    assert code == 1 and report["result"]["precision"]["dtype"] == "f16"
    assert report["result"]["precision"]["f32_removes_origin"] is True


GRAD_TARGET = textwrap.dedent("""
    import jax.numpy as jnp
    import numpy as np


    def loss(params, x):
        dist = jnp.sqrt(jnp.sum((x - params["centre"]) ** 2, axis=-1))  # distance line
        return jnp.mean(dist)


    def make_inputs():
        x = np.array([[1.0, 2.0], [0.0, 0.0]], np.float32)
        return {"centre": np.zeros(2, np.float32)}, x
""")


def test_function_mode_grad_finds_the_backward_origin(tmp_path, capsys) -> None:
    target = tmp_path / "model.py"
    target.write_text(GRAD_TARGET)
    code, report, _ = _run(["nan-hunt", f"{target}::loss", "--inputs", f"{target}::make_inputs", "--grad",
                            "--json", "-", "--out", str(tmp_path / "g")], capsys)
    assert code == 1
    result = report["result"]
    assert result["first"]["pass"] == "backward" and result["first"]["function"] == "grad(loss)"
    line = next(i for i, text in enumerate(GRAD_TARGET.splitlines(), start=1) if "# distance line" in text)
    assert result["first"]["source"]["line"] == line
    norms = {g["name"]: g for g in result["grad_norms"]}
    assert norms["params['centre']"]["nan"] == 2


def test_function_mode_clean_with_random_args(tmp_path, capsys) -> None:
    target = tmp_path / "ok.py"
    target.write_text("import jax.numpy as jnp\n\ndef loss(w, x):\n    return jnp.mean(jnp.tanh(x @ w))\n")
    code, report, _ = _run(["nan-hunt", f"{target}::loss", "--args", "f32[3] f32[4,3]", "--grad", "--argnums", "0",
                            "--json", "-", "--out", str(tmp_path / "ok")], capsys)
    assert code == 0 and report["result"]["found"] is False
    assert [g["name"] for g in report["result"]["grad_norms"]] == ["w"]


NULLARY_AND_KEYED = """import jax
import jax.numpy as jnp


def f():
    x = jnp.linspace(-1.0, 1.0, 5)
    return jnp.log(x)


def keyed(key, scale):
    return jnp.sqrt(jax.random.normal(key, (4,)) * scale - 10.0)
"""


def test_function_mode_without_arguments_and_with_a_prng_key(tmp_path, capsys) -> None:
    """`def f():` needs no --args; --args spells a PRNG key as key:SEED (jax.random.key)."""
    target = tmp_path / "nullary.py"
    target.write_text(NULLARY_AND_KEYED)
    code, report, _ = _run(["nan-hunt", f"{target}::f", "--json", "-", "--out", str(tmp_path / "f")], capsys)
    assert code == 1 and report["result"]["first"]["primitive"] == "log"
    code, report, _ = _run(["nan-hunt", f"{target}::keyed", "--args", "key:3 f32[]", "--json", "-",
                            "--out", str(tmp_path / "k")], capsys)
    assert code == 1 and report["result"]["first"]["primitive"] == "sqrt"
    assert report["result"]["first"]["source"]["line"] == 11


AUX_TARGET = GRAD_TARGET.replace("return jnp.mean(dist)", "return jnp.mean(dist), {\"dist\": dist}")


def test_function_mode_grad_of_a_loss_with_aux(tmp_path) -> None:
    """A loss returning (loss, aux) is differentiated with has_aux=True instead of being refused."""
    target = tmp_path / "aux_model.py"
    target.write_text(AUX_TARGET)
    options = HuntOptions(grad=True, inputs=f"{target}::make_inputs", out_dir=str(tmp_path / "a"))
    result, _ = hunt_here(parse_target(f"{target}::loss"), options)
    line = next(i for i, text in enumerate(AUX_TARGET.splitlines(), start=1) if "# distance line" in text)
    assert result.found and result.first.pass_ == "backward" and result.first.source.line == line
    assert {g.name: g.nan for g in result.grad_norms}["params['centre']"] == 2


STATIC_TARGET = textwrap.dedent("""
    import functools

    import jax
    import jax.numpy as jnp


    @functools.partial(jax.jit, static_argnums=(1,), donate_argnums=(0,))
    def squash(x, mode):
        return jnp.log(x - 1.0) if mode == "log" else x  # log line


    def make_inputs():
        return jnp.array([2.0, 0.5, 3.0]), "log"
""")


def test_function_mode_jitted_target_keeps_its_static_arguments(tmp_path) -> None:
    """A target already under jax.jit(static_argnums=..., donate_argnums=...): its static argument stays static
    (a string cannot be traced) and the path names its jit once."""
    target = tmp_path / "static_model.py"
    target.write_text(STATIC_TARGET)
    options = HuntOptions(inputs=f"{target}::make_inputs", out_dir=str(tmp_path / "s"))
    result, _ = hunt_here(parse_target(f"{target}::squash"), options)
    line = next(i for i, text in enumerate(STATIC_TARGET.splitlines(), start=1) if "# log line" in text)
    assert result.found and result.first.primitive == "log" and result.first.path == ("jit(squash)",)
    assert result.first.source.line == line


@pytest.mark.parametrize("argv,fragment", [
    (["nan-hunt", "missing.py"], "no such file"),
    (["nan-hunt", os.path.join(RECIPES, "nan_scan", "train.py"), "--grad"], "function target"),
    (["nan-hunt", os.path.join(RECIPES, "nan_scan", "train.py") + "::rollout", "--args", "f33[2]"], "unknown dtype"),
    (["nan-hunt", os.path.join(RECIPES, "nan_scan", "train.py") + "::rollout", "--argnums", "x", "--args", "f32[]"],
     "--argnums"),
    (["nan-hunt", os.path.join(RECIPES, "nan_scan", "train.py") + "::rollout"], "needs inputs"),
    (["nan-hunt", os.path.join(RECIPES, "nan_scan", "train.py") + "::rollout", "--args", "f32[] f32[]"],
     "do not fit rollout("),
])
def test_bad_usage_is_one_line_exit_2(argv, fragment, capsys, tmp_path) -> None:
    code, _, err = _run([*argv, "--out", str(tmp_path / "u")], capsys)
    assert code == 2 and err.count("\n") == 1 and fragment in err


def test_target_failing_before_any_nan_exits_3(tmp_path, capsys) -> None:
    script = tmp_path / "broken.py"
    script.write_text("import jax.numpy as jnp\n\nx = jnp.ones(3)\nraise RuntimeError('dataset not found')\n")
    code, _, err = _run(["nan-hunt", str(script), "--out", str(tmp_path / "b")], capsys)
    assert code == 3 and "dataset not found" in err and "broken.py:4" in err and err.count("\n") == 1
    hang = tmp_path / "hang.py"
    hang.write_text("import time\nwhile True:\n    time.sleep(0.1)\n")
    code, _, err = _run(["nan-hunt", str(hang), "--timeout", "3", "--out", str(tmp_path / "h")], capsys)
    assert code == 3 and "timeout" in err


def test_as_a_subprocess(tmp_path) -> None:
    done = subprocess.run([sys.executable, "-m", "jaxdbg", "nan-hunt", os.path.join(RECIPES, "nan_data", "train.py"),
                           "--out", str(tmp_path / "sub"), "-q"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    report = json.loads((tmp_path / "sub" / "report.json").read_text())
    assert report["result"]["first"]["kind"] == "input" and report["result"]["first"]["argument"] == "batch['x']"


def test_quiet_still_says_where_the_nan_was_made(tmp_path, capsys) -> None:
    code = main(["nan-hunt", os.path.join(RECIPES, "nan_scan", "train.py"), "-q", "--out", str(tmp_path / "q")])
    captured = capsys.readouterr()
    assert code == 1 and captured.out == ""
    assert captured.err.strip() == ("jaxdbg nan-hunt: nan first made by sqrt (forward pass) at train.py:9 in "
                                    "rollout, call 1")


OVERFLOWING = textwrap.dedent("""
    import jax, jax.numpy as jnp

    def loss_fn(w, x):
        return jnp.mean(jnp.log(jnp.exp(x @ w))) ** 2 + jnp.sum(jnp.exp(w))

    @jax.jit
    def step(w, x, lr):
        return w - lr * jax.grad(loss_fn)(w, x)

    w, x, lr = jnp.ones((4, 2)), jnp.ones((3, 4)), 0.01
    for i in range(40):
        w = step(w, x, lr)
        lr *= 3.0
""")


def test_nan_from_values_that_overflowed_is_explained_as_such(tmp_path) -> None:
    """A backward-pass division of inf by inf is not 'an infinite derivative at 0' of a finite forward value."""
    script = tmp_path / "growing.py"
    script.write_text(OVERFLOWING)
    result, _ = hunt_here(parse_target(str(script)), HuntOptions(out_dir=str(tmp_path / "o")))
    assert result.found and result.first.primitive == "div" and result.first.pass_ == "backward"
    assert "inf / inf is NaN" in result.explanation and "derivative of" not in result.explanation
    assert not any("denominator away from zero" in h for h in result.hints)


SCHEDULED = textwrap.dedent("""
    import jax
    import jax.numpy as jnp

    ALPHAS_BAR = jnp.cumprod(1.0 - jnp.linspace(0.1, 1.0, 10))  # the last step's alpha_bar is 0


    @jax.jit
    def x0_error(x_t, t):
        ab = ALPHAS_BAR[t][:, None]
        x0 = x_t / jnp.sqrt(ab)  # inf at the last step
        return jnp.mean((x0 @ jnp.array([[1.0], [-1.0]])) ** 2)


    for t in ([0, 3], [5, 9]):
        x0_error(jnp.ones((2, 2)), jnp.array(t))
""")


def test_a_zero_in_a_global_array_the_step_captured_is_named_by_its_global() -> None:
    """inf - inf made of x / sqrt(alpha_bar) where a global noise schedule holds a 0: the explanation names the
    global and the element (after the run, jaxdbg has dropped the script's global arrays: still named)."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "schedule.py"
        script.write_text(SCHEDULED)
        result, _ = hunt_here(parse_target(str(script)), HuntOptions(out_dir=os.path.join(folder, "o")))
    assert result.found and result.first.call_index == 1 and result.chain[0].primitive == "div"
    assert "The zero denominator comes from `ALPHAS_BAR`" in result.explanation, result.explanation
    assert "element [9] is 0" in result.explanation and "`ALPHAS_BAR` holds a 0" in result.hints[0]


def test_the_device_is_shown_when_the_nan_sits_in_one_devices_part_of_an_array() -> None:
    """A sharded jit's origin shows its device and shard (process 0 included); a value whole on one device does
    not need the line."""
    from jaxdbg.cli.nan_hunt import _a_part
    from jaxdbg.nan.result import Origin, ValueStats

    def origin(shard):
        out = ValueStats(shape=(16, 8), dtype="f32", min=-1.0, max=1.0, nan=1, inf=0, zero=0, negative=1)
        return Origin("nan", "log", "forward", outputs=(out,), process=0, device="cpu:3", shard=shard)

    assert _a_part(origin(((12, 16), (0, 8)))) and not _a_part(origin(((0, 16), (0, 8))))
    assert not _a_part(origin(None)) and not _a_part(origin(()))


def test_growth_in_a_run_with_no_nan_is_not_called_before_a_non_finite_call() -> None:
    """A loss scale that doubles every step but stays finite: nothing non-finite was found, so the growth table
    says the values grew during the run, not before a non-finite call that never came."""
    from rich.console import Console

    from jaxdbg.cli.nan_hunt import render
    from jaxdbg.nan.result import GrowthEntry, NanHuntResult
    from jaxdbg.report import Report

    grew = GrowthEntry("scale", None, 7, 1024.0, "train_step", 16.0, 16384.0)
    console = Console(record=True, width=120)
    render(Report("nan-hunt", "train.py", NanHuntResult(False, growth=(grew,), explanation="No NaN."), 0), console)
    text = console.export_text()
    assert "grew during the run (no NaN/Inf yet)" in text and "non-finite call" not in text
