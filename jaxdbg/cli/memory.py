"""``jaxdbg memory TARGET``: what fills device memory, per jitted function, over the run and at an out-of-memory
error. Parses options, calls :func:`jaxdbg.memory.memory` (contained), renders the result (exit 1 when
something does not fit, leaks, or ran out of memory; 0 when everything fits)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from jaxdbg._errors import UsageError
from jaxdbg.cli._common import (
    ArgsOpt,
    Common,
    InputsOpt,
    JsonOpt,
    MetricsOpt,
    MetricsPushOpt,
    OutOpt,
    QuietOpt,
    ScriptArgsArg,
    SeedOpt,
    TargetArg,
    TimeoutOpt,
    VerboseOpt,
    execute,
)
from jaxdbg.multihost_calls import shown_name
from jaxdbg.report import Report, relative_or_absolute

if TYPE_CHECKING:  # annotations only: the memory package is imported when the command runs
    from jaxdbg._source import SourceLocation
    from jaxdbg.memory.result import LiveGroup, MemoryResult, ProgramMemory

DeviceMemoryOpt = Annotated[str | None, typer.Option(
    "--device-memory", metavar="BYTES", help="Memory per device to check every function against before it runs, "
    "e.g. 16GiB (default: the device's own limit where it reports one; CPU devices report none).")]
BudgetOpt = Annotated[str | None, typer.Option(
    "--budget", metavar="RULES", help='Fail (exit 1) past a budget, e.g. "peak_bytes<=2GiB,'
    'train_step.temp_bytes<=512MiB,leaked_bytes<=0".')]
TopOpt = Annotated[int, typer.Option("--top", min=1, help="Buffers listed per function.")]
LeakBytesOpt = Annotated[str, typer.Option(
    "--leak-bytes", metavar="BYTES", help="Growth below this is not called a leak.")]
PlotOpt = Annotated[bool, typer.Option(
    "--plot/--no-plot", help="Also write memory.png (with matplotlib); memory.html is always written.")]


def register(app: typer.Typer) -> None:
    app.command("memory", context_settings={"allow_interspersed_args": True})(memory)


def memory(
    target: TargetArg, script_args: ScriptArgsArg = None, device_memory: DeviceMemoryOpt = None,
    budget: BudgetOpt = None, top: TopOpt = 10, leak_bytes: LeakBytesOpt = "1MiB", plot: PlotOpt = False,
    args: ArgsOpt = None, inputs: InputsOpt = None, seed: SeedOpt = 0, json: JsonOpt = None, out: OutOpt = None,
    timeout: TimeoutOpt = None, quiet: QuietOpt = False, verbose: VerboseOpt = False,
    metrics: MetricsOpt = None, metrics_push: MetricsPushOpt = None,
) -> int:
    """What fills device memory: per jitted function, over the run, at an out-of-memory error; hints to fit."""
    common = Common("memory", json, out, timeout, quiet, verbose, target, metrics=metrics, metrics_push=metrics_push)

    def build(c: Common) -> Report:
        from jaxdbg.memory import MemoryOptions
        from jaxdbg.memory import memory as measure
        from jaxdbg.target import parse_target

        options = MemoryOptions(device_memory=_bytes("--device-memory", device_memory), budget=budget, top=top,
                                leak_bytes=_bytes("--leak-bytes", leak_bytes) or 0, plot=plot, args=args,
                                inputs=inputs, seed=seed, timeout=timeout)
        spec = parse_target(target, script_args or [])
        with c.progress() as progress:
            progress.add_task(f"measuring {spec.display_name}", total=None, status="")
            run = measure(spec, options, str(c.out_dir()))
        return Report("memory", target, run.result, run.exit_code, dict(run.artifacts), run.environment)

    return execute(common, build, render)


def _bytes(option: str, text: str | None) -> int | None:
    from jaxdbg.memory.units import parse_bytes

    if text is None:
        return None
    try:
        value = parse_bytes(text)
    except ValueError as err:
        raise UsageError(f"{option} {err}") from None
    if value <= 0 and option == "--device-memory":
        raise UsageError(f"{option} '{text}': give a positive amount, e.g. 16GiB")
    return value


def _size(value: float | None) -> str:
    from jaxdbg.memory.units import format_bytes

    return format_bytes(value)


def _where(source: SourceLocation | None) -> str:
    return f"{relative_or_absolute(source.file)}:{source.line}" if source else ""


def render(report: Report, console: Console) -> None:
    result: MemoryResult = report.result
    _render_functions(result.functions, console)
    for program in _latest(result.functions):
        _render_buffers(program, console)
    _render_run(result, console)
    if result.out_of_memory is not None:
        _render_oom(result, console)
    for leak in result.leaks:
        keeper = f", kept by {leak.kept_by}" if leak.kept_by else ""
        at = f" ({_where(leak.kept_at)})" if leak.kept_at else ""
        console.print(f"[bold red]leak[/] {escape(leak.producer)} outputs from {_where(leak.source)} pile up"
                      f"{escape(keeper)}{escape(at)}: {leak.arrays} arrays, {_size(leak.bytes)} "
                      f"({_size(leak.per_call_bytes)} per call)", soft_wrap=True)
    if not result.budget.ok:
        console.print("[bold red]budget broken:[/] " + escape("; ".join(result.budget.violations)), soft_wrap=True)
    if result.error:
        console.print(f"[red]{escape(result.error)}[/]", soft_wrap=True)
    if result.found:
        console.print(f"[red]{escape(result.essential_line() or '')}[/]", soft_wrap=True)
    elif not result.error:
        console.print("[green]everything fits[/]")
    for hint in result.hints:
        console.print(f"  [cyan]try[/] {escape(hint.text)}", soft_wrap=True)
    for row in result.processes:
        said = row.note or (f"peak {_size(row.peak_bytes)} on {row.peak_device}, {row.leaks} leak(s), "
                            f"{row.misfits} misfit(s){', out of memory' if row.out_of_memory else ''}")
        said += f"; raised {row.failed}" if row.failed else ""
        console.print(f"  process {row.index}: {escape(said)}", soft_wrap=True)
    for note in result.notes:
        console.print(f"  [dim]note: {escape(note)}[/]", soft_wrap=True)
    for name, path in report.artifacts.items():
        console.print(f"  [dim]{name}: {escape(relative_or_absolute(path))}[/]")


def _latest(programs: tuple[ProgramMemory, ...]) -> list[ProgramMemory]:
    from jaxdbg.memory.hints import latest_programs

    return latest_programs(programs)


def _render_functions(programs: tuple[ProgramMemory, ...], console: Console) -> None:
    if not programs:
        return
    columns = {"args": lambda p: _size(p.argument_bytes), "outputs": lambda p: _size(p.output_bytes),
               "aliased": lambda p: _size(p.alias_bytes), "temp": lambda p: _size(p.temp_bytes),
               "peak": lambda p: _size(p.peak_bytes), "needs": lambda p: _size(p.needs_bytes), "fits": _fits}
    if not any(p.alias_bytes for p in programs):  # room on an 80-column terminal for what says something
        del columns["aliased"]
    if all(p.fits is None for p in programs):
        del columns["fits"]
    table = Table(title="jitted functions (bytes per device)", title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("function", overflow="fold", min_width=8)  # a long name (a barrier's call) folds
    cells = [[escape(_shown(p) + (f" #{p.compile_index}" if p.compile_index else "")),
              *(show(p) for show in columns.values())] for p in programs]
    for i, column in enumerate(columns, start=1):  # never a number cut
        table.add_column(column, justify="right", no_wrap=True,
                         min_width=max(len(column), *(Text.from_markup(row[i]).cell_len for row in cells)))
    for row in cells:
        table.add_row(*row)
    console.print(table)
    # Which static value, shape or structure each recompiled row is; rows with the same cause share a line
    causes: dict[tuple[str, str], list[ProgramMemory]] = {}
    for p in programs:
        if p.recompiled_because:
            causes.setdefault((_shown(p), p.recompiled_because), []).append(p)
    for (name, because), rows in causes.items():
        which = ", ".join(f"#{p.compile_index}" for p in rows)
        calls = ", ".join(str(p.call_index) for p in rows)
        console.print(f"  {escape(name)} {which} (call{'s' if len(rows) > 1 else ''} {calls}): {escape(because)}",
                      soft_wrap=True)



# A held argument under this share of its program's peak is summed up, not listed (the JSON has every one).
HELD_MIN_SHARE = 0.01


def _shown(program: ProgramMemory) -> str:
    """Its name, or a multihost helper's jit as the user called it, at that call's line."""
    return shown_name(program.name, program.called_as, program.source)


def _fits(program: ProgramMemory) -> str:
    if program.fits is None:
        return ""
    return "yes" if program.fits else "[red]no[/]"


def _render_buffers(program: ProgramMemory, console: Console) -> None:
    # Only what weighs: a step counter or a learning rate held across the call is not worth a line each. A
    # multihost helper's arguments are jax's to donate, not the user's.
    candidates = () if program.called_as else program.held
    shown = [h for h in candidates if h.bytes >= HELD_MIN_SHARE * program.peak_bytes]
    if program.largest or shown or program.note:  # each program's lines under its own name
        which = f" #{program.compile_index}" if program.compile_index else ""  # its latest compile: say which
        what = ": largest buffers at its peak" if program.largest else ""
        console.print(f"[bold]{escape(_shown(program) + which)}[/]{what}")
    for b in program.largest[:5]:
        console.print(f"  {_size(b.bytes):>10}  {escape(b.shape):<20} {b.kind:<8} {escape(b.label())}  "
                      f"{escape(_where(b.source))}", soft_wrap=True)
    for held in shown:
        why = " (the loop passes the outputs back in)" if held.threaded else ""
        console.print(f"  held across the call: {escape(held.argument)}, {_size(held.bytes)} in {held.leaves} "
                      f"array(s), not donated although an output has its shape{why}", soft_wrap=True)
    rest = [h for h in candidates if h not in shown]
    if rest and shown:
        console.print(f"  [dim]and {len(rest)} smaller argument(s) held across the call, "
                      f"{_size(sum(h.bytes for h in rest))} in all[/]", soft_wrap=True)
    if program.note:
        console.print(f"  [dim]{escape(program.note)}[/]", soft_wrap=True)


def _render_run(result: MemoryResult, console: Console) -> None:
    peak = result.peak
    if peak is None:
        return
    during = f" during {peak.function} call {peak.call_index}" if peak.function else " at the end of the run"
    line = f" ({_where(peak.source)})" if peak.source else ""
    console.print(f"[bold]peak[/] {_size(peak.bytes)} on {peak.device}{escape(during + line)}: "
                  f"{_size(peak.live_bytes)} live + {_size(peak.program_bytes)} the call adds ({result.samples} "
                  "samples)", soft_wrap=True)
    for device in result.devices:
        if device.measured_peak_bytes is not None:
            console.print(f"  {device.device}: the device measured a peak of {_size(device.measured_peak_bytes)}"
                          + (f" of {_size(device.limit_bytes)}" if device.limit_bytes else ""))
    _render_groups("live at the peak", result.live_at_peak, console)


def _render_groups(title: str, groups: tuple[LiveGroup, ...], console: Console) -> None:
    if not groups:
        return
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for column in ("made by", "line", "arrays", "calls", "bytes", "shapes"):
        table.add_column(column, justify="right" if column in ("arrays", "calls", "bytes") else "left",
                         no_wrap=column != "shapes")
    for g in groups:
        line = f"{os.path.basename(g.source.file)}:{g.source.line}" if g.source else ""
        table.add_row(escape(g.producer), escape(line), str(g.arrays), str(g.calls), _size(g.bytes), escape(g.shapes))
    console.print(table)


def _render_oom(result: MemoryResult, console: Console) -> None:
    from jaxdbg.memory.oom import same_size

    oom = result.out_of_memory
    assert oom is not None
    where = f" call {oom.call_index} of {oom.function}" if oom.function else " an eager operation"
    asked = f", asking for {_size(oom.requested_bytes)}" if oom.requested_bytes else ""
    console.print(f"[bold red]out of memory[/] in{escape(where)} {escape(_where(oom.source))}{asked}; "
                  f"{_size(oom.live_bytes)} of live arrays at that moment", soft_wrap=True)
    console.print(f"  [dim]{escape(oom.message)}[/]", soft_wrap=True)
    if oom.explanation:
        console.print(f"  {escape(oom.explanation)}", soft_wrap=True)
    failed = next((b for b in (oom.program.largest if oom.program else ()) if same_size(oom.requested_bytes, b.bytes)),
                  None)
    if failed is not None:
        what = (f"argument {failed.argument}" if failed.argument
                else failed.output or f"the {failed.op or failed.name} result")
        console.print(f"  the allocation that failed is {escape(what)} of {escape(oom.function or '')} "
                      f"({escape(failed.shape)}, {failed.kind}) at {escape(_where(failed.source))}", soft_wrap=True)
    elif oom.program is not None and same_size(oom.requested_bytes, oom.program.temp_bytes):
        console.print(f"  the allocation that failed is the temporaries of {escape(oom.function or '')} "
                      f"({_size(oom.program.temp_bytes)}, allocated as one block)", soft_wrap=True)
    _render_groups("live at the out-of-memory error", oom.live, console)
    if oom.program is not None and oom.program not in result.functions:
        _render_buffers(oom.program, console)

