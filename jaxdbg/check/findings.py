"""The one-line finding of a check and the user line it points at, read from its command's JSON report.

nan-hunt points at the origin's source; profile at what broke the budget: the user's line of the first
call that recompiled for ``recompiles``/``compiles`` (its cause joins the line), the function named in a
``function.metric`` violation, else the first function that ran; memory at the call that ran out of memory,
the function that does not fit (or that a broken rule names), or the line that keeps a leak. The line is the
command's own ``essential_line()``, rebuilt from the JSON report.

Example:
    >>> report = {"command": "nan-hunt", "exit_code": 1, "result": {"found": True, "first": {
    ...     "kind": "nan", "primitive": "log", "pass": "forward", "function": "loss", "call_index": 0,
    ...     "source": {"file": "/p/train.py", "line": 7, "function": "loss"}}}}
    >>> line, where = finding(report)
    >>> line, str(where)
    ('nan first made by log (forward pass) at train.py:7 in loss, call 0', '/p/train.py:7 (loss)')
"""

from __future__ import annotations

from typing import Any

from jaxdbg._source import SourceLocation


def location(raw: dict | None) -> SourceLocation | None:
    """A report's ``{file, line, function}`` as a SourceLocation (None when the report has none)."""
    if not raw or raw.get("file") is None or raw.get("line") is None:
        return None
    return SourceLocation(str(raw["file"]), int(raw["line"]), str(raw.get("function") or ""))


def finding(report: dict[str, Any]) -> tuple[str | None, SourceLocation | None]:
    """(the one-line finding, its user line) of a command's report; (None, None) when it found nothing."""
    result = report.get("result") or {}
    if "error" in result and len(result) == 1:  # a command that stopped: its stderr line
        return str(result["error"]), None
    if report.get("command") == "nan-hunt":
        return _nan_finding(result)
    if report.get("command") == "memory":
        return _memory_finding(result)
    if report.get("command") == "hang-hunt":
        return _hang_finding(result, report.get("exit_code"))
    return _profile_finding(result)


def _memory_finding(result: dict) -> tuple[str | None, SourceLocation | None]:
    """The out-of-memory call's line, else the function that does not fit (or a function a broken rule names),
    else the line that keeps a leak."""
    from jaxdbg.memory.result import finding_line

    line = finding_line(result)
    if line is None:
        return None, None
    oom = result.get("out_of_memory")
    if oom and oom.get("source"):
        return line, location(oom["source"])
    functions = result.get("functions") or []
    violations = (result.get("budget") or {}).get("violations") or []
    named = next((f for f in functions if f.get("fits") is False), None) or next(
        (f for f in functions for v in violations if v.startswith(f"{f['name']}.")), None)
    if named is not None:
        return line, location(named.get("source"))
    leak = next(iter(result.get("leaks") or []), None)
    if leak is not None:
        return line, location(leak.get("kept_at") or leak.get("source"))
    return line, location(result.get("error_source")) or (location(functions[0].get("source")) if functions else None)


def _hang_finding(result: dict, exit_code: Any) -> tuple[str | None, SourceLocation | None]:
    """The verdict, at the stuck process's line (or the first side of a divergence).

        >>> _hang_finding({"verdict": "deadlock: ...", "stuck": [0], "divergence": None,
        ...                "processes": [{"source": {"file": "t.py", "line": 3, "function": "f"}}]}, 1)
        ('deadlock: ...', SourceLocation(file='t.py', line=3, function='f'))
    """
    if exit_code == 0:
        return None, None
    processes = result.get("processes") or []
    stuck = [processes[i] for i in result.get("stuck") or () if i < len(processes)]
    where = next((location(p.get("source")) for p in stuck if p.get("source")), None)
    sides = (result.get("divergence") or {}).get("sides") or []
    if where is None and sides:
        where = location(sides[0].get("source"))
    return result.get("verdict"), where


def _nan_finding(result: dict) -> tuple[str | None, SourceLocation | None]:
    from jaxdbg.nan.result import Origin

    first = result.get("first")
    if not result.get("found") or not first:
        return None, None
    where = location(first.get("source"))
    origin = Origin(first["kind"], first.get("primitive"), first.get("pass") or "forward", where,
                    first.get("function") or "", int(first.get("call_index") or 0))
    return origin.describe(), where


def _profile_finding(result: dict) -> tuple[str | None, SourceLocation | None]:
    functions = result.get("functions") or []
    budget = result.get("budget") or {}
    if result.get("error"):
        return str(result["error"]), location(result.get("error_source"))
    if budget.get("ok", True):
        return None, None
    violations = budget.get("violations") or []
    where, cause = _budget_location(violations, functions)
    return "budget broken: " + "; ".join(violations) + (f"; {cause}" if cause else ""), where


def _budget_location(violations: list[str], functions: list[dict]) -> tuple[SourceLocation | None, str | None]:
    """A recompile budget points at the call that recompiled (and says why it did); any other at the
    function it names, else the first function that ran."""
    by_name = {f["name"]: f for f in functions}
    first = violations[0] if violations else ""
    named = next((f for name, f in by_name.items() if first.startswith(f"{name}.")), None)
    metric = first[len(named["name"]) + 1:] if named else first
    if metric.startswith(("recompiles", "compiles")):
        for function in [named] if named else functions:
            call = next((r for r in function.get("recompiles") or [] if r.get("source")), None)
            if call is not None:
                cause = f"{function['name']} recompiled at call {call.get('call_index')}"
                return location(call["source"]), cause + (f": {call['reason']}" if call.get("reason") else "")
        named = named or next((f for f in functions if f.get("recompiles")), None)
    if named is None and functions:
        named = functions[0]
    return (location(named.get("source")) if named else None), None
