"""Run a suite of checks: each check's command in its own process (a crashing target stays contained),
several at once up to ``jobs``, then findings, baseline comparison and the suite's result.

A check runs ``python -m jaxdbg <command> [--budget B] OPTIONS --out OUT/<check> -q TARGET`` in the folder of
its pyproject.toml and is judged on that command's JSON report (``OUT/<check>/report.json``). A profile check
runs ``repeats`` times (5 when a baseline is written) (``OUT/<check>/repeat-<k>/``), so the baseline
holds the run-to-run noise too. A command that refuses its input (exit 2: an unknown budget rule or option,
a missing target) is bad configuration: the suite stops at once (the other checks' processes are stopped,
those not started are skipped, so a typo costs seconds, not the suite's time) with exit 2 naming the check.

Example:
    >>> import pathlib, tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "pyproject.toml").write_text(
    ...     '[tool.jaxdbg.check.clean]\\ncommand = "nan-hunt"\\ntarget = "ok.py"\\n')
    >>> _ = (folder / "ok.py").write_text("import jax.numpy as jnp\\nprint(jnp.ones(2).sum())\\n")
    >>> from jaxdbg.check.config import load_checks
    >>> run = run_suite(load_checks(folder / "pyproject.toml"), Settings(folder / "out"))
    >>> run.result.passed, [(c.name, c.exit_code, c.finding) for c in run.result.checks]
    (True, [('clean', 0, None)])
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jaxdbg._errors import EXIT_FOUND, EXIT_TARGET_FAILED, EXIT_USAGE, UsageError
from jaxdbg.check.baseline import (
    Samples,
    compare_check,
    fingerprint,
    load_baseline,
    samples_of,
    scale_for,
    write_baseline,
)
from jaxdbg.check.calibrate import calibrate_in_child
from jaxdbg.check.config import CheckSpec
from jaxdbg.check.findings import finding, function_source
from jaxdbg.check.result import CheckOutcome, CheckSuiteResult, Regression
from jaxdbg.report import Report, ReportReadError, to_jsonable
from jaxdbg.results import read_report

STOP_GRACE_S = 15.0  # a stopped check's command gets this long to stop its target and write its report


@dataclass(frozen=True)
class Settings:
    """How a suite runs; ``repeats`` None means 5 runs of a profile check when writing a baseline (its
    run-to-run noise needs several), else 1."""

    out_dir: Path
    jobs: int | None = None
    timeout: float | None = None
    repeats: int | None = None
    baseline: Path | None = None
    update_baseline: bool = False
    alpha: float = 0.01

    def runs_of(self, spec: CheckSpec) -> int:
        if spec.command != "profile":
            return 1
        if self.repeats is not None:
            return self.repeats
        return 5 if self.update_baseline else 1


@dataclass(frozen=True)
class Ran:
    """One check's command runs: their reports (first run first, read back typed), exit codes, wall time, and
    stderr's last line (or why a report could not be read)."""

    spec: CheckSpec
    reports: list[Report]
    exit_code: int
    duration_s: float
    report_path: Path
    stderr_line: str


class _Running:
    """The checks' processes (each its own process group, so the terminal's Ctrl-C does not reach them): the
    suite stops them all at the first check whose command refuses its input, or when jaxdbg check itself is
    interrupted (Ctrl-C, a CI job's SIGTERM); once stopped, no check starts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._processes: set[subprocess.Popen] = set()
        self.stopped = threading.Event()

    def started(self, process: subprocess.Popen) -> None:
        with self._lock:
            self._processes.add(process)
            if not self.stopped.is_set():
                return
        _stop([process])  # stopped while it was starting

    def ended(self, process: subprocess.Popen, code: int) -> None:
        with self._lock:
            self._processes.discard(process)
        if code == EXIT_USAGE:
            self.stop()

    def stop(self) -> None:
        with self._lock:
            self.stopped.set()
            processes = list(self._processes)
        _stop(processes)


def _stop(processes: list[subprocess.Popen], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM first: a jaxdbg command then stops its target, which runs in a session of its own that a
    signal to the command's group does not reach; SIGKILL the groups still there after ``grace_s``."""
    for process in processes:
        _signal_group(process, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(p.poll() is None for p in processes) and time.monotonic() < deadline:
        time.sleep(0.05)
    for process in processes:
        _signal_group(process, signal.SIGKILL)


def _signal_group(process: subprocess.Popen, number: int) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, number)


@dataclass
class SuiteRun:
    result: CheckSuiteResult
    artifacts: dict[str, str] = field(default_factory=dict)
    environment: dict[str, Any] | None = None


def run_suite(specs: tuple[CheckSpec, ...], settings: Settings) -> SuiteRun:
    """Run every check and judge it; raise UsageError (exit 2) for bad configuration or a bad baseline."""
    baseline = load_baseline(settings.baseline) if settings.baseline and not settings.update_baseline else None
    jobs = max(1, min(settings.jobs or os.cpu_count() or 1, len(specs)))
    running = _Running()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        try:
            ran = list(pool.map(lambda spec: _run_check(spec, settings, running), specs))
        except BaseException:  # Ctrl-C, SIGTERM (SystemExit): no check may outlive jaxdbg check
            running.stop()
            raise
    refused = next((r for r in ran if r.exit_code == EXIT_USAGE), None)
    if refused is not None:
        raise UsageError(f"[tool.jaxdbg.check.{refused.spec.name}] in {refused.spec.config}: "
                         f"{refused.stderr_line or 'its command refused its input (exit 2)'}; fix the check")
    samples = {r.spec.name: samples_of(r.reports) for r in ran if r.spec.command == "profile" and r.reports}
    environment = next((r.reports[0].environment for r in ran if r.reports), None)
    here = fingerprint(environment or {})
    compared: dict[str, tuple[Regression, ...]] = {}
    artifacts: dict[str, str] = {}
    if baseline is not None and settings.baseline is not None:
        compared = _compare(baseline, samples, here, settings, artifacts)
    outcomes = tuple(_outcome(r, compared.get(r.spec.name, ())) for r in ran)
    passed = all(o.passed for o in outcomes)
    # A baseline is the last good run: a failing run (a crash, a NaN, a broken budget) leaves the old one.
    if settings.update_baseline and settings.baseline is not None and passed:
        write_baseline(settings.baseline, samples, here, calibrate_in_child())
        artifacts["baseline"] = str(settings.baseline)
    return SuiteRun(CheckSuiteResult(passed, outcomes), artifacts, environment)


def _compare(baseline: dict[str, Any], samples: dict[str, Samples], here: dict[str, str], settings: Settings,
             artifacts: dict[str, str]) -> dict[str, tuple[Regression, ...]]:
    """Each profile check's regressions; every figure compared (regressed or not) goes to
    ``OUT/<check>/baseline-comparison.json``, so a passing comparison shows its tests too."""
    assert settings.baseline is not None
    scale = scale_for(baseline, here, settings.baseline, calibrate_in_child)
    found = {}
    for name, current in samples.items():
        stored = (baseline.get("checks") or {}).get(name)
        if stored:
            compared, found[name] = compare_check(stored, current, scale, settings.alpha)
            path = (settings.out_dir / name / "baseline-comparison.json").resolve()
            path.write_text(json.dumps(to_jsonable(compared), indent=1) + "\n")
            artifacts[f"{name}_baseline_comparison"] = str(path)
    return found


def _run_check(spec: CheckSpec, settings: Settings, running: _Running) -> Ran:
    folder = (settings.out_dir / spec.name).resolve()
    started = time.perf_counter()
    reports, codes, last = [], [], ""
    for k in range(settings.runs_of(spec)):
        if running.stopped.is_set():  # another check's input was refused (exit 2 anyway), or we were interrupted
            break
        out = folder if k == 0 else folder / f"repeat-{k}"
        code, last = _run_command(spec, out, settings.timeout, running)
        codes.append(code)
        report, unread = _read_report(out / "report.json")
        if report is not None:
            reports.append(report)
        last = unread or last
        if code not in (0, EXIT_FOUND):
            break  # a crash or a refusal repeats itself: no more samples to gain
    failing = next((c for c in codes if c != 0), 0)
    return Ran(spec, reports, failing, time.perf_counter() - started, folder / "report.json", last)


def _run_command(spec: CheckSpec, out: Path, timeout: float | None, running: _Running) -> tuple[int, str]:
    """Run the check's command once; (exit code, last line of its stderr). Its output goes to output.log."""
    out.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "jaxdbg", spec.command, *spec.argv("--out", str(out), "-q")]
    with open(out / "output.log", "w") as log:
        process = subprocess.Popen(argv, cwd=spec.folder, stdout=log, stderr=subprocess.PIPE, text=True,
                                   start_new_session=True)  # its own group: a timeout stops the target's children too
        running.started(process)
        try:
            _, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _stop([process])
            process.wait()
            running.ended(process, EXIT_TARGET_FAILED)
            return EXIT_TARGET_FAILED, f"timed out after {timeout:g} s (jaxdbg check --timeout)"
        finally:
            _stop([process])  # whatever stopped this thread: leave no process behind
        running.ended(process, process.returncode)
        log.write(stderr)
    lines = [line for line in stderr.splitlines() if line.strip()]
    return process.returncode, lines[-1] if lines else ""


def _read_report(path: Path) -> tuple[Report | None, str]:
    """The command's report read back typed, or None and why not: none written (a crash) is no reason of ours;
    one that does not read as its command's result (a jaxdbg bug) says which field."""
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return None, ""
    try:
        return read_report(document), ""
    except ReportReadError as err:
        return None, f"jaxdbg check could not read its report {path}: {err}"


def _outcome(ran: Ran, regressed: tuple[Regression, ...]) -> CheckOutcome:
    spec = ran.spec
    report = ran.reports[0] if ran.reports else None
    line, where = finding(report) if report is not None else (None, None)
    if ran.exit_code != 0 and line is None:
        line = ran.stderr_line or f"jaxdbg {spec.command} exited with code {ran.exit_code} and wrote no report"
    if regressed:
        described = "; ".join(r.describe() for r in regressed)
        line = f"{line}; regression: {described}" if line else f"regression: {described}"
        where = where or function_source(report, regressed[0].function)
    failed = ran.exit_code != 0 or bool(regressed)
    code = ran.exit_code if ran.exit_code != 0 else (EXIT_FOUND if regressed else 0)
    return CheckOutcome(spec.name, spec.command, spec.target, not failed, code, line if failed else None,
                        round(ran.duration_s, 3), str(ran.report_path), where if failed else None, regressed)
