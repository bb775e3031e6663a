"""Memory budgets: ``--budget "peak_bytes<=2GiB,train_step.peak_bytes<=512MiB,leaked_bytes<=0"``.

A rule is ``[function.]metric OP amount`` (amounts with B/KiB/MiB/GiB/TiB or KB/MB/GB/TB). Per function
(the largest over its compiles): ``peak_bytes`` (what a call holds at once), ``needs_bytes`` (live memory
when it was called plus what the call adds), ``temp_bytes``. For the run: ``peak_bytes`` (the estimate at its
busiest call), ``live_bytes`` (most bytes of live arrays seen), ``leaked_bytes`` (held by leaks at the end).
An unqualified per-function-only metric checks every function; a rule naming a function that never ran is a
violation (a CI gate must not pass silently). Budgets are per device.

Example:
    >>> [str(rule) for rule in parse_budget("peak_bytes<=2GiB, train_step.temp_bytes<512MiB")]
    ['peak_bytes<=2147483648', 'train_step.temp_bytes<536870912']
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from jaxdbg._errors import UsageError
from jaxdbg.memory.result import ProgramMemory
from jaxdbg.memory.units import format_bytes, parse_bytes
from jaxdbg.profile.budget import OPERATORS

_RULE = re.compile(r"^\s*(?:([A-Za-z_<>][\w.<>\-]*)\.)?([a-z_]+)\s*(<=|>=|==|<|>)\s*([0-9.eE+]+\s*[A-Za-z]*)\s*$")
_FUNCTION: dict[str, Callable[[ProgramMemory], int | None]] = {
    "peak_bytes": lambda p: p.peak_bytes, "needs_bytes": lambda p: p.needs_bytes, "temp_bytes": lambda p: p.temp_bytes,
}
_RUN = ("peak_bytes", "live_bytes", "leaked_bytes")


@dataclass(frozen=True)
class MemoryRule:
    function: str | None
    metric: str
    op: str
    limit: int

    def __str__(self) -> str:
        return f"{self.function + '.' if self.function else ''}{self.metric}{self.op}{self.limit}"


def parse_budget(text: str | None) -> tuple[MemoryRule, ...]:
    """Parse a budget; :class:`UsageError` (exit 2) naming the rule that cannot be read."""
    if text is None:
        return ()
    rules = []
    for part in text.split(","):
        match = _RULE.match(part)
        if not match:
            raise UsageError(f"--budget '{text}': cannot read '{part.strip()}'; write [function.]metric<=amount, "
                             "e.g. peak_bytes<=2GiB or train_step.temp_bytes<512MiB")
        function, metric, op, amount = match.groups()
        if metric not in _FUNCTION and metric not in _RUN:
            raise UsageError(f"--budget '{text}': unknown metric '{metric}'; use one of "
                             f"{', '.join(sorted(set(_FUNCTION) | set(_RUN)))}")
        if function and metric not in _FUNCTION:
            raise UsageError(f"--budget '{text}': '{metric}' is measured for the whole run only; write it without "
                             f"'{function}.'")
        try:
            limit = parse_bytes(amount)
        except ValueError as err:
            raise UsageError(f"--budget '{text}': {err}") from None
        rules.append(MemoryRule(function, metric, op, limit))
    return tuple(rules)


def check_budget(rules: Sequence[MemoryRule], programs: Sequence[ProgramMemory],
                 run: dict[str, int | None]) -> tuple[str, ...]:
    """Each broken rule as 'metric actual > limit'; ``run`` holds the run-wide figures by metric."""
    violations: list[str] = []
    by_name: dict[str, list[ProgramMemory]] = {}
    for program in programs:
        by_name.setdefault(program.name, []).append(program)
    for rule in rules:
        if rule.function is not None:
            if rule.function not in by_name:
                violations.append(f"{rule}: no jitted function '{rule.function}' ran (ran: "
                                  f"{', '.join(sorted(by_name)) or 'none'})")
                continue
            violations.extend(_compare(rule, f"{rule.function}.", _largest(by_name[rule.function], rule.metric)))
        elif rule.metric in _RUN:
            violations.extend(_compare(rule, "", run.get(rule.metric)))
        else:
            for name, compiled in by_name.items():
                violations.extend(_compare(rule, f"{name}.", _largest(compiled, rule.metric)))
    return tuple(violations)


def _largest(programs: list[ProgramMemory], metric: str) -> int | None:
    values = [v for v in (_FUNCTION[metric](p) for p in programs) if v is not None]
    return max(values) if values else None


def _compare(rule: MemoryRule, prefix: str, value: int | None) -> list[str]:
    if value is None:
        return []
    holds, negation = OPERATORS[rule.op]
    if holds(value, rule.limit):
        return []
    return [f"{prefix}{rule.metric} {value} ({format_bytes(value)}) {negation} {rule.limit} "
            f"({format_bytes(rule.limit)})"]
