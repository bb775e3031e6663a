"""``jaxdbg nan-hunt TARGET``: where the first NaN/Inf is born. Parses options, calls
:func:`jaxdbg.nan.hunt` (contained), renders the result (exit 1 when found, 0 when everything stayed finite)."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from jaxdbg._errors import UsageError
from jaxdbg._source import SourceLocation
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
    render_advice,
)
from jaxdbg.nan.result import Origin, ValueStats
from jaxdbg.report import Report, relative_or_absolute

GradOpt = Annotated[bool, typer.Option("--grad", help=(
    "Function target: hunt inside its gradient (value_and_grad). A function returning a (scalar loss, aux) pair is "
    "differentiated with has_aux=True: the gradient of the loss, and aux is checked too."))]
ArgnumsOpt = Annotated[str | None, typer.Option("--argnums", metavar="I,J",
                                                  help="Arguments to differentiate with --grad (default 0).")]
NanOnlyOpt = Annotated[bool, typer.Option("--nan-only", help="Look for NaN only; ignore Inf.")]
GrowthOpt = Annotated[float, typer.Option(
    "--growth-factor", min=1.0, help="Report outputs whose magnitude grew by this factor before the NaN.")]
PrecisionOpt = Annotated[bool, typer.Option(
    "--precision", help="For a bf16/f16 origin, replay in float32 and say whether that removes it.")]


def register(app: typer.Typer) -> None:
    app.command("nan-hunt", context_settings={"allow_interspersed_args": True})(nan_hunt)


def nan_hunt(
    target: TargetArg, script_args: ScriptArgsArg = None, grad: GradOpt = False, argnums: ArgnumsOpt = None,
    nan_only: NanOnlyOpt = False, growth_factor: GrowthOpt = 100.0, precision: PrecisionOpt = False,
    args: ArgsOpt = None, inputs: InputsOpt = None, seed: SeedOpt = 0, json: JsonOpt = None, out: OutOpt = None,
    timeout: TimeoutOpt = None, quiet: QuietOpt = False, verbose: VerboseOpt = False,
    metrics: MetricsOpt = None, metrics_push: MetricsPushOpt = None,
) -> int:
    """Locate where NaN/Inf values are born: operation, source line, forward/backward pass, loop iteration."""
    common = Common("nan-hunt", json, out, timeout, quiet, verbose, target, metrics=metrics, metrics_push=metrics_push)

    def build(c: Common) -> Report:
        from jaxdbg.nan import HuntOptions, hunt
        from jaxdbg.target import parse_target

        spec = parse_target(target, script_args or [])
        if spec.is_script and grad:  # (--args/--inputs: jaxdbg.target.check_inputs, for every command)
            raise UsageError("--grad applies to a function target (file.py::fn); a script runs as written")
        if argnums is not None and not grad:
            raise UsageError(f"--argnums {argnums} only applies with --grad (which arguments to differentiate); "
                             "add --grad or drop --argnums")
        options = HuntOptions(nan_only, growth_factor, precision, grad, _argnums(argnums or "0"), args, inputs, seed,
                              str(c.out_dir()), timeout)
        with c.progress() as progress:
            progress.add_task(f"hunting in {spec.display_name}", total=None, status="")
            run = hunt(spec, options)
        if c.verbose:  # a step after the origin that failed: its traceback (the report keeps the warning)
            for warning in run.result.warnings:
                sys.stderr.write(f"jaxdbg nan-hunt: {warning.line()}\n{warning.traceback}")
        return Report("nan-hunt", target, run.result, run.exit_code, dict(run.artifacts), run.environment)

    return execute(common, build, render)


def _argnums(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UsageError(f"--argnums '{text}': give argument positions separated by commas, e.g. 0,1") from None
    if not values:
        raise UsageError("--argnums is empty; give argument positions, e.g. 0 or 0,1")
    return values


def _where(source: SourceLocation | None) -> str:
    if not source:
        return "no user source line"
    return f"{relative_or_absolute(source.file)}:{source.line} in {source.function}"


def _a_part(origin: Origin) -> bool:
    """Whether the origin's first non-finite value sits in one device's part of an array spread over several."""
    bad = next((o for o in origin.outputs if (o.nan or o.inf) and len(o.shape) == len(origin.shard or ())), None)
    return bad is not None and any(stop - start < size for (start, stop), size in zip(origin.shard or (), bad.shape))


def _short_where(source: SourceLocation | None) -> str:
    return f"{os.path.basename(source.file)}:{source.line}" if source else ""


def _num(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def render(report: Report, console: Console) -> None:
    result = report.result
    if not result.found:
        console.print(f"[green]no NaN/Inf[/] {escape(result.explanation)}")
        _render_growth(result.growth, console, "grew during the run (no NaN/Inf yet)")
        return
    first = result.first
    what = {"nan": "NaN", "inf": "Inf", "input": "non-finite input"}[first.kind]
    eager = {"eager": " (eager, outside jit)", "pmap": " (pmap)"}.get(first.path[0] if first.path else "", "")
    if first.transformed_by:
        eager = f" (through {first.transformed_by}, outside jit)"
    console.print(f"[bold red]{what}[/] first appeared in call {first.call_index} of "
                  f"[bold]{escape(first.function)}[/]{eager}", soft_wrap=True)
    if first.kind == "input":
        console.print(f"  argument  [bold]{escape(str(first.argument))}[/] (it came in with the data)")
    else:
        from jaxdbg.nan.explain import constant_nan_note  # (imports jax: only when a report is shown)

        note = constant_nan_note(first)  # jax's select of its own NaN constant: say who returned it
        console.print(f"  operation [bold]{first.primitive}[/]  ({first.pass_} pass)"
                      f"{escape(': ' + note) if note else ''}", soft_wrap=True)
        console.print(f"  source    {escape(_where(first.source))}", soft_wrap=True)
    console.print(f"  path      {escape(' > '.join(first.path))}", soft_wrap=True)
    mapped = any(p.startswith(("shard_map", "pmap")) for p in first.path)
    if first.device is not None and (result.processes or mapped or _a_part(first)):
        rows = ", ".join(f"{a}:{b}" for a, b in first.shard or ())
        shard = f", shard [{rows}]" if first.shard else ""
        console.print(f"  where     process {first.process}, device {first.device}{shard}")
    for row in result.processes:
        said = row.origin or ("no NaN/Inf" if not row.note else row.note)
        console.print(f"  process {row.index}: {escape(said)}", soft_wrap=True)
    if result.strategy:
        console.print(f"  found by  {result.strategy}")
    _render_values("inputs", first.inputs, console)
    for i, link in enumerate(result.chain):
        console.print(f"  chain {i + 1}: {link.kind} from [bold]{escape(str(link.primitive or link.argument))}[/] "
                      f"({link.pass_}) at {escape(_where(link.source))}", soft_wrap=True)
    if result.overflow is not None:
        cause = result.overflow
        console.print(f"  overflow  [bold]{cause.origin.primitive}[/] ({cause.origin.pass_}) at "
                      f"{escape(_where(cause.origin.source))}: beyond {cause.dtype}'s max {cause.max:.6g}",
                      soft_wrap=True)
    _render_growth(result.growth, console)
    if result.precision is not None:
        console.print(f"  precision ({result.precision.dtype}): {escape(result.precision.detail)}", soft_wrap=True)
    if result.grad_norms:
        shown = ", ".join(f"{g.name}={_num(g.norm)}" for g in result.grad_norms[:8])
        console.print(f"  gradient norms: {escape(shown)}", soft_wrap=True)
    render_advice(console, report, result.explanation, result.hints, result.notes,
                  [warning.line() for warning in result.warnings])


def _render_values(title: str, stats: tuple[ValueStats, ...], console: Console) -> None:
    if not stats:
        return
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for column in ("#", "shape", "dtype", "min", "max", "nan", "inf", "zero", "negative"):
        table.add_column(column, justify="right")
    for i, s in enumerate(stats):
        table.add_row(str(i), str(tuple(s.shape)), s.dtype, _num(s.min), _num(s.max), str(s.nan), str(s.inf),
                      str(s.zero), str(s.negative))
    console.print(table)


def _render_growth(growth: tuple, console: Console, title: str = "grew before the non-finite call") -> None:
    if not growth:
        return
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for column in ("output", "function", "from call", "growth", "source"):
        table.add_column(column)
    for g in growth[:10]:
        table.add_row(escape(g.name), escape(g.function), str(g.first_call), f"{g.ratio:.3g}x",
                      escape(_short_where(g.source)))
    console.print(table)
