"""The two errors a running :func:`jaxdbg.watch` raises (imports no jax: the pytest plugin catches them).

Both carry ``.report``, the ``result`` dict of the report the watch wrote (``.path`` is that file), and
say in their one-line message what was found.

Example:
    >>> err = NonFiniteError("nan from log at train.py:12", {"found": True}, "out/report.json")
    >>> err.exit_code, err.report["found"], err.path
    (1, True, 'out/report.json')
"""

from __future__ import annotations

from jaxdbg._errors import EXIT_FOUND, JaxdbgError


class WatchError(JaxdbgError):
    """Something :func:`jaxdbg.watch` looks for was found (exit code 1, as the commands use for a finding)."""

    exit_code = EXIT_FOUND

    def __init__(self, message: str, report: dict, path: str | None = None):
        super().__init__(message)
        self.report = report
        self.path = path


class NonFiniteError(WatchError):
    """A watched jitted call returned NaN/Inf; ``report`` is the nan-hunt ``result`` of its origin."""


class RecompileError(WatchError):
    """A watched function compiled more than ``max_compiles`` times; ``report`` names each recompile's cause."""
