"""``jaxdbg profile TARGET``: compile vs execute per function, recompilation causes, HLO, per-op tables,
traces, monitoring and CI budgets. Parses options, calls :func:`jaxdbg.profile.profile`, renders."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.cells import cell_len
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
    TimeoutOpt,
    VerboseOpt,
    execute,
)
from jaxdbg.multihost_calls import shown_name
from jaxdbg.report import Report, environment_info, relative_or_absolute

if TYPE_CHECKING:  # annotations only: the profile package is imported when a command runs
    from jaxdbg._source import SourceLocation
    from jaxdbg.profile.model import BudgetResult, FunctionProfile, ProfileResult, ShardingCause
    from jaxdbg.profile.run import ProfileOptions

RunsOpt = Annotated[int, typer.Option("--runs", min=1, help="Timed runs of a function target.")]
WarmupOpt = Annotated[int, typer.Option("--warmup", min=0, help="Untimed runs before the timed ones.")]
BudgetOpt = Annotated[str | None, typer.Option(
    "--budget", metavar="RULES", help='Fail (exit 1) past a budget, e.g. "compile_s<=2,execute_median_ms<=50,'
    'recompiles<=0,train_step.compile_s<=1".')]
CompareOpt = Annotated[str | None, typer.Option(
    "--compare", metavar="OLD.json", help="Show per-function deltas against an earlier --json report.")]
XlaDumpOpt = Annotated[bool, typer.Option("--xla-dump", help="Also write XLA's full dump folder into --out.")]
MonitorOpt = Annotated[bool, typer.Option(
    "--monitor", help="Sample host memory/CPU and device memory through the run.")]
ServeOpt = Annotated[bool, typer.Option("--serve", help="Open the capture in xprof on localhost (Ctrl-C stops it).")]
TopOpt = Annotated[int, typer.Option("--top", min=0, help="Ops shown per function in the per-op table.")]
TraceCallsOpt = Annotated[int, typer.Option(
    "--trace-calls", min=0, help="Calls captured by jax.profiler from the start of the run (0: no capture).")]

PythonTracerOpt = Annotated[bool, typer.Option(
    "--python-tracer", help="Also record every Python call in the capture (large traces, slows the target).")]
CommandBuffersOpt = Annotated[bool, typer.Option(
    "--command-buffers", help="Keep XLA:GPU command buffers during the capture (ops inside them then have no "
    "per-op times).")]
SyncEveryOpt = Annotated[int, typer.Option(
    "--sync-every", min=1, help="Script mode: after a function's first calls, wait for and time one call in N, "
    "after 8 such no more often than keeps those waits near 1% of the run; the others run ahead as in a plain run "
    "(1: time every call).")]

ProfileTargetArg = Annotated[str | None, typer.Argument(
    metavar="TARGET", show_default=False,
    help="script.py (run as __main__), file.py::func or package.module:func; none with --attach/--from-capture.")]
AttachOpt = Annotated[str | None, typer.Option(
    "--attach", metavar="HOST:PORT[,HOST:PORT...]", help="Capture live processes that called "
    "jax.profiler.start_server(PORT), all at once, instead of running a TARGET.")]
DurationOpt = Annotated[float, typer.Option(
    "--duration", metavar="SECONDS", help="How long --attach captures.")]
FromCaptureOpt = Annotated[str | None, typer.Option(
    "--from-capture", metavar="DIR", help="Read an existing capture (a logdir with plugins/profile/RUN/*.xplane.pb) "
    "instead of running a TARGET; the folder is left unchanged.")]
CsvOpt = Annotated[str | None, typer.Option(
    "--csv", metavar="DIR", help="Also write calls.csv and ops.csv (flat tables) into DIR.")]


def register(app: typer.Typer) -> None:
    app.command("profile", context_settings={"allow_interspersed_args": True})(profile)


def profile(
    target: ProfileTargetArg = None, script_args: ScriptArgsArg = None, runs: RunsOpt = 20, warmup: WarmupOpt = 3,
    budget: BudgetOpt = None, compare: CompareOpt = None, xla_dump: XlaDumpOpt = False, monitor: MonitorOpt = False,
    serve: ServeOpt = False, top: TopOpt = 10, trace_calls: TraceCallsOpt = 10,
    python_tracer: PythonTracerOpt = False, command_buffers: CommandBuffersOpt = False,
    sync_every: SyncEveryOpt = 8, args: ArgsOpt = None,
    inputs: InputsOpt = None, seed: SeedOpt = 0, attach: AttachOpt = None, duration: DurationOpt = 2.0,
    from_capture: FromCaptureOpt = None, csv: CsvOpt = None, json: JsonOpt = None, out: OutOpt = None,
    timeout: TimeoutOpt = None, quiet: QuietOpt = False, verbose: VerboseOpt = False,
    metrics: MetricsOpt = None, metrics_push: MetricsPushOpt = None,
) -> int:
    """Where the time goes: compile vs execute per jitted function, why it recompiled, HLO, per-op tables."""
    from jaxdbg.profile import ProfileOptions

    captured = _Capture(attach, duration, from_capture)
    common = Common("profile", json, out, timeout, quiet, verbose, target or captured.text(),
                    metrics=metrics, metrics_push=metrics_push)
    options = ProfileOptions(runs=runs, warmup=warmup, top=top, trace_calls=trace_calls, xla_dump=xla_dump,
                             monitor=monitor, budget=budget, compare=compare, args=args, inputs=inputs, seed=seed,
                             timeout=timeout, python_tracer=python_tracer, command_buffers=command_buffers,
                             sync_every=sync_every)
    built: list[Report] = []

    def build(c: Common) -> Report:
        if captured.asked():
            report = _build_capture(c, target, captured, options)
        elif target is None:
            raise UsageError("profile needs a TARGET (script.py, file.py::func, module:func), or --attach "
                             "HOST:PORT or --from-capture DIR")
        else:
            report = _build(c, target, script_args or [], options)
        if csv:
            _export_csv(c, report, csv)
        built.append(report)
        return report

    code = execute(common, build, render)
    if serve and built and built[0].artifacts.get("trace_dir"):
        _serve(common, built[0].artifacts["trace_dir"])
    return code


def _build(common: Common, target: str, script_args: list[str], options: ProfileOptions) -> Report:
    from jaxdbg.profile import profile as run_profile
    from jaxdbg.target import parse_target

    spec = parse_target(target, script_args)
    with common.progress() as progress:
        progress.add_task(f"profiling {spec.display_name}", total=None, status="")
        run = run_profile(spec, options, str(common.out_dir()))
    # The child's view of jax (it ran the target); importing jax here only for the envelope would cost ~1 s.
    return Report("profile", target, run.result, run.exit_code, run.artifacts, run.environment or environment_info())


@dataclass(frozen=True)
class _Capture:
    """--attach / --duration / --from-capture as given."""

    attach: str | None
    duration: float
    from_capture: str | None

    def asked(self) -> bool:
        return self.attach is not None or self.from_capture is not None

    def text(self) -> str | None:
        """What the report names as its target."""
        if self.attach is not None:
            return f"attach:{self.attach}"
        return f"capture:{self.from_capture}" if self.from_capture is not None else None


def _build_capture(common: Common, target: str | None, captured: _Capture, options: ProfileOptions) -> Report:
    from jaxdbg.profile.capture_report import profile_capture

    if target is not None:
        raise UsageError(f"TARGET '{target}' together with --attach/--from-capture: these read a job already "
                         "running or a capture already taken; give either a TARGET or one of them")
    if captured.attach is not None and captured.from_capture is not None:
        raise UsageError("give either --attach or --from-capture, not both")
    unused = [name for name, given in (("--compare", options.compare), ("--monitor", options.monitor),
                                       ("--xla-dump", options.xla_dump), ("--args", options.args),
                                       ("--inputs", options.inputs)) if given]
    if unused:
        raise UsageError(f"{', '.join(unused)}: only for a profiled TARGET; a capture of a job has no compiles, "
                         "inputs or host samples to give them")
    if captured.attach is not None and not captured.duration > 0:
        raise UsageError(f"--duration {captured.duration:g}: give a positive number of seconds to capture, e.g. 2")
    with common.progress() as progress:
        progress.add_task(f"reading {captured.text()}", total=None, status="")
        run = profile_capture(str(common.out_dir()), attach_to=captured.attach, from_capture=captured.from_capture,
                              duration_s=captured.duration, top=options.top, budget=options.budget)
    from jaxdbg.profile.capture_report import capture_environment

    return Report("profile", captured.text() or "", run.result, run.exit_code, run.artifacts,
                  capture_environment(run.result))


def _export_csv(common: Common, report: Report, folder: str) -> None:
    """--csv: a failed export is one line on stderr; the report itself is still written."""
    from jaxdbg.profile.csv_export import write_profile_csv

    try:
        paths = write_profile_csv(report.result, folder)
    except OSError as err:
        common.err_console.print(f"jaxdbg profile: --csv {folder}: could not write the tables ({err.strerror or err}); "
                                 "the report is written without them", soft_wrap=True, highlight=False, markup=False)
        return
    report.artifacts.update({f"csv_{name}": os.path.abspath(path) for name, path in paths.items()})


def _serve(common: Common, logdir: str) -> None:
    from jaxdbg.profile.serve import start_xprof

    server = start_xprof(logdir)
    server.wait(announce=lambda: common.err_console.print(
        f"xprof: {server.url}  (serving {relative_or_absolute(logdir)}; Ctrl-C stops it)"))


# ---- rendering ---------------------------------------------------------------------------------------------


def _s(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 1:
        return f"{value:.3g}s"
    if value >= 1e-3:
        return f"{value * 1e3:.3g}ms"
    return f"{value * 1e6:.3g}us"


def _rate(value: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.2f} {prefix}{unit}"
    return f"{value:.0f} {unit}"


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole > 0 else "-"


def _io_line(summary: dict) -> str:
    """The host's network and disk traffic during the run (--monitor), where the host counts it."""
    parts = [f"{label} {summary[f'{key}_bytes'] / 1e6:.1f} MB "
             f"(peak {summary[f'peak_{key}_bytes_per_s'] / 1e6:.1f} MB/s)"
             for key, label in (("net_receive", "net in"), ("net_transmit", "net out"), ("disk_read", "disk read"),
                                ("disk_write", "disk write")) if f"{key}_bytes" in summary]
    return "\n  host I/O: " + ", ".join(parts) if parts else ""


def _tpu_line(tpu: dict | None) -> str:
    """The TPU runtime's figures (--monitor on a TPU host with tpu-info installed)."""
    if not tpu:
        return ""
    parts = []
    if tpu.get("mean_duty_cycle_percent"):
        parts.append("duty cycle " + " ".join(f"{v:.0f}%" for v in tpu["mean_duty_cycle_percent"]))
    if tpu.get("peak_hbm_bytes"):
        parts.append("peak HBM " + " ".join(f"{v / 2**30:.1f}" for v in tpu["peak_hbm_bytes"]) + " GiB")
    if tpu.get("peak_hbm_bandwidth_percent"):
        parts.append("peak HBM bandwidth " + " ".join(f"{v:.0f}%" for v in tpu["peak_hbm_bandwidth_percent"]))
    return "\n  TPU runtime: " + ", ".join(parts) if parts else ""


def _render_processes(console: Console, result: Any) -> None:
    """The job's processes side by side (process 0's report of a multi-process job)."""
    columns = [_Column("process"), _Column("wall", drop=2), _Column("compile"), _Column("execute", drop=1),
               _Column("in collectives"), _Column("host between steps"), _Column("steps", drop=3, minor=True)]
    rows = [[f"{r.index}{' *' if r.index in result.stragglers else ''}", _s(r.wall_s), _s(r.compile_s),
             _s(r.execute_s), _s(r.collective_s), _s(r.host_s), str(r.steps)] for r in result.processes if r.reported]
    console.print(_fitted_table(f"processes ({len(result.processes)}; * straggler)", columns, rows, console.width))
    for row in result.processes:
        if not row.reported:
            console.print(f"  process {row.index}: {row.note}", soft_wrap=True)
    if result.step_skew_s is not None:
        console.print(f"step skew: {_s(result.step_skew_s)} per step between the busiest and the least busy process")


def render(report: Report, console: Console) -> None:
    from jaxdbg.profile.hints import eager_label, eager_matters

    result = report.result
    t = result.totals
    eager = result.eager_compile or {}
    shown = eager_matters(eager, t)
    console.print(f"[bold]jaxdbg profile[/] {report.target}  ({result.mode} mode, {result.device.get('backend', '?')})")
    if result.capture is not None:
        _render_capture(console, result)
        return
    console.print(f"wall {_s(t.wall_s)} = compile {_s(t.compile_s)} ({_pct(t.compile_s, t.wall_s)}"
                  + (f", {_s(eager['total_s'])} of it eager" if shown else "") + ") + execute "
                  f"{_s(t.execute_s)} ({_pct(t.execute_s, t.wall_s)}) + transfer {_s(t.transfer_s)} "
                  f"({_pct(t.transfer_s, t.wall_s)}) + other {_s(t.other_s)} ({_pct(t.other_s, t.wall_s)})"
                  + (f"  [dim]jaxdbg overhead {_s(t.overhead_s)} not included[/]" if t.overhead_s > 1e-3 else ""))
    if result.functions:
        console.print(_functions_table(result, console.width))
    for function in result.functions:
        _render_function_detail(console, function)
    if shown:  # compiles outside jit: no row in the table above, yet counted in the compile total
        top = ", ".join(f"{eager_label(e['name'])} {_s(e['compile_s'])}" for e in eager.get("top", [])[:3])
        console.print(f"eager compiles (operations run outside jit): {eager['count']} in {_s(eager['total_s'])}, "
                      f"{_pct(eager['total_s'], t.compile_s)} of compile time" + (f"; most in {top}" if top else ""))
    _render_host(console, result)
    if result.monitor is not None:
        summary = result.monitor.summary
        console.print(f"monitor: {summary['samples']} samples, "
                      f"peak host RSS {summary['peak_host_rss_bytes'] / 2**20:.0f} "
                      f"MiB, mean CPU {summary['mean_host_cpu_percent']:.0f}% of a core"
                      + _io_line(summary) + _tpu_line(summary.get("tpu"))
                      + "".join(f"\n  [yellow]{w}[/]" for w in summary.get("warnings", [])))
    if result.comparison:
        _render_comparison(console, result.comparison)
    if result.processes:
        _render_processes(console, result)
    for note in result.notes:
        console.print(f"[cyan]note[/] {note}", soft_wrap=True)
    for hint in result.hints:
        console.print(f"[yellow]hint[/] {hint}", soft_wrap=True)
    if result.trace is not None:
        console.print(f"trace: {relative_or_absolute(result.trace.logdir)} ({result.trace.calls_traced} calls; "
                      f"open with xprof --logdir, or the Perfetto file in ui.perfetto.dev)")
    if report.artifacts.get("report"):
        console.print(f"[dim]report: {relative_or_absolute(report.artifacts['report'])}[/]")
    _render_budget(console, result.budget)
    if result.error and not console.quiet:  # quiet: execute() prints the essential line, which is this error
        Console(stderr=True, highlight=False).print(f"jaxdbg profile: {result.error}", soft_wrap=True, markup=False)


def _render_host(console: Console, result: ProfileResult) -> None:
    """Transfers and syncs at their user lines, and whether the device waits for the host between steps."""
    if result.transfers:
        console.print("transfers: " + ", ".join(
            f"{x.kind} {x.count}x {_s(x.total_s)} {_rate(x.bytes, 'B')}"
            + (f" ({', '.join(_loc(site.source) for site in x.sources[:3])})" if x.sources else "")
            for x in result.transfers), soft_wrap=True)
    if result.syncs:
        console.print("syncs (the host waited for the device): " + ", ".join(
            f"{x.kind} at {_loc(x.source)} {x.count}x, waited {_s(x.wait_s)}, device idle after {_s(x.device_idle_s)}"
            for x in result.syncs[:5]) + (f" and {len(result.syncs) - 5} more" if len(result.syncs) > 5 else ""),
            soft_wrap=True)
    p = result.input_pipeline
    if p is not None:
        parts = [f"executions {_s(p.device_s)}", f"device idle {_s(p.device_idle_s)} "
                 f"({_pct(p.device_idle_s, p.step_s)})", f"host work {_s(p.host_s)}", f"transfers {_s(p.transfer_s)}",
                 f"waiting in syncs {_s(p.sync_wait_s)}", f"dispatching {_s(p.dispatch_s)}"]
        colour = "red" if p.device_idle_fraction >= 0.2 else "yellow" if p.device_idle_fraction >= 0.05 else "green"
        console.print(f"steps of {p.function}: {p.steps} steady, {_s(p.step_s)} each = " + ", ".join(parts)
                      + f": [{colour}]{p.verdict}[/]", soft_wrap=True)


def _render_capture(console: Console, result: ProfileResult) -> None:
    """A capture: its processes and steps, then the same function and per-op tables as a profiled run."""
    capture = result.capture
    assert capture is not None
    for host in capture.hosts:
        steps = host.steps
        line = (f"  {host.label}: programs ran {_s(host.execute_s)} of {_s(host.duration_s)}")
        if steps is not None:
            busy = f"{100 * steps.execute_fraction:.0f}%" if steps.execute_fraction is not None else "-"
            line += (f"; {steps.count} steps ({steps.marker}), median {_s(steps.median_s)}, p90 {_s(steps.p90_s)}, "
                     f"{busy} in programs, host {_s(steps.host_median_s)} per step")
        console.print(line, soft_wrap=True)
        if host.overview:
            parts = ", ".join(f"{key[:-3].replace('_', ' ')} {value:g}ms" for key, value in host.overview.items()
                              if key.endswith("_ms") and key != "step_ms" and value)
            verdict = host.overview.get("bottleneck", "?")
            console.print(f"    xprof: {verdict}-bound; step {host.overview['step_ms']:g}ms"
                          + (f": {parts}" if parts else ""), soft_wrap=True)
    if result.functions:
        console.print(_functions_table(result, console.width))
    for function in result.functions:
        _render_ops(console, function)
    for note in result.notes:
        console.print(f"[cyan]note[/] {note}", soft_wrap=True)
    for hint in result.hints:
        console.print(f"[yellow]hint[/] {hint}", soft_wrap=True)
    console.print(f"capture: {relative_or_absolute(capture.run)} (a copy; open with xprof --logdir)")
    _render_budget(console, result.budget)


@dataclass(frozen=True)
class _Column:
    """A table column. ``drop`` > 0: a narrow terminal may leave it out (higher goes first), and a ``minor``
    one goes before any name is folded; ``fold``: its text (a name) may break over lines. Numbers (and
    file:line sources) neither fold nor shrink."""

    header: str
    drop: int = 0
    minor: bool = False
    fold: bool = False


_FOLDED_MIN = 12  # a name folds onto lines no narrower than this


def _fitted_table(title: str, columns: list[_Column], rows: list[list[str]], width: int) -> Table:
    """A table no wider than ``width`` that never cuts a number: rich would shorten the cells of a table too
    wide for the terminal ('469…', 'compil…', even when piped: 80 columns). Minor columns go first, then
    names fold, then other optional columns go; what is left out is named in the caption (the JSON report
    has everything)."""
    natural = [max([cell_len(c.header)] + [cell_len(row[i]) for row in rows]) for i, c in enumerate(columns)]
    folded = [min(n, _FOLDED_MIN) if c.fold else n for c, n in zip(columns, natural)]
    keep = list(range(len(columns)))

    def needed(widths: list[int]) -> int:  # each column: its cells, a space either side, a border; one more border
        return sum(widths[i] + 3 for i in keep) + 1

    dropped = []
    by_rank = sorted((i for i, c in enumerate(columns) if c.drop), key=lambda i: -columns[i].drop)
    for i in [i for i in by_rank if columns[i].minor] + [i for i in by_rank if not columns[i].minor]:
        if needed(natural if columns[i].minor else folded) <= width:
            continue
        keep.remove(i)
        dropped.append(columns[i].header)
    caption = f"left out at {width} columns: {', '.join(dropped)} (in --json)" if dropped else None
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    spare = max(width - needed(folded), 0)
    for i in keep:
        if columns[i].fold:
            grown = min(natural[i], folded[i] + spare)
            spare -= grown - folded[i]
            table.add_column(columns[i].header, width=grown, overflow="fold")
        else:
            table.add_column(columns[i].header, no_wrap=True, min_width=natural[i])
    for row in rows:
        table.add_row(*(Text(row[i]) for i in keep))
    return table


def _functions_table(result: ProfileResult, width: int) -> Table:
    columns = [_Column("function", fold=True), _Column("compiles", drop=1), _Column("compile"),
               _Column("calls", drop=2), _Column("first", drop=4, minor=True), _Column("median", drop=3),
               _Column("p90", drop=5, minor=True), _Column("execute")]
    rows = [[shown_name(f.name, f.called_as, f.source) + (" (pmap)" if f.kind == "pmap" else "")
             + (f" @{f.host}" if f.host else ""),
             "-" if f.compiles is None else str(f.compiles),
             _s(f.compile.total_s if f.compile else None), str(f.execute.calls), _s(f.execute.first_s),
             _s(f.execute.median_s), _s(f.execute.p90_s), _s(f.execute.total_s)] for f in result.functions]
    return _fitted_table("jitted functions", columns, rows, width)


def _loc(source: SourceLocation | None) -> str:
    """'train.py:14': the file's base name keeps tables narrow (the JSON has the full path)."""
    if source is None:
        return "-"
    return f"{os.path.basename(source.file)}:{source.line}"


def _render_function_detail(console: Console, f: FunctionProfile) -> None:
    c = f.compile
    shown = escape(f.called_as or f.name)  # a multihost helper's jit: as the user called it
    if c is None:  # a capture: no compiles seen
        _render_ops(console, f)
        return
    where = "called" if f.called_as else "defined"  # a multihost helper's jit: at the user's line that called it
    # (a barrier at a second line runs the program the first one compiled: nothing of its own to split)
    split = (f"compile {_s(c.total_s)} over {f.compiles} compile(s): trace {_s(c.trace_s)}, lower {_s(c.lower_s)}, "
             f"backend {_s(c.compile_s)}" if f.compiles else "no compile of its own (jax reused a program compiled "
             "by an earlier call)")
    console.print(f"  [bold]{shown}[/] {split}"
                  + (f"; {where} at {relative_or_absolute(f.source.file)}:{f.source.line}" if f.source else ""),
                  soft_wrap=True)
    for calls, reason in _grouped(f.recompiles or ())[:8]:
        which = ", ".join(map(str, calls[:6])) + (f", ... ({len(calls)} recompiles)" if len(calls) > 6 else "")
        label = "call" if len(calls) == 1 else "calls"
        console.print(f"  [magenta]recompile[/] {shown} {label} {which}: {reason}", soft_wrap=True)
    if f.cost or f.rates:
        parts = []
        if f.cost:
            parts.append(", ".join(f"{k} {v:.3g}" for k, v in f.cost.items()))
        r = f.rates
        if r and r.flops_per_s:
            frac = f" = {100 * r.flops_fraction:.1f}% of peak" if r.flops_fraction else ""
            bw = f", {_rate(r.bytes_per_s, 'B/s')}" if r.bytes_per_s else ""
            bwfrac = f" = {100 * r.bytes_fraction:.1f}% of peak" if r.bytes_fraction else ""
            if r.bytes_fraction and r.bytes_fraction > 1:
                bwfrac += " (above the measured memory peak: the data fits in caches)"
            bound = f", {r.bound}-bound" if r.bound else ""
            parts.append(f"{_rate(r.flops_per_s, 'FLOP/s')}{frac}{bw}{bwfrac}{bound} [dim]({r.peak_source})[/]")
            if r.note:
                parts.append(f"[dim]{r.note}[/]")
        console.print(f"  {shown} cost: " + "; ".join(parts), soft_wrap=True)
    if f.memory:
        console.print(f"  {shown} memory: " + ", ".join(f"{k} {_rate(v, 'B')}" for k, v in f.memory.items()),
                      soft_wrap=True)
    if f.devices:
        console.print(f"  {shown} per device (captured calls): " + ", ".join(
            f"{d.device} {d.executions}x median {_s(d.median_s)}" for d in f.devices), soft_wrap=True)
    _render_ops(console, f)


def _render_ops(console: Console, f: FunctionProfile) -> None:
    if f.ops:
        columns = [_Column("op", fold=True), _Column("category", drop=1), _Column("count", drop=2, minor=True),
                   _Column("total"), _Column("share"), _Column("source")]
        rows = [[op.name, op.category, str(op.count), _s(op.total_s), f"{100 * op.fraction:.1f}%", _loc(op.source)]
                for op in f.ops]
        where = f" in {f.host}" if f.host else ""
        title = f"top ops of {escape(f.called_as or f.name)}{where} ({f.ops_source})"
        console.print(_fitted_table(title, columns, rows, console.width))
        for op in f.ops:
            if op.sharding_cause is not None:
                console.print(f"  {op.name}: {_cause_line(op.sharding_cause)}", soft_wrap=True)
    if f.scopes:
        shares = ", ".join(f"{escape(s.scope) if s.scope else '(none)'} {100 * s.fraction:.1f}%" for s in f.scopes)
        console.print(f"  op time of {escape(f.called_as or f.name)} by named scope: {shares}", soft_wrap=True)


def _cause_line(cause: ShardingCause) -> str:
    """Which sharding put a collective there, e.g. "over mesh axis 'model': batch['x'] P('data', 'model')
    is split there; for dot_general at train.py:12"."""
    over = f"over mesh axis {', '.join(repr(a) for a in cause.axes)}" if cause.axes else f"over devices {cause.devices}"
    split = ", ".join(f"{a.argument} {a.sharding}" for a in cause.arguments)
    why = (f"{split} split across those devices" if split
           else "no argument is split across those devices (an output or intermediate sharding)")
    return f"{over}: {why}; for {cause.op or '?'} at {_loc(cause.source)}"


def _grouped(recompiles: tuple) -> list[tuple[list[int], str]]:
    """Recompiles with the same reason together, in order of first appearance."""
    groups: dict[str, list[int]] = {}
    for r in recompiles:
        groups.setdefault(r.reason, []).append(r.call_index)
    return [(calls, reason) for reason, calls in groups.items()]


def _render_comparison(console: Console, deltas: tuple) -> None:
    def cell(metric: dict | None, seconds: bool = True) -> str:
        if not metric or metric.get("new") is None:
            return "-"
        new = _s(metric["new"]) if seconds else f"{metric['new']:g}"
        if metric.get("ratio") is None:
            return new
        return f"{new} ({metric['ratio']:.2f}x)"

    rows = []
    for d in deltas:
        m = d.metrics
        if d.name == "<totals>":
            rows.append(["(run)", d.status, cell(m.get("compile_s")), "-", "-"])
        else:
            rows.append([d.name, d.status, cell(m.get("compile_s")), cell(m.get("execute_median_s")),
                         cell(m.get("calls"), seconds=False)])
    columns = [_Column("function", fold=True), _Column("status", drop=2, minor=True), _Column("compile"),
               _Column("execute median"), _Column("calls", drop=1)]
    console.print(_fitted_table("compared with the earlier report", columns, rows, console.width))


def _render_budget(console: Console, budget: BudgetResult) -> None:
    if not budget.checked:
        return
    if budget.ok:
        console.print(f"[green]budget held[/] ({', '.join(budget.checked)})")
        return
    console.print("[bold red]budget violated[/]")
    for violation in budget.violations:
        console.print(f"  [red]{violation}[/]", soft_wrap=True)
