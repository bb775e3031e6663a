"""``jaxdbg repro``: minimise a failing JAX program into a standalone reproducer that fails the same way.

The steps, each bounded by ``--max-time`` (the smallest reproducer so far is kept and verified on time-out):

1. Detect: run the target contained ``runs`` times (in parallel) under the jit watch; collect every failure
   (exception, crash, timeout, NaN/Inf from a jitted call, jit vs op-by-op mismatch); keep the one
   ``--kind``/``--match`` name, or the first by priority. Runs that disagree make the failure *flaky*.
2. Reduce. A NaN/Inf or a mismatch lives in a jitted computation: capture its jaxpr and inputs, cut it down
   (:mod:`jaxdbg.repro.cut`) and emit plain jax/lax code. Otherwise (exception, crash, hang), shrink the
   script's source (:mod:`jaxdbg.repro.source`), each candidate checked in a contained run.
3. Verify the written ``repro.py`` in a fresh process; if it does not fail the same way, fall back to the
   previous (larger) candidate.

Example:
    >>> result, artifacts = reproduce(parse_target("bug.py"), ReproOptions(max_time=60), "out")  # doctest: +SKIP
    >>> result.verified, result.minimized.lines                                                   # doctest: +SKIP
    (True, 6)
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from jaxdbg._errors import TargetFailedError, UsageError
from jaxdbg.repro.failures import STILL_FAILS_WITHOUT_JIT, Checker, Failure, choose, observe
from jaxdbg.repro.jobs import CHILD_ENV, CUT_JOB, JOB, CutRequest, RunRequest, reduction_env
from jaxdbg.repro.messages import CutFinished, LoweredText
from jaxdbg.repro.program import INPUTS_FILE, REPRO_FILE, STABLEHLO_FILE, count_lines, expected_message
from jaxdbg.repro.signature import KINDS, FailureSignature, normalise_message
from jaxdbg.repro.source import SourceReducer, State, statement_lines
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


@dataclass(frozen=True)
class Size:
    lines: int | None
    equations: int | None = None


@dataclass(frozen=True)
class ReproResult:
    """The contract's repro result, plus how it was obtained."""

    signature: FailureSignature
    original: Size
    minimized: Size
    checks: int
    elapsed_s: float
    verified: bool
    strategy: str  # "computation" (cut jaxpr) or "source" (reduced script)
    flaky: bool = False
    runs: list[str] = field(default_factory=list)
    timed_out: bool = False
    verification: str = ""
    failing_primitives: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def essential_line(self) -> str | None:
        return self.verification or None


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
    clock = _Clock(options.max_time)
    work = tempfile.mkdtemp(prefix="jaxdbg-repro-")
    try:
        subject = prepare_subject(spec, options.inputs, options.args, options.seed, work, options.timeout)
        return _Reproduction(spec, subject, options, out_dir, work, clock, progress).run()
    finally:
        shutil.rmtree(work, ignore_errors=True)


EMITTED_FRAME_LINES = 15
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
                 clock: _Clock, progress: Progress):
        self.spec, self.subject, self.options = spec, subject, options
        self.out_dir, self.work, self.clock, self.progress = out_dir, work, clock, progress
        self.checks = 0
        self.notes: list[str] = []
        self.detect_timeout = options.timeout or DEFAULT_TIMEOUT
        self.env = reduction_env(os.path.join(work, "jax-cache"))
        self.cwd = scratch_folder(os.path.join(work, "cwd"), out_dir)
        self.verify_reserve = 5.0

    # 1. Detect ----------------------------------------------------------------------------------------------

    def run(self) -> tuple[ReproResult, dict[str, str]]:
        target, flaky, runs, outcomes = self.detect()
        check_timeout = self.check_timeout(target, outcomes)
        computational = target.signature.kind == "nonfinite" or (
            target.signature.kind == "mismatch" and self.options.reference == "eager")
        if computational:  # (a float64 reference has no faithful replay per equation: source reduction)
            done = self.cut(target, flaky, runs)
            if done is not None:
                return done
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
        outcome = run_contained(JOB, request, timeout=check_timeout, env=self.env, cwd=self.cwd)
        self.checks += 1
        sensitive = not any(f.signature.same_as(target.signature) and f.location == target.location
                            for f in observe(outcome))
        if sensitive:
            self.notes.append("the failure needs jit (it goes away with JAX_DISABLE_JIT=1); every candidate was "
                              "checked to still need it")
        return sensitive

    def detect(self) -> tuple[Failure, bool, list[str], list[Outcome]]:
        self.progress("detect", 0, f"{self.subject.original_lines} lines")
        kind = self.options.kind
        watch = WatchConfig(nonfinite=kind in (None, "nonfinite"),
                            mismatch_calls=2 if kind in (None, "mismatch") else 0,
                            reference=self.options.reference, rtol=self.options.rtol, atol=self.options.atol)
        request = replace(self.subject.request, script=self.subject.path, watch=watch)
        runs = max(1, self.options.runs)
        with ThreadPoolExecutor(max_workers=max(1, min(self.options.jobs, runs))) as pool:
            outcomes = list(pool.map(lambda _: run_contained(JOB, request, timeout=self.detect_timeout, env=self.env,
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
                                      lambda: run_contained(CUT_JOB, request, timeout=budget + self.detect_timeout + 30,
                                                            env=self.env, cwd=self.cwd))
        summary = outcome.last(CutFinished)
        if summary is None or not summary.ok:
            reason = (summary.reason if summary else None) or outcome.describe()
            self.notes.append(f"computation reduction not possible ({reason}); reduced the source instead")
            self.checks += summary.checks if summary else 0
            return None
        self.checks += summary.checks + 1
        # Written out, a cut carries a fixed frame (imports, inputs, the jit call, the check): beyond that, a
        # program longer than the user's is no reduction (e.g. a whole scan written out as lax code).
        if summary.lines > self.subject.original_lines + EMITTED_FRAME_LINES:
            self.notes.append(f"the cut computation ({summary.lines} lines, {summary.equations} equation(s)) "
                              f"is not smaller than the program ({self.subject.original_lines} lines); reduced "
                              "the source instead")
            return None
        artifacts = self._publish(summary.files)
        verified, verification = self.verify_program(artifacts["repro"], summary.criterion)
        self.progress("verify", self.checks, f"{summary.equations} equations")
        if not verified:  # an emitted program that does not fail as promised is no answer: reduce the source
            for path in artifacts.values():
                with contextlib.suppress(OSError):
                    os.remove(path)
            self.notes.append(f"the cut computation did not verify ({verification}); reduced the source instead")
            return None
        timed_out = self.clock.left() <= verify_reserve
        result = ReproResult(
            signature=target.signature, original=Size(self.subject.original_lines, summary.equations_original),
            minimized=Size(summary.lines, summary.equations), checks=self.checks,
            elapsed_s=round(self.clock.elapsed(), 2), verified=verified, strategy="computation", flaky=flaky,
            runs=runs, timed_out=timed_out, verification=verification,
            failing_primitives=summary.primitives, notes=self.notes)
        return result, artifacts

    def verify_program(self, path: str, criterion: dict) -> tuple[bool, str]:
        """Run an emitted reproducer as ``python repro.py`` would, in a fresh process."""
        outcome = run_contained(JOB, RunRequest(script=path), timeout=self.detect_timeout, env=CHILD_ENV,
                                cwd=self.cwd)
        self.checks += 1
        exc = outcome.exception
        if outcome.status != "exception" or exc is None:
            return False, f"repro.py {outcome.describe()} (expected it to fail)"
        if criterion["kind"] == "exception":
            ok = exc.type == criterion["type"] and normalise_message(exc.message) == criterion["message"]
        else:
            ok = exc.type == "AssertionError" and expected_message_for(criterion) in exc.message
        return ok, f"fresh `python {REPRO_FILE}` {outcome.describe()}"

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
                      jit_sensitive: bool = False) -> tuple[ReproResult, dict[str, str]]:
        subject = self.subject
        watch = self._check_watch(target)
        request = replace(subject.request, watch=watch)
        folder = os.path.join(self.work, "candidates")
        os.makedirs(folder, exist_ok=True)
        checker = Checker(target, request, script_name=subject.script_name, work_dir=folder,
                          original_path=subject.path, timeout=check_timeout, jobs=self.options.jobs,
                          companions=subject.companions, env=self.env, jit_sensitive=jit_sensitive, flaky=flaky,
                          cwd=self.cwd)
        protected = target.location.line if target.location and _same(target.location.file, subject.path) else None
        source = subject.source
        if subject.data_free_source and checker.check_text(subject.data_free_source,
                                                           (protected, protected) if protected else None):
            source = subject.data_free_source  # the inputs' values do not matter: no inputs.npz needed
            self.notes.append("the failure does not depend on the input values: the reproducer uses np.ones")
        accepted: list[State] = []
        base_checks = self.checks
        reserve = self.verify_reserve
        reducer = SourceReducer(
            source, protected, checker, jobs=self.options.jobs, deadline=self.clock.deadline - reserve,
            on_progress=lambda checks, text: self.progress("reduce source", base_checks + checks,
                                                           f"{count_lines(text)} lines"),
            on_accept=accepted.append)
        try:
            reducer.run()
            timed_out = reducer.out_of_time()
            self.checks = base_checks + checker.checks
            candidates = [reducer.state, *accepted[::-1][1:3], State(None, None, subject.source)]  # type: ignore[arg-type]
            return self._finish_source(target, flaky, runs, candidates, checker, timed_out, check_timeout)
        finally:
            checker.close()

    def _check_watch(self, target: Failure) -> WatchConfig:
        kind = target.signature.kind
        return WatchConfig(nonfinite=kind == "nonfinite", mismatch_calls=(target.seen.call if target.seen else 0) + 1
                           if kind == "mismatch" else 0, reference=self.options.reference, rtol=self.options.rtol,
                           atol=self.options.atol, stop_on=kind if kind in ("nonfinite", "mismatch") else None,
                           function=target.last_jit if kind in ("nonfinite", "mismatch") else None)

    def _finish_source(self, target: Failure, flaky: bool, runs: list[str], candidates: list[State],
                       checker: Checker, timed_out: bool, check_timeout: float) -> tuple[ReproResult, dict[str, str]]:
        """Write the smallest candidate that verifies in a fresh process (falling back to larger ones)."""
        artifacts: dict[str, str] = {}
        verified, verification, text = False, "not verified", candidates[-1].text
        path = os.path.join(self.out_dir, REPRO_FILE)
        for state in candidates:
            text = _with_header(state.text, target)
            lines = statement_lines(state) if state.tree is not None else _original_lines(target)
            shift = text.count("\n") - state.text.count("\n")
            lines = (lines[0] + shift, lines[1] + shift) if lines else None
            with open(path, "w") as handle:
                handle.write(text)
            for name, source in self.subject.companions.items():
                if name in text:  # e.g. inputs.npz, read by the driver of a function target
                    artifacts["inputs" if name == INPUTS_FILE else name] = os.path.join(self.out_dir, name)
                    shutil.copyfile(source, os.path.join(self.out_dir, name))
            watch = replace(self._check_watch(target), send_lowered=True, stop_on=None)
            request = replace(self.subject.request, script=path, watch=watch)
            self.progress("verify", self.checks, f"{count_lines(text)} lines")
            # Every run the verdict needs, at once: twice in a fresh process (as every candidate failed
            # twice), and op by op where the failure needs jit.
            fresh_runs = 1 if flaky or target.signature.kind == "timeout" else 2
            with ThreadPoolExecutor(max_workers=fresh_runs + checker.jit_sensitive) as pool:
                fresh = [pool.submit(run_contained, JOB, request, timeout=check_timeout, env=CHILD_ENV, cwd=self.cwd)
                         for _ in range(fresh_runs)]
                without_jit = pool.submit(checker.needs_jit, path, text, lines) if checker.jit_sensitive else None
                outcomes = [future.result() for future in fresh]
                needs_jit = without_jit.result() if without_jit is not None else True
            self.checks += fresh_runs + (without_jit is not None)
            outcome = outcomes[0]
            verified = all(checker.accepts(o, path, text, lines) for o in outcomes)
            if verified and not needs_jit:
                verified = False
                checker.last_rejections = [STILL_FAILS_WITHOUT_JIT]
            verification = f"fresh run of {REPRO_FILE} {_plain_end(outcome, observe(outcome))}"
            if verified:
                lowered = [m for m in outcome.all(LoweredText) if m.function == target.last_jit]
                if lowered and target.signature.kind in ("crash", "timeout", "exception", "nonfinite", "mismatch"):
                    artifacts["stablehlo"] = os.path.join(self.out_dir, STABLEHLO_FILE)
                    with open(artifacts["stablehlo"], "w") as handle:
                        handle.write(lowered[-1].text)
                break
            why = "; ".join(checker.last_rejections)
            self.notes.append(f"a {count_lines(text)}-line candidate did not verify ({why}); trying a larger one")
        if target.signature.kind in ("nonfinite", "mismatch"):
            self.notes.append("this reduced script shows the failure only under jaxdbg's detector (no assertion)")
        artifacts["repro"] = path
        result = ReproResult(
            signature=target.signature, original=Size(self.subject.original_lines),
            minimized=Size(count_lines(text)), checks=self.checks, elapsed_s=round(self.clock.elapsed(), 2),
            verified=verified, strategy="source", flaky=flaky, runs=runs, timed_out=timed_out,
            verification=verification, notes=self.notes)
        return result, artifacts


def expected_message_for(criterion: dict) -> str:
    from jaxdbg.repro.cut import Criterion

    return expected_message(Criterion(criterion["kind"], what=criterion.get("what") or "NaN"))


def _with_header(text: str, target: Failure) -> str:
    return f"# jaxdbg repro: {target.signature.describe()}\n" + text


def _original_lines(target: Failure) -> tuple[int, int] | None:
    return (target.location.line, target.location.line) if target.location else None


def _plain_end(outcome: Outcome, failures: list[Failure]) -> str:
    if failures:
        return failures[0].describe()
    return "ran to completion without failing" if outcome.ok else outcome.describe()


def _same(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)
