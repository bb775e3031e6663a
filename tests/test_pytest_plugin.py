"""The pytest plugin: a marked test runs under jaxdbg.watch and fails with one line, the report in its tmp dir;
unmarked tests are untouched (no jax imported); pytest-xdist workers load it too, through the ``pytest11``
entry point that pyproject.toml declares (no ``-p`` option)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

USER_TESTS = textwrap.dedent('''
    from functools import partial

    import jax
    import jax.numpy as jnp
    import pytest


    @partial(jax.jit, static_argnames=("mode",))  # jitted before the watch: adopted, rebuilt with its options
    def update(buf, mode="add"):
        return buf + 1 if mode == "add" else buf * 2


    @pytest.mark.jaxdbg(max_compiles=1)
    def test_static_keyword():
        update(jnp.ones(3))
        update(jnp.ones(3), mode="mul")


    @pytest.mark.jaxdbg
    def test_goes_nan():
        step = jax.jit(lambda x: jnp.sqrt(2.5 - x))  # <- origin
        for i in range(4):
            step(jnp.full((2,), float(i)))


    @pytest.mark.jaxdbg(max_compiles=1)
    def test_ragged():
        step = jax.jit(lambda batch: batch.sum())
        for n in (8, 8, 5):
            step(jnp.ones((n, 2)))


    @pytest.mark.jaxdbg(nans=True, max_compiles=2)
    def test_clean():
        step = jax.jit(lambda x: jnp.exp(-x))
        assert float(step(jnp.array(1.0))) < 1


    def test_unmarked():
        assert jnp.ones(2).sum() == 2
''')


ORIGIN_LINE = next(i for i, text in enumerate(USER_TESTS.splitlines(), 1) if "<- origin" in text)


def entry_point_path(folder: Path) -> list[str]:
    """What to put on PYTHONPATH so pytest finds the plugin by its entry point, as after ``pip install jaxdbg``:
    nothing when the installed jaxdbg declares it, else a distribution's metadata holding pyproject.toml's
    ``[project.entry-points.pytest11]`` table (an editable install older than the entry point lacks it)."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["pytest11"]
    assert declared == {"jaxdbg": "jaxdbg.pytest_plugin"}
    if any(ep.name == "jaxdbg" for ep in importlib.metadata.entry_points(group="pytest11")):
        return []
    info = folder / "jaxdbg_entry_points-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: jaxdbg-entry-points\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[pytest11]\n" + "".join(f"{k} = {v}\n" for k, v in declared.items()))
    return [str(folder)]


def test_marked_tests_fail_with_one_line_and_keep_their_report_under_xdist(tmp_path):
    (tmp_path / "test_user.py").write_text(USER_TESTS)
    basetemp = tmp_path / "base"
    path = [str(ROOT), *entry_point_path(tmp_path / "site"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider",
         f"--basetemp={basetemp}", "-rf", "test_user.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    out = done.stdout
    assert done.returncode == 1, out[-3000:] + done.stderr[-3000:]
    assert "3 failed, 2 passed" in out, out[-3000:]
    failed = {line.split("::")[-1].split(" ")[0] for line in out.splitlines() if line.startswith("FAILED ")}
    assert failed == {"test_goes_nan", "test_ragged", "test_static_keyword"}
    messages = [line for line in out.splitlines() if line.startswith("jaxdbg.watch: ")]  # each test's failure
    assert len(messages) == 3, out[-3000:]
    nan_line = f"jaxdbg.watch: nan first made by sqrt (forward pass) at test_user.py:{ORIGIN_LINE} in <lambda>, call 3"
    assert any(m.startswith(nan_line + " (report: ") for m in messages)
    assert any(re.search(r"call 2 at test_user\.py:\d+: argument 'batch' shape changed \(8, 2\) -> \(5, 2\); fix: ", m)
               for m in messages)
    # The adopted twin once knew only jax's static_argnums, so the keyword 'mode' read as a pytree change.
    assert any(re.search(r"call 1 at test_user\.py:\d+: static argument 'mode' changed its default \(not passed\) "
                         r"-> 'mul'", m) for m in messages)
    assert "Traceback" not in out and "NonFiniteError" not in out  # the one line, not a traceback
    reports = {path.parent.parent.name: json.loads(path.read_text()) for path in basetemp.glob("*/*/jaxdbg/report.json")
               if not path.parent.parent.name.endswith("current")}  # pytest's "...current" links
    assert {name.rstrip("0123456789") for name in reports} == {"test_goes_nan", "test_ragged", "test_static_keyword"}
    nan = next(r for name, r in reports.items() if name.startswith("test_goes_nan"))
    assert (nan["command"], nan["result"]["first"]["source"]["line"], nan["result"]["first"]["call_index"]) == (
        "watch", ORIGIN_LINE, 3)


def test_loading_the_plugin_imports_no_jax():
    code = "import sys, jaxdbg.pytest_plugin; print(sorted(m for m in sys.modules if m.split('.')[0] == 'jax'))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stderr
