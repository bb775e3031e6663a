"""CI budgets: ``--budget "compile_s<=2,execute_median_ms<=50,recompiles<=0,train_step.compile_s<=1"``.

A rule is ``[function.]metric OP number`` with OP one of ``<= < >= > ==``. Time metrics take a unit
suffix (``_s``, ``_ms``, ``_us``). An unqualified metric that has a run-wide total (``compile_s``,
``execute_s``, ``transfer_s``, ``wall_s``, ``other_s``, ``recompiles``, ``compiles``) checks the total;
one that exists only per function (``execute_median_ms``, ``execute_p90_ms``, ``first_s``, ``calls``)
checks every function. A qualified rule checks that function; one naming a function that never ran is a
violation (a CI gate must not pass silently).

Example:
    >>> rules = parse_budget("compile_s<=2, train_step.execute_median_ms<50")
    >>> [str(r) for r in rules]
    ['compile_s<=2', 'train_step.execute_median_ms<50']
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from jaxdbg._errors import UsageError
from jaxdbg.profile.compare import labels, place
from jaxdbg.profile.model import BudgetResult, FunctionProfile, Totals

_OPS: dict[str, tuple[Callable[[float, float], bool], str]] = {
    "<=": (operator.le, ">"), "<": (operator.lt, ">="), ">=": (operator.ge, "<"), ">": (operator.gt, "<="),
    "==": (operator.eq, "!="),
}
OPERATORS = _OPS  # shared with jaxdbg.memory.budget: (holds, the operator that says it broke)
_RULE = re.compile(r"^\s*(?:([A-Za-z_<>][\w.<>\-]*)\.)?([a-z_0-9]+)\s*(<=|>=|==|<|>)\s*([-+0-9.eE]+)\s*$")
_UNITS = {"s": 1.0, "ms": 1e3, "us": 1e6}

# metric (in seconds or a count) -> (reads a Totals or None, reads a FunctionProfile or None)
_TOTAL_READERS: dict[str, Callable[[Totals, tuple[FunctionProfile, ...]], float | None]] = {
    "wall": lambda t, f: t.wall_s, "compile": lambda t, f: t.compile_s, "execute": lambda t, f: t.execute_s,
    "transfer": lambda t, f: t.transfer_s, "other": lambda t, f: t.other_s,
    "recompiles": lambda t, f: _known_sum(len(x.recompiles) if x.recompiles is not None else None for x in f),
    "compiles": lambda t, f: _known_sum(x.compiles for x in f),
}
_FUNCTION_READERS: dict[str, Callable[[FunctionProfile], float | None]] = {
    "compile": lambda f: f.compile.total_s if f.compile else None,
    "trace": lambda f: f.compile.trace_s if f.compile else None,
    "lower": lambda f: f.compile.lower_s if f.compile else None,
    "backend_compile": lambda f: f.compile.compile_s if f.compile else None,
    "execute": lambda f: f.execute.total_s,
    "execute_median": lambda f: f.execute.median_s, "execute_p90": lambda f: f.execute.p90_s,
    "first": lambda f: f.execute.first_s, "calls": lambda f: float(f.execute.calls),
    "recompiles": lambda f: _known_sum([len(f.recompiles)] if f.recompiles is not None else [None]),
    "compiles": lambda f: _known_sum([f.compiles]),
}


def _known_sum(values: Iterable[float | None]) -> float | None:
    """The sum, or None where a value is unknown (a capture knows no compiles)."""
    known = list(values)
    return None if any(v is None for v in known) else float(sum(v for v in known if v is not None))
_COUNTS = {"recompiles", "compiles", "calls"}


@dataclass(frozen=True)
class BudgetRule:
    function: str | None
    metric: str  # as written, e.g. 'execute_median_ms'
    base: str  # without the unit, e.g. 'execute_median'
    scale: float  # seconds -> the written unit
    op: str
    limit: float

    def __str__(self) -> str:
        prefix = f"{self.function}." if self.function else ""
        return f"{prefix}{self.metric}{self.op}{self.limit:g}"


def parse_budget(text: str | None) -> tuple[BudgetRule, ...]:
    """Parse a budget; raise :class:`UsageError` (exit 2) naming the rule that cannot be read."""
    if text is None:
        return ()
    rules = []
    for part in (p for p in text.split(",")):
        if not part.strip():
            raise UsageError(f"--budget '{text}': empty rule; separate rules with single commas, e.g. "
                             "\"compile_s<=2,recompiles<=0\"")
        match = _RULE.match(part)
        if not match:
            raise UsageError(f"--budget '{text}': cannot read '{part.strip()}'; write [function.]metric<=number, "
                             "e.g. compile_s<=2 or train_step.execute_median_ms<50")
        function, metric, op, number = match.groups()
        base, scale = _split_unit(metric, text)
        if function and base not in _FUNCTION_READERS:
            raise UsageError(f"--budget '{text}': '{metric}' is measured for the whole run only; "
                             f"write it without '{function}.'")
        try:
            limit = float(number)
        except ValueError:
            raise UsageError(f"--budget '{text}': '{number}' is not a number") from None
        rules.append(BudgetRule(function, metric, base, scale, op, limit))
    return tuple(rules)


def _split_unit(metric: str, text: str) -> tuple[str, float]:
    if metric in _COUNTS:
        return metric, 1.0
    base, _, unit = metric.rpartition("_")
    if unit in _UNITS and (base in _FUNCTION_READERS or base in _TOTAL_READERS) and base not in _COUNTS:
        return base, _UNITS[unit]
    known = sorted({f"{m}_s" for m in _FUNCTION_READERS if m not in _COUNTS} |
                   {f"{m}_s" for m in _TOTAL_READERS if m not in _COUNTS} | _COUNTS)
    raise UsageError(f"--budget '{text}': unknown metric '{metric}'; use one of {', '.join(known)} "
                     "(time metrics also as _ms or _us)")


def check_budget(rules: tuple[BudgetRule, ...], functions: tuple[FunctionProfile, ...], totals: Totals) -> BudgetResult:
    """Check every rule; each violation is named as 'metric actual > limit'."""
    violations, checked = [], []
    # a rule naming a function holds for every function of that name (jax.jit(loss) and its value_and_grad's)
    named = list(zip(functions, labels([(f.name, place(f.source)) for f in functions])))
    for rule in rules:
        checked.append(str(rule))
        if rule.function is not None:
            chosen = [(f, label) for f, label in named if f.name == rule.function]
            if not chosen:
                ran = ", ".join(sorted({f.name for f in functions})) or "none"
                violations.append(f"{rule}: no jitted function '{rule.function}' ran (ran: {ran})")
                continue
        elif rule.base in _TOTAL_READERS:
            value = _TOTAL_READERS[rule.base](totals, functions)
            violations.extend(_compare(rule, "", value))
            continue
        else:
            chosen = named
        for function, label in chosen:
            violations.extend(_compare(rule, f"{label}.", _FUNCTION_READERS[rule.base](function)))
    return BudgetResult(not violations, tuple(violations), tuple(checked))


def _compare(rule: BudgetRule, prefix: str, value: float | None) -> list[str]:
    if value is None:
        return []  # not measured (e.g. a median with no calls): nothing to hold against the budget
    shown = value * rule.scale
    holds, negation = _OPS[rule.op]
    if holds(shown, rule.limit):
        return []
    return [f"{prefix}{rule.metric} {_fmt(shown)} {negation} {rule.limit:g}"]


def _fmt(value: float) -> str:
    return f"{value:.4g}" if value != int(value) or abs(value) >= 1e6 else str(int(value))
