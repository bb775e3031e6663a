"""The processes of a multi-process job side by side: each one's figures, and the stragglers.

In a synchronous data- or model-parallel step every process waits in the step's collectives for the
slowest one, so wall and step times look alike everywhere; where the processes differ is in how long they
*waited*. The straggler is the process the others waited for: it waited much less than they did. What it
spent that time on (host-side work between steps, such as its input pipeline; compiling; its own device
work) is the component where it exceeds the others most.

Example:
    >>> rows = [ProcessFigures(0, 2.0, 0.3, 1.5, 0.0, 0.2, 1.2, 10, 0.15),
    ...         ProcessFigures(1, 2.0, 0.3, 0.4, 0.0, 1.3, 0.1, 10, 0.04)]
    >>> stragglers, hints = find_stragglers(rows)
    >>> stragglers, hints[0].split(":")[0]
    ((1,), 'process 1 is the straggler')
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

SLACK_FRACTION = 0.1  # a process waited "much less" than the others when the gap exceeds 10% of the wall
SLACK_MIN_S = 0.05


@dataclass(frozen=True)
class ProcessFigures:
    """One process of the job. ``host_s``: time between jitted calls (input pipeline, Python, logging);
    ``collective_s``: time its jitted calls spent in cross-process collectives (mostly waiting for peers),
    estimated from the captured op events; ``note``: why a process has no figures (it died or hung); ``failed``:
    the error its program raised (type, message and user line), empty where it finished."""

    index: int
    wall_s: float
    compile_s: float
    execute_s: float
    transfer_s: float
    host_s: float
    collective_s: float
    steps: int
    step_median_s: float | None
    note: str = ""
    failed: str = ""

    @property
    def reported(self) -> bool:
        return not self.note

    @classmethod
    def missing(cls, index: int, note: str) -> ProcessFigures:
        return cls(index, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, None, note)

    def as_message(self) -> dict[str, Any]:
        return asdict(self)


def figures_of(index: int, functions: list, totals: Any) -> ProcessFigures:
    """This process's figures from its own profile (functions with per-op tables, and the run's totals).

    The time in collectives is estimated per steady call (the median call, times the calls): a call that
    compiles also waits, in its first collective, for the other processes to finish compiling theirs, and
    that start-up skew is compile time, not a straggler."""
    collective = 0.0
    for function in functions:
        ops_total = sum(op.total_s for op in function.ops)
        waiting = sum(op.total_s for op in function.ops if op.category == "collective")
        if ops_total > 0 and function.execute.median_s is not None:
            collective += function.execute.median_s * function.execute.calls * waiting / ops_total
    # the steps are the calls of the busiest of the program's own functions: a barrier after the loop, whose one
    # call waits for the slowest process (a multihost helper's jit), is not the step
    own = [f for f in functions if f.called_as is None] or functions
    busiest = max(own, key=lambda f: f.execute.total_s, default=None)
    return ProcessFigures(
        index, totals.wall_s, totals.compile_s, totals.execute_s, totals.transfer_s, totals.other_s, collective,
        busiest.execute.calls if busiest else 0, busiest.execute.median_s if busiest else None)


def find_stragglers(rows: list[ProcessFigures]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The processes the others waited for, and a hint per straggler naming where its time went."""
    reported = [r for r in rows if r.reported]
    if len(reported) < 2:
        return (), ()
    wall = statistics.median(r.wall_s for r in reported)
    found, hints = [], []
    for row in reported:
        others = [r for r in reported if r.index != row.index]
        others_wait = statistics.median(r.collective_s for r in others)
        gap = others_wait - row.collective_s
        if gap <= max(SLACK_FRACTION * wall, SLACK_MIN_S):
            continue
        found.append(row.index)
        hints.append(f"process {row.index} is the straggler: the other processes waited {others_wait:.2f} s in "
                     f"collectives, it waited {row.collective_s:.2f} s; {_where_time_went(row, others)}")
    return tuple(found), tuple(hints)


def _where_time_went(row: ProcessFigures, others: list[ProcessFigures]) -> str:
    parts = {
        "host-side work between steps (input pipeline, Python)": lambda r: r.host_s,
        "compilation": lambda r: r.compile_s,
        "its own device work (execute time outside collectives)": lambda r: r.execute_s - r.collective_s,
        "host-device transfers": lambda r: r.transfer_s,
    }
    excess = {name: get(row) - statistics.median(get(r) for r in others) for name, get in parts.items()}
    name, extra = max(excess.items(), key=lambda kv: kv[1])
    if extra <= 0:
        return "its time went nowhere jaxdbg measures (look at the host: CPU, network, disk)"
    mine = parts[name](row)
    return f"its extra time went to {name}: {mine:.2f} s against {mine - extra:.2f} s on the others"


def failure_hints(rows: list[ProcessFigures], own: int = 0) -> tuple[str, ...]:
    """A hint naming each other process whose program raised: the error to fix first, where this process's
    own failure (a collective whose peer left the job) only follows from it.

    Example:
        >>> rows = [ProcessFigures(0, 2.0, 0.3, 1.5, 0.0, 0.2, 1.2, 3, 0.1, failed="ValueError: Gloo failed"),
        ...         ProcessFigures(1, 1.0, 0.3, 0.4, 0.0, 0.2, 0.1, 2, 0.1, failed="OSError: bad shard at a.py:9")]
        >>> failure_hints(rows)[0].split(";")[0]
        'process 1 raised OSError: bad shard at a.py:9'
    """
    return tuple(f"process {r.index} raised {r.failed}; fix that first: the others wait for it in their collectives "
                 "or fail there once it has left the job" for r in rows if r.failed and r.index != own)


def step_skew_s(rows: list[ProcessFigures]) -> float | None:
    """How much longer, per step, the busiest process worked than the least busy (time not spent waiting)."""
    reported = [r for r in rows if r.reported and r.steps]
    if len(reported) < 2:
        return None
    busy = [(r.wall_s - r.collective_s) / r.steps for r in reported]
    return max(busy) - min(busy)
