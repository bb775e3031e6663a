"""The examples in jaxdbg's docstrings run, module by module, against the jaxdbg that is imported.

The modules are found from the imported package itself (not from the source tree), so under CI, where
jaxdbg is installed non-editably and the tests run from the repository's root, the installed copy's
docstrings are the ones checked. An example marked ``# doctest: +SKIP`` is allowed only in the modules of
``SKIP_ALLOWED``: each needs a child process, files on disk or a long run, and the test named beside it
makes an equivalent call for real.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import jaxdbg

# Modules whose examples may be skipped, and where an equivalent call runs for real.
SKIP_ALLOWED = {
    "jaxdbg.check": "run_suite() runs the checks' commands in children: tests/test_check.py",
    "jaxdbg.memory": "memory() in a child: tests/test_docs_api.py (docs/api.md)",
    "jaxdbg.memory.run": "memory() in a child: tests/test_docs_api.py (docs/api.md)",
    "jaxdbg.hang.api": "hunt() in a child: tests/test_hang_single.py",
    "jaxdbg.nan": "hunt() in a child: tests/test_docs_api.py (docs/api.md)",
    "jaxdbg.nan.api": "hunt() in a child: tests/test_docs_api.py (docs/api.md)",
    "jaxdbg.nan.bundle": "writes files: tests/test_nan_cli.py::test_script_found_contract_json_and_bundle",
    "jaxdbg.nan.session":
        "hunt_here() runs a script: tests/test_nan_cli.py::test_function_mode_grad_of_a_loss_with_aux",
    "jaxdbg.nan.watch": "Watch raising inside jit: tests/test_nan_watch.py",
    "jaxdbg.pipeline.output": "writes files: tests/test_pipeline_cli.py::test_trace_and_plots_are_written",
    "jaxdbg.pipeline.real": "threads over several devices: tests/test_pipeline_real.py",
    "jaxdbg.profile": "profile() in a child: tests/test_docs_api.py (docs/api.md)",
    "jaxdbg.profile.run": "profile() in a child: tests/test_docs_api.py (docs/api.md)",
    "jaxdbg.profile.assemble": "child messages: tests/test_profile_script.py",
    "jaxdbg.profile.capture_report": "reads a capture on disk: tests/test_profile_capture.py",
    "jaxdbg.profile.instrument": "instrumentation inside the child: tests/test_profile_script.py",
    "jaxdbg.profile.ops": "reads a capture on disk: tests/test_profile_function.py",
    "jaxdbg.profile.serve": "starts xprof: tests/test_profile_function.py::test_serve_answers_on_loopback_then_stops",
    "jaxdbg.profile.trace": "jax.profiler capture to disk: tests/test_profile_script.py",
    "jaxdbg.repro": "reproduce() in children: tests/test_docs_api.py (docs/api.md)",
    "jaxdbg.repro.core": "reproduce() in children: tests/test_docs_api.py (docs/api.md)",
    "jaxdbg.repro.cutting": "runs in the cut child: tests/test_repro_cli.py",
    "jaxdbg.repro.failures": "observes child runs: tests/test_repro_cli.py",
    "jaxdbg.repro.forkserver": "a fork server process: tests/test_repro_cli.py",
    "jaxdbg.repro.jobs": "a child job: tests/test_repro_cli.py",
    "jaxdbg.repro.subject": "writes the subject's files: tests/test_repro_cli.py",
    "jaxdbg.repro.watch": "inside a contained job: tests/test_repro_cli.py",
    "jaxdbg.runner": "a child process: tests/test_docs_api.py (docs/api.md), tests/test_runner.py",
}

# Examples that fail today in files this change may not edit; each entry goes when its file is fixed
# (strict: the test then fails until the entry is removed).
KNOWN_FAILING: dict[str, str] = {}

FLAGS = doctest.ELLIPSIS


def _modules() -> list[str]:
    names = [jaxdbg.__name__]
    names.extend(info.name for info in pkgutil.walk_packages(jaxdbg.__path__, prefix="jaxdbg.")
                 if info.name.rsplit(".", 1)[-1] != "__main__")  # running it would edit sys.path
    return sorted(names)


MODULES = _modules()


def _tests(name: str) -> list[doctest.DocTest]:
    module = importlib.import_module(name)
    return [t for t in doctest.DocTestFinder(exclude_empty=True).find(module, name, module=module) if t.examples]


def _params() -> list:
    return [pytest.param(name, marks=pytest.mark.xfail(reason=KNOWN_FAILING[name], strict=True))
            if name in KNOWN_FAILING else name for name in MODULES]


@pytest.mark.parametrize("name", _params())
def test_docstring_examples_run(name: str) -> None:
    failures = []
    for test in _tests(name):
        runner = doctest.DocTestRunner(optionflags=FLAGS)
        report: list[str] = []
        result = runner.run(test, out=report.append, clear_globs=True)
        if result.failed:
            failures.append("".join(report))
    assert not failures, "\n".join(failures)


def test_skips_only_where_a_real_test_covers_the_call() -> None:
    skipped = {}
    for name in MODULES:
        count = sum(1 for t in _tests(name) for e in t.examples if e.options.get(doctest.SKIP))
        if count:
            skipped[name] = count
    unexpected = sorted(set(skipped) - set(SKIP_ALLOWED))
    assert not unexpected, f"examples marked +SKIP outside SKIP_ALLOWED (make them run): {unexpected}"


def test_the_walk_sees_the_whole_package() -> None:
    """A test over no modules could not fail: the walk must find the command modules and the subpackages."""
    walked = {"jaxdbg.cli.profile", "jaxdbg.nan.localise", "jaxdbg.repro.cut", "jaxdbg.schema", "jaxdbg.report"}
    assert walked <= set(MODULES)
    assert sum(len(t.examples) for name in MODULES for t in _tests(name)) > 100
