"""The command line: help, version, usage errors as one line + exit 2, doctor's JSON, a real subprocess."""

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from jaxdbg import __version__
from jaxdbg.cli import app, main

runner = CliRunner()


def test_help_and_version():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0 and "doctor" in result.output
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"jaxdbg {__version__}"
    assert runner.invoke(app, []).exit_code == 0  # bare `jaxdbg` shows the help


def test_help_keeps_bracketed_names():
    # Rich markup took "[tool.jaxdbg.check]" for a style tag and printed "pyproject.toml's  (exit 1 ...".
    result = runner.invoke(app, ["check", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and result.output.count("[tool.jaxdbg.check]") == 2, result.output


@pytest.mark.parametrize("argv, fragment", [
    (["doctor", "--bogus"], "No such option: --bogus"),
    (["no-such-command"], "No such command"),
    (["doctor", "--timeout", "abc"], "--timeout"),
])
def test_usage_errors_are_one_line_exit_2(argv, fragment, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err and err.startswith("jaxdbg")


def test_doctor_json_to_stdout_only(tmp_path):
    result = runner.invoke(app, ["doctor", "--json", "-", "--out", str(tmp_path / "doc")])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["tool"] == "jaxdbg" and report["command"] == "doctor" and report["exit_code"] == 0
    env = report["environment"]
    assert env["backend"] == "cpu" and len(env["devices"]) == 4  # conftest gives 4 CPU devices
    res = report["result"]
    assert res["versions"]["jax"] == env["jax"] and res["host"]["cores"] >= 1
    assert res["profiler"]["ok"] is True
    assert any(f.endswith(".xplane.pb") for f in res["profiler"]["files"])
    assert any(s["name"] == "--xla_force_host_platform_device_count" for s in res["settings"])
    assert os.path.exists(tmp_path / "doc" / "report.json")


def test_bad_out_parent_and_json_folder(tmp_path, capsys):
    assert main(["doctor", "--no-profiler", "--out", str(tmp_path / "missing" / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err
    json_in_no_folder = str(tmp_path / "nope" / "r.json")
    assert main(["doctor", "--no-profiler", "--out", str(tmp_path / "o"), "--json", json_in_no_folder]) == 2
    assert "does not exist" in capsys.readouterr().err


def _jaxdbg_cmd():
    exe = os.path.join(os.path.dirname(sys.executable), "jaxdbg")
    return [exe] if os.path.exists(exe) else [sys.executable, "-m", "jaxdbg"]


def test_console_script_subprocess_warns_about_pitfalls(tmp_path):
    env = dict(os.environ, JAX_DEBUG_NANS="1", JAX_ENABLE_X64="1")
    proc = subprocess.run(
        [*_jaxdbg_cmd(), "doctor", "--no-profiler", "--json", "-", "--out", str(tmp_path / "d")],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    checks = {c["name"]: c for c in json.loads(proc.stdout)["result"]["checks"]}
    assert checks["jax_debug_nans"]["status"] == "warn" and checks["jax_enable_x64"]["status"] == "warn"
    settings = {s["name"] for s in json.loads(proc.stdout)["result"]["settings"]}
    assert {"JAX_DEBUG_NANS", "JAX_ENABLE_X64"} <= settings


def test_python_dash_m_matches(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "jaxdbg", "doctor", "--bogus"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "No such option" in proc.stderr and "Traceback" not in proc.stderr


def test_python_dash_m_ignores_modules_in_the_current_folder(tmp_path):
    """A user's typer.py (or timeit.py, profile.py) beside them must not replace jaxdbg's own imports."""
    for name in ("typer", "timeit", "rich"):
        (tmp_path / f"{name}.py").write_text("raise RuntimeError('the current folder shadowed a module')\n")
    proc = subprocess.run([sys.executable, "-m", "jaxdbg", "--version"], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("jaxdbg "), proc.stderr


def test_doctor_exits_1_when_a_check_fails(tmp_path, capsys):
    out = tmp_path / "doc"
    out.mkdir()
    (out / "profiler-check").write_text("a file where the capture folder should go")
    assert main(["doctor", "--out", str(out), "--json", str(tmp_path / "r.json")]) == 1
    report = json.loads((tmp_path / "r.json").read_text())
    failed = [c for c in report["result"]["checks"] if c["status"] == "fail"]
    assert report["exit_code"] == 1 and [c["name"] for c in failed] == ["profiler"]
    assert "some checks failed" in capsys.readouterr().out
    # -q keeps one line: the failed check
    assert main(["doctor", "--out", str(out), "-q"]) == 1
    assert capsys.readouterr().err.startswith("jaxdbg doctor: failed: profiler: ")
