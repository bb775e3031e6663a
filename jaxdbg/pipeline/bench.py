"""The pipeline-bench harness: every combination of options, paired by seed, measured and summarised.

For each schedule, variability and seed the durations are drawn once; the fixed order runs under each
communication model, and the readiness-first policy under each hint, memory cap and communication
model, all against those same durations (with ``lookahead``, ready leaves the schedule only for work that
fits). ``speedup_vs_fixed`` divides the fixed run's makespan (same schedule, communication, variability and
seed; the fixed order uses the memory its order implies) by the run's own. In real mode every run executes in
one contained child process with one JAX device per stage (or several, ``devices_per_stage``), and each is also
simulated from the same realised durations (the prediction) and from the durations the run measured (a replay)
to check the simulator.

Example:
    >>> result, runs = run_bench(BenchOptions(stages=4, microbatches=8, variabilities=("jitter:cv=0.3",)))
    >>> [(r.policy, r.speedup_vs_fixed > 0) for r in result.runs]
    [('fixed', True), ('ready', True)]
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np

from jaxdbg._errors import UsageError
from jaxdbg.pipeline.admission import ORDERS, Order, admission_order, microbatch_costs
from jaxdbg.pipeline.arbiter import RunRecord
from jaxdbg.pipeline.bounds import EXACT_NODES, EXACT_SECONDS, EXACT_TASKS, Bound, BoundMethod, memory_lower_bound
from jaxdbg.pipeline.messages import RealJob, RealRun, RealTimeline, StageDevices
from jaxdbg.pipeline.metrics import RunMetrics, lower_bound, measure
from jaxdbg.pipeline.planner import SAMPLES, Pick, choose
from jaxdbg.pipeline.policies import HINTS, POLICIES, Hint, PolicyName, make_policies, memory_caps
from jaxdbg.pipeline.real import ModelSpec
from jaxdbg.pipeline.schedules import Schedule, ScheduleName, build_schedule, shape_for, static_peak_inflight
from jaxdbg.pipeline.simulate import COMMS, Comm, simulate
from jaxdbg.pipeline.tasks import BACKWARD, FORWARD, WEIGHT, PipelineShape
from jaxdbg.pipeline.transport import AUTH
from jaxdbg.pipeline.variability import Costs, Durations, Variability, noise_samples, parse_variability, realise
from jaxdbg.protocol import Environment, handles

MODES = ("sim", "real")
C = TypeVar("C", bound=str)
HINT_CHOICES: tuple[Hint | Literal["auto"], ...] = (*HINTS, "auto")  # auto: the planner picks


@dataclass(frozen=True)
class BenchOptions:
    """What to run: each tuple is a set of alternatives, and every combination runs."""

    mode: str = "sim"
    stages: int = 4
    microbatches: int = 16
    virtual_stages: int | None = None  # None: 2 for the interleaved schedule, else 1
    schedules: tuple[str, ...] = ("1f1b",)
    policies: tuple[str, ...] = POLICIES
    hints: tuple[str, ...] = ("auto",)
    comms: tuple[str, ...] = ("async",)
    memory_caps: tuple[float, ...] = (1.0,)
    variabilities: tuple[str, ...] = ("none",)
    seeds: int = 1
    seed: int = 0
    costs: Costs = Costs()
    lookahead: bool = True  # ready leaves the schedule only for work that fits (see pipeline.lookahead)
    devices_per_stage: int = 1
    model: ModelSpec = ModelSpec()
    xprof_dir: str | None = None
    timeout: float | None = None
    transfer_bind: str = "127.0.0.1"  # real mode across processes: the interface jax.experimental.transfer binds
    admissions: tuple[str, ...] = ("data",)  # admission orders of the named hints (auto picks its own)
    exact_bound_s: float = EXACT_SECONDS  # time for the exact memory-aware bound on small pipelines (0: off)
    message_auth: str = "full"  # real mode across processes: what each message's HMAC covers (transport.AUTH)


@dataclass(frozen=True)
class RunGroup:
    """What a summary row aggregates over seeds: schedule, policy (with hint, admission order and cap), comm,
    variability."""

    schedule: ScheduleName
    policy: PolicyName
    hint: Hint | Literal["auto"] | None  # None for the fixed policy
    admission: Order | Literal["auto"]  # the order microbatches are admitted in; auto: the planner's pick
    comm: Comm
    memory_cap: float | None  # multiple of 1F1B's in-flight microbatches; None: fixed uses what its order holds
    variability: str


@dataclass(frozen=True)
class RunKey(RunGroup):
    seed: int

    def label(self) -> str:
        policy = (self.policy if self.hint is None
                  else f"ready/{self.hint}{_order(self.admission)} cap {self.memory_cap:g}x")
        return f"{self.schedule} {policy} {self.comm} {self.variability} seed {self.seed}"


def _order(admission: str) -> str:
    """How a policy's label names its admission order (nothing for the data order, or auto's own pick)."""
    return "" if admission in ("data", "auto") else f"+{admission}"


@dataclass(frozen=True)
class RunRow(RunMetrics, RunKey):
    """One row of the contract's ``runs``: its key, its metrics, and how it compares."""

    memory_cap_microbatches: list[int] | None
    lower_bound_s: float
    makespan_over_lower_bound: float
    memory_lower_bound_s: float  # a bound at this run's memory cap (pipeline.bounds)
    memory_bound_method: BoundMethod  # which argument gave it
    makespan_over_memory_bound: float
    speedup_vs_fixed: float
    picked_hint: Hint | Literal["fixed"] | None = None  # auto: the hint the planner picked
    picked_admission: Order | None = None  # auto: the admission order it picked
    pick_reason: str | None = None  # auto: why, from its dry runs on the expected durations
    sim_makespan_s: float | None = None  # real mode: the simulator's prediction from the same durations
    sim_error: float | None = None  # real mode: sim / real - 1
    replay_makespan_s: float | None = None  # real mode: simulated from the durations this run measured
    max_abs_grad_diff: float | None = None

    def key(self) -> RunKey:
        return RunKey(**_fields(self, RunKey))


@dataclass(frozen=True)
class SummaryRow(RunGroup):
    runs: int
    median_speedup_vs_fixed: float
    median_makespan_over_lower_bound: float
    median_makespan_over_memory_bound: float
    median_bubble_fraction: float
    median_decision_ns: float
    median_abs_sim_error: float | None = None
    picked: str | None = None  # auto: its picks over the seeds, e.g. "1f1b+grouped x4, bfw+grouped x1"


def _fields(value: Any, cls: type) -> dict[str, Any]:
    """The values of ``cls``'s fields on ``value`` (a dataclass instance of ``cls`` or of a subclass)."""
    return {f.name: getattr(value, f.name) for f in fields(cls)}


@dataclass(frozen=True)
class Correctness:
    reference: str
    max_abs_grad_diff: float
    max_abs_grad: float
    tolerance: float
    runs_checked: int
    ok: bool


@dataclass(frozen=True)
class BenchResult:
    """The contract's pipeline-bench ``result``."""

    config: dict
    runs: list[RunRow]
    summary: list[SummaryRow]
    correctness: Correctness | None = None
    devices: list[str] = field(default_factory=list)

    def essential_line(self) -> str | None:
        c = self.correctness
        if c is None or c.ok:
            return None
        return (f"pipelined gradients differ from the {c.reference} reference by {c.max_abs_grad_diff:.3g} "
                f"(tolerance {c.tolerance:.3g})")


@dataclass(frozen=True)
class _Job:
    """One run to execute: its key, its shape and schedule, its policy parameters and durations."""

    key: RunKey
    shape: PipelineShape
    schedule: Schedule
    durations: Durations
    costs: Costs = Costs()  # what ready expects tasks to take before it has measured them
    lookahead: bool = True
    hint: str | None = None  # the hint ready runs (auto: the planner's pick)
    order: tuple[int, ...] | None = None  # the admission order (None: the data order)
    pick: Pick | None = None  # auto: the planner's choice and its reasons

    def policies(self) -> list:
        key = self.key
        policy = "fixed" if self.hint == "fixed" else key.policy  # auto may pick the schedule as written
        return make_policies(
            policy, self.shape, self.schedule, self.hint, key.memory_cap or 1.0, self.costs, self.lookahead,
            known=self.durations.known(), order=self.order,
        )


def check_options(options: BenchOptions) -> dict[str, Variability]:
    """Check every option before any work (UsageError naming the option at fault)."""
    _one_of("--mode", (options.mode,), MODES)
    _one_of("--policy", options.policies, POLICIES)
    _one_of("--hint", options.hints, HINT_CHOICES)
    _one_of("--admit", options.admissions, ORDERS)
    _one_of("--message-auth", (options.message_auth,), AUTH)
    if options.exact_bound_s < 0:
        raise UsageError(f"--exact-bound {options.exact_bound_s:g}: give seconds, 0 or more (0: no exact bound)")
    _one_of("--comm", options.comms, COMMS)
    if options.seeds < 1:
        raise UsageError(f"--seeds {options.seeds}: run at least one seed")
    if options.devices_per_stage < 1:
        raise UsageError("--devices-per-stage must be at least 1")
    if options.xprof_dir and options.mode != "real":
        raise UsageError("--xprof captures real execution; add --mode real")
    if options.seed < 0:  # numpy's generators take no negative seed: a usage error, not an internal one
        raise UsageError(f"--seed {options.seed}: give a seed of 0 or more")
    for cap in options.memory_caps:
        if not 0 < cap < math.inf:  # nan and inf too: a cap of inf has no in-flight count to round
            raise UsageError(f"--memory-cap {cap:g}: use positive multiples of 1F1B's memory, e.g. 1,2,4")
    costs = options.costs
    # not `<= 0` alone: nan passes every comparison, and a nan or inf duration never ends the simulation
    if not (0 < costs.forward_s < math.inf and 0 < costs.backward_s < math.inf and 0 <= costs.comm_s < math.inf):
        raise UsageError("--task-ms must be a positive number and --comm-ms a number not negative")
    if options.virtual_stages not in (None, 1) and "interleaved" not in options.schedules:
        raise UsageError(f"--virtual-stages {options.virtual_stages} only applies to --schedule interleaved")
    model_stages = []
    for schedule in options.schedules:
        shape = shape_for(schedule, options.stages, options.microbatches, _virtual(options, schedule))
        model_stages.append(shape.model_stages)
    if not options.schedules:
        raise UsageError("--schedule: give at least one schedule")
    return {
        spec: parse_variability(spec, options.stages, min(model_stages))
        for spec in dict.fromkeys(options.variabilities)
    }


def _chosen(values: tuple[str, ...], allowed: tuple[C, ...]) -> tuple[C, ...]:
    """Option values (already checked by :func:`check_options`) typed as the closed set they come from."""
    return tuple(known for value in values for known in allowed if known == value)


def _one_of(option: str, values: tuple[str, ...], allowed: tuple[str, ...]) -> None:
    if not values:
        raise UsageError(f"{option}: give at least one of {', '.join(allowed)}")
    for value in values:
        if value not in allowed:
            raise UsageError(
                f"{option} '{value}': unknown; use one of {', '.join(allowed)} (comma-separated for several)")


def _virtual(options: BenchOptions, schedule: str) -> int:
    """Chunks per stage: ``virtual_stages`` (default 2) for the interleaved schedule, one for the others."""
    return (options.virtual_stages or 2) if schedule == "interleaved" else 1


def plan_jobs(options: BenchOptions) -> list[_Job]:
    """Every run, fixed baselines first in each group; durations drawn once per schedule/variability/seed."""
    variabilities = check_options(options)
    wanted_ready = "ready" in options.policies
    jobs = []
    for schedule_name in options.schedules:
        shape = shape_for(schedule_name, options.stages, options.microbatches, _virtual(options, schedule_name))
        schedule = build_schedule(schedule_name, shape)
        for spec, variability in variabilities.items():
            for seed in range(options.seed, options.seed + options.seeds):
                durations = realise(variability, shape, options.costs, seed)
                for comm in _chosen(options.comms, COMMS):
                    key = RunKey(schedule.name, "fixed", None, "data", comm, None, spec, seed)
                    jobs.append(_Job(key, shape, schedule, durations, options.costs, options.lookahead))
                if wanted_ready:
                    jobs += _ready_jobs(options, shape, schedule, durations, variability, seed)
    return jobs


def _ready_jobs(options: BenchOptions, shape: PipelineShape, schedule: Schedule, durations: Durations,
                variability: Variability, seed: int) -> list[_Job]:
    """The ready runs of one draw: each named hint in each admission order, and auto with the planner's pick
    (planned on the known durations and on other draws of the noise, never on this draw's)."""
    known, spec = durations.known(), variability.spec
    per_microbatch = microbatch_costs(shape, known)
    samples = noise_samples(variability, durations, options.costs, seed, SAMPLES) if "auto" in options.hints else []
    jobs = []
    for hint in _chosen(options.hints, HINT_CHOICES):
        admissions: tuple[Order | Literal["auto"], ...] = (
            ("auto",) if hint == "auto" else _chosen(options.admissions, ORDERS))
        for admission in admissions:
            for cap in options.memory_caps:
                for comm in _chosen(options.comms, COMMS):
                    key = RunKey(schedule.name, "ready", hint, admission, comm, cap, spec, seed)
                    if hint == "auto":
                        pick = choose(shape, schedule, cap, known, options.costs, comm, options.lookahead, samples)
                        jobs.append(_Job(key, shape, schedule, durations, options.costs, options.lookahead,
                                         pick.hint, pick.order, pick))
                    else:
                        order = admission_order(admission, per_microbatch)
                        jobs.append(_Job(key, shape, schedule, durations, options.costs, options.lookahead, hint,
                                         order))
    return jobs


def run_bench(
    options: BenchOptions, progress: Callable[[int, int, str], None] | None = None, out_dir: Path | None = None,
    on_run: Callable[[int, int, RunKey, RunRecord], None] | None = None, seen_environment: dict | None = None,
) -> tuple[BenchResult, dict[RunKey, RunRecord]]:
    """Run every combination; returns the result and each run's timeline (for traces and plots).

    ``on_run(done, total, key, record)`` hears of each finished run as it ends (real mode: as the child
    process reports it), e.g. for the live ``--metrics-port`` endpoint. Real mode fills
    ``seen_environment`` with the jax environment its runs saw (the process's place in a job).
    """
    jobs = plan_jobs(options)
    if options.mode == "sim":
        records = {}
        for i, job in enumerate(jobs):
            if progress:
                progress(i, len(jobs), job.key.label())
            records[job.key] = simulate(job.shape, job.policies(), job.durations, job.key.comm)
            if on_run:
                on_run(i + 1, len(jobs), job.key, records[job.key])
        real: dict[Any, RealTimeline] = {}
        devices: list[str] = []
        environment = None
        correctness: Correctness | None = None
    else:
        if progress:
            progress(0, len(jobs), f"{len(jobs)} real runs in a child process")
        records, real, devices, environment = _run_real(options, jobs, on_run)
        correctness = _correctness(real)
        if out_dir is not None:
            from jaxdbg.report import process_folder

            first = jobs[0]
            replay = replay_file(first.shape, real[first.key])
            folder = process_folder(out_dir, environment)  # a job's processes may share one --out
            folder.mkdir(exist_ok=True)
            (folder / "durations.json").write_text(json.dumps(replay) + "\n")
    rows = _rows(options, jobs, records, real)
    if "fixed" not in options.policies:
        rows = [r for r in rows if r.policy != "fixed"]
    if environment is not None and seen_environment is not None:
        seen_environment.update(environment)
    result = BenchResult(_config(options), rows, summarise(rows), correctness, devices)
    return result, records


def _config(options: BenchOptions) -> dict:
    config = {
        "stages": options.stages,
        "microbatches": options.microbatches,
        "mode": options.mode,
        "variability": ",".join(options.variabilities),
        "seed": options.seed,
        "seeds": options.seeds,
        "virtual_stages": {s: _virtual(options, s) for s in options.schedules},
        "schedules": list(options.schedules),
        "policies": list(options.policies),
        "hints": list(options.hints),
        "admissions": list(options.admissions),
        "comms": list(options.comms),
        "memory_caps": list(options.memory_caps),
        "costs": options.costs,
        "lookahead": options.lookahead,
    }
    if options.mode == "real":
        config.update(model=options.model, devices_per_stage=options.devices_per_stage,
                      message_auth=options.message_auth)
    return config


def _rows(options: BenchOptions, jobs: list[_Job], records: dict, real: dict) -> list[RunRow]:
    bounds: dict[int, float] = {}
    memory_bounds: dict[tuple, Bound] = {}
    fixed: dict[tuple, float] = {}
    metrics: dict[RunKey, RunMetrics] = {}
    for job in jobs:
        metrics[job.key] = measure(records[job.key])
        if job.key.policy == "fixed":
            k = job.key
            fixed[k.schedule, k.comm, k.variability, k.seed] = metrics[job.key].makespan_s
    rows = []
    for job in jobs:
        key, m = job.key, metrics[job.key]
        if id(job.durations) not in bounds:  # one bound per realised draw, shared by every policy run on it
            bounds[id(job.durations)] = lower_bound(job.durations)
        bound = bounds[id(job.durations)]
        caps = memory_caps(job.shape, key.memory_cap) if key.memory_cap is not None else None
        held = caps or static_peak_inflight(job.schedule)  # a fixed order holds what its order implies
        if (id(job.durations), tuple(held)) not in memory_bounds:
            memory_bounds[id(job.durations), tuple(held)] = _memory_bound(options, job, held, jobs, records)
        capped = memory_bounds[id(job.durations), tuple(held)]
        baseline = fixed[key.schedule, key.comm, key.variability, key.seed]
        extra: dict[str, Any] = {}
        if key in real:
            predicted = measure(simulate(job.shape, job.policies(), job.durations, key.comm)).makespan_s
            replayed = measure(simulate(job.shape, job.policies(), _measured(job, real[key]), key.comm)).makespan_s
            extra = {
                "sim_makespan_s": predicted, "sim_error": predicted / m.makespan_s - 1, "replay_makespan_s": replayed,
                "max_abs_grad_diff": real[key].grad_diff,
            }
        if job.pick is not None:
            extra.update(picked_hint=job.pick.hint, picked_admission=job.pick.admission, pick_reason=job.pick.why())
        rows.append(RunRow(
            **_fields(key, RunKey), **_fields(m, RunMetrics), memory_cap_microbatches=caps, lower_bound_s=bound,
            makespan_over_lower_bound=m.makespan_s / bound if bound > 0 else float("nan"),
            memory_lower_bound_s=capped.value, memory_bound_method=capped.method,
            makespan_over_memory_bound=m.makespan_s / capped.value if capped.value > 0 else float("nan"),
            speedup_vs_fixed=baseline / m.makespan_s if m.makespan_s > 0 else float("nan"), **extra,
        ))
    return rows


def _memory_bound(options: BenchOptions, job: _Job, caps: list[int], jobs: list[_Job], records: dict) -> Bound:
    """The memory-aware bound of a draw at ``caps``; in simulation the runs on that draw that held no more than
    ``caps`` give the exact program its upper bound (real runs did not keep to the drawn durations)."""
    within = [records[other.key] for other in jobs if other.durations is job.durations
              and all(held <= cap for held, cap in zip(records[other.key].peak_inflight, caps))]
    upper = min((float(r.end.max() - r.start.min()) for r in within), default=None) if options.mode == "sim" else None
    exact = EXACT_TASKS if options.exact_bound_s > 0 else 0
    # real mode: each process of a job computes the rows itself, so the bound must not depend on its load
    nodes = EXACT_NODES if options.mode == "real" else None
    return memory_lower_bound(job.durations, caps, exact_tasks=exact, time_limit=options.exact_bound_s, upper=upper,
                              node_limit=nodes)


def summarise(rows: list[RunRow]) -> list[SummaryRow]:
    """Medians over seeds for each (schedule, policy, hint, comm, memory cap, variability)."""
    groups: dict[RunGroup, list[RunRow]] = {}
    for row in rows:
        groups.setdefault(RunGroup(**_fields(row, RunGroup)), []).append(row)
    summary = []
    for group, members in groups.items():
        errors = [abs(r.sim_error) for r in members if r.sim_error is not None]
        picks = Counter(f"{r.picked_hint}{_order(r.picked_admission or 'data')}" for r in members if r.picked_hint)
        summary.append(SummaryRow(
            **_fields(group, RunGroup), runs=len(members),
            median_speedup_vs_fixed=statistics.median(r.speedup_vs_fixed for r in members),
            median_makespan_over_lower_bound=statistics.median(r.makespan_over_lower_bound for r in members),
            median_makespan_over_memory_bound=statistics.median(r.makespan_over_memory_bound for r in members),
            median_bubble_fraction=statistics.median(r.bubble_fraction for r in members),
            median_decision_ns=statistics.median(r.decision_ns_mean for r in members),
            median_abs_sim_error=statistics.median(errors) if errors else None,
            picked=", ".join(f"{name} x{count}" for name, count in picks.most_common()) or None,
        ))
    return summary


# --- real mode ------------------------------------------------------------------------------------


def _run_real(options: BenchOptions, jobs: list[_Job], on_run: Callable[[int, int, RunKey, RunRecord], None] | None,
              ) -> tuple[dict, dict, list[str], dict | None]:
    from jaxdbg.runner import run_contained

    shapes = {job.key: job.shape for job in jobs}
    done: list[RunKey] = []

    def heard(message: Any) -> None:  # each run as the child finishes it: live figures (--metrics-port)
        if on_run is not None and isinstance(message, RealTimeline) and message.key in shapes:
            done.append(message.key)
            on_run(len(done), len(jobs), message.key, _record(shapes[message.key], message))

    payload = RealJob(options.model, options.devices_per_stage, options.xprof_dir, options.costs, options.lookahead,
                      tuple(RealRun(job.key, job.shape, job.schedule.name, job.durations, job.hint, job.order)
                            for job in jobs),
                      options.transfer_bind, options.timeout, options.message_auth)
    devices = options.stages * options.devices_per_stage
    outcome = run_contained(payload, timeout=options.timeout, device_count=devices,
                            on_message=heard if on_run is not None else None, sigterm_as_timeout=True)
    if not outcome.ok:
        raise outcome.failure(
            f"the real pipeline run {outcome.describe()}; try fewer stages or microbatches, or a longer --timeout")
    results = {timeline.key: timeline for timeline in outcome.all(RealTimeline)}
    records = {key: _record(job.shape, results[key]) for job in jobs for key in [job.key]}
    stages = outcome.last(StageDevices)
    environment = outcome.last(Environment)
    return records, results, list(stages.devices) if stages else [], environment.info if environment else None


def _record(shape: PipelineShape, value: RealTimeline) -> RunRecord:
    return RunRecord(
        shape, np.asarray(value.start), np.asarray(value.end), tuple(value.blocked),
        tuple(value.memory_wait), tuple(value.peak), value.decisions, value.decision_ns,
    )


def _measured(job: _Job, value: RealTimeline) -> Durations:
    """The durations a real run measured (its tasks' times and its messages' delays) for a replay."""
    return replace(job.durations, task=np.asarray(value.measured), comm=np.asarray(value.message_delay))


def _correctness(real: dict[Any, RealTimeline]) -> Correctness:
    diff = max(v.grad_diff for v in real.values())
    biggest = max(v.grad_max for v in real.values())
    tolerance = 1e-6 + 1e-4 * biggest  # float32 sums over microbatches in a different order
    return Correctness("single-device", diff, biggest, tolerance, len(real), diff <= tolerance)


def replay_file(shape: PipelineShape, value: RealTimeline) -> dict:
    """A ``replay:`` durations file from what a real run measured (rows: model stages)."""
    measured = np.asarray(value.measured).reshape(shape.kinds, shape.model_stages, shape.microbatches)
    delay = np.asarray(value.message_delay).reshape(shape.kinds, shape.model_stages, shape.microbatches)
    backward = measured[BACKWARD] + (measured[WEIGHT] if shape.split else 0.0)
    data = {
        "source": "jaxdbg pipeline-bench --mode real (seconds per model stage and microbatch)",
        "forward": measured[FORWARD].tolist(),
        "backward": backward.tolist(),
        "comm": delay[:2].tolist(),
    }
    if shape.split:
        data.update(input_grad=measured[BACKWARD].tolist(), weight_grad=measured[WEIGHT].tolist())
    return data


@handles(RealJob)
def real_job(payload: RealJob, channel: Any) -> None:
    """Child side of real mode: build each shape's pipeline once, run every job, send back timelines. A
    process launched as one of several joins the job first and runs its own stages (pipeline.transport)."""

    from jaxdbg.pipeline.transport import join_job

    wait = payload.timeout or 300.0
    transport = join_job(payload.transfer_bind, wait, payload.message_auth)  # before anything starts jax's backend

    from jaxdbg.report import environment_info

    channel.send(Environment(environment_info()))
    try:
        _real_runs(payload, channel, transport, wait)  # (the child leaves the job on its way out: jaxdbg._child)
    except BaseException as err:
        transport.abort(f"{type(err).__name__}: {err}".splitlines()[0])  # the other processes stop, not wait
        raise


def _real_runs(payload: RealJob, channel, transport, wait: float) -> None:
    import contextlib

    import jax

    from jaxdbg import multihost
    from jaxdbg.pipeline.real import RealPipeline

    pipelines: dict[PipelineShape, RealPipeline] = {}
    folder = payload.xprof_dir and multihost.process_folder(payload.xprof_dir)
    capture = jax.profiler.trace(folder) if folder else contextlib.nullcontext()
    with capture:
        for planned in payload.jobs:
            key, shape, durations = planned.key, planned.shape, planned.durations
            if shape not in pipelines:
                pipelines[shape] = RealPipeline(shape, payload.model, payload.devices_per_stage, transport=transport)
                channel.send(StageDevices(tuple(str(d) for d in pipelines[shape].devices)))
            pipe = pipelines[shape]
            job = _Job(key, shape, build_schedule(planned.schedule, shape), durations, payload.costs, payload.lookahead,
                       planned.hint, planned.order)
            annotate = key.label() if payload.xprof_dir else None
            run = pipe.run(job.policies(), durations, key.comm, annotate=annotate, timeout=wait)
            record = run.record
            channel.send(RealTimeline(
                key, record.start, record.end, tuple(record.blocked_s), tuple(record.memory_wait_s),
                tuple(record.peak_inflight), record.decisions, record.decision_ns, run.max_abs_grad_diff,
                run.max_abs_grad, run.measured, run.message_delay))
