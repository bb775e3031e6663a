"""GitHub Actions: workflow-command annotations at the user's line, and a Markdown job summary.

An annotation is ``::error file=F,line=L,title=T::MESSAGE`` on stdout, with ``F`` relative to the
workspace (``GITHUB_WORKSPACE``, else the current folder) so GitHub places it on the pull request's diff.
Values are escaped as GitHub's toolkit does: ``%``, ``\\r``, ``\\n`` everywhere, and ``:`` and ``,`` in
properties too.

Example:
    >>> from jaxdbg._source import SourceLocation
    >>> from jaxdbg.check.result import CheckOutcome
    >>> at = SourceLocation("/repo/train.py", 7, "loss")
    >>> bad = CheckOutcome("no-nan", "nan-hunt", "train.py", False, 1, "nan: 100% bad\\nline", 1.0, "r.json", at)
    >>> annotation(bad, workspace="/repo")
    '::error file=train.py,line=7,title=jaxdbg check no-nan (nan-hunt)::nan: 100%25 bad%0Aline'
"""

from __future__ import annotations

import os
from pathlib import Path

from jaxdbg.check.result import CheckOutcome, CheckSuiteResult


def escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def annotation(check: CheckOutcome, workspace: str | None = None) -> str:
    """The ``::error`` line of a failed check, at its location when it has one."""
    properties = []
    if check.location is not None:
        base = workspace or os.environ.get("GITHUB_WORKSPACE") or os.getcwd()
        file = os.path.relpath(check.location.file, base)
        properties += [f"file={escape_property(file)}", f"line={check.location.line}"]
    properties.append(f"title={escape_property(f'jaxdbg check {check.name} ({check.command})')}")
    message = check.finding or f"exit code {check.exit_code}"
    return f"::error {','.join(properties)}::{escape_data(message)}"


def annotation_lines(result: CheckSuiteResult) -> list[str]:
    return [annotation(check) for check in result.checks if not check.passed]


def summary_markdown(result: CheckSuiteResult) -> str:
    """The job summary: one row per check."""
    verdict = "all checks passed" if result.passed else f"{sum(not c.passed for c in result.checks)} failed"
    rows = [f"### jaxdbg check: {verdict}", "", "| check | command | result | time | finding |",
            "| --- | --- | --- | --- | --- |"]
    for c in result.checks:
        where = f" ({os.path.basename(c.location.file)}:{c.location.line})" if c.location else ""
        finding = (c.finding or "").replace("|", "\\|") + where
        rows.append(f"| {c.name} | {c.command} | {'pass' if c.passed else '**FAIL**'} | {c.duration_s:.1f} s | "
                    f"{finding} |")
    return "\n".join(rows) + "\n"


def append_summary(result: CheckSuiteResult, path: Path) -> None:
    """Append (GitHub collects every step's additions to this file)."""
    with open(path, "a") as handle:
        handle.write(summary_markdown(result))
