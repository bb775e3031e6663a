"""``--compare OLD.json``: per-function deltas against an earlier ``jaxdbg profile`` report.

:func:`load_baseline` reads the earlier report's ``result``; :func:`compare` matches functions by name (and, among
functions of one name, by their line first: ``jax.jit(loss)`` beside ``jax.jit(jax.value_and_grad(loss))``).

Example:
    >>> from jaxdbg.profile.model import CompileTimes, ExecuteStats, FunctionProfile, Totals
    >>> old = {"functions": [{"name": "step", "compile": {"total_s": 1.0}, "execute": {"median_s": 0.004}}]}
    >>> new = FunctionProfile("step", None, 1, (), CompileTimes(total_s=0.5), ExecuteStats(calls=8, median_s=0.002))
    >>> step, totals = compare(old, (new,), Totals(wall_s=1.0, compile_s=0.5, execute_s=0.1, transfer_s=0, other_s=0.4))
    >>> step.status, step.metrics["compile_s"]["ratio"], step.metrics["execute_median_s"]["ratio"]
    ('changed', 0.5, 0.5)
    >>> totals.name, totals.metrics["wall_s"]
    ('<totals>', {'old': None, 'new': 1.0, 'delta': None, 'ratio': None})
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Sequence
from typing import Any

from jaxdbg._errors import UsageError
from jaxdbg.profile.model import FunctionDelta, FunctionProfile, Totals

# metric -> path into a function's JSON
_FUNCTION_METRICS = {
    "compile_s": ("compile", "total_s"), "backend_compile_s": ("compile", "compile_s"),
    "execute_median_s": ("execute", "median_s"), "execute_p90_s": ("execute", "p90_s"),
    "execute_total_s": ("execute", "total_s"), "calls": ("execute", "calls"), "compiles": ("compiles",),
}
_TOTAL_METRICS = ("wall_s", "compile_s", "execute_s", "transfer_s", "other_s")


def load_baseline(path: str) -> dict[str, Any]:
    """The ``result`` of an earlier profile report; UsageError (exit 2) for anything else."""
    if not os.path.exists(path):
        raise UsageError(f"--compare '{path}': no such file; pass the --json output of an earlier jaxdbg profile")
    try:
        with open(path) as handle:
            report = json.load(handle)
    except (OSError, ValueError) as err:
        raise UsageError(f"--compare '{path}': not a readable JSON report ({err})") from None
    if not isinstance(report, dict) or report.get("command") != "profile":
        command = report.get("command") if isinstance(report, dict) else None
        raise UsageError(f"--compare '{path}': not a jaxdbg profile report (command is {command!r}); "
                         "pass the --json output of an earlier jaxdbg profile")
    result = report.get("result")
    if not isinstance(result, dict) or not isinstance(result.get("functions"), list):
        raise UsageError(f"--compare '{path}': the report holds no profile result; was the earlier run cut short?")
    return {**result, "_target": report.get("target")}


def other_target_note(baseline: dict, target: str) -> str | None:
    """A note when the earlier report profiled another program (its deltas may mean little)."""
    earlier = baseline.get("_target")
    if not earlier or os.path.basename(str(earlier).split("::")[0]) == os.path.basename(target.split("::")[0]):
        return None
    return f"--compare: the earlier report profiled '{earlier}', not '{target}'; its deltas compare different programs"


def _dig(data: Any, path: tuple[str, ...]) -> float | None:
    for key in path:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return float(data) if isinstance(data, (int, float)) and not isinstance(data, bool) else None


def _delta(old: float | None, new: float | None) -> dict[str, float | None]:
    return {"old": old, "new": new, "delta": None if old is None or new is None else new - old,
            "ratio": None if not old or new is None else new / old}


def labels(functions: Sequence[tuple[str, str | None]]) -> list[str]:
    """Each function's name, with its place (``file:line``) where another function has the same name.

    Example:
        >>> labels([("loss", "train.py:12"), ("loss", "train.py:20"), ("step", "train.py:30")])
        ['loss (train.py:12)', 'loss (train.py:20)', 'step']
    """
    counts = Counter(name for name, _ in functions)
    return [f"{name} ({place})" if counts[name] > 1 and place else name for name, place in functions]


def place(source: Any) -> str | None:
    """``file:line`` of a function's source (a SourceLocation, or its JSON form), the file by its base name."""
    if isinstance(source, dict):
        file, line = source.get("file"), source.get("line")
    else:
        file, line = getattr(source, "file", None), getattr(source, "line", None)
    return f"{os.path.basename(str(file))}:{line}" if file else None


def compare(baseline: dict[str, Any], functions: tuple[FunctionProfile, ...],
            totals: Totals) -> tuple[FunctionDelta, ...]:
    """Deltas per function (by name; functions of one name by their line first, then in order) and for the run's
    totals (as the pseudo-function ``<totals>``)."""
    from jaxdbg.report import to_jsonable

    earlier = [f for f in baseline["functions"] if isinstance(f, dict)]
    places = [place(f.source) for f in functions]
    matched: list[dict | None] = [None] * len(functions)
    for same_line in (True, False):
        for i, function in enumerate(functions):
            if matched[i] is None:
                found = next((o for o in earlier if o.get("name") == function.name
                              and (not same_line or place(o.get("source")) == places[i])), None)
                if found is not None:
                    matched[i] = found
                    earlier.remove(found)
    deltas = []
    for function, label, old in zip(functions, labels([(f.name, p) for f, p in zip(functions, places)]), matched):
        new = to_jsonable(function)
        metrics = {m: _delta(_dig(old, p) if old else None, _dig(new, p)) for m, p in _FUNCTION_METRICS.items()}
        deltas.append(FunctionDelta(label, "changed" if old else "new", metrics))
    gone = labels([(str(o.get("name")), place(o.get("source"))) for o in earlier])
    deltas.extend(FunctionDelta(label, "gone", {}) for label in gone)
    old_totals = baseline.get("totals") or {}
    deltas.append(FunctionDelta("<totals>", "changed", {
        m: _delta(_dig(old_totals, (m,)), getattr(totals, m)) for m in _TOTAL_METRICS}))
    return tuple(deltas)
