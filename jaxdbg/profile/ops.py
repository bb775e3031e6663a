"""Per-op tables from a jax.profiler capture: the top HLO operations by time, with the user line behind each.

Two sources, one result shape:
- xprof's ``hlo_stats`` tool (via ``xspace_to_tool_data``) where the backend records device op metrics
  (GPU, TPU). Rows are assigned to a function by their framework op name (``jit(train_step)/...``).
- The capture's own XLA:CPU thunk events where xprof's per-op tools come back empty (CPU): every event
  with ``hlo_op``/``hlo_module`` stats is one execution of one instruction. Nested events (a while loop's
  body inside the loop's own event) are counted by self time, so nothing is counted twice.

Categories and source lines come from the compiled HLO text (:mod:`jaxdbg.profile.hlo`).

Example:
    >>> events = thunk_events("trace/plugins/profile/run/host.xplane.pb")     # doctest: +SKIP
    >>> rows = op_table(events["jit_f"], parse_hlo(text), top=5)               # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import sys
import warnings
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from jaxdbg._source import SourceLocation, is_user_file
from jaxdbg.profile.collectives import sharding_cause
from jaxdbg.profile.hlo import HloModule, named_scope, opcode_category
from jaxdbg.profile.model import OpRow, ScopeRow

PROGRAM_MARK = "#"  # between a module name and its program id, where programs of one name ran (see _program_keys)


@dataclass
class OpTotal:
    """Executions of one instruction in one module: count and summed self time (seconds)."""

    count: int = 0
    total_s: float = 0.0
    category: str = ""
    expression: str = ""
    source: SourceLocation | None = None


def thunk_events(xplane_path: str) -> dict[str, dict[str, OpTotal]]:
    """``{module: {op: OpTotal}}`` from the XLA:CPU (or device) events of an xplane.pb, by self time."""
    return read_xplane(xplane_path).ops


@dataclass
class XplaneEvents:
    """What one host's capture holds: per-op totals by module, each program execution's span, step markers.

    ``executions``: ``{module: [(start_ns, end_ns)]}``, one per execution (the op events of one ``run_id``);
    ``steps``: ``{name: [(step_num, start_ns, end_ns)]}`` from ``jax.profiler.StepTraceAnnotation``;
    ``programs``: ``{module: program_id}`` (xprof names a module's HLO ``module(program_id)``);
    ``devices``: the device planes' names (``/device:GPU:0``), empty on CPU; ``per_device``: ``{module: {device
    ordinal: [seconds of each execution on that device]}}`` (an SPMD program, a pmap, runs on several)."""

    ops: dict[str, dict[str, OpTotal]]
    executions: dict[str, list[tuple[float, float]]]
    steps: dict[str, list[tuple[int, float, float]]]
    programs: dict[str, int]
    devices: tuple[str, ...]
    per_device: dict[str, dict[int, list[float]]] = field(default_factory=dict)
    first_runs_left_out: int = 0  # programs whose first run the op totals leave out (see _without_first_runs)


def read_xplane(xplane_path: str, first_runs: bool = False) -> XplaneEvents:
    """One pass over an xplane.pb: op self times, program executions and step markers. ``first_runs``: the capture
    holds each program's first run (a script's capture window opens at its first call), and the op totals leave
    it out where the program ran again."""
    from jax.profiler import ProfileData

    # jaxlib's event-stats type has no __module__: Python 3.12 warns at each read of it (an error under -W error)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return _read_events(ProfileData.from_file(xplane_path), first_runs)


def _read_events(data: Any, first_runs: bool = False) -> XplaneEvents:
    # per (module, run): each op's executions and self time; folded into totals once the first runs are known
    by_run: dict[tuple[str, int | None], dict[str, list[float]]] = defaultdict(
        lambda: defaultdict(lambda: [0, 0.0]))
    run_program: dict[tuple[str, int], int] = {}
    runs: dict[tuple[str, int], list[float]] = {}
    unnumbered: dict[str, list[tuple[float, float]]] = defaultdict(list)  # op events without a run_id (GPU)
    steps: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    programs: dict[str, int] = {}
    devices = []
    on_device: dict[tuple[str, int, int], list[float]] = {}  # (module, run, device) -> [start, end]
    for plane in data.planes:
        if plane.name.startswith("/device:"):
            devices.append(plane.name)
        plane_device = _plane_ordinal(plane.name)
        for line in plane.lines:
            events = []
            for event in line.events:
                stats = _stats(event)
                start, duration = float(event.start_ns), float(event.duration_ns)
                op, name = stats.get("hlo_op"), stats.get("hlo_module")
                if op and name:
                    run = int(stats["run_id"]) if "run_id" in stats else None
                    program = int(stats.get("program_id", -1))
                    module = f"{name}{PROGRAM_MARK}{program}"  # named by its module alone below, where unique
                    events.append((start, duration, module, str(op), run))
                    programs.setdefault(module, program)
                    if run is None:
                        unnumbered[module].append((start, start + duration))
                        continue
                    run_program[(module, run)] = program
                    span = runs.setdefault((module, run), [start, start + duration])
                    span[0], span[1] = min(span[0], start), max(span[1], start + duration)
                    device = stats.get("device_ordinal", plane_device)
                    if device is not None:
                        key = (module, int(stats["run_id"]), int(device))
                        mine = on_device.setdefault(key, [start, start + duration])
                        mine[0], mine[1] = min(mine[0], start), max(mine[1], start + duration)
                elif "step_num" in stats and not name:
                    steps[str(event.name)].append((int(stats["step_num"]), start, start + duration))
            for module, op, run, self_ns in _self_times(events):
                entry = by_run[(module, run)][op]
                entry[0] += 1
                entry[1] += self_ns * 1e-9
    first = _first_runs(runs, run_program) if first_runs else set()
    totals: dict[str, dict[str, OpTotal]] = defaultdict(lambda: defaultdict(OpTotal))
    for (module, numbered), ops in by_run.items():
        if (module, numbered) in first:
            continue
        for op, (count, seconds) in ops.items():
            total = totals[module][op]
            total.count += int(count)
            total.total_s += seconds
    executions: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for (module, _), (start, end) in sorted(runs.items(), key=lambda kv: kv[1][0]):
        executions[module].append((start, end))
    for module, spans in unnumbered.items():
        if module not in executions:
            calls = min(t.count for t in totals[module].values())
            executions[module] = split_at_gaps(spans, calls)
    per_device: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for (module, _, device), (start, end) in sorted(on_device.items(), key=lambda kv: kv[1][0]):
        per_device[module][device].append((end - start) * 1e-9)
    named = _program_keys(programs)
    return XplaneEvents({named[m]: dict(ops) for m, ops in totals.items()},
                        {named[m]: spans for m, spans in executions.items()}, dict(steps),
                        {named[m]: program for m, program in programs.items()}, tuple(devices),
                        {named[m]: dict(d) for m, d in per_device.items() if len(d) > 1}, len(first))


def _program_keys(programs: dict[str, int]) -> dict[str, str]:
    """The key each program's figures go under: its module's name, or ``name#program_id`` where several programs of
    one name ran (``jax.jit(loss)`` and ``jax.jit(jax.value_and_grad(loss))`` are both ``jit_loss``).

        >>> sorted(_program_keys({"jit_loss#3": 3, "jit_loss#7": 7, "jit_step#5": 5}).values())
        ['jit_loss#3', 'jit_loss#7', 'jit_step']
    """
    names = Counter(module_of(key) for key in programs)
    return {key: key if names[module_of(key)] > 1 else module_of(key) for key in programs}


def module_of(key: str) -> str:
    """The HLO module name of a program's key in :class:`XplaneEvents` (``jit_loss#7`` -> ``jit_loss``)."""
    return key.rpartition(PROGRAM_MARK)[0] or key


def assign_programs(functions: list[tuple[str, HloModule | None]], by_module: dict[str, dict[str, OpTotal]]) -> list[
        list[str]]:
    """Which captured programs (keys of ``by_module``, :class:`XplaneEvents`) each function ran, given each
    function's HLO module name and parsed HLO: every program of its module's name (a recompile is another program
    of the same name); where several functions share the name (``jax.jit(loss)`` and
    ``jax.jit(jax.value_and_grad(loss))`` are both ``jit_loss``), each program goes to the function whose HLO's op
    names best match the program's ops.

        >>> from jaxdbg.profile.hlo import parse_hlo
        >>> def hlo(op):
        ...     return parse_hlo(f"HloModule jit_loss\\n\\nENTRY %main (p: f32[2]) -> f32[2] {{\\n"
        ...                      f"  %p = f32[2]{{0}} parameter(0)\\n"
        ...                      f"  ROOT %{op} = f32[2]{{0}} tanh(f32[2]{{0}} %p)\\n}}")
        >>> ran = {"jit_loss#3": {"t": OpTotal()}, "jit_loss#7": {"u": OpTotal()}, "jit_step": {"add": OpTotal()}}
        >>> assign_programs([("jit_loss", hlo("t")), ("jit_loss", hlo("u")), ("jit_step", None)], ran)
        [['jit_loss#3'], ['jit_loss#7'], ['jit_step']]
    """
    found: list[list[str]] = [[] for _ in functions]
    sharing: dict[str, list[int]] = defaultdict(list)
    for index, (module, _) in enumerate(functions):
        sharing[module].append(index)
    for key, ops in by_module.items():
        owners = sharing.get(module_of(key), [])
        if len(owners) == 1:
            found[owners[0]].append(key)
        elif owners:
            ran = set(ops)
            found[max(owners, key=lambda i: _match(ran, functions[i][1]))].append(key)
    return found


def merged_ops(by_module: dict[str, dict[str, OpTotal]], keys: list[str]) -> dict[str, OpTotal]:
    """One function's per-op totals over the programs it ran (``keys``: :func:`assign_programs`)."""
    if len(keys) == 1:
        return by_module[keys[0]]
    merged: dict[str, OpTotal] = {}
    for key in keys:
        for op, total in by_module[key].items():
            into = merged.setdefault(op, OpTotal(category=total.category, expression=total.expression,
                                                 source=total.source))
            into.count += total.count
            into.total_s += total.total_s
    return merged


def _match(ran: set[str], hlo: HloModule | None) -> float:
    if hlo is None:
        return -1.0
    known = set(hlo.ops)
    return len(ran & known) / max(len(ran | known), 1)


def _first_runs(runs: dict[tuple[str, int], list[float]], run_program: dict[tuple[str, int], int]) -> set[
        tuple[str, int]]:
    """The first run of each executable, as ``(module, run id)``, in a module that also ran other than first runs
    in the capture: XLA:CPU's first runs set up its kernels (a dot's first run took 75 ms, its next ones 0.06 ms;
    once per process, so a recompile's first run may not pay it), a one-time cost that made a tiny matmul the "hot
    op" of a gather-bound step. A module of first runs only (a function jitted afresh each step) keeps them: that
    is what its steps cost. Events without a run id (GPU kernels) have none.

        >>> runs = {("jit_f", 1): [0.0, 1.0], ("jit_f", 2): [2.0, 3.0], ("jit_f", 3): [4.0, 5.0],
        ...         ("jit_g", 5): [1.0, 2.0], ("jit_g", 6): [3.0, 4.0]}
        >>> sorted(_first_runs(runs, {("jit_f", 1): 7, ("jit_f", 2): 9, ("jit_f", 3): 9, ("jit_g", 5): 8,
        ...                           ("jit_g", 6): 10}))
        [('jit_f', 1), ('jit_f', 2)]
    """
    per_program: dict[tuple[str, int], list[tuple[float, int]]] = defaultdict(list)
    for (module, run), (start, _) in runs.items():
        per_program[(module, run_program.get((module, run), -1))].append((start, run))
    first = {(module, min(started)[1]) for (module, _), started in per_program.items()}
    steady = {module for module, run in runs if (module, run) not in first}
    return {(module, run) for module, run in first if module in steady}


def _plane_ordinal(name: str) -> int | None:
    """The device index of a device plane (``/device:GPU:3`` -> 3); None for the host's."""
    tail = name.rpartition(":")[2]
    return int(tail) if name.startswith("/device:") and tail.isdigit() else None


def split_at_gaps(spans: list[tuple[float, float]], parts: int) -> list[tuple[float, float]]:
    """A program's op events cut into ``parts`` executions at the widest gaps between them: where the op events
    carry no run id (XLA:GPU's kernels), the gap between two calls is wider than any between the kernels of one.
    ``parts`` is how often the program's rarest op ran (an entry op runs once per call).

        >>> split_at_gaps([(0, 1), (1, 2), (10, 11), (11, 12)], 2)
        [(0, 2), (10, 12)]
    """
    spans = sorted(spans)
    gaps = sorted(range(1, len(spans)), key=lambda i: spans[i][0] - spans[i - 1][1])[len(spans) - max(parts, 1):]
    cuts = [0, *sorted(gaps), len(spans)]
    return [(spans[a][0], max(e for _, e in spans[a:b])) for a, b in itertools.pairwise(cuts) if b > a]


def _stats(event: object) -> dict:
    """An event's stats; {} where one holds bytes that are not text (the reader raises on those)."""
    try:
        return dict(event.stats)  # type: ignore[attr-defined]
    except (UnicodeDecodeError, ValueError):
        return {}


def _self_times(events: list[tuple[float, float, str, str, int | None]]) -> Iterator[
        tuple[str, str, int | None, float]]:
    """Each event's duration minus that of the events nested inside it on the same line (with its run id)."""
    events.sort(key=lambda e: (e[0], -e[1]))
    stack: list[list] = []  # [end, module, op, run, self_ns]
    for start, duration, module, op, run in events:
        while stack and start >= stack[-1][0]:
            _, m, o, r, self_ns = stack.pop()
            yield m, o, r, self_ns
        if stack:
            stack[-1][4] -= min(duration, stack[-1][0] - start)
        stack.append([start + duration, module, op, run, duration])
    while stack:
        _, m, o, r, self_ns = stack.pop()
        yield m, o, r, max(self_ns, 0.0)


@contextlib.contextmanager
def quiet_native_stderr(fds: tuple[int, ...] = (2,)) -> Iterator[None]:
    """Silence C++ logging on file descriptor 2 (xprof's converters log every step at INFO); with ``fds=(1, 2)``
    stdout too (xprof's capture client prints its progress there, which would spoil ``--json -``)."""
    sys.stdout.flush()
    saved = []
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in fds:
            with contextlib.suppress(OSError):
                saved.append((fd, os.dup(fd)))
                os.dup2(devnull, fd)
        yield
    finally:
        for fd, copy in saved:
            os.dup2(copy, fd)
            os.close(copy)
        os.close(devnull)


def xprof_hlo_stats(xplane_path: str) -> dict[str, dict[str, OpTotal]]:
    """``{function prefix: {op: OpTotal}}`` from xprof's hlo_stats tool; empty where the backend has none (CPU).

    The function prefix is the first component of the framework op name, e.g. ``jit(train_step)``.
    """
    try:
        from xprof.convert.raw_to_tool_data import xspace_to_tool_data
    except ImportError:
        return {}
    try:
        with quiet_native_stderr():
            data, _ = xspace_to_tool_data([xplane_path], "hlo_stats", {})
    except Exception:  # noqa: BLE001 - an xprof failure leaves us with our own table, not an error
        return {}
    if not data:
        return {}
    table = json.loads(data)
    columns = [c.get("id") for c in table.get("cols", [])]
    rows = [dict(zip(columns, (c.get("v") if isinstance(c, dict) else c for c in row.get("c", []))))
            for row in table.get("rows", []) or []]
    program_prefix = _program_prefixes(rows)
    found: dict[str, dict[str, OpTotal]] = defaultdict(dict)
    for cells in rows:
        op = str(cells.get("hlo_op_name") or "")
        if not op:
            continue
        framework = str(cells.get("tf_op_name") or "")
        prefix = framework.split("/", 1)[0] if framework else program_prefix.get(str(cells.get("program_id")), "")
        self_us = cells.get("total_self_time") or cells.get("total_time") or 0.0
        entry = found[prefix].setdefault(op, OpTotal())
        entry.count += int(cells.get("occurrences") or 0)
        entry.total_s += float(self_us) * 1e-6
        entry.category = str(cells.get("category") or "")
        entry.expression = str(cells.get("hlo_op_expression") or "")[:200]
        entry.source = _parse_source_info(cells.get("source_info"))
    return dict(found)


def _program_prefixes(rows: list[dict]) -> dict[str, str]:
    """``{program id: function prefix}``, from the ops of each program that carry a framework name.

    XLA leaves some ops without one (a fusion made of a convert after a cuBLAS call, a loop counter's copy);
    their program id still says which jitted function they ran in.
    """
    votes: dict[str, Counter] = defaultdict(Counter)
    for cells in rows:
        framework = str(cells.get("tf_op_name") or "")
        if framework:
            votes[str(cells.get("program_id"))][framework.split("/", 1)[0]] += 1
    return {program: counts.most_common(1)[0][0] for program, counts in votes.items()}


def _parse_source_info(value: object) -> SourceLocation | None:
    """xprof's source_info cell ('file.py:12' or a small HTML fragment holding it)."""
    match = re.search(r"([^\s<>\"']+\.py):(\d+)", str(value or ""))
    if match and is_user_file(match.group(1)):
        return SourceLocation(match.group(1), int(match.group(2)), "?")
    return None


def op_table(ops: dict[str, OpTotal], module: HloModule | None, top: int, module_name: str = "") -> tuple[OpRow, ...]:
    """The ``top`` ops by self time, with share of the function's op time, category and user source."""
    grand = sum(o.total_s for o in ops.values()) or 1.0
    rows = []
    for name, total in sorted(ops.items(), key=lambda kv: -kv[1].total_s)[: max(top, 0)]:
        hlo = module.op(name) if module is not None else None
        category = hlo.category if hlo else (total.category or opcode_category(name.split(".")[0]))
        source = (hlo.source if hlo else None) or total.source
        expression = (hlo.expression if hlo else "") or (module.readable(total.expression) if module else
                                                         total.expression)
        cause = sharding_cause(module, name) if module is not None and category == "collective" else None
        rows.append(OpRow(name, category, total.count, total.total_s, total.total_s / grand, source,
                          module_name or (module.name if module else ""), expression, cause))
    return tuple(rows)


def scope_table(ops: dict[str, OpTotal], module: HloModule | None) -> tuple[ScopeRow, ...]:
    """Every op's self time summed by the scope the user named around it (its HLO ``op_name``), largest first;
    () where no op is under a named scope."""
    if module is None:
        return ()
    totals: dict[str, float] = defaultdict(float)
    for name, total in ops.items():
        hlo = module.op(name)
        totals[named_scope(hlo.op_name) if hlo else ""] += total.total_s
    if not any(totals.keys()):
        return ()
    grand = sum(totals.values()) or 1.0
    return tuple(ScopeRow(scope, seconds, seconds / grand) for scope, seconds in
                 sorted(totals.items(), key=lambda kv: -kv[1]))


def function_ops(function: str, module_name: str, module: HloModule | None, by_prefix: dict, by_module: dict,
                 top: int) -> tuple[tuple[OpRow, ...], tuple[ScopeRow, ...], str]:
    """One function's per-op table, its op time by named scope, and where they came from: xprof's hlo_stats
    rows named ``jit(function)`` first, else the capture's own op events of its HLO module. A profiled run and
    a capture share it."""
    ops, source = by_prefix.get(f"jit({function})"), "xprof hlo_stats"
    if not ops:
        ops, source = by_module.get(module_name), "xplane op events"
    rows = op_table(ops, module, top, module_of(module_name)) if ops and top > 0 else ()
    scopes = scope_table(ops, module) if ops and rows else ()
    return rows, scopes, source if rows else ""
