"""``jaxdbg repro``: minimise a failing JAX program into a standalone reproducer that fails the same way.

The steps, each bounded by ``--max-time`` (the smallest reproducer so far is kept and verified on time-out):

1. Detect: run the target contained ``runs`` times (in parallel) under the jit watch; collect every failure
   (exception, crash, timeout, NaN/Inf from a jitted call, jit vs op-by-op mismatch); keep the one
   ``--kind``/``--match`` name, or the first by priority. Runs that disagree make the failure *flaky*.
2. Reduce. A NaN/Inf or a mismatch lives in a jitted computation: capture its jaxpr and inputs, cut it down
   (:mod:`jaxdbg.repro.cut`; a failure born in a loop body: that body once, at its first failing iteration,
   :mod:`jaxdbg.repro.loops`) and emit plain jax/lax code. An exception raised by one JAX operation's rules
   (a shape or dtype error while tracing or lowering) is cut to that operation alone, on arrays of the
   recorded shapes and dtypes (:mod:`jaxdbg.repro.operation`). Otherwise (any other exception, crash,
   hang), shrink the script's source (:mod:`jaxdbg.repro.source`), each candidate checked in a contained run.
   After a cut, the source is still reduced for a short while into ``repro_source.py``: the user's program,
   at the user's level, failing at the user's line.
3. Verify each written file alone: copied into an empty folder and run there in a fresh process, as
   ``python repro.py`` would run on another machine (a file that needs the user's other modules or data is
   not a reproducer). If it does not fail the same way, fall back to the previous (larger) candidate.

Example:
    >>> result, artifacts = reproduce(parse_target("bug.py"), ReproOptions(max_time=60), "out")  # doctest: +SKIP
    >>> result.verified, result.minimized.lines                                                   # doctest: +SKIP
    (True, 6)
"""

from __future__ import annotations

import ast
import contextlib
import itertools
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from jaxdbg._errors import TargetFailedError, UsageError
from jaxdbg._source import SourceLocation
from jaxdbg.launch import launched_place
from jaxdbg.repro.failures import STILL_FAILS_WITHOUT_JIT, Checker, Failure, choose, observe, preloadable
from jaxdbg.repro.job import run_in_job
from jaxdbg.repro.jobs import CHILD_ENV, CutRequest, RunRequest, reduction_env
from jaxdbg.repro.messages import CutFinished, LoweredText
from jaxdbg.repro.program import INPUTS_FILE, REPRO_FILE, STABLEHLO_FILE, count_lines
from jaxdbg.repro.result import ReproResult, Size
from jaxdbg.repro.signature import KINDS, Criterion, FailureSignature
from jaxdbg.repro.source import SourceReducer, State, parse, statement_lines
from jaxdbg.repro.source_check import with_checks
from jaxdbg.repro.standard import beyond_jax
from jaxdbg.repro.subject import Subject, prepare_subject
from jaxdbg.repro.watch import WatchConfig
from jaxdbg.runner import Outcome, run_contained
from jaxdbg.target import TargetSpec, check_target

DEFAULT_TIMEOUT = 60.0  # a run that takes longer counts as a hang unless --timeout says otherwise
Progress = Callable[[str, int, str], None]  # (phase, checks so far, current size)


@dataclass(frozen=True)
class ReproOptions:
    kind: str | None = None
    match: str | None = None
    max_time: float = 600.0
    jobs: int = 2
    timeout: float | None = None
    inputs: str | None = None
    args: str | None = None
    seed: int = 0
    runs: int = 2
    reference: str = "eager"
    rtol: float = 1e-3
    atol: float = 1e-5
    source_time: float | None = None  # seconds for repro_source.py after a cut; None: SOURCE_FILE_SECONDS; 0: none


class _Clock:
    def __init__(self, max_time: float):
        self.started = time.perf_counter()
        self.deadline = self.started + max_time

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.started


def reproduce(spec: TargetSpec, options: ReproOptions, out_dir: str, on_progress: Progress | None = None
              ) -> tuple[ReproResult, dict[str, str]]:
    """Detect, reduce and verify; writes ``repro.py`` (and friends) into ``out_dir``. Returns (result, artifacts)."""
    if options.kind is not None and options.kind not in KINDS:
        raise UsageError(f"--kind '{options.kind}': use one of {', '.join(KINDS)}")
    check_target(spec)  # a syntax error or a missing function is bad input (exit 2), not a failure to keep
    progress = on_progress or (lambda phase, checks, size: None)
    out_dir = os.path.abspath(out_dir)  # runs happen in a scratch folder: a relative --out would not be found
    os.makedirs(out_dir, exist_ok=True)
    clock = _Clock(options.max_time)
    work = tempfile.mkdtemp(prefix="jaxdbg-repro-")
    try:
        subject = prepare_subject(spec, options.inputs, options.args, options.seed, work, options.timeout)
        result, artifacts = _Reproduction(spec, subject, options, out_dir, work, clock, progress,
                                          launched_place(os.environ)).run()
        # The report outlives the work folder: its place is said in the user's files, not in a copy there.
        place = subject.in_users_files(result.signature.location)
        return replace(result, signature=replace(result.signature, location=place)), artifacts
    finally:
        shutil.rmtree(work, ignore_errors=True)


EMITTED_FRAME_LINES = 15
EXACT_PRECISION = "--xla_allow_excess_precision=false"  # XLA rounds every bf16/f16 intermediate, as op by op
SOURCE_FILE = "repro_source.py"  # the source-level reduction written next to a cut computation
# Seconds the source-level reduction gets after a verified cut: as long as finding the cut took, within these
# bounds. The cut is the answer, this file a companion that shows the user's own code; the bound keeps a
# framework program within about two minutes at the defaults.
SOURCE_FILE_SECONDS = (15.0, 45.0)
MIRROR_COPY_BYTES = 1 << 20  # files up to this size are copied into the scratch folder, larger ones linked
MIRROR_MAX_ENTRIES = 5000


def scratch_folder(folder: str, out_dir: str) -> str | None:
    """A working folder for the many runs of a reduction, mirroring the user's: what the target writes there
    (logs it appends to, checkpoints) lands in the scratch copy, not in the user's folder dozens of times.

    Small files are copied (so appending to them stays here); folders and large files are linked, so reads
    work as before (writes inside a linked folder still reach it). None (run in place) for a huge folder.
    """
    here = os.getcwd()
    try:
        entries = list(itertools.islice(os.scandir(here), MIRROR_MAX_ENTRIES + 1))
    except OSError:
        return None
    if len(entries) > MIRROR_MAX_ENTRIES:
        return None
    os.makedirs(folder, exist_ok=True)
    out = os.path.realpath(out_dir)
    for entry in entries:
        target = os.path.join(folder, entry.name)
        try:
            if os.path.realpath(entry.path) == out:
                continue
            if entry.is_file(follow_symlinks=True) and entry.stat().st_size <= MIRROR_COPY_BYTES:
                shutil.copy2(entry.path, target)
            else:
                os.symlink(entry.path, target)
        except OSError:
            continue
    return folder


class _Reproduction:
    """One `jaxdbg repro` run (state shared by the steps)."""

    def __init__(self, spec: TargetSpec, subject: Subject, options: ReproOptions, out_dir: str, work: str,
                 clock: _Clock, progress: Progress, place: tuple[int, int] | None = None):
        self.spec, self.subject, self.options = spec, subject, options
        self.place = place  # (index, count) in a multi-process job: every run is one run of the job (repro.job)
        self.out_dir, self.work, self.clock, self.progress = out_dir, work, clock, progress
        self.checks = 0
        self.notes: list[str] = []
        self.detect_timeout = options.timeout or DEFAULT_TIMEOUT
        self.env = reduction_env(os.path.join(work, "jax-cache"))
        self.cwd = scratch_folder(os.path.join(work, "cwd"), out_dir)
        self.verify_reserve = 5.0
        self.program_lines: int | None = None  # lines of the reduced source written, jaxdbg's check left out

    # 1. Detect ----------------------------------------------------------------------------------------------

    def run(self) -> tuple[ReproResult, dict[str, str]]:
        if self.place is not None:
            return run_in_job(self)
        target, flaky, runs, outcomes = self.detect()
        check_timeout = self.check_timeout(target, outcomes)
        kind = target.signature.kind
        done = None
        if kind == "nonfinite" or (kind == "mismatch" and self.options.reference == "eager"):
            done = self.cut(target, flaky, runs)  # (a float64 reference has no faithful replay per equation)
        elif kind == "exception" and (target.raised_in_jax or _matching_cut(outcomes, target.signature)):
            done = self.cut_operation(target, flaky, runs, outcomes)  # (a host callback's is not raised in jax)
        if done is not None:
            return self.with_source_file(done, target, flaky, runs, check_timeout)
        jit_sensitive = self.jit_sensitive(target, check_timeout)
        return self.reduce_source(target, flaky, runs, check_timeout, jit_sensitive)

    def jit_sensitive(self, target: Failure, check_timeout: float) -> bool:
        """Does the exception go away with JAX_DISABLE_JIT=1? Then candidates must keep needing jit.

        This is what rejects "reproducers" that keep the failing assert but no longer compute the values it
        compares (e.g. `jit and op-by-op disagree` reduced to comparing two unrelated constants).
        """
        if target.signature.kind != "exception" or target.last_jit is None:
            return False
        request = replace(self.subject.request, script=self.subject.path, watch=WatchConfig(nonfinite=False),
                          disable_jit=True)
        outcome = run_contained(request, timeout=check_timeout, env=self.env, cwd=self.cwd)
        self.checks += 1
        sensitive = not any(f.signature.same_as(target.signature) and f.location == target.location
                            for f in observe(outcome))
        if sensitive:
            self.notes.append("the failure needs jit (it goes away with JAX_DISABLE_JIT=1); the reproducer was checked "
                              "to still need it (the reduction goes back where a step loses that)")
        return sensitive

    def detect(self) -> tuple[Failure, bool, list[str], list[Outcome]]:
        self.progress("detect", 0, f"{self.subject.original_lines} lines")
        kind = self.options.kind
        watch = WatchConfig(nonfinite=kind in (None, "nonfinite"),
                            mismatch_calls=2 if kind in (None, "mismatch") else 0,
                            reference=self.options.reference, rtol=self.options.rtol, atol=self.options.atol,
                            rounding_slack=kind is None)
        # An exception is cut to its JAX operation as it passes (its frames are gone once it is reported).
        operations = os.path.join(self.work, "operation") if kind in (None, "exception") else None
        request = replace(self.subject.request, script=self.subject.path, watch=watch, operation_dir=operations)
        runs = max(1, self.options.runs) if self.place is None else 1  # a job runs once per process, in lockstep
        with ThreadPoolExecutor(max_workers=max(1, min(self.options.jobs, runs))) as pool:
            outcomes = list(pool.map(lambda _: run_contained(request, timeout=self.detect_timeout, env=self.env,
                                                             cwd=self.cwd),
                                     range(runs)))
        self.checks += runs
        seen = [observe(o) for o in outcomes]
        chosen = [choose(failures, kind, self.options.match) for failures in seen]
        descriptions = [(c.describe() if c else _plain_end(o, failures))
                        for c, o, failures in zip(chosen, outcomes, seen)]
        target = next((c for c in chosen if c is not None), None)
        if target is None:
            raise UsageError(self._nothing_to_reproduce(seen, outcomes))
        if not (target.jax_work or target.last_jit or target.raised_in_jax):
            raise TargetFailedError(
                f"the target fails before doing any JAX work ({target.describe()}); jaxdbg repro minimises failures "
                "of JAX computations: fix this first, then run repro again")
        flaky = any(c is None or not c.signature.same_as(target.signature) for c in chosen)
        if flaky:
            self.notes.append(f"flaky: {sum(c is not None and c.signature.same_as(target.signature) for c in chosen)} "
                              f"of {runs} runs failed this way; the reduction accepts a candidate that fails once")
        self.progress("detect", self.checks, f"{self.subject.original_lines} lines")
        return target, flaky, descriptions, outcomes

    def _nothing_to_reproduce(self, seen: list[list[Failure]], outcomes: list[Outcome]) -> str:
        runs = len(outcomes)
        other = [f for failures in seen for f in failures]
        if other and (self.options.kind or self.options.match):
            wanted = " ".join(x for x in (f"--kind {self.options.kind}" if self.options.kind else "",
                                          f"--match '{self.options.match}'" if self.options.match else "") if x)
            return (f"nothing to reproduce: no failure matching {wanted} in {runs} contained runs (saw: "
                    f"{other[0].describe()}); drop or change {wanted}")
        ends = "; ".join(sorted({_plain_end(o, []) for o in outcomes}))
        return (f"nothing to reproduce: '{self.spec.text}' {ends} in {runs} contained runs (fresh processes, "
                f"timeout {self.detect_timeout:g}s); if it fails when you run it yourself, the failure depends on "
                "something a fresh process does not share (environment, working folder, earlier state)")

    def check_timeout(self, target: Failure, outcomes: list[Outcome]) -> float:
        """Seconds per candidate run: the hang bound for a timeout, else a margin over the original run.

        Also sets ``verify_reserve``: the time kept back at the end to write and verify the result.
        """
        slowest = max((o.elapsed_s for o in outcomes if o.status != "timeout"), default=self.detect_timeout)
        if target.signature.kind == "timeout":
            self.verify_reserve = self.detect_timeout + 2
            return self.detect_timeout
        self.verify_reserve = min(self.detect_timeout, 1.5 * slowest + 1)
        return min(self.detect_timeout, max(10.0, 3 * slowest + 5))

    # 2a. Computation reduction ------------------------------------------------------------------------------

    def cut(self, target: Failure, flaky: bool, runs: list[str]) -> tuple[ReproResult, dict[str, str]] | None:
        kind = target.signature.kind
        call = (target.seen.call if target.seen else 0)
        watch = WatchConfig(nonfinite=kind == "nonfinite", mismatch_calls=call + 1 if kind == "mismatch" else 0,
                            reference=self.options.reference, rtol=self.options.rtol, atol=self.options.atol,
                            capture=kind, function=target.last_jit)
        folder = os.path.join(self.work, "cut")
        os.makedirs(folder, exist_ok=True)
        progress_path = os.path.join(folder, "progress")
        verify_reserve = self.verify_reserve + 1
        budget = max(5.0, self.clock.left() - verify_reserve)
        request = CutRequest(replace(self.subject.request, script=self.subject.path, watch=watch), folder,
                             progress_path, budget, self.options.rtol, self.options.atol)
        outcome = self._with_progress("cut computation", progress_path, "equations",
                                      lambda: run_contained(request, timeout=budget + self.detect_timeout + 30,
                                                            env=self.env, cwd=self.cwd))
        summary = outcome.last(CutFinished)
        if summary is None or not summary.ok:
            reason = (summary.reason if summary else None) or outcome.describe()
            self.notes.append(f"computation reduction not possible ({reason}); reduced the source instead")
            self.checks += summary.checks if summary else 0
            return None
        self.checks += summary.checks + 1
        done = self._accept_cut(summary, target, flaky, runs, "cut computation", verify_reserve)
        if done is not None and summary.reason:  # not a cut: a frozen value's function alone (repro.frozen)
            self.notes.append(summary.reason)
        return done

    def cut_operation(self, target: Failure, flaky: bool, runs: list[str],
                      outcomes: list[Outcome]) -> tuple[ReproResult, dict[str, str]] | None:
        """An exception raised by one JAX operation: that operation alone, as the detection runs wrote it."""
        self.progress("cut operation", self.checks, f"{self.subject.original_lines} lines")
        summaries = [c for o in outcomes for c in o.all(CutFinished)]
        summary = _matching_cut(outcomes, target.signature)
        if summary is None:
            reasons = [c.reason for c in summaries if c.reason]
            self.notes.append(f"no single JAX operation to cut to ({reasons[0] if reasons else 'none was seen'}); "
                              "reduced the source instead")
            return None
        self.checks += summary.checks
        done = self._accept_cut(summary, target, flaky, runs, "failing operation", self.verify_reserve + 1)
        if done is not None and summary.reason:  # what was written (e.g. a host callback alone)
            self.notes.append(summary.reason)
        return done

    def _accept_cut(self, summary: CutFinished, target: Failure, flaky: bool, runs: list[str], what: str,
                    verify_reserve: float) -> tuple[ReproResult, dict[str, str]] | None:
        """Publish a cut's files and verify them alone; None (files removed, a note says why) if they fail to."""
        # Written out, a cut carries a fixed frame (imports, inputs, the jit call, the check): beyond that, a
        # program longer than the user's is no reduction (e.g. a whole scan written out as lax code).
        if summary.lines > self.subject.original_lines + EMITTED_FRAME_LINES:
            self.notes.append(f"the {what} ({summary.lines} lines, {summary.equations} equation(s)) is not smaller "
                              f"than the program ({self.subject.original_lines} lines); reduced the source instead")
            return None
        assert summary.criterion is not None  # a cut that is ok says how its program fails
        artifacts = self._publish(summary.files)
        verified, verification = self.verify_program(artifacts, summary.criterion)
        self.progress("verify", self.checks, f"{summary.equations} equations")
        if not verified:  # an emitted program that does not fail as promised is no answer: reduce the source
            for path in artifacts.values():
                with contextlib.suppress(OSError):
                    os.remove(path)
            self.notes.append(f"the {what} did not verify ({verification}); reduced the source instead")
            return None
        if summary.criterion.kind == "mismatch" and self.clock.left() > verify_reserve + self.detect_timeout:
            self.notes.extend(self._excess_precision(artifacts))
        timed_out = self.clock.left() <= verify_reserve
        result = ReproResult(
            signature=target.signature, original=Size(self.subject.original_lines, summary.equations_original or None),
            minimized=Size(summary.lines, summary.equations), checks=self.checks,
            elapsed_s=round(self.clock.elapsed(), 2), verified=verified, strategy="computation", flaky=flaky,
            runs=runs, timed_out=timed_out, verification=verification,
            failing_primitives=summary.primitives, notes=self.notes)
        return result, artifacts

    def verify_program(self, artifacts: dict[str, str], criterion: Criterion) -> tuple[bool, str]:
        """Run an emitted reproducer as ``python repro.py`` would, alone in an empty folder, in a fresh process."""
        with self._alone(artifacts["repro"], [p for k, p in artifacts.items() if k == "inputs"]) as path:
            outcome = run_contained(RunRequest(script=path), timeout=self.detect_timeout, env=CHILD_ENV,
                                    cwd=os.path.dirname(path))
        self.checks += 1
        exc = outcome.exception
        said = _in_out_dir(outcome.describe(), path, artifacts["repro"])
        if outcome.status != "exception" or exc is None:
            return False, f"{REPRO_FILE} alone in an empty folder {said} (expected it to fail)"
        ok = criterion.reproduced_by(exc.type, exc.message)
        return ok, f"fresh `python {REPRO_FILE}` alone in an empty folder {said}"

    def _excess_precision(self, artifacts: dict[str, str]) -> list[str]:
        self.checks += 1
        folder = tempfile.mkdtemp(prefix="precision-", dir=self.work)
        return excess_precision(artifacts["repro"], [p for k, p in artifacts.items() if k == "inputs"], folder,
                                self.detect_timeout)

    @contextlib.contextmanager
    def _alone(self, path: str, companions: list[str]) -> Iterator[str]:
        """A copy of ``path`` (and the companion files it reads) in a new empty folder: nothing of the user's
        folder (sibling modules, data files) is there to lean on, and nothing is on ``sys.path`` but it."""
        folder = tempfile.mkdtemp(prefix="alone-", dir=self.work)
        try:
            for source in [path, *companions]:
                shutil.copyfile(source, os.path.join(folder, os.path.basename(source)))
            yield os.path.join(folder, os.path.basename(path))
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _with_progress(self, phase: str, path: str, unit: str, work: Callable[[], Outcome]) -> Outcome:
        """Run ``work`` in a thread while relaying the child's progress file (``"<checks> <size>"``)."""
        box: list[Outcome] = []
        thread = threading.Thread(target=lambda: box.append(work()), daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(0.25)
            try:
                with open(path) as handle:
                    checks, size = handle.read().split()[:2]
                self.progress(phase, self.checks + int(checks), f"{size} {unit}")
            except (OSError, ValueError):
                pass
        return box[0]

    def _publish(self, files: dict[str, str]) -> dict[str, str]:
        names = {"repro": REPRO_FILE, "inputs": INPUTS_FILE, "stablehlo": STABLEHLO_FILE}
        artifacts = {}
        for key, path in files.items():
            destination = os.path.join(self.out_dir, names.get(key, os.path.basename(path)))
            shutil.copyfile(path, destination)
            artifacts[key] = destination
        return artifacts

    # 2b. Source reduction -----------------------------------------------------------------------------------

    def reduce_source(self, target: Failure, flaky: bool, runs: list[str], check_timeout: float,
                      jit_sensitive: bool = False, deadline: float | None = None,
                      file_name: str = REPRO_FILE) -> tuple[ReproResult, dict[str, str]]:
        """Shrink the script's source until ``deadline`` (default: the end of ``--max-time``, less the time kept
        to verify) and write the smallest candidate that verifies alone as ``file_name``."""
        subject = self.subject
        watch = self._check_watch(target)
        request = replace(subject.request, watch=watch)
        folder = os.path.join(self.work, "candidates")
        os.makedirs(folder, exist_ok=True)
        # The failure's place in the text being reduced (in which the user's sibling modules may be pasted).
        target = replace(target, location=subject.locate(target.location))
        checker = Checker(target, request, script_name=subject.script_name, work_dir=folder,
                          original_path=subject.reduce_path, timeout=check_timeout, jobs=self.options.jobs,
                          companions=subject.companions, env=self.env, jit_sensitive=jit_sensitive, flaky=flaky,
                          cwd=self.cwd, preload=preloadable(subject.source))
        located = target.location is not None and _same(target.location.file, subject.reduce_path)
        protected = target.location.line if located and target.location else None
        # A runtime check that raised inside jit stays as written too: its condition is the user's test.
        check = subject.locate(target.check.location) if target.check is not None else None
        kept = [check.line] if check is not None and _same(check.file, subject.reduce_path) else []
        source = subject.source
        if subject.data_free_source and checker.check_text(subject.data_free_source,
                                                           (protected, protected) if protected else None):
            source = subject.data_free_source  # the inputs' values do not matter: no inputs.npz needed
            self.notes.append("the failure does not depend on the input values: the reproducer uses np.ones")
        accepted: list[State] = []
        base_checks = self.checks
        reserve = self.verify_reserve
        reducer = SourceReducer(
            source, protected, checker, jobs=self.options.jobs,
            deadline=deadline if deadline is not None else self.clock.deadline - reserve,
            on_progress=lambda checks, text: self.progress("reduce source", base_checks + checks,
                                                           f"{count_lines(text)} lines"),
            on_accept=accepted.append, kept_lines=kept,
            standardise=file_name == REPRO_FILE,  # repro_source.py: the user's level
            slow_test=checker.still_needs_jit if jit_sensitive else None)
        checker.defer_jit = jit_sensitive  # (asked by the reducer of a few accepted candidates; the result passes it)
        try:
            checker.deadline = reducer.deadline
            reducer.run()
            checker.deadline = None  # the verification below runs for as long as it takes
            timed_out = reducer.out_of_time()
            self.checks = base_checks + checker.checks
            candidates = [reducer.state, *accepted[::-1][1:3], State(None, None, subject.source)]  # type: ignore[arg-type]
            return self._finish_source(target, flaky, runs, candidates, checker, timed_out, check_timeout, file_name)
        finally:
            checker.close()

    def with_source_file(self, done: tuple[ReproResult, dict[str, str]], target: Failure, flaky: bool, runs: list[str],
                         check_timeout: float) -> tuple[ReproResult, dict[str, str]]:
        """Add ``repro_source.py`` to a verified cut: the program reduced at the user's level for a short while,
        still failing at the user's line. Written only when it verifies alone; the notes say what happened."""
        result, artifacts = done
        low, high = SOURCE_FILE_SECONDS
        wanted = self.options.source_time
        if wanted == 0:  # the cut alone was asked for
            self.notes.append(f"{SOURCE_FILE} not written (--source-time 0)")
            return replace(result, notes=self.notes), artifacts
        wanted = min(high, max(low, self.clock.elapsed())) if wanted is None else wanted
        budget = min(wanted, self.clock.left() - self.verify_reserve)
        if budget < 5:  # (too short to run and verify one candidate)
            self.notes.append(f"no time was left to reduce the program's source into {SOURCE_FILE}"
                              if budget < wanted else f"{SOURCE_FILE} not written (--source-time below 5 s)")
            return replace(result, notes=self.notes), artifacts
        if "inputs" in artifacts and self.subject.companions:
            self.notes.append(f"{SOURCE_FILE} not written: it would need its own {INPUTS_FILE} beside the cut's")
            return replace(result, notes=self.notes), artifacts
        notes = len(self.notes)
        source_result, source_artifacts = self.reduce_source(
            target, flaky, runs, check_timeout, deadline=time.perf_counter() + budget, file_name=SOURCE_FILE)
        del self.notes[notes:]  # the source reduction's own notes describe a fallback that did not happen
        where = self._originally(target, ", failing at {}")
        if source_result.verified:
            artifacts = {**artifacts, "source": source_artifacts["repro"],
                         **{k: v for k, v in source_artifacts.items() if k not in ("repro", "stablehlo")}}
            stopped = f" (stopped after {budget:.0f}s)" if source_result.timed_out else ""
            check = " with jaxdbg's check of the failing call" if target.signature.kind in ("nonfinite",
                                                                                           "mismatch") else ""
            total = source_result.minimized.lines or 0
            before, after = source_result.original.lines or 0, self.program_lines or total
            checked = f" ({total}{check})" if check and total != after else ""
            size = (f"reduced from {before} to {after} lines{checked}{stopped}" if after < before else
                    f"not reduced in the {budget:.0f}s it had ({before} lines{checked})")
            self.notes.append(f"{SOURCE_FILE}: the program itself{where}, {size}; it too fails alone in an empty "
                              "folder")
        else:
            for path in source_artifacts.values():
                if path not in artifacts.values():
                    with contextlib.suppress(OSError):
                        os.remove(path)
            self.notes.append(f"{SOURCE_FILE} not written: no reduction of the program{where} verified alone in an "
                              f"empty folder ({source_result.verification})")
        result = replace(result, checks=self.checks, elapsed_s=round(self.clock.elapsed(), 2), notes=self.notes)
        return result, artifacts

    def _check_watch(self, target: Failure) -> WatchConfig:
        kind = target.signature.kind
        return WatchConfig(nonfinite=kind == "nonfinite", mismatch_calls=(target.seen.call if target.seen else 0) + 1
                           if kind == "mismatch" else 0, reference=self.options.reference, rtol=self.options.rtol,
                           atol=self.options.atol, stop_on=kind if kind in ("nonfinite", "mismatch") else None,
                           function=target.last_jit if kind in ("nonfinite", "mismatch") else None)

    def _finish_source(self, target: Failure, flaky: bool, runs: list[str], candidates: list[State],
                       checker: Checker, timed_out: bool, check_timeout: float,
                       file_name: str = REPRO_FILE) -> tuple[ReproResult, dict[str, str]]:
        """Write the smallest candidate that verifies alone in an empty folder (falling back to larger ones).

        A NaN or a mismatch raises nothing by itself: such a candidate is written with a check of the failing
        call (:mod:`jaxdbg.repro.source_check`), and verifies when `python repro.py` raises its AssertionError.
        """
        artifacts: dict[str, str] = {}
        verified, verification, text = False, "not verified", candidates[-1].text
        path = os.path.join(self.out_dir, file_name)
        fresh_runs = 1 if flaky or target.signature.kind == "timeout" else 2  # (as every candidate failed twice)
        with ThreadPoolExecutor(max_workers=1) as pool:
            for state in candidates:
                lines = statement_lines(state) if state.tree is not None else _original_lines(target)
                evidence = None  # a NaN/mismatch: does the candidate without its check fail so alone?
                # repro.py's imports: jax/numpy, or a line that says what more it needs and why
                because = "time" if timed_out else "needed" if state is candidates[0] else "unverified"
                beyond = beyond_jax(state.text, because) if file_name == REPRO_FILE else ""
                for version, version_lines, call in self._versions(state.text, lines, target):
                    checked = call is not None
                    text, marked = self._headed(version, version_lines, target, beyond)
                    companions = self._write(path, text, artifacts)
                    self.progress("verify", self.checks, f"{count_lines(text)} lines")
                    if checked and evidence is None:  # (at the same time as the check's runs)
                        evidence = pool.submit(self._verify_unchecked, state.text, lines, companions, target, checker,
                                               check_timeout, file_name)
                    verified, outcome, said = self._verify_alone(path, text, marked, companions, target, checker,
                                                                 check_timeout, fresh_runs, checked)
                    if evidence is not None and not evidence.result()[0]:
                        verified, outcome, said = evidence.result()  # no check of this candidate can verify
                    verification = f"fresh run of {file_name} alone in an empty folder {said}"
                    if verified or (evidence is not None and not evidence.result()[0]):
                        break
                if verified:
                    self.program_lines = count_lines(state.text)  # the program alone, without jaxdbg's check
                    if beyond:
                        self.notes.append(f"{file_name} {beyond[2:].strip()}")
                    if call:
                        self.notes.append(f"{file_name} ends in a check jaxdbg wrote around `{call}`: it raises "
                                          f"AssertionError while the bug is present")
                    lowered = evidence.result()[1] if evidence is not None else outcome  # (the detector's run)
                    functions = [m for m in lowered.all(LoweredText) if m.function == target.last_jit]
                    if functions and file_name == REPRO_FILE:
                        artifacts["stablehlo"] = os.path.join(self.out_dir, STABLEHLO_FILE)
                        with open(artifacts["stablehlo"], "w") as handle:
                            handle.write(functions[-1].text)
                    break
                why = "; ".join(checker.last_rejections)
                self.notes.append(f"a {count_lines(text)}-line candidate did not verify alone ({why}); trying a "
                                  "larger one")
        artifacts["repro"] = path
        result = ReproResult(
            signature=target.signature, original=Size(self.subject.original_lines),
            minimized=Size(count_lines(text)), checks=self.checks, elapsed_s=round(self.clock.elapsed(), 2),
            verified=verified, strategy="source", flaky=flaky, runs=runs, timed_out=timed_out,
            verification=verification, notes=self.notes)
        return result, artifacts

    def _versions(self, text: str, lines: tuple[int, int] | None,
                  target: Failure) -> list[tuple[str, tuple[int, int] | None, str | None]]:
        """The programs to write for candidate ``text``, each with its failing statement's lines and the call it
        checks: for a NaN/mismatch, the call checked (one version per call that may be it, best first; "": no
        call to check, and as it is nothing raises); for other failures (None), the candidate as it is."""
        signature = target.signature
        if signature.kind not in ("nonfinite", "mismatch"):
            return [(text, lines, None)]
        function = target.last_jit or signature.function or "f"
        versions = with_checks(text, lines, signature, function, self.options.rtol, self.options.atol) if lines else []
        return [(v.text, v.lines, v.call) for v in versions] or [(text, lines, "")]

    def _write(self, path: str, text: str, artifacts: dict[str, str]) -> dict[str, str]:
        """Write ``text`` at ``path`` with the companion files it reads (e.g. the inputs.npz a function target's
        driver loads) next to it; returns those companions (name -> the subject's copy)."""
        with open(path, "w") as handle:
            handle.write(text if text.endswith("\n") else text + "\n")  # a reduced source's unparse ends bare
        companions = {name: source for name, source in self.subject.companions.items() if name in text}
        for name, source in companions.items():
            artifacts["inputs" if name == INPUTS_FILE else name] = os.path.join(self.out_dir, name)
            shutil.copyfile(source, os.path.join(self.out_dir, name))
        return companions

    def _verify_unchecked(self, text: str, lines: tuple[int, int] | None, companions: dict[str, str],
                          target: Failure, checker: Checker, check_timeout: float,
                          file_name: str) -> tuple[bool, Outcome, str]:
        """A NaN/mismatch candidate without its check, alone under the detector: the evidence that its check
        asserts the original failure (the same jitted function, from the failing statement)."""
        text, lines = self._headed(text, lines, target)
        path = os.path.join(self.work, "unchecked", file_name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as handle:
            handle.write(text)
        return self._verify_alone(path, text, lines, companions, target, checker, check_timeout, 1)

    def _verify_alone(self, path: str, text: str, lines: tuple[int, int] | None, companions: dict[str, str],
                      target: Failure, checker: Checker, check_timeout: float, runs: int,
                      checked: bool = False) -> tuple[bool, Outcome, str]:
        """Run ``path`` alone in an empty folder, in ``runs`` fresh processes at once; returns (verified, the first
        run's outcome, what it did). Under the detector it must fail as the candidates did (and where the failure
        needs jit, op by op it must not). ``checked`` (a NaN/mismatch with its check): run as `python repro.py`,
        it must raise the AssertionError that names the failure."""
        watch = None if checked else replace(self._check_watch(target), send_lowered=True, stop_on=None)
        jit_run = checker.jit_sensitive and not checked
        with contextlib.ExitStack() as stack:
            alone = [stack.enter_context(self._alone(path, list(companions.values()))) for _ in range(runs)]
            with ThreadPoolExecutor(max_workers=runs + jit_run) as pool:
                fresh = [pool.submit(run_contained, RunRequest(script=copy, argv=self.subject.request.argv,
                                                               watch=watch),
                                     timeout=check_timeout, env=CHILD_ENV, cwd=os.path.dirname(copy))
                         for copy in alone]
                without_jit = pool.submit(checker.needs_jit, path, text, lines) if jit_run else None
                outcomes = [future.result() for future in fresh]
                needs_jit = without_jit.result() if without_jit is not None else True
            if checked:
                verified = all(self._raises_check(o, target, checker) for o in outcomes)
            else:
                verified = all(checker.accepts(o, copy, text, lines) for o, copy in zip(outcomes, alone))
            said = _in_out_dir(_plain_end(outcomes[0], observe(outcomes[0])), alone[0], path)
        self.checks += runs + (without_jit is not None)
        if verified and not needs_jit:
            verified = False
            checker.last_rejections = [STILL_FAILS_WITHOUT_JIT]
        return verified, outcomes[0], said

    @staticmethod
    def _raises_check(outcome: Outcome, target: Failure, checker: Checker) -> bool:
        """Whether a run of a checked reproducer ended in the AssertionError of its check (else says why not)."""
        exc = outcome.exception
        if outcome.status == "exception" and exc is not None and target.signature.reproduced_by(exc.type, exc.message):
            return True
        expected = target.signature.assertion(target.last_jit or target.signature.function or "f")
        checker.last_rejections = [f"it {outcome.describe()}, not AssertionError: {expected}"]
        return False

    def _headed(self, text: str, lines: tuple[int, int] | None, target: Failure,
                beyond: str = "") -> tuple[str, tuple[int, int] | None]:
        """``text`` with the header (and the ``beyond`` line: what it imports beyond jax/numpy), the failing
        statement marked, and that statement's lines in it."""
        headed = self._with_header(text, target, beyond)
        shift = headed.count("\n") - text.count("\n")
        lines = (lines[0] + shift, lines[1] + shift) if lines else None
        if lines:
            where = self._originally(target, " ({} in the original)")
            headed = _marked(headed, lines[0], "<- jaxdbg: fails here" + where)
        return headed, lines

    def _with_header(self, text: str, target: Failure, beyond: str = "") -> str:
        """The signature, and where the original program failed (the user's own file and line)."""
        return (f"# jaxdbg repro: {target.signature.describe()}\n"
                + self._originally(target, "# the original program fails at {}\n") + beyond + text)

    def _originally(self, target: Failure, template: str) -> str:
        """``template`` filled with where the original failed, when that is a file of the user's (a function
        target fails in the call jaxdbg wrote, which the user never saw: then nothing)."""
        location = target.signature.location
        if location is None or os.path.realpath(location.file).startswith(os.path.realpath(self.work) + os.sep):
            return ""
        return template.format(_short(location))


def excess_precision(repro: str, companions: list[str], folder: str, timeout: float) -> list[str]:
    """A jit/op-by-op mismatch of a bfloat16/float16 computation: its verified reproducer run again (copied into the
    empty ``folder``) with XLA made to round every intermediate to its dtype. If it then passes, that is the cause:
    a note says so (else ``[]``).

    Example:
        >>> import tempfile
        >>> work = tempfile.mkdtemp()
        >>> with open(f"{work}/repro.py", "w") as f:
        ...     _ = f.write("import os  # bfloat16\\nassert 'excess_precision=false' in os.environ['XLA_FLAGS']")
        >>> excess_precision(f"{work}/repro.py", [], f"{work}/alone", 60)[0][:47]
        'the mismatch goes away with XLA_FLAGS=--xla_all'
    """
    with open(repro) as handle:
        if "float16" not in handle.read():  # (bfloat16 too)
            return []
    os.makedirs(folder, exist_ok=True)
    for source in [repro, *companions]:
        shutil.copyfile(source, os.path.join(folder, os.path.basename(source)))
    flags = f"{os.environ.get('XLA_FLAGS', '')} {EXACT_PRECISION}".strip()
    outcome = run_contained(RunRequest(script=os.path.join(folder, os.path.basename(repro))), timeout=timeout,
                            env={**CHILD_ENV, "XLA_FLAGS": flags}, cwd=folder)
    if outcome.status != "ok":
        return []
    return [f"the mismatch goes away with XLA_FLAGS={EXACT_PRECISION}: under jit, XLA keeps the bfloat16/float16 "
            "intermediates of the operations it fuses at float32 (it is allowed excess precision, and rounds only "
            "where a value leaves the fusion), while op by op every operation rounds to its dtype; neither is a bug "
            "of yours, but a sum of many low-precision terms (gradients accumulated in bfloat16) differs by much "
            "more than one rounding: accumulate in float32 (`jnp.zeros_like(w, jnp.float32)`), or run with that "
            "flag to get op-by-op's rounding under jit"]


def _matching_cut(outcomes: list[Outcome], signature: FailureSignature) -> CutFinished | None:
    """A detection run's cut of the exception to its operation (or host callback) that raised the same."""
    return next((c for o in outcomes for c in o.all(CutFinished) if c.ok and signature.same_as(c.criterion)), None)


def _short(location: SourceLocation) -> str:
    return f"{os.path.basename(location.file)}:{location.line} ({location.function})"


def _marked(text: str, line: int, comment: str) -> str:
    """``text`` with ``# comment`` at the end of ``line``, unless that changes the program (a line inside a string)."""
    rows = text.split("\n")
    if not 0 < line <= len(rows):
        return text
    rows[line - 1] += f"  # {comment}"
    marked = "\n".join(rows)
    try:
        same = ast.dump(parse(marked)) == ast.dump(parse(text))
    except SyntaxError:
        return text
    return marked if same else text


def _in_out_dir(text: str, copy: str, path: str) -> str:
    """A run's description with the empty folder it ran in named as the file it copied (that folder is gone)."""
    return text.replace(copy, path)


def _original_lines(target: Failure) -> tuple[int, int] | None:
    return (target.location.line, target.location.line) if target.location else None


def _plain_end(outcome: Outcome, failures: list[Failure]) -> str:
    if failures:
        return failures[0].describe()
    return "ran to completion without failing" if outcome.ok else outcome.describe()


def _same(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)
