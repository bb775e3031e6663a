"""`jaxdbg repro` end to end on the recipes and small scripts: every reproducer is verified in a fresh process."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxdbg.cli import main
from jaxdbg.repro.jobs import CHILD_ENV, RunRequest
from jaxdbg.repro.program import count_lines
from jaxdbg.repro.signature import Criterion
from jaxdbg.repro.subject import prepare_subject
from jaxdbg.runner import run_contained
from jaxdbg.target import parse_target

RECIPES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "recipes")


def recipe(name, script):
    return os.path.join(RECIPES, name, script)


def repro(tmp_path_factory, *argv, runs=1):
    """Run `jaxdbg repro ...`; returns (exit code, report dict, out folder). One run of the original by default:
    these targets fail every time (the runs that tell a flaky failure: nan_run and test_flaky_failure_...)."""
    out = tmp_path_factory.mktemp("repro")
    code = main(["repro", "--out", str(out / "o"), "--json", str(out / "r.json"), "-q", "--runs", str(runs), *argv])
    report = json.loads((out / "r.json").read_text()) if (out / "r.json").exists() else None
    return code, report, out / "o"


def imports_of(path):
    tree = ast.parse(Path(path).read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return names | {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}


def fresh_run(path, timeout=60):
    """`python repro.py` exactly as a user would run it."""
    return subprocess.run([sys.executable, os.path.basename(path)], cwd=os.path.dirname(path), capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def nan_run(tmp_path_factory):
    # --source-time 0: the cut alone (repro_source.py is checked in test_time_limit_keeps_the_smallest_...)
    return repro(tmp_path_factory, recipe("repro_nan_graph", "train.py"), "--max-time", "300", "--source-time", "0",
                 runs=2)


def test_nan_in_a_big_graph_becomes_one_equation(nan_run):
    code, report, out = nan_run
    result = report["result"]
    assert code == 0 and report["exit_code"] == 0
    assert result["signature"]["kind"] == "nonfinite" and result["verified"] and not result["flaky"]
    assert Criterion.from_json(result["signature"]) == Criterion.nonfinite("NaN")  # a report reads back as one
    assert result["original"]["equations"] > 500 and result["minimized"]["equations"] == 1
    assert result["failing_primitives"] == ["log1p"]
    assert set(report["artifacts"]) >= {"repro", "stablehlo", "report"}
    assert imports_of(out / "repro.py") <= {"jax", "numpy"}
    assert "stablehlo.log_plus_one" in (out / "repro.stablehlo.mlir").read_text()
    run = fresh_run(str(out / "repro.py"))
    assert run.returncode != 0 and "AssertionError: jax.jit(f) produced NaN" in run.stderr


LATE_LOOP_NAN = """import jax
import jax.numpy as jnp


def step(i, state):
    h, total = state
    h = h - 0.25                        # 7.5 - 0.25 (i + 1): negative from iteration 30 of 50
    g = jnp.tanh(h) * 2.0 + jnp.cos(h)
    return h, total + (jnp.log(h) + g).sum() * 0.01 + g.mean()


@jax.jit
def run(h0):
    return jax.lax.fori_loop(0, 50, step, (h0, jnp.float32(0.0)))[1]


print(run(jnp.full((4,), 7.5, jnp.float32)))
"""


def test_a_nan_born_late_in_a_loop_becomes_its_body_once_at_that_iteration(tmp_path_factory):
    """Not the loop of 50 with its whole body: the body once, on the carry of iteration 30, cut to the log."""
    script = tmp_path_factory.mktemp("loop") / "drain.py"
    script.write_text(LATE_LOOP_NAN)
    code, report, out = repro(tmp_path_factory, str(script), "--max-time", "120", "--source-time", "0")
    result = report["result"]
    assert code == 0 and result["verified"] and result["strategy"] == "computation"
    assert result["failing_primitives"] == ["log"] and result["minimized"]["equations"] == 1
    assert result["original"]["equations"] > 10  # the loop's body counts
    assert any("iteration 30 of 50 of the loop at drain.py:14" in note for note in result["notes"])
    text = (out / "repro.py").read_text()
    assert "lax.scan(" not in text and "length=50" not in text and count_lines(text) <= 10
    run = fresh_run(str(out / "repro.py"))
    assert run.returncode != 0 and "AssertionError: jax.jit(f) produced NaN" in run.stderr


def test_mismatch_from_algebraic_rewriting_is_cut_to_add_and_sub(tmp_path_factory):
    code, report, out = repro(tmp_path_factory, recipe("repro_jit_mismatch", "features.py"), "--kind", "mismatch",
                              "--max-time", "300", "--source-time", "0")
    result = report["result"]
    assert code == 0 and result["verified"] and result["strategy"] == "computation"
    assert result["failing_primitives"] == ["add", "sub"]
    # --source-time 0: the cut alone, no source reduction after it
    assert "source" not in report["artifacts"] and not (out / "repro_source.py").exists()
    assert "repro_source.py not written (--source-time 0)" in result["notes"]
    run = fresh_run(str(out / "repro.py"))
    assert "jit and op-by-op (jax.disable_jit) disagree" in run.stderr


def test_user_assert_is_kept_and_still_needs_jit(tmp_path_factory):
    # --max-time 60: every candidate runs twice (with jit, and without, where it must pass), so the whole
    # reduction takes a minute alone and two on a loaded machine; what is checked holds at any stage of it.
    code, report, out = repro(tmp_path_factory, recipe("repro_jit_mismatch", "features.py"), "--max-time", "60")
    result = report["result"]
    assert code == 0 and result["verified"] and result["strategy"] == "source"
    assert result["signature"] == {**result["signature"], "kind": "exception", "type": "AssertionError",
                                   "message": "jit and op-by-op disagree"}
    text = (out / "repro.py").read_text()
    assert "assert np.allclose(jit_out, eager_out, atol=0.001), 'jit and op-by-op disagree'" in text
    assert "jax.jit(" in text and "100000000.0" in text  # the folded arithmetic is still computed
    assert text.endswith(")\n")  # a reduced source ends its last line
    assert result["minimized"]["lines"] < result["original"]["lines"]
    # The reproducer fails with jit and passes without it, like the original.
    assert fresh_run(str(out / "repro.py")).returncode != 0
    env = {**os.environ, "JAX_DISABLE_JIT": "1"}
    assert subprocess.run([sys.executable, "repro.py"], cwd=out, env=env, capture_output=True).returncode == 0


def test_crash_in_host_callback(tmp_path_factory):
    # --max-time 30: what is checked holds at any stage of the reduction (the crash stays in the callback)
    code, report, out = repro(tmp_path_factory, recipe("repro_callback_crash", "host_stats.py"), "--max-time", "30")
    result = report["result"]
    assert code == 0 and result["verified"]
    assert result["signature"]["kind"] == "crash" and result["signature"]["signal"] == "SIGSEGV"
    assert "pure_callback" in (out / "repro.py").read_text()
    assert (out / "repro.stablehlo.mlir").exists()  # the crash happened inside compiled code
    assert fresh_run(str(out / "repro.py")).returncode == -11


def test_an_unverified_reproducer_under_quiet_says_why_and_exits_3(tmp_path, capsys):
    """-q prints the essential line of a failing report. It once looked for doctor's list of checks on any
    result and iterated repro's `checks` (a count of runs): an unverified hang repro (its fresh run, slowed
    down on a loaded machine, stopped somewhere else) exited 4 with "'int' object is not iterable"."""
    from jaxdbg.cli._common import Common, execute
    from jaxdbg.cli.repro import render
    from jaxdbg.report import Report
    from jaxdbg.repro.result import ReproResult, Size
    from jaxdbg.repro.signature import FailureSignature

    result = ReproResult(FailureSignature("timeout"), Size(17), Size(17), checks=9, elapsed_s=15.0, verified=False,
                         strategy="source", verification="fresh run of repro.py timeout after 2.0s at hang.py:2")
    common = Common("repro", json=str(tmp_path / "r.json"), out=str(tmp_path / "o"), quiet=True, target="hang.py")
    code = execute(common, lambda c: Report("repro", "hang.py", result, 3, environment={}), render)
    assert code == 3 and json.loads((tmp_path / "r.json").read_text())["exit_code"] == 3
    assert capsys.readouterr().err == ("jaxdbg repro: reproducer NOT verified: fresh run of repro.py timeout after "
                                       "2.0s at hang.py:2\n")


def test_the_verification_quotes_the_failing_values_verbatim():
    """The verification quotes the reproducer's assertion, whose message prints the array (`[[nan]]`): rich
    once took `[nan]` for markup and printed `produced NaN: []` (a BCOO graph layer's 0 / 0)."""
    from rich.console import Console

    from jaxdbg.cli.repro import render
    from jaxdbg.report import Report
    from jaxdbg.repro.result import ReproResult, Size
    from jaxdbg.repro.signature import FailureSignature

    said = "fresh `python repro.py` alone in an empty folder raised AssertionError: jax.jit(f) produced NaN: [[nan]]"
    result = ReproResult(FailureSignature("nonfinite", message="jitted function produced NaN"), Size(28, 27),
                         Size(11, 1), checks=11, elapsed_s=35.8, verified=True, strategy="computation",
                         verification=said, notes=["kept [the] note"])
    console = Console(width=400, record=True, color_system=None)
    render(Report("repro", "gcn[0].py", result, 0, environment={}), console)
    text = console.export_text()
    assert "produced NaN: [[nan]]" in text and "kept [the] note" in text and "gcn[0].py" in text


def test_function_target_with_random_args(tmp_path_factory):
    module = tmp_path_factory.mktemp("fn") / "model.py"
    module.write_text("import jax.numpy as jnp\n\ndef loss(x, w):\n    h = jnp.tanh(x @ w)\n"
                      "    return jnp.sum(jnp.log(h - 2.0))\n")
    code, report, _ = repro(tmp_path_factory, f"{module}::loss", "--args", "f32[4,8] f32[8,8]", "--max-time", "300",
                            "--source-time", "0")
    result = report["result"]
    assert code == 0 and result["verified"] and result["failing_primitives"] == ["log"]
    # The place is said in the user's module, not in jaxdbg's copy of it (deleted once repro ends).
    location = result["signature"]["location"]
    assert location is None or location["file"] == str(module)


HOST_NAN = """import jax
import jax.numpy as jnp
import numpy as np


def host_log(x):
    return np.log(x).astype(np.float32)


def step(key):
    noise = jax.random.uniform(key, (4,))
    return jax.pure_callback(host_log, jax.ShapeDtypeStruct((4,), jnp.float32), noise - 2.0)
"""


def test_a_nan_reduced_at_the_source_level_ends_in_an_assertion(tmp_path_factory):
    """No cut: the NaN comes from a host callback (no equation of it can be written as Python). The source-level
    reproducer ends in a check of the jitted call's values, so `python repro.py` raises an AssertionError naming
    the NaN, and that is what `verified` checked. The function takes a PRNG key: --args key:0."""
    module = tmp_path_factory.mktemp("host") / "host.py"
    module.write_text(HOST_NAN)
    code, report, out = repro(tmp_path_factory, f"{module}::step", "--args", "key:0", "--max-time", "120")
    result = report["result"]
    assert code == 0 and result["verified"] and result["strategy"] == "source", result
    assert any("computation reduction not possible" in note for note in result["notes"])
    assert "AssertionError: jax.jit(step) produced NaN" in result["verification"]
    text = (out / "repro.py").read_text()
    assert "check_no_nan(_jax.jit(step)(" in text and imports_of(out / "repro.py") <= {"jax", "numpy"}
    run = fresh_run(str(out / "repro.py"))
    assert run.returncode != 0 and "AssertionError: jax.jit(step) produced NaN" in run.stderr


def test_a_function_without_arguments_is_called_with_nothing(tmp_path):
    """No inputs: the script jaxdbg reduces calls `jax.jit(f)()` and reads no inputs.npz."""
    module = tmp_path / "nullary.py"
    module.write_text("import jax.numpy as jnp\n\ndef f():\n    return jnp.log(jnp.zeros(2) - 1.0)\n")
    subject = prepare_subject(parse_target(f"{module}::f"), None, None, 0, str(tmp_path / "work"))
    assert subject.companions == {} and subject.data_free_source is None
    assert subject.source.endswith("_jax.jit(f)()\n") and "inputs.npz" not in subject.source
    run = subprocess.run([sys.executable, subject.path], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr


def test_time_limit_keeps_the_smallest_verified_reproducer(tmp_path_factory):
    """The shape error is cut to its operation (repro.py); the source, reduced for the time left, goes into
    repro_source.py: the smallest candidate that verified, with the raising statement as written."""
    code, report, out = repro(tmp_path_factory, recipe("repro_shape_error", "model_init.py"), "--max-time", "90")
    result = report["result"]
    assert code == 0 and result["verified"] and result["failing_primitives"] == ["dot_general"]
    assert result["signature"]["type"] == "TypeError" and "dot_general" in result["signature"]["message"]
    source = (out / "repro_source.py").read_text()
    assert "return x @ p['w'] + p['b']" in source and source.endswith("\n")  # the raising statement, as written
    assert any("repro_source.py" in note and "stopped after" in note for note in result["notes"])
    assert count_lines(source) < result["original"]["lines"]


def test_flaky_failure_is_reported_as_such(tmp_path_factory):
    folder = tmp_path_factory.mktemp("flaky")
    script = folder / "flaky.py"
    # (raised by the program itself: a JAX operation's error would be cut to that operation, which never flakes)
    script.write_text("import os, sys\nimport jax.numpy as jnp\nmarker = sys.argv[1]\nx = jnp.ones(3)\n"
                      "if not os.path.exists(marker):\n    open(marker, 'w').close()\n"
                      "    raise ValueError(f'bad batch: {float(x.sum())}')\n")
    code, report, _ = repro(tmp_path_factory, str(script), "--jobs", "1", "--max-time", "8", "--",
                            str(folder / "marker"), runs=2)
    result = report["result"]
    assert code == 0 and result["flaky"] and not result["verified"]
    assert any("flaky" in note for note in result["notes"])
    assert "ran to completion" in " ".join(result["runs"])


@pytest.mark.usefixtures("hang_repro")  # runs while the hang's reduction waits (see hang_repro)
def test_a_target_that_does_not_fail_is_bad_input(tmp_path, capsys):
    script = tmp_path / "fine.py"
    script.write_text("import jax.numpy as jnp\nprint(jnp.ones(3).sum())\n")
    assert main(["repro", str(script), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nothing to reproduce" in err[0] and "ran to completion" in err[0]


@pytest.mark.usefixtures("hang_repro")
def test_kind_that_does_not_occur_is_reported(tmp_path, capsys):
    script = tmp_path / "raises.py"
    script.write_text("import jax.numpy as jnp\njnp.dot(jnp.ones(3), jnp.ones(4))\n")
    assert main(["repro", str(script), "--kind", "crash", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "no failure matching --kind crash" in err and "TypeError" in err


@pytest.mark.parametrize("script, status", [
    (("repro_shape_error", "model_init.py"), "exception"),
    (("repro_nan_graph", "train.py"), "ok"),  # NaN, but nothing raises: only the watch sees it
    (("repro_jit_mismatch", "features.py"), "exception"),
    (("repro_callback_crash", "host_stats.py"), "crash"),
    (("repro_hang", "prefetch.py"), "timeout"),
])
@pytest.mark.usefixtures("hang_repro")
def test_recipes_fail_as_described(script, status):
    # Only the hang needs a short limit; the others get room for a loaded machine.
    outcome = run_contained(RunRequest(script=recipe(*script)), timeout=4 if status == "timeout" else 60,
                            env=CHILD_ENV)
    assert outcome.status == status
    if script[0] == "repro_nan_graph":
        assert "loss nan" in outcome.stdout


HANG = """import threading
import jax
import jax.numpy as jnp

gate = threading.Event()
SIZE = 16

def wait_for_data(x):
    gate.wait()
    return x

@jax.jit
def step(x):
    y = jnp.cos(x) * 2
    return jax.pure_callback(wait_for_data, jax.ShapeDtypeStruct(y.shape, y.dtype), y)

print(step(jnp.ones(SIZE)))
"""


@pytest.fixture(scope="module")
def hang_repro(tmp_path_factory):
    """`jaxdbg repro` of HANG in a process of its own, started by the first test that uses this fixture and
    collected by test_hang_in_host_callback. Its runs mostly wait (a hung run sleeps in gate.wait() for the
    whole --timeout), so the tests marked to run meanwhile (single contained runs and bad input: one core)
    overlap its 80 s instead of adding to them."""
    folder = tmp_path_factory.mktemp("hang")
    (folder / "hang.py").write_text(HANG)
    # Every run that hangs takes the whole --timeout, and a fresh process (detection, verification) must reach
    # the hang within it, jax imported, on a loaded machine too: 15 s (8 s was too short at load 4: "fails
    # before doing any JAX work"). --max-time leaves room for one round of candidates between detection and
    # verification (each about --timeout).
    proc = subprocess.Popen([sys.executable, "-m", "jaxdbg", "repro", str(folder / "hang.py"), "--timeout", "15",
                             "--max-time", "80", "--out", str(folder / "o"), "--json", str(folder / "r.json"), "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def finished():
        _, err = proc.communicate(timeout=240)
        report = json.loads((folder / "r.json").read_text()) if (folder / "r.json").exists() else None
        return proc.returncode, report, folder / "o", err

    yield finished
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def test_hang_in_host_callback(hang_repro):
    code, report, out, err = hang_repro()
    assert report is not None, err[-3000:]
    result = report["result"]
    assert code == 0 and result["verified"] and result["signature"]["kind"] == "timeout"
    assert "gate.wait()" in (out / "repro.py").read_text()
    assert result["minimized"]["lines"] < result["original"]["lines"]


def test_the_many_runs_leave_the_users_folder_alone(tmp_path, monkeypatch):
    """Detection, candidates and verification run in a scratch mirror of the working folder: a log the
    target appends to, or a file it creates, is written there, not dozens of times into the user's folder."""
    home = tmp_path / "project"
    home.mkdir()
    (home / "run_log.txt").write_text("mine\n")
    (home / "shape.py").write_text(
        "import jax.numpy as jnp\n\nwith open('run_log.txt', 'a') as log:\n    log.write('started\\n')\n"
        "open('made_by_target.txt', 'w').write('x')\nx = jnp.ones((2, 3))\nprint((x @ x).sum())\n")
    monkeypatch.chdir(home)
    # --out relative to the user's folder: the reproducer is still found and verified from the scratch one
    assert main(["repro", "shape.py", "--max-time", "120", "--out", "../o", "-q"]) == 0
    assert (tmp_path / "o" / "repro.py").exists()
    assert (home / "run_log.txt").read_text() == "mine\n"
    assert sorted(p.name for p in home.iterdir()) == ["run_log.txt", "shape.py"]
