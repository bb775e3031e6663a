"""``jaxdbg check``: the CI smoke checks of ``[tool.jaxdbg.check]`` in pyproject.toml, one summary table,
JUnit XML, GitHub annotations and job summary, and baselines. Parses options, calls
:func:`jaxdbg.check.run_suite`, renders."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from jaxdbg._errors import UsageError
from jaxdbg.cli._common import (
    Common,
    JsonOpt,
    MetricsOpt,
    MetricsPushOpt,
    OutOpt,
    QuietOpt,
    TimeoutOpt,
    VerboseOpt,
    execute,
)
from jaxdbg.report import Report, environment_info, relative_or_absolute

# "\\[": typer renders help as rich markup, which would drop "[tool.jaxdbg.check]" as an unknown style tag.
ConfigOpt = Annotated[str | None, typer.Option(
    "--config", metavar="PATH", help="The pyproject.toml holding \\[tool.jaxdbg.check] (default: the nearest one "
    "from the current folder up).")]
JobsOpt = Annotated[int | None, typer.Option(
    "--jobs", metavar="N", min=1, help="Checks run at once (default: the CPU count).")]
JunitOpt = Annotated[str | None, typer.Option(
    "--junit", metavar="PATH", help="Write JUnit XML: one test case per check.")]
BaselineOpt = Annotated[str | None, typer.Option(
    "--baseline", metavar="PATH", help="Compare compile and execute figures with this baseline (a regression is "
    "a slowdown beyond its measured noise).")]
UpdateBaselineOpt = Annotated[bool, typer.Option(
    "--update-baseline", help="Write the --baseline file from this run instead of comparing.")]
RepeatsOpt = Annotated[int | None, typer.Option(
    "--repeats", metavar="N", min=1, help="Runs of each profile check (default: 5 with --update-baseline, else 1).")]
AlphaOpt = Annotated[float, typer.Option(
    "--alpha", min=1e-6, max=0.5, help="Significance level of the baseline's regression test.")]


def register(app: typer.Typer) -> None:
    app.command("check")(check)


def check(
    config: ConfigOpt = None, jobs: JobsOpt = None, junit: JunitOpt = None, baseline: BaselineOpt = None,
    update_baseline: UpdateBaselineOpt = False, repeats: RepeatsOpt = None, alpha: AlphaOpt = 0.01,
    json: JsonOpt = None, out: OutOpt = None, timeout: TimeoutOpt = None, quiet: QuietOpt = False,
    verbose: VerboseOpt = False, metrics: MetricsOpt = None, metrics_push: MetricsPushOpt = None,
) -> int:
    """Run the CI checks of pyproject.toml's \\[tool.jaxdbg.check] (exit 1 if one fails)."""
    common = Common("check", json, out, timeout, quiet, verbose, metrics=metrics, metrics_push=metrics_push)
    return execute(common, lambda c: _build(c, config, jobs, junit, baseline, update_baseline, repeats, alpha),
                   render)


def _build(common: Common, config: str | None, jobs: int | None, junit: str | None, baseline: str | None,
           update_baseline: bool, repeats: int | None, alpha: float) -> Report:
    from jaxdbg.check import Settings, find_config, load_checks, run_suite
    from jaxdbg.check.github import annotation_lines, append_summary
    from jaxdbg.check.junit import write_junit

    path = Path(config) if config else find_config(Path.cwd())
    common.target = str(path)  # an error report names the file too
    specs = load_checks(path)
    if update_baseline and not baseline:
        raise UsageError("--update-baseline needs --baseline PATH: the file to write")
    for option, value in (("--junit", junit), ("--baseline", baseline if update_baseline else None)):
        if value and not Path(value).resolve().parent.is_dir():
            raise UsageError(f"{option} '{value}': folder '{Path(value).parent}' does not exist; create it first")
    settings = Settings(common.out_dir(), jobs, common.timeout, repeats, Path(baseline) if baseline else None,
                        update_baseline, alpha)
    run = run_suite(specs, settings)
    artifacts = dict(run.artifacts)
    if junit:
        write_junit(run.result, Path(junit))
        artifacts["junit"] = os.path.abspath(junit)
    if os.environ.get("GITHUB_ACTIONS") == "true":
        stream = sys.stderr if common.json == "-" else sys.stdout  # stdout carries only the JSON then
        for line in annotation_lines(run.result):
            print(line, file=stream, flush=True)
    if update_baseline and not run.result.passed:
        print(f"jaxdbg check: baseline '{baseline}' not written: a check failed (a baseline is the last good run; "
              "an existing file is kept)", file=sys.stderr, flush=True)
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        append_summary(run.result, Path(os.environ["GITHUB_STEP_SUMMARY"]))
    return Report("check", str(path), run.result, 0 if run.result.passed else 1, artifacts,
                  run.environment or environment_info())


def render(report: Report, console: Console) -> None:
    result = report.result
    table = Table(title=f"jaxdbg check: {relative_or_absolute(report.target or '')}", title_justify="left")
    for column in ("check", "command", "result", "time", "finding"):
        table.add_column(column, overflow="fold")
    for c in result.checks:
        where = f" [dim]{relative_or_absolute(c.location.file)}:{c.location.line}[/]" if c.location else ""
        verdict = "[green]pass[/]" if c.passed else "[bold red]FAIL[/]"
        table.add_row(c.name, c.command, verdict, f"{c.duration_s:.1f} s", (c.finding or "") + where)
    console.print(table)
    for line in _baseline_lines(report):
        console.print(line, highlight=False)
    failed = sum(not c.passed for c in result.checks)
    console.print("[green]all checks passed[/]" if not failed else
                  f"[bold red]{failed} of {len(result.checks)} checks failed[/]")


def _baseline_lines(report: Report) -> list[str]:
    """Say what happened to the baseline: written, or which checks were compared (a passing comparison is
    otherwise silent, and a check missing from the baseline would look compared)."""
    artifacts = report.artifacts
    if "baseline" in artifacts:
        return [f"baseline written: {relative_or_absolute(artifacts['baseline'])}"]
    suffix = "_baseline_comparison"
    compared = [name.removesuffix(suffix) for name in artifacts if name.endswith(suffix)]
    if not compared:
        return []
    profiles = [c.name for c in report.result.checks if c.command == "profile"]
    lines = [f"compared with the baseline: {', '.join(compared)} (every figure and its test in "
             f"{relative_or_absolute(str(Path(artifacts[compared[0] + suffix]).parent.parent))}"
             "/<check>/baseline-comparison.json)"]
    missing = [name for name in profiles if name not in compared]
    if missing:
        lines.append(f"not in the baseline, not compared: {', '.join(missing)}")
    return lines
