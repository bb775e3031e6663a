"""``jaxdbg doctor``: environment report (versions, devices, settings, profiler, pitfalls)."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from jaxdbg.cli._common import Common, JsonOpt, OutOpt, QuietOpt, TimeoutOpt, VerboseOpt, execute
from jaxdbg.report import Report, environment_info

_STYLE = {"ok": "green", "info": "cyan", "warn": "yellow", "fail": "bold red"}


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)


def doctor(
    no_profiler: bool = typer.Option(False, "--no-profiler", help="Skip the test profiler capture."),
    distributed: bool | None = typer.Option(
        None, "--distributed/--no-distributed",
        help="Join the jax.distributed job first and report its setup (default: when a SLURM or Open MPI "
             "launch, or JAX_COORDINATOR_ADDRESS, says this process is one of a job's)."),
    json: JsonOpt = None, out: OutOpt = None, timeout: TimeoutOpt = None, quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> int:
    """Report the environment: versions, backend, devices, settings and known pitfalls (exit 1 if a check fails)."""
    common = Common("doctor", json, out, timeout, quiet, verbose)
    return execute(common, lambda c: _build(c, no_profiler, distributed), render)


def _build(common: Common, no_profiler: bool, distributed: bool | None) -> Report:
    from jaxdbg.doctor import diagnose

    trace_dir = None if no_profiler else str(common.out_dir() / "profiler-check")
    result = diagnose(trace_dir, distributed, common.timeout or 60)
    artifacts = {"profiler_trace": trace_dir} if trace_dir is not None and result.profiler.get("ok") else {}
    environment = environment_info()
    job = result.distributed or {}
    if job.get("joined"):  # joined in a contained child (doctor.distributed_report): its place is this process's
        environment.update(process_index=job["process_index"], process_count=job["process_count"])
    return Report("doctor", None, result, 0 if result.ok else 1, artifacts, environment)


def render(report: Report, console: Console) -> None:
    result = report.result
    versions = ", ".join(f"{k} {v}" for k, v in result.versions.items())
    console.print(f"[bold]jaxdbg doctor[/] {versions}")
    devices = Table(title=f"backend: {result.backend}", title_justify="left")
    for column in ("id", "platform", "kind", "memory"):
        devices.add_column(column)
    for d in result.devices:
        memory = "n/a" if not d["memory"] else ", ".join(f"{k}={v / 1024**3:.2f}GiB" for k, v in d["memory"].items())
        devices.add_row(str(d["id"]), d["platform"], d["kind"], memory)
    console.print(devices)
    host = result.host
    total = (host.get("memory_total_bytes") or 0) / 1024**3
    free = (host.get("memory_available_bytes") or 0) / 1024**3
    console.print(f"host: {host['cores']} cores, {free:.1f} of {total:.1f} GiB memory free, {host['platform']}")
    if result.settings:
        console.print("settings in effect:")
        for s in result.settings:
            console.print(f"  {s.name}={s.value}  [dim]{s.meaning}[/]")
    for check in result.checks:
        console.print(f"[{_STYLE[check.status]}]{check.status:>4}[/] {check.name}: {check.detail}", soft_wrap=True)
    console.print("[green]all checks passed[/]" if result.ok else "[bold red]some checks failed[/]")
