"""The ``jaxdbg`` command line: a typer app with one module per subcommand.

Each subcommand module defines ``register(app)``; only commands that work are listed in ``COMMANDS``.
:func:`main` is the console script; usage errors become one line on stderr and exit code 2.

Example:
    >>> main(["--version"])                      # doctest: +ELLIPSIS
    jaxdbg ...
    0
    >>> main(["doctor", "--no-such-option"])    # one line on stderr, exit code 2
    2
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

import typer
from typer.core import TyperGroup

try:  # typer >= 0.22 vendors click as typer._click; older releases depend on click itself
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover - depends on the installed typer
    click_errors = importlib.import_module("click.exceptions")

from jaxdbg import runner
from jaxdbg._errors import EXIT_USAGE, UsageError
from jaxdbg._version import __version__
from jaxdbg.launch import COMMAND_VARIABLE, launch, split_processes_option

# Subcommand modules under jaxdbg.cli, in the order --help lists them.
COMMANDS = ("doctor", "profile", "nan_hunt", "repro", "pipeline_bench", "check", "hang_hunt", "memory")


class JaxdbgGroup(TyperGroup):
    """Turns click's multi-line usage errors into the contract's single line and exit code 2."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, *a: Any, **extra: Any) -> Any:
        extra["standalone_mode"] = False
        try:
            code = super().main(args, prog_name or "jaxdbg", *a, **extra)
        except click_errors.NoArgsIsHelpError as err:
            typer.echo(err.ctx.get_help() if err.ctx else str(err))
            code = 0
        except click_errors.UsageError as err:
            where = f"jaxdbg {err.ctx.info_name}" if err.ctx and err.ctx.parent else "jaxdbg"
            hint = f"run '{err.ctx.command_path} --help' for the options" if err.ctx else "run 'jaxdbg --help'"
            typer.echo(f"{where}: {err.format_message().rstrip('.')}; {hint}", err=True)
            code = EXIT_USAGE
        except (typer.Exit, getattr(click_errors, "Exit", typer.Exit)) as done:
            code = done.exit_code
        except (typer.Abort, getattr(click_errors, "Abort", typer.Abort)):
            typer.echo("jaxdbg: aborted", err=True)
            code = 130
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    cls=JaxdbgGroup,
    name="jaxdbg",
    help="Debugging and profiling for JAX programs: find where NaNs are born, where time goes, "
    "and turn a failing program into a small reproducer.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"jaxdbg {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True, help="Print the version."),
    processes: int | None = typer.Option(
        None, "--processes", metavar="N", min=1,
        help="Run the command as N processes of one local jax.distributed job (as srun would; CPU collectives "
             "over gloo); must come before the command."),
) -> None:
    """jaxdbg: debugging and profiling for JAX programs."""


for _name in COMMANDS:
    importlib.import_module(f"jaxdbg.cli.{_name}").register(app)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code instead of exiting."""
    # SIGTERM (a scheduler's time limit, `kill`, a job's launcher) ends the command's run of its target as its
    # --timeout would, and the command reports; before any such run, it becomes SystemExit, so contained children
    # are stopped on the way out.
    on_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if on_main_thread else None
    args = list(argv) if argv is not None else sys.argv[1:]
    try:
        processes, rest = split_processes_option(args)
        if processes is not None:
            return launch(rest, processes)
        # What this process runs, for the processes of a jax.distributed job to compare (multihost.agree_on_command).
        os.environ[COMMAND_VARIABLE] = json.dumps(args)
        app(args=args, prog_name="jaxdbg")
    except UsageError as err:
        typer.echo(f"jaxdbg: {err.message}", err=True)
        return err.exit_code
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    finally:
        if on_main_thread:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        runner.stop_contained()  # only a child waited for on another thread can be left by now
    return 0


def _terminate(signum: int, _frame: object) -> None:
    if not runner.end_runs_at_sigterm():
        raise SystemExit(128 + signum)
