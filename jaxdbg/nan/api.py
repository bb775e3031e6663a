"""``nan-hunt`` from the outside: options, and the contained run the command line uses.

This module imports neither jax nor the target: the work happens in a child process
(:func:`jaxdbg.nan.session.hunt_job`), so jaxdbg survives whatever the target does.

Example:
    >>> from jaxdbg.target import parse_target
    >>> run = hunt(parse_target("recipes/nan_forward/train.py"), HuntOptions())   # doctest: +SKIP
    >>> run.result.first.primitive, run.result.first.pass_                   # doctest: +SKIP
    ('log', 'forward')
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jaxdbg.launch import hang_named
from jaxdbg.nan.messages import HuntFinished, HuntJob, NonFiniteDetected, PeerNote
from jaxdbg.nan.result import AnalysisWarning, NanHuntResult, Origin
from jaxdbg.runner import run_contained, waited_to_join
from jaxdbg.target import TargetSpec, check_inputs


@dataclass(frozen=True)
class HuntRun:
    """A finished hunt: the result, the artifacts written, and the child's jax environment (or None)."""

    result: NanHuntResult
    artifacts: dict[str, str] = field(default_factory=dict)
    environment: dict | None = None

    @property
    def exit_code(self) -> int:
        return 1 if self.result.found else 0


@dataclass(frozen=True)
class HuntOptions:
    """The command's options (see ``jaxdbg nan-hunt --help``)."""

    nan_only: bool = False
    growth_factor: float = 100.0
    precision: bool = False
    grad: bool = False
    argnums: tuple[int, ...] = (0,)
    args: str | None = None
    inputs: str | None = None
    seed: int = 0
    out_dir: str | None = None
    timeout: float | None = None


# ---------------------------------------------------------------------------------------------------------
# Contained (the command line)
# ---------------------------------------------------------------------------------------------------------


def hunt(spec: TargetSpec, options: HuntOptions) -> HuntRun:
    """Run the target in a child process and return what it found.

    Raises :class:`UsageError` for bad input and :class:`TargetFailedError` when the target failed before
    any NaN/Inf was seen (raised, crashed, timed out).
    """
    check_inputs(spec, options.inputs, options.args)
    outcome = run_contained(HuntJob(spec, options), timeout=options.timeout, sigterm_as_timeout=True)
    got = outcome.last(HuntFinished)
    if got is not None:
        return HuntRun(got.result, got.artifacts, got.environment)
    # A job that ended on a hang: the process it hung on, as this process's heartbeat named it.
    hung = hang_named([note.text for note in outcome.all(PeerNote)], outcome.status)
    stopped = f"{outcome.describe()}: {hung}" if hung else outcome.describe()
    detected = outcome.last(NonFiniteDetected)
    if detected is not None:  # found, but the analysis itself did not finish (a jaxdbg bug, or --timeout)
        said = outcome.exception.traceback if outcome.status == "exception" and outcome.exception else ""
        return HuntRun(_degraded(detected, stopped, said))
    if outcome.status == "exception":  # the child catches the target's exceptions: this one is jaxdbg's
        raise outcome.failure(outcome.describe(), bug="nan-hunt failed in its child process")
    timed_out = outcome.status == "timeout" and not outcome.terminated
    what = f"ran past --timeout {options.timeout}s" if timed_out else outcome.describe()
    remedy = ("raise --timeout or shorten the run" if timed_out else "give it more time, or shorten the run"
              if outcome.terminated else "fix that failure first")
    if hung:
        what, remedy = f"{what} ({hung})", "see where that process stands"
    elif timed_out and waited_to_join(outcome.stderr):  # (describe() says it of a run SIGTERM ended)
        what, remedy = (f"{what} waiting in jax.distributed.initialize() for the job's other processes",
                        "one never started or cannot reach the coordinator: start every process of the job")
    raise outcome.failure(f"the target {what} before any NaN/Inf was seen; nothing to localise ({remedy})")


def _degraded(detected: NonFiniteDetected, why: str, traceback: str = "") -> NanHuntResult:
    """What the parent knows when the child found a NaN/Inf but sent no analysis: the call, and why."""
    first = Origin(detected.kind, None, "forward", detected.source, detected.function, detected.call_index,
                   (f"jit({detected.function})",))
    return NanHuntResult(True, first, explanation=(
        f"`{detected.function}` returned non-finite values in call {detected.call_index}, but the analysis "
        f"did not finish ({why})."), strategy=None, notes=(f"analysis stopped: {why}",),
        warnings=(AnalysisWarning("analysis", why, traceback),))


