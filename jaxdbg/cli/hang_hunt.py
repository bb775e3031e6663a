"""``jaxdbg hang-hunt TARGET`` / ``--pid PID[,PID...]``: which process is stuck, where, and what the others
wait in. Parses options, calls :func:`jaxdbg.hang.hunt` (contained) or :func:`jaxdbg.hang.pids.hunt_pids`,
renders the verdict (exit 1: a stall, deadlock, dead process or divergence; 0: finished cleanly; 3: failed
otherwise)."""

from __future__ import annotations

import os
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from jaxdbg._errors import UsageError
from jaxdbg.cli._common import (
    ArgsOpt,
    Common,
    InputsOpt,
    JsonOpt,
    OutOpt,
    QuietOpt,
    ScriptArgsArg,
    SeedOpt,
    TimeoutOpt,
    VerboseOpt,
    execute,
    render_advice,
)
from jaxdbg.report import Report

StallOpt = Annotated[float, typer.Option(
    "--stall", metavar="SECONDS", min=0.1,
    help="No progress (no call started or finished, no result ready, no callback, little CPU) for this long is a "
         "stall: take every process's stacks and draw the verdict.")]
PidOpt = Annotated[str | None, typer.Option(
    "--pid", metavar="PID[,PID...]",
    help="Look at processes already running (not started under jaxdbg) with py-spy: their stacks now, and the "
         "verdict for what they show.")]
KeepOpt = Annotated[bool, typer.Option(
    "--keep-running", help="Leave the stalled program running after the verdict (to attach a debugger); by default "
                           "every process of it is stopped.")]
NativeOpt = Annotated[bool, typer.Option(
    "--native/--no-native", help="Ask py-spy for the native frames of stuck threads (where installed and allowed).")]
TargetOptArg = Annotated[str | None, typer.Argument(
    metavar="TARGET", show_default=False,
    help="script.py (run as __main__), file.py::func or package.module:func (not with --pid).")]


def register(app: typer.Typer) -> None:
    app.command("hang-hunt", context_settings={"allow_interspersed_args": True})(hang_hunt)


def hang_hunt(
    target: TargetOptArg = None, script_args: ScriptArgsArg = None, stall: StallOpt = 30.0, pid: PidOpt = None,
    keep_running: KeepOpt = False, native: NativeOpt = True, args: ArgsOpt = None, inputs: InputsOpt = None,
    seed: SeedOpt = 0, json: JsonOpt = None, out: OutOpt = None, timeout: TimeoutOpt = None,
    quiet: QuietOpt = False, verbose: VerboseOpt = False,
) -> int:
    """Run a program with a flight recorder; when it stalls, say which process is stuck, where, and why."""
    common = Common("hang-hunt", json, out, timeout, quiet, verbose, target or (f"--pid {pid}" if pid else None))

    def build(c: Common) -> Report:
        if pid is not None:
            return _build_pids(c, pid, native)
        if target is None:
            raise UsageError("give a TARGET to run (script.py, file.py::func) or --pid PID of a running process")
        from jaxdbg.hang import HangOptions, hunt
        from jaxdbg.hang.api import check_options
        from jaxdbg.hang.environment import fallback_environment
        from jaxdbg.target import parse_target

        spec = parse_target(target, script_args or [])
        check_options(spec, HangOptions(stall, timeout, args=args, inputs=inputs))  # bad input: before any folder
        options = HangOptions(stall, timeout, keep_running, native, args, inputs, seed, str(c.out_dir().resolve()))
        with c.progress() as progress:
            progress.add_task(f"watching {spec.display_name}", total=None, status="")
            run = hunt(spec, options)
        artifacts = dict(run.artifacts)
        if run.left_running is not None:
            c.err_console.print(f"jaxdbg hang-hunt: left the program running (pid {run.left_running}, its own "
                                "session): stop it with kill when done", highlight=False)
        return Report("hang-hunt", target, run.result, run.exit_code, artifacts,
                      run.environment or fallback_environment())

    return execute(common, build, render)


def _build_pids(common: Common, text: str, native: bool) -> Report:
    from jaxdbg.hang.environment import fallback_environment
    from jaxdbg.hang.pids import hunt_pids, parse_pids

    pids = parse_pids(text)
    result, artifacts = hunt_pids(pids, native, str(common.out_dir().resolve()))
    return Report("hang-hunt", f"--pid {text}", result, result.exit_code, artifacts, fallback_environment())


def render(report: Report, console: Console) -> None:
    result = report.result
    colour = "bold red" if report.exit_code == 1 else ("green" if report.exit_code == 0 else "yellow")
    verdict = result.verdict
    if verdict.startswith(result.kind):  # 'deadlock: ...' says its kind itself: not 'deadlock deadlock: ...'
        kind, verdict = verdict.partition(" ")[::2]
    else:
        kind = result.kind
    console.print(f"[{colour}]{escape(kind)}[/] {escape(verdict)}", soft_wrap=True)
    table = Table(show_edge=False, pad_edge=False)
    for column in ("process", "state", "call", "step", "collective", "user line", "idle"):
        table.add_column(column)
    for p in result.processes:
        call = f"{p.function} #{'?' if p.call_index is None else p.call_index}" if p.function else ""
        idle = f"{p.idle_s:.0f} s" if p.idle_s else ""
        table.add_row(str(p.index), p.state, escape(call), "" if p.step is None else str(p.step),
                      escape(p.collective or ""), escape(_short(p.source)), idle)
    if len(result.processes) > 1 or result.stalled:
        console.print(table)
    if result.divergence is not None:
        console.print(f"  divergence at step {result.divergence.step}: {escape(result.divergence.detail)}",
                      soft_wrap=True)
    for index in result.stuck:
        _render_threads(result.processes[index] if index < len(result.processes) else None, console)
    render_advice(console, report, result.explanation, result.hints, result.notes)


def _render_threads(process: object, console: Console) -> None:
    threads = getattr(process, "threads", ())
    if not threads:
        return
    console.print(f"  threads of process {getattr(process, 'index', '?')}:")
    for thread in threads:
        where = _short(thread.source)
        waits = f"; waits for {thread.waits_for}" if thread.waits_for else ""
        holds = f"; holds {', '.join(thread.holds)}" if thread.holds else ""
        below = f"; in {thread.waiting_in}" if thread.waiting_in else ""
        console.print(f"    {escape(thread.name)} ({thread.state}) at {escape(where)}{escape(below + waits + holds)}",
                      soft_wrap=True)


def _short(source: object) -> str:
    if source is None:
        return ""
    file, line, function = (getattr(source, name, "") for name in ("file", "line", "function"))
    return f"{os.path.basename(str(file))}:{line} ({function})"
