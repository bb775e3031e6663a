"""``jaxdbg check``: the CI smoke checks listed in a pyproject.toml's ``[tool.jaxdbg.check]`` table.

A library first (:mod:`jaxdbg.cli.check` only parses options and renders): :func:`load_checks` reads the
table, :func:`run_suite` runs the checks and judges them (findings, baselines), :func:`junit_xml` and
:mod:`jaxdbg.check.github` turn the result into what CI systems read.

Example:
    >>> from pathlib import Path
    >>> run = run_suite(load_checks(Path("pyproject.toml")), Settings(Path("jaxdbg-out/check")))  # doctest: +SKIP
    >>> run.result.passed, [c.finding for c in run.result.checks]                                  # doctest: +SKIP
    (False, ['nan first made by log (forward pass) at train.py:7 in loss, call 0'])
"""

from jaxdbg.check.config import CheckSpec as CheckSpec
from jaxdbg.check.config import find_config as find_config
from jaxdbg.check.config import load_checks as load_checks
from jaxdbg.check.junit import junit_xml as junit_xml
from jaxdbg.check.result import CheckOutcome as CheckOutcome
from jaxdbg.check.result import CheckSuiteResult as CheckSuiteResult
from jaxdbg.check.result import Regression as Regression
from jaxdbg.check.runner import Settings as Settings
from jaxdbg.check.runner import SuiteRun as SuiteRun
from jaxdbg.check.runner import run_suite as run_suite
