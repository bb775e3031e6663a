"""What every subcommand shares: the common options, consoles, progress bars and the one error boundary.

A command module parses its options, then hands :func:`execute` a function that builds the
:class:`~jaxdbg.report.Report` and one that renders it. Only :func:`execute` turns a
:class:`~jaxdbg._errors.JaxdbgError` into one line on stderr and an exit code.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from jaxdbg._errors import EXIT_FOUND, EXIT_OK, JaxdbgError, UsageError
from jaxdbg.launch import WORKER_VARIABLE, launched_place, naming_process
from jaxdbg.report import Report, Result, process_folder, resolve_out_dir, write_json

EXIT_INTERNAL = 4  # a bug in jaxdbg itself (not in the contract's 0-3): report it with the -v traceback

JsonOpt = Annotated[
    str | None,
    typer.Option("--json", metavar="PATH",
                 help="Write the JSON report to PATH; '-' prints it to stdout and nothing else."),
]
OutOpt = Annotated[
    str | None,
    typer.Option("--out", metavar="DIR", help="Folder for artifacts (default: jaxdbg-out/<command>-<timestamp>/)."),
]
TimeoutOpt = Annotated[
    float | None,
    typer.Option("--timeout", metavar="SECONDS", min=0.1, help="Stop the target after this long and report it."),
]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="Print only the essentials.")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Print more detail, and tracebacks of errors.")]
TargetArg = Annotated[
    str, typer.Argument(metavar="TARGET", show_default=False,
                        help="script.py (run as __main__), file.py::func or package.module:func."),
]
ScriptArgsArg = Annotated[
    list[str] | None, typer.Argument(metavar="[-- ARGS]...", show_default=False,
                                        help="Arguments passed to a script target (after --)."),
]
ArgsOpt = Annotated[
    str | None, typer.Option("--args", metavar="SPEC", help='Inputs of a function target, e.g. "f32[8,128] i32[8]".'),
]
InputsOpt = Annotated[
    str | None, typer.Option("--inputs", metavar="SRC", help="file.py::make_inputs or data.npz (arg0, arg1, ...)."),
]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of the random --args inputs.")]
MetricsOpt = Annotated[str | None, typer.Option(
    "--metrics", metavar="PATH.prom",
    help="Write the report's figures as Prometheus/OpenMetrics text (docs/metrics.md).")]
MetricsPushOpt = Annotated[str | None, typer.Option(
    "--metrics-push", metavar="URL", help="Push the report's figures to a Prometheus Pushgateway at URL.")]


@dataclass
class Common:
    """The common options of every command, and the consoles and folders derived from them."""

    command: str
    json: str | None = None
    out: str | None = None
    timeout: float | None = None
    quiet: bool = False
    verbose: bool = False
    target: str | None = None
    metrics: str | None = None  # --metrics PATH.prom
    metrics_push: str | None = None  # --metrics-push URL
    _out_dir: Path | None = field(default=None, repr=False)

    @property
    def console(self) -> Console:
        """Where the human-readable report goes: stdout, or stderr when stdout carries the JSON."""
        return Console(stderr=self.json == "-", quiet=self.quiet and not self.verbose, highlight=False)

    @property
    def err_console(self) -> Console:
        return Console(stderr=True, highlight=False)

    def out_dir(self) -> Path:
        """The artifacts folder, created on first use."""
        if self._out_dir is None:
            self._out_dir = resolve_out_dir(self.out, self.command)
        return self._out_dir

    def progress(self) -> Progress | NullProgress:
        """A progress bar on a terminal; a silent stand-in when piped, quiet or under CI."""
        console = self.err_console
        if self.quiet or not console.is_terminal or os.environ.get("CI"):
            return NullProgress()
        return Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(), console=console, transient=True,
        )


class NullProgress:
    """Progress with rich's API that shows nothing (piped output, CI, --quiet)."""

    def __enter__(self) -> NullProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def add_task(self, description: str, total: float | None = None, **fields: Any) -> TaskID:
        return TaskID(0)

    def update(self, task_id: TaskID, **kwargs: Any) -> None:
        return None

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        return None


def execute(common: Common, build: Callable[[Common], Report], render: Callable[[Report, Console], None]) -> int:
    """Build a report, write its JSON (``--json`` and ``report.json`` in the artifacts folder), render it.

    Returns the exit code; never lets an exception out (``-v`` prints the traceback of one).
    """
    try:
        validate_destinations(common)
        report = build(common)
        check_launched_job(report)
        export_metrics(common, report)
        out_dir = report_folder(common._out_dir, report)
        if out_dir is not None:
            report.artifacts.setdefault("report", os.path.abspath(out_dir / "report.json"))
            write_json(report, str(out_dir / "report.json"))
        if common.json and (common.json == "-" or speaks_for_the_job(report)):
            write_json(report, common.json)
        render(report, common.console)
        line = essential_line(report) if common.quiet and not common.verbose and report.exit_code else None
        if line:
            line = naming_process(line, job_place(report))
            common.err_console.print(f"jaxdbg {common.command}: {line}", soft_wrap=True, highlight=False, markup=False)
        return report.exit_code
    except JaxdbgError as err:
        fail(common, err.message, err)
        write_error_report(common, err.message, err.exit_code)
        return err.exit_code
    except KeyboardInterrupt:
        common.err_console.print(f"jaxdbg {common.command}: interrupted")
        return 130
    except Exception as err:  # noqa: BLE001 - the one boundary where a jaxdbg bug becomes an exit code
        message = f"internal error {type(err).__name__}: {err}; rerun with -v and report the traceback"
        fail(common, message, err)
        write_error_report(common, message, EXIT_INTERNAL)
        return EXIT_INTERNAL


def export_metrics(common: Common, report: Report) -> None:
    """--metrics / --metrics-push: a failed export is one line on stderr; the report and exit code stay."""
    if not (common.metrics or common.metrics_push):
        return
    from jaxdbg.metrics import export

    data = report.to_dict()
    report.environment = report.environment or data["environment"]  # asked once (it may import jax)
    written, failures = export(data, common.metrics, common.metrics_push)
    for path in written:
        report.artifacts.setdefault("metrics", os.path.abspath(path))
    for line in failures:
        fail(common, line)
    if failures and hasattr(report.result, "warned"):  # a result that keeps warnings (nan-hunt's) keeps these too
        report.result = report.result.warned("metrics", failures)


def report_folder(out_dir: Path | None, report: Report) -> Path | None:
    """Where report.json goes: the output folder, or this process's folder in it (report.process_folder)."""
    if out_dir is None:
        return None
    folder = process_folder(out_dir, report.environment)
    folder.mkdir(exist_ok=True)
    return folder


def check_launched_job(report: Report) -> None:
    """A process started by ``jaxdbg --processes N`` whose program never joined the job ran alone: say so
    (each process would otherwise report a whole run of its own as if it were the job)."""
    launched = os.environ.get("SLURM_NTASKS") if os.environ.get(WORKER_VARIABLE) is not None else None
    ran_as = (report.environment or {}).get("process_count")
    finished = report.exit_code in (EXIT_OK, EXIT_FOUND)  # one that was stopped may be waiting to join the job
    if launched and int(launched) > 1 and ran_as == 1 and finished:
        raise UsageError(f"started as one of {launched} processes (--processes {launched}), but the program never "
                         "called jax.distributed.initialize(), so each process ran alone; call it at the start of "
                         "the program, or drop --processes")


def job_place(report: Report | None = None) -> tuple[int, int] | None:
    """``(index, count)`` of this process in a job of several processes: as its report says, or (no report yet,
    or a program that never joined) as its launcher's environment says; None for a single process."""
    env = (report.environment if report is not None else None) or {}
    if int(env.get("process_count") or 1) > 1:
        return int(env.get("process_index") or 0), int(env["process_count"])
    return launched_place(os.environ)


def speaks_for_the_job(report: Report) -> bool:
    """Process 0 of a multi-process job (or a single process): the one that writes ``--json PATH``, which
    every process of the job was given (the others' reports are in their process-<index>/ folders)."""
    return (report.environment or {}).get("process_index", 0) == 0


def write_error_report(common: Common, message: str, exit_code: int) -> None:
    """Even a failed command leaves one JSON object where --json points, so CI can read why it failed.

    Another process of a job (``--json`` is process 0's) writes only into its own ``process-<index>/`` folder.
    """
    report = Report(common.command, common.target, {"error": message}, exit_code)
    place = launched_place(os.environ)
    destinations = [common.json] if common.json and (place is None or place[0] == 0 or common.json == "-") else []
    if common._out_dir is not None:
        folder = common._out_dir if place is None else process_folder(
            common._out_dir, {"process_index": place[0], "process_count": place[1]})
        with contextlib.suppress(OSError):
            folder.mkdir(exist_ok=True)
        destinations.append(str(folder / "report.json"))
    for destination in destinations:
        with contextlib.suppress(Exception):  # the error line above is already the answer; JSON is a courtesy
            write_json(report, destination)


def essential_line(report: Report) -> str | None:
    """What `-q` still says when a command finds something: each result says it itself (report.Result)."""
    result = report.result
    return result.essential_line() if isinstance(result, Result) else None


def validate_destinations(common: Common) -> None:
    """Refuse a bad --out or --json before any work is done (not after minutes of analysis)."""
    if common.out:
        common.out_dir()
    if common.metrics_push:
        from jaxdbg.metrics.export import check_push_url

        check_push_url(common.metrics_push)
    if common.json and common.json != "-":
        path = Path(common.json)
        if not path.resolve().parent.exists():
            raise UsageError(f"--json '{common.json}': folder '{path.parent}' does not exist; create it or pick "
                             "another path")
        if path.is_dir():
            raise UsageError(f"--json '{common.json}' is a folder; give a file path, e.g. {path / 'report.json'}")
        place = launched_place(os.environ)
        if place is not None and place[0] != 0:
            return  # process 0 writes the job's --json (and tests it): the others racing it could delete its file
        existed = path.exists()
        try:  # the one sure test of writability (read-only file systems, permissions)
            with open(path, "a"):
                pass
        except OSError as err:
            raise UsageError(f"--json '{common.json}': cannot write there ({err.strerror}); pick another path") from err
        if not existed:
            path.unlink(missing_ok=True)


def render_advice(console: Console, report: Report, explanation: str, hints: Sequence[str],
                  notes: Sequence[str], warnings: Sequence[str] = ()) -> None:
    """The end of a command's human report: the explanation, what to try, notes, warnings (steps of jaxdbg's own
    that failed), and the artifacts written."""
    from rich.markup import escape

    from jaxdbg.report import relative_or_absolute

    console.print()
    if explanation:
        console.print(escape(explanation), soft_wrap=True)
    for hint in hints:
        console.print(f"  [cyan]try[/] {escape(hint)}", soft_wrap=True)
    for note in notes:
        console.print(f"  [dim]note: {escape(note)}[/]", soft_wrap=True)
    for warning in warnings:
        console.print(f"  [yellow]warning:[/] {escape(warning)}", soft_wrap=True)
    for name, path in report.artifacts.items():
        console.print(f"  [dim]{name}: {escape(relative_or_absolute(path))}[/]")


def fail(common: Common, message: str, err: BaseException | None = None) -> None:
    """One line on stderr (plain text, no markup), plus the traceback with -v."""
    if common.verbose and err is not None:
        traceback.print_exception(type(err), err, err.__traceback__, file=sys.stderr)
    sys.stderr.write(f"jaxdbg {common.command}: {naming_process(message, job_place())}\n")
    sys.stderr.flush()
