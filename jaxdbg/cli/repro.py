"""``jaxdbg repro``: minimise a failing program into a standalone reproducer (see :mod:`jaxdbg.repro`)."""

from __future__ import annotations

import os

import typer
from rich.console import Console
from rich.markup import escape

from jaxdbg._errors import EXIT_OK, EXIT_TARGET_FAILED
from jaxdbg.cli._common import (
    ArgsOpt,
    Common,
    InputsOpt,
    JsonOpt,
    OutOpt,
    QuietOpt,
    ScriptArgsArg,
    SeedOpt,
    TargetArg,
    TimeoutOpt,
    VerboseOpt,
    execute,
    validate_destinations,
)
from jaxdbg.launch import launched_place
from jaxdbg.report import Report, environment_info, relative_or_absolute


def register(app: typer.Typer) -> None:
    app.command("repro", context_settings={"allow_interspersed_args": True})(repro)


def repro(
    target: TargetArg,
    script_args: ScriptArgsArg = None,
    kind: str | None = typer.Option(None, "--kind", metavar="KIND",
                                       help="Failure to keep: exception, crash, timeout, nonfinite or mismatch."),
    match: str | None = typer.Option(None, "--match", metavar="REGEX", help="Keep only a failure whose text matches."),
    max_time: float = typer.Option(600.0, "--max-time", metavar="SECONDS", min=1.0,
                                   help="Time bound for the whole reduction; the best verified result so far is kept."),
    jobs: int = typer.Option(2, "--jobs", "-j", min=1, help="Candidates checked in parallel."),
    source_time: float | None = typer.Option(
        None, "--source-time", metavar="SECONDS", min=0.0,
        help="After a cut: seconds to reduce the program's own source into repro_source.py (0: skip it)."),
    runs: int = typer.Option(2, "--runs", min=1, help="Runs of the original (a failure that comes and goes is flaky)."),
    reference: str = typer.Option(
        "eager", "--reference", metavar="REF",
        help="What a jitted call is compared with for a mismatch: eager (op-by-op) or float64."),
    rtol: float = typer.Option(1e-3, "--rtol", help="Relative tolerance of a mismatch."),
    atol: float = typer.Option(1e-5, "--atol", help="Absolute tolerance of a mismatch."),
    args: ArgsOpt = None, inputs: InputsOpt = None, seed: SeedOpt = 0,
    json: JsonOpt = None, out: OutOpt = None, timeout: TimeoutOpt = None, quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> int:
    """Minimise a failing JAX program into a small standalone reproducer that fails the same way."""
    from jaxdbg.repro import ReproOptions

    common = Common("repro", json, out, timeout, quiet, verbose, target)
    options = ReproOptions(kind=kind, match=match, max_time=max_time, jobs=jobs, timeout=timeout, inputs=inputs,
                           args=args, seed=seed, runs=runs, reference=reference, rtol=rtol, atol=atol,
                           source_time=source_time)
    return execute(common, lambda c: _build(c, target, script_args or [], options), render)


def _build(common: Common, target: str, script_args: list[str], options) -> Report:
    from jaxdbg._errors import UsageError
    from jaxdbg.repro import reproduce
    from jaxdbg.repro.signature import KINDS
    from jaxdbg.target import parse_target

    if options.reference not in ("eager", "float64"):
        raise UsageError(f"--reference '{options.reference}': use eager (op-by-op) or float64")
    if options.kind is not None and options.kind not in KINDS:
        raise UsageError(f"--kind '{options.kind}': use one of {', '.join(KINDS)}")
    spec = parse_target(target, script_args)
    validate_destinations(common)
    out_dir = common.out_dir()
    with common.progress() as bar:
        task = bar.add_task("repro", total=None, status="")

        def on_progress(phase: str, checks: int, size: str) -> None:
            bar.update(task, description=phase, completed=checks, status=f"{checks} checks, {size}")

        result, artifacts = reproduce(spec, options, str(out_dir), on_progress)
    # An unverified reproducer is no answer (the original program is the last fallback, so this is rare);
    # for a flaky failure it is the expected best effort, and says so.
    code = EXIT_OK if result.verified or result.flaky else EXIT_TARGET_FAILED
    environment = environment_info()
    place = launched_place(os.environ)
    if place is not None:  # each run was one process of the job (jaxdbg.repro.job); process 0 speaks for it
        environment.update(process_index=place[0], process_count=place[1])
        code = code if place[0] == 0 else EXIT_OK
    return Report("repro", target, result, code, artifacts, environment)


def render(report: Report, console: Console) -> None:
    r = report.result
    sig = r.signature
    # The target, the failure and the verification quote the user's values (an assertion's message reads
    # `[[nan]]`): escaped, or rich takes `[nan]` for markup and prints `[]`.
    console.print(f"[bold]jaxdbg repro[/] {escape(report.target or '')}: {escape(sig.describe())}"
                  + (" [yellow](flaky)[/]" if r.flaky else ""))
    before = f"{r.original.lines} lines" + (f", {r.original.equations} equations" if r.original.equations else "")
    after = f"{r.minimized.lines} lines" + (
        f", {r.minimized.equations} equations" if r.minimized.equations is not None else "")
    how = "reduced the source" if r.strategy != "computation" else (
        "cut the jitted computation" if r.original.equations else
        "cut to the host callback" if r.failing_primitives and r.failing_primitives[0].endswith("callback") else
        "cut to the failing operation")
    console.print(f"  {how}: {before} -> {after}; {r.checks} checks in {r.elapsed_s:.1f}s"
                  + (" [yellow](time limit reached)[/]" if r.timed_out else ""))
    if r.failing_primitives:
        console.print(f"  failing equations: {escape(', '.join(r.failing_primitives))}")
    mark = "[green]verified[/]" if r.verified else "[bold red]NOT verified[/]"
    console.print(f"  {mark}: {escape(r.verification)}")
    for note in r.notes:
        console.print(f"  [dim]{escape(note)}[/]")
    for name, path in report.artifacts.items():
        console.print(f"  {name}: {escape(relative_or_absolute(path))}")
