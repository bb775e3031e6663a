"""Every bad input to a TARGET command gets one clear line on stderr and exit 2, never a traceback."""

import numpy as np
import pytest

from jaxdbg.cli import COMMANDS, main

TARGET_COMMANDS = [name.replace("_", "-") for name in COMMANDS
                   if name in ("profile", "nan_hunt", "repro", "memory", "hang_hunt")]


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "syntax.py").write_text("def f(:\n    pass\n")
    (tmp_path / "model.py").write_text("import jax.numpy as jnp\n\ndef f(x):\n    return jnp.sin(x)\n")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    np.savez(tmp_path / "objects.npz", arg0=np.array([{"a": 1}], dtype=object))
    return tmp_path


CASES = [
    (["missing.py"], "no such file"),
    (["syntax.py"], "syntax error at line 1"),
    (["model.py::g", "--args", "f32[2]"], "no function 'g'"),
    (["model.py::f", "--args", "f32[2"], "cannot read"),
    (["model.py::f", "--args", "q8[2]"], "unknown dtype"),
    (["model.py::f", "--inputs", "junk.npz"], "not a readable npz"),
    (["model.py::f", "--inputs", "objects.npz"], "Python objects"),
    (["model.py", "--args", "f32[2]"], "a script makes its own inputs"),
    (["model.py::f"], "needs inputs"),
    (["model.py::f", "--args", "f32[2]", "--inputs", "junk.npz"], "not both"),
    (["model.py::f", "--inputs", "data.csv"], "expected file.py::make_inputs or a .npz file"),
    (["model.py::f", "--args", "f32[2]", "--out", "no/such/parent/out"], "does not exist"),
    (["model.py::f", "--args", "f32[2]", "--out", "model.py/out"], "cannot create the folder"),  # was exit 4
    (["model.py::f", "--args", "f32[2]", "--no-such-option"], "No such option"),
    (["model.py::f", "--args", "f32[2]", "--json", "."], "is a folder"),
    (["model.py::f", "--args", "f32[2]", "--json", "/proc/version"], "cannot write there"),
]


@pytest.mark.parametrize("command", TARGET_COMMANDS)
@pytest.mark.parametrize("argv, fragment", CASES, ids=[c[1] for c in CASES])
def test_bad_input_is_one_line_and_exit_2(command, argv, fragment, files, capsys):
    code = main([command, *argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert fragment in err and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"jaxdbg {command}")


def test_nan_hunt_argnums_without_grad_is_bad_input(files, capsys):
    assert main(["nan-hunt", "model.py::f", "--args", "f32[2]", "--argnums", "0"]) == 2
    err = capsys.readouterr().err
    assert "only applies with --grad" in err and err.count("\n") == 1


@pytest.mark.parametrize("command", TARGET_COMMANDS)
def test_failed_command_still_writes_its_json(command, files, capsys):
    import json

    assert main([command, "model.py::g", "--args", "f32[2]", "--json", "-"]) == 2
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["exit_code"] == 2 and report["target"] == "model.py::g" and report["command"] == command
    assert "no function 'g'" in report["result"]["error"] and captured.err.count("\n") == 1
