"""Each command's result type, and a whole report read back from its JSON into them.

:func:`read_report` is the one way jaxdbg reads a report (``jaxdbg check`` judging its commands' reports,
``--metrics`` exporting one): the envelope as a :class:`~jaxdbg.report.Report` whose ``result`` is the command's
result dataclass again (:func:`jaxdbg.report.from_jsonable`), or ``{"error": ...}`` for a command that stopped.
A field the result type does not have, or lacks, is a :class:`~jaxdbg.report.ReportReadError` naming it.

Example:
    >>> document = {"command": "check", "target": "pyproject.toml", "exit_code": 0, "artifacts": {},
    ...             "environment": {"process_index": 0}, "result": {"passed": True, "checks": []}}
    >>> read_report(document).result
    CheckSuiteResult(passed=True, checks=())
    >>> read_report({**document, "result": {"error": "--jobs 0: give 1 or more"}, "exit_code": 2}).result
    {'error': '--jobs 0: give 1 or more'}
"""

from __future__ import annotations

from typing import Any

from jaxdbg.report import Report, ReportReadError, from_jsonable


def result_type(command: str) -> Any:
    """The type of ``command``'s ``result`` (a union for ``watch``, whose report holds one of three findings).

    The result modules are imported here, on first use: most of the command packages import jax, which a
    reader of nan-hunt or check reports (the parent of ``jaxdbg check``) need not pay for.
    """
    if command == "check":
        from jaxdbg.check.result import CheckSuiteResult

        return CheckSuiteResult
    if command == "nan-hunt":
        from jaxdbg.nan.result import NanHuntResult

        return NanHuntResult
    if command == "hang-hunt":
        from jaxdbg.hang.result import HangResult

        return HangResult
    if command == "watch":
        from jaxdbg.hang.result import HangResult
        from jaxdbg.live.watch import RecompileResult
        from jaxdbg.nan.result import NanHuntResult

        return NanHuntResult | RecompileResult | HangResult
    return _heavy_result_type(command)


def _heavy_result_type(command: str) -> Any:
    """The result types whose packages import jax (lazy: see :func:`result_type`)."""
    if command == "profile":
        from jaxdbg.profile.model import ProfileResult  # the profile package imports jax

        return ProfileResult
    if command == "memory":
        from jaxdbg.memory.result import MemoryResult  # the memory package imports jax

        return MemoryResult
    if command == "pipeline-bench":
        from jaxdbg.pipeline.bench import BenchResult  # imports jax

        return BenchResult
    if command == "repro":
        from jaxdbg.repro.result import ReproResult  # the repro package imports jax

        return ReproResult
    if command == "doctor":
        from jaxdbg.doctor import DoctorResult  # imports jax

        return DoctorResult
    raise ReportReadError(f"command {command!r}: not a jaxdbg command; a jaxdbg report names one of check, doctor, "
                          "hang-hunt, memory, nan-hunt, pipeline-bench, profile, repro, watch")


def is_error(result: Any) -> bool:
    """Whether a report's ``result`` is a stopped command's ``{"error": ...}``."""
    return isinstance(result, dict) and set(result) == {"error"}


def read_result(command: str, result: Any) -> Any:
    """A report's ``result`` JSON as ``command``'s result type (an error result stays ``{"error": ...}``)."""
    if is_error(result):
        return {"error": str(result["error"])}
    return from_jsonable(result_type(command), result)


def read_report(document: Any) -> Report:
    """A report's JSON (``Report.to_dict()``, or the file read back) as a :class:`Report` with a typed result."""
    if not isinstance(document, dict) or not isinstance(document.get("command"), str):
        raise ReportReadError("report: not a jaxdbg report (no 'command'); give the JSON a jaxdbg command wrote")
    missing = [key for key in ("result", "exit_code") if key not in document]
    if missing:
        raise ReportReadError(f"report: missing field {missing[0]!r}")
    command = document["command"]
    return Report(command, document.get("target"), read_result(command, document["result"]),
                  int(document["exit_code"]), dict(document.get("artifacts") or {}), document.get("environment"))
