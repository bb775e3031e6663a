"""The one-line finding of a check and the user line it points at, read from its command's JSON report.

nan-hunt points at the origin's source; profile at what broke the budget: the user's line of the first
call that recompiled for ``recompiles``/``compiles`` (its cause joins the line), the function named in a
``function.metric`` violation, else the first function that ran; memory at the call that ran out of memory,
the function that does not fit (or that a broken rule names), or the line that keeps a leak. The report is read
back into its command's result types (:func:`jaxdbg.results.read_report`) and judged on them (memory's line
is its result's ``essential_line()``, nan-hunt's its origin's ``describe()``).

Example:
    >>> from jaxdbg.nan.result import NanHuntResult, Origin
    >>> origin = Origin("nan", "log", "forward", SourceLocation("/p/train.py", 7, "loss"), "loss", 0)
    >>> report = Report("nan-hunt", "train.py", NanHuntResult(True, origin), 1, {}, {"process_index": 0})
    >>> line, where = finding(report.to_dict())
    >>> line, str(where)
    ('nan first made by log (forward pass) at train.py:7 in loss, call 0', '/p/train.py:7 (loss)')
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jaxdbg._source import SourceLocation
from jaxdbg.report import Report
from jaxdbg.results import is_error, read_report

if TYPE_CHECKING:
    from jaxdbg.hang.result import HangResult
    from jaxdbg.memory.result import MemoryResult
    from jaxdbg.nan.result import NanHuntResult
    from jaxdbg.profile.model import FunctionProfile, ProfileResult

Finding = tuple[str | None, SourceLocation | None]


def finding(report: Report | dict[str, Any]) -> Finding:
    """(the one-line finding, its user line) of a command's report (typed, or its JSON); (None, None) when it
    found nothing. A report whose JSON is not its command's result raises ReportReadError naming the field."""
    read = report if isinstance(report, Report) else read_report(report)
    result = read.result
    if is_error(result):  # a command that stopped: its stderr line
        return str(result["error"]), None
    if read.command == "nan-hunt":
        return _nan_finding(result)
    if read.command == "memory":
        return _memory_finding(result)
    if read.command == "hang-hunt":
        return _hang_finding(result, read.exit_code)
    return _profile_finding(result)


def _memory_finding(result: MemoryResult) -> Finding:
    """The out-of-memory call's line, else the function that does not fit (or a function a broken rule names),
    else the line that keeps a leak."""
    line = result.essential_line()
    if line is None:
        return None, None
    oom = result.out_of_memory
    if oom is not None and oom.source is not None:
        return line, oom.source
    functions = result.functions
    violations = result.budget.violations
    named = next((f for f in functions if f.fits is False), None) or next(
        (f for f in functions for v in violations if v.startswith(f"{f.name}.")), None)
    if named is not None:
        return line, named.source
    leak = next(iter(result.leaks), None)
    if leak is not None:
        return line, leak.kept_at or leak.source
    return line, result.error_source or (functions[0].source if functions else None)


def _hang_finding(result: HangResult, exit_code: int) -> Finding:
    """The verdict, at the stuck process's line (or the first side of a divergence)."""
    if exit_code == 0:
        return None, None
    processes = result.processes
    stuck = [processes[i] for i in result.stuck if i < len(processes)]
    where = next((p.source for p in stuck if p.source is not None), None)
    sides = result.divergence.sides if result.divergence is not None else ()
    if where is None and sides:
        where = sides[0].source
    return result.verdict, where


def _nan_finding(result: NanHuntResult) -> Finding:
    first = result.first
    if not result.found or first is None:
        return None, None
    return result.essential_line(), first.source


def _profile_finding(result: ProfileResult) -> Finding:
    if result.error:
        return result.error, result.error_source
    if result.budget.ok:
        return None, None
    violations = result.budget.violations
    where, cause = _budget_location(violations, result.functions)
    return "budget broken: " + "; ".join(violations) + (f"; {cause}" if cause else ""), where


def _budget_location(violations: tuple[str, ...], functions: tuple[FunctionProfile, ...]
                     ) -> tuple[SourceLocation | None, str | None]:
    """A recompile budget points at the call that recompiled (and says why it did); any other at the
    function it names, else the first function that ran."""
    by_name = {f.name: f for f in functions}
    first = violations[0] if violations else ""
    named = next((f for name, f in by_name.items() if first.startswith(f"{name}.")), None)
    metric = first[len(named.name) + 1:] if named else first
    if metric.startswith(("recompiles", "compiles")):
        for function in [named] if named else functions:
            call = next((r for r in function.recompiles or () if r.source is not None), None)
            if call is not None:
                cause = f"{function.name} recompiled at call {call.call_index}"
                return call.source, cause + (f": {call.reason}" if call.reason else "")
        named = named or next((f for f in functions if f.recompiles), None)
    if named is None and functions:
        named = functions[0]
    return (named.source if named else None), None


def function_source(report: Report | None, name: str) -> SourceLocation | None:
    """Where the profiled function ``name`` is defined (a regression's line)."""
    if report is None or is_error(report.result):
        return None
    profile: ProfileResult = report.result
    return next((f.source for f in profile.functions if f.name == name), None)
