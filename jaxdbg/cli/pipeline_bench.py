"""``jaxdbg pipeline-bench``: readiness-first pipeline execution against fixed schedules, profiled."""

from __future__ import annotations

from pathlib import Path

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from jaxdbg._errors import EXIT_FOUND, EXIT_OK, UsageError
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
from jaxdbg.report import Report, process_folder, relative_or_absolute

RUNS_SHOWN = 16  # beyond this many runs, only the summary is printed (the JSON holds every run)


def register(app: typer.Typer) -> None:
    app.command("pipeline-bench")(pipeline_bench)


def pipeline_bench(
    mode: str = typer.Option("sim", "--mode", help="real: threads and JAX devices; sim: discrete-event simulation."),
    stages: int = typer.Option(4, "--stages", min=1, help="Pipeline stages (one device or device group each)."),
    microbatches: int = typer.Option(16, "--microbatches", min=1, help="Microbatches per step."),
    virtual_stages: int | None = typer.Option(
        None, "--virtual-stages", min=1, help="Chunks per stage for the interleaved schedule (default 2)."),
    schedule: str = typer.Option(
        "1f1b", "--schedule", help="gpipe, 1f1b, interleaved, zb-h1 (comma-separated for several)."),
    policy: str = typer.Option("fixed,ready", "--policy", help="fixed (strict order) and/or ready (readiness-first)."),
    hint: str = typer.Option(
        "auto", "--hint",
        help="Ranking for ready: 1f1b, bf, bfw, gpipe, or auto (picks hint and admission order by dry runs on the "
        "expected durations); comma-separated."),
    admit: str = typer.Option(
        "data", "--admit",
        help="Admission orders of the named hints: data, grouped (by expected cost, light first and last), "
        "light-first, heavy-first (comma-separated)."),
    comm: str = typer.Option("async", "--comm", help="async (buffered messages) and/or sync (paired blocking sends)."),
    memory_cap: str = typer.Option(
        "1", "--memory-cap", help="Ready's per-stage cap, multiples of 1F1B's in-flight microbatches, e.g. 1,2,4."),
    variability: str = typer.Option(
        "none", "--variability", metavar="SPEC",
        help="none; jitter:cv=0.3 (lognormal factor per task); straggler:stage=2,factor=2,prob=0.1; "
        "multimodal:heavy=0.3,factor=3[,encoder=K,rest=2,light=1,length=0,partition=balanced|layers] (each "
        "microbatch is heavy, e.g. image+text, with probability heavy: it costs factor x on the first K model "
        "stages, the encoder, default a quarter, and rest x elsewhere; the others cost light x on the encoder "
        "stages; length: CV of a per-microbatch sequence-length factor on every stage; partition=balanced scales "
        "each stage to the same expected load); comm:cv=0.5; replay:FILE; seqlen:mean=1024,cv=0.5[,min,max,"
        "batch=1,attention=0.2] or seqlen:file=LENGTHS (sequence lengths per microbatch, attention quadratic); "
        "hetero:encoder=K,factor=1.5 or hetero:costs=A/B/... (stage costs); link:stage=S,factor=10[,cv] (a slow "
        "link). '+' combines.",
    ),
    seeds: int = typer.Option(
        1, "--seeds", min=1, help="Seeds per combination (paired: every policy meets the same draws)."),
    seed: int = typer.Option(0, "--seed", help="First seed."),
    task_ms: float = typer.Option(4.0, "--task-ms", help="Base forward time of a stage in ms (backward: twice that)."),
    comm_ms: float = typer.Option(0.2, "--comm-ms", help="Base delay of a message between stages in ms."),
    lookahead: bool = typer.Option(
        True, "--lookahead/--no-lookahead",
        help="ready: start work ranked below the schedule's next task only if it should be done before that task can "
        "start (--no-lookahead: whenever it is ready)."),
    devices_per_stage: int = typer.Option(
        1, "--devices-per-stage", min=1, help="Real mode: devices per stage (weights sharded across them)."),
    trace: str | None = typer.Option(
        None, "--trace", metavar="OUT.json",
        help="Write a Chrome/Perfetto trace: one process per run, one track per stage."),
    plot: str | None = typer.Option(
        None, "--plot", metavar="OUT.png", help="Write a timeline PNG and OUT-memory.png (speedup vs memory cap)."),
    xprof: bool = typer.Option(
        False, "--xprof", help="Real mode: capture a jax.profiler trace with one annotation per task."),
    transfer_bind: str = typer.Option(
        "127.0.0.1", "--transfer-bind", metavar="ADDRESS",
        help="Real mode across processes: the interface the jax.experimental.transfer server binds (the one port "
        "jaxdbg opens); give this host's address for a job across hosts."),
    exact_bound: float = typer.Option(
        1.0, "--exact-bound", metavar="SECONDS", min=0.0,
        help="Time HiGHS may take for the exact memory-aware lower bound on pipelines of at most 32 tasks (0: off)."),
    message_auth: str = typer.Option(
        "full", "--message-auth",
        help="Real mode across processes: full (HMAC over each note and a digest of its array's bytes), notes "
        "(the note and the array's shape and dtype), off."),
    csv: str | None = typer.Option(
        None, "--csv", metavar="DIR", help="Write runs.csv (one row per run) and stages.csv (per run and stage)."),
    metrics_port: int | None = typer.Option(
        None, "--metrics-port", metavar="N", min=0, max=65535,
        help="While the bench runs, serve stage occupancy and progress at http://127.0.0.1:N/metrics."),
    json: JsonOpt = None, out: OutOpt = None, timeout: TimeoutOpt = None, quiet: QuietOpt = False,
    verbose: VerboseOpt = False, metrics: MetricsOpt = None, metrics_push: MetricsPushOpt = None,
) -> int:
    """Run pipeline schedules in fixed order and readiness-first, and show where every stage's time went."""
    common = Common("pipeline-bench", json, out, timeout, quiet, verbose, metrics=metrics, metrics_push=metrics_push)

    def build(c: Common) -> Report:
        from jaxdbg.pipeline.bench import BenchOptions
        from jaxdbg.pipeline.variability import Costs, split_specs

        options = BenchOptions(
            mode=mode, stages=stages, microbatches=microbatches, virtual_stages=virtual_stages,
            schedules=_names(schedule), policies=_names(policy), hints=_names(hint), admissions=_names(admit),
            comms=_names(comm), exact_bound_s=exact_bound, message_auth=message_auth.strip().lower(),
            memory_caps=_caps(memory_cap), variabilities=tuple(split_specs(variability)) or ("none",),
            seeds=seeds, seed=seed,
            costs=Costs(forward_s=task_ms / 1e3, backward_s=2 * task_ms / 1e3, comm_s=comm_ms / 1e3),
            lookahead=lookahead, devices_per_stage=devices_per_stage, timeout=timeout, transfer_bind=transfer_bind,
        )
        return _build(c, options, trace, plot, xprof, csv, metrics_port)

    return execute(common, build, render)


def _names(text: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(p.strip().lower() for p in text.split(",") if p.strip()))


def _caps(text: str) -> tuple[float, ...]:
    caps = []
    for piece in _names(text):
        try:
            caps.append(float(piece.rstrip("x")))
        except ValueError:
            raise UsageError(
                f"--memory-cap '{piece}' is not a number; use multiples of 1F1B's memory, e.g. 1,2,4") from None
    return tuple(caps)


def _writable(option: str, path: str | None) -> None:
    if path and not Path(path).resolve().parent.is_dir():
        raise UsageError(
            f"{option} '{path}': folder '{Path(path).parent}' does not exist; create it or pick another path")


def _build(common: Common, options, trace: str | None, plot: str | None, xprof: bool, csv: str | None,
           metrics_port: int | None) -> Report:
    import contextlib
    from dataclasses import replace

    from jaxdbg.pipeline.bench import check_options, run_bench

    _writable("--trace", trace)
    _writable("--plot", plot)
    _writable("--csv", csv)
    if csv and Path(csv).exists() and not Path(csv).is_dir():
        raise UsageError(f"--csv '{csv}' is a file; give a folder for runs.csv and stages.csv")
    if xprof and options.mode != "real":
        raise UsageError("--xprof captures real execution; add --mode real")
    check_options(options)
    out_dir = common.out_dir()
    artifacts: dict[str, str] = {}
    if xprof:
        options = replace(options, xprof_dir=str(out_dir / "xprof"))
        artifacts["xprof"] = options.xprof_dir
    environment: dict = {}
    live = None
    endpoint: contextlib.AbstractContextManager = contextlib.nullcontext()
    if metrics_port is not None:
        from jaxdbg.metrics.live import LiveBench, serve

        live = LiveBench()
        endpoint = serve(live, metrics_port)
    with endpoint as url, common.progress() as bar:
        if url:
            common.console.print(f"[dim]metrics:[/] {url}")
        task = bar.add_task("pipeline-bench", total=None, status="")
        result, records = run_bench(
            options, progress=lambda i, n, label: bar.update(task, completed=i, total=n, status=label), out_dir=out_dir,
            on_run=live.update if live else None, seen_environment=environment,
        )
    if options.mode == "real":
        artifacts["durations"] = str(process_folder(out_dir, environment) / "durations.json")
        if environment.get("process_count", 1) > 1:
            if xprof:
                artifacts["xprof"] = str(process_folder(Path(artifacts["xprof"]), environment))
            if environment.get("process_index") != 0:  # every process holds the job's runs: one writes the files
                trace = plot = csv = None
    labels = {_label(row): row.key() for row in result.runs}
    if trace:
        from jaxdbg.pipeline.output import write_trace

        write_trace(trace, {label: records[key] for label, key in labels.items()})
        artifacts["trace"] = trace
    if plot:
        artifacts.update(_plots(plot, result, records))
    if csv:
        from jaxdbg.pipeline.tables import write_tables

        artifacts.update(write_tables(csv, result.runs))
    code = EXIT_FOUND if result.correctness is not None and not result.correctness.ok else EXIT_OK
    return Report("pipeline-bench", None, result, code, artifacts, environment or None)


def _label(row) -> str:
    return f"{row.schedule} {_policy(row)} {row.comm} | {row.variability} | seed {row.seed}"


def _plots(plot: str, result, records) -> dict[str, str]:
    """The timeline of the first group's fixed run beside its best ready run, and speedup vs memory cap."""
    from jaxdbg.pipeline.output import plot_memory, plot_timeline

    first = result.runs[0]
    group = [row for row in result.runs
             if (row.schedule, row.comm, row.variability, row.seed)
             == (first.schedule, first.comm, first.variability, first.seed)]
    chosen = [row for row in group if row.policy == "fixed"][:1]
    ready = [row for row in group if row.policy == "ready"]
    if ready:
        chosen.append(max(ready, key=lambda row: row.speedup_vs_fixed))
    plot_timeline(plot, {_label(row): records[row.key()] for row in chosen})
    series: dict[str, list[tuple[float, float]]] = {}
    for s in result.summary:
        if s.policy == "ready":
            series.setdefault(f"{s.schedule} {s.hint} {s.comm} | {s.variability}", []).append(
                (s.memory_cap, s.median_speedup_vs_fixed))
    artifacts = {"plot": plot}
    if series:
        path = Path(plot)
        memory_path = str(path.with_name(f"{path.stem}-memory{path.suffix or '.png'}"))
        plot_memory(memory_path, series)
        artifacts["plot_memory"] = memory_path
    return artifacts


def render(report: Report, console: Console) -> None:
    result = report.result
    config = result.config
    seeds = (f"seed {config['seed']}" if config["seeds"] == 1
             else f"seeds {config['seed']}..{config['seed'] + config['seeds'] - 1}")
    console.print(
        f"[bold]jaxdbg pipeline-bench[/] {config['mode']}: {config['stages']} stages x {config['microbatches']} "
        f"microbatches, {seeds}" + (f", {len(result.devices)} devices" if result.devices else "")
    )
    show_runs = len(result.runs) <= RUNS_SHOWN
    for variability in dict.fromkeys(s.variability for s in result.summary):
        console.print(_summary_table(result, variability))
        if show_runs:
            console.print(_runs_table(result, variability))
    if show_runs:
        for table in _stage_tables(result):
            console.print(table)
    for line in _pick_reasons(result):
        console.print(line)
    console.print(
        "[dim]speedup: fixed order's makespan / this run's (same schedule, comm, seed); /LB: makespan over the "
        "lower bound for any memory; /LBmem: over the lower bound at the run's memory cap (the fixed order's: what "
        "it holds); ns/pick: mean cost of one arbitration decision[/]"
    )
    if result.correctness is not None:
        c = result.correctness
        style, word = ("green", "match") if c.ok else ("bold red", "DIFFER from")
        console.print(
            f"[{style}]gradients {word} the single-device reference[/]: max |diff| {c.max_abs_grad_diff:.2e} "
            f"(tolerance {c.tolerance:.1e}, {c.runs_checked} runs)"
        )
    for name, path in report.artifacts.items():
        console.print(f"[dim]{name}:[/] {relative_or_absolute(path)}")


def _pick_reasons(result) -> list[str]:
    """Why auto picked what it did: one line per schedule, cap, comm and variability (its first seed's run)."""
    lines, seen = [], set()
    for row in result.runs:
        group = (row.schedule, row.memory_cap, row.comm, row.variability)
        if row.hint == "auto" and row.pick_reason and group not in seen:
            seen.add(group)
            lines.append(f"[dim]auto, {row.schedule} {row.memory_cap:g}x {row.comm} | {row.variability} | seed "
                         f"{row.seed}:[/] {row.pick_reason}")
    return lines


def _policy(row) -> str:
    """``fixed``, ``ready/bfw+grouped 2x``, ``ready/auto 1x`` (auto's pick is in the lines below the tables)."""
    return "fixed" if row.hint is None else f"ready/{row.hint}{_order(row.admission)} {row.memory_cap:g}x"


def _order(admission: str | None) -> str:
    return "" if admission in (None, "data", "auto") else f"+{admission}"


def _table(title: str, columns: tuple[str, ...], text_columns: int = 3) -> Table:
    """A borderless table (fits 80 columns): the first ``text_columns`` left-aligned and never wrapped."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i < text_columns else "right", no_wrap=i < text_columns)
    return table


def _summary_table(result, variability: str) -> Table:
    real = result.config["mode"] == "real"
    columns = (("schedule", "policy", "comm", "speedup", "/LB", "/LBmem", "bubble", "ns/pick")
               + (("sim err",) if real else ()))
    seeds = result.config["seeds"]
    table = _table(
        f"summary ({'median of ' + str(seeds) + ' seeds' if seeds > 1 else 'one seed'}) | {variability}", columns)
    for s in result.summary:
        if s.variability != variability:
            continue
        cells = [
            s.schedule, _policy(s), s.comm, f"{s.median_speedup_vs_fixed:.3f}x",
            f"{s.median_makespan_over_lower_bound:.3f}", f"{s.median_makespan_over_memory_bound:.3f}",
            f"{s.median_bubble_fraction:.1%}",
            f"{s.median_decision_ns:.0f}",
        ]
        if real:
            cells.append("" if s.median_abs_sim_error is None else f"{s.median_abs_sim_error:.1%}")
        table.add_row(*cells)
    return table


def _runs_table(result, variability: str) -> Table:
    real = result.config["mode"] == "real"
    columns = (("schedule", "policy", "comm", "seed", "ms", "speedup") + (("sim ms",) if real else ())
               + ("peak in flight",))
    table = _table(f"runs | {variability}", columns)
    for row in result.runs:
        if row.variability != variability:
            continue
        cells = [
            row.schedule, _policy(row), row.comm, str(row.seed), f"{row.makespan_s * 1e3:.1f}",
            f"{row.speedup_vs_fixed:.3f}x",
        ]
        if real:
            cells.append(f"{row.sim_makespan_s * 1e3:.1f}")
        table.add_row(*cells, " ".join(map(str, row.peak_inflight)))
    return table


def _stage_tables(result) -> list[Table]:
    """Where each stage's time went (ms), for the first fixed run and the best ready run."""
    fixed = [r for r in result.runs if r.policy == "fixed"][:1]
    ready = [r for r in result.runs if r.policy == "ready"]
    tables = []
    for row in fixed + ([max(ready, key=lambda r: r.speedup_vs_fixed)] if ready else []):
        columns = ("stage", "busy", "wait", "mem-cap wait", "blocked send", "fill/drain idle", "peak")
        table = _table(f"where the time went (ms): {_label(row)}", columns, text_columns=0)
        for w, busy in enumerate(row.stage_busy):
            table.add_row(
                str(w), f"{busy * 1e3:.1f}", f"{row.stage_wait[w] * 1e3:.1f}", f"{row.stage_memory_wait[w] * 1e3:.1f}",
                f"{row.stage_blocked[w] * 1e3:.1f}", f"{row.stage_idle[w] * 1e3:.1f}", str(row.peak_inflight[w]),
            )
        tables.append(table)
    return tables
