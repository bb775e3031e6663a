"""Baselines: the compile and execute samples of each profile check, where they were measured, and tests
that say whether a new run is slower beyond the noise the baseline's repeated runs showed.

A baseline (``--update-baseline``) stores, per check and jitted function, every timed call's execute time
(``samples_s`` of the profile report), each run's median and each run's compile time, with the machine's
fingerprint (jax, backend, device kind, CPU model) and a calibration run (:mod:`jaxdbg.check.calibrate`).
Compared on another machine of the same backend, figures are divided by the calibration's ratio; across
backends they are refused.

Example:
    >>> calls = [1.0, 1.02, 0.98, 1.01, 0.99, 1.03, 0.97, 1.0]
    >>> samples = {"f": {"execute_samples_s": calls, "execute_run_medians_s": [1.0, 1.02, 0.99],
    ...                  "compile_samples_s": [0.5, 0.52, 0.49]}}
    >>> slower = {"f": {"execute_samples_s": [2 * v for v in calls], "execute_run_medians_s": [2.0],
    ...                 "compile_samples_s": [0.51]}}
    >>> compared, regressed = compare_check(samples, slower, Scale(), alpha=0.01)
    >>> [r.metric for r in compared], [r.metric for r in regressed]
    (['execute_median_s', 'compile_s'], ['execute_median_s'])
    >>> compare_check(samples, samples, Scale(), alpha=0.01)[1]
    ()
"""

from __future__ import annotations

import json
import math
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from jaxdbg._errors import UsageError
from jaxdbg._version import __version__
from jaxdbg.check.result import Regression
from jaxdbg.check.stats import median_ratio_test, run_level_test
from jaxdbg.results import is_error

if TYPE_CHECKING:
    from jaxdbg.profile.model import ProfileResult
    from jaxdbg.report import Report

FORMAT = 1  # bump when the file's layout changes; an older file is refused, not misread
MIN_SAMPLES = 3  # fewer on either side and the permutation test cannot reach a small p-value

Samples = dict[str, dict[str, list[float]]]  # function -> series name -> values
SERIES = ("execute_samples_s", "execute_run_medians_s", "compile_samples_s")


def cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), else what platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def fingerprint(environment: dict[str, Any]) -> dict[str, str]:
    """Where figures were measured, from a report's ``environment`` plus this machine's CPU."""
    devices = environment.get("devices") or [{}]
    return {"jax": str(environment.get("jax")), "backend": str(environment.get("backend")),
            "device_kind": str(devices[0].get("kind")), "device_count": str(len(devices)), "cpu": cpu_model()}


def samples_of(reports: list[Report]) -> Samples:
    """Each function's execute samples (all runs), per-run execute medians and per-run compile times, from a
    profile check's reports (read back typed; an error report has none)."""
    found: Samples = {}
    for report in reports:
        if is_error(report.result):
            continue
        profile: ProfileResult = report.result
        for function in profile.functions:
            series = found.setdefault(function.name, {name: [] for name in SERIES})
            taken = [v for v in function.execute.samples_s if v > 0]  # a NaN sample is no sample either
            series["execute_samples_s"].extend(taken)
            if taken:
                series["execute_run_medians_s"].append(float(np.median(taken)))
            series["compile_samples_s"].append(function.compile_total_s)
    return found


def write_baseline(path: Path, checks: dict[str, Samples], print_: dict[str, str],
                   calibration: dict[str, float]) -> None:
    document = {"tool": "jaxdbg", "kind": "check-baseline", "format": FORMAT, "version": __version__,
                "fingerprint": print_, "calibration": calibration, "checks": checks}
    path.write_text(json.dumps(document, indent=1) + "\n")


def load_baseline(path: Path) -> dict[str, Any]:
    """Read a baseline; a missing, unreadable or other-format file is bad input naming the file (exit 2)."""
    where = f"--baseline '{path}'"
    if not path.is_file():
        raise UsageError(f"{where}: no such file; write one with 'jaxdbg check --baseline {path} --update-baseline'")
    try:
        document = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise UsageError(f"{where}: not JSON ({err}); give a file written by --update-baseline") from None
    if not isinstance(document, dict) or document.get("kind") != "check-baseline":
        raise UsageError(f"{where}: not a jaxdbg check baseline (a command's --json report is not one); write "
                         "one with --update-baseline")
    if document.get("format") != FORMAT:
        raise UsageError(f"{where}: baseline format {document.get('format')} (jaxdbg {document.get('version')}), "
                         f"this jaxdbg reads format {FORMAT}; rewrite it with --update-baseline")
    problem = _malformed(document)
    if problem is not None:
        raise UsageError(f"{where}: {problem}; the file was edited or cut short, rewrite it with --update-baseline")
    return document


def _malformed(document: dict[str, Any]) -> str | None:
    """What is wrong with a baseline's layout (the key at fault), or None: checked before any check runs, so a
    damaged file is bad input, not a crash after the suite's work."""
    fingerprint = document.get("fingerprint")
    if not isinstance(fingerprint, dict) or not all(isinstance(v, str) for v in fingerprint.values()):
        return "'fingerprint' is not a table of strings"
    calibration = document.get("calibration")
    if calibration is not None and not (isinstance(calibration, dict) and all(
            _positive(calibration.get(key)) for key in ("compile_s", "execute_s"))):
        return "'calibration' needs positive numbers compile_s and execute_s"
    checks = document.get("checks")
    if not isinstance(checks, dict):
        return "'checks' is not a table of checks"
    for check, functions in checks.items():
        if not isinstance(functions, dict):
            return f"'checks.{check}' is not a table of functions"
        for function, series in functions.items():
            if not isinstance(series, dict):
                return f"'checks.{check}.{function}' is not a table of figures"
            for name in SERIES:
                values = series.get(name)
                if not isinstance(values, list) or not all(_positive(v) or v == 0 for v in values):
                    return f"'checks.{check}.{function}.{name}' is not a list of positive numbers"
            if not all(v > 0 for name in SERIES[:2] for v in series[name]):
                return f"'checks.{check}.{function}' holds an execute time of 0"
    return None


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


@dataclass(frozen=True)
class Scale:
    """How much slower this machine runs the calibration workload than the baseline's (1.0: same machine)."""

    execute: float = 1.0
    compile: float = 1.0

    @property
    def note(self) -> str:
        if self.execute == 1.0 and self.compile == 1.0:
            return ""
        return f", calibrated: this machine {self.execute:.3g}x execute, {self.compile:.3g}x compile"


def scale_for(baseline: dict[str, Any], here: dict[str, str], path: Path,
              calibrate: Any) -> Scale:
    """Same fingerprint: no scaling. Same backend elsewhere: the calibration workload's ratio. Another
    backend: refused (exit 2), as CPU figures say nothing about a GPU's."""
    there = baseline.get("fingerprint") or {}
    if there == here:
        return Scale()
    if there.get("backend") != here.get("backend"):
        raise UsageError(f"--baseline '{path}': measured on backend {there.get('backend')}, this run is on "
                         f"{here.get('backend')}; figures of different backends cannot be compared, write a "
                         "baseline on this backend with --update-baseline")
    stored = baseline.get("calibration") or {}
    if not stored.get("execute_s") or not stored.get("compile_s"):
        raise UsageError(f"--baseline '{path}': measured on another machine ({there.get('cpu')}, "
                         f"{there.get('device_kind')}) and holds no calibration run to compare ratios; rewrite it "
                         "with --update-baseline")
    now = calibrate()
    return Scale(now["execute_s"] / stored["execute_s"], now["compile_s"] / stored["compile_s"])


def compare_check(baseline: Samples, current: Samples, scale: Scale,
                  alpha: float) -> tuple[tuple[Regression, ...], tuple[Regression, ...]]:
    """(every figure compared, the regressions among them) for the functions present in both runs.

    A regression is a slowdown beyond run-to-run noise: the runs' medians fail a one-sided Student t
    prediction test against the baseline's repeated runs (p < alpha) and, for execute time, the calls'
    bootstrap interval of the median ratio lies above 1. With a single baseline run no run-to-run noise was
    measured: execute time then falls back to the one-sided permutation test on the calls' times, and compile
    time (one figure a run) is not compared.
    """
    compared: list[Regression] = []
    regressed: list[Regression] = []
    for name, base in baseline.items():
        now = current.get(name)
        if now is None:
            continue
        for figure in (_execute(name, base, now, scale, alpha), _compile(name, base, now, scale, alpha)):
            if figure is not None:
                compared.append(figure[0])
                if figure[1]:
                    regressed.append(figure[0])
    return tuple(compared), tuple(regressed)


def _execute(function: str, base: dict[str, list[float]], now: dict[str, list[float]], scale: Scale,
             alpha: float) -> tuple[Regression, bool] | None:
    calls = [v / scale.execute for v in now["execute_samples_s"]]
    runs = [v / scale.execute for v in now["execute_run_medians_s"]]
    base_calls, base_runs = base["execute_samples_s"], base["execute_run_medians_s"]
    if len(base_calls) < MIN_SAMPLES or len(calls) < MIN_SAMPLES:
        return None
    ratio, p_calls, interval = median_ratio_test(base_calls, calls, confidence=1 - alpha)
    medians = float(np.median(base_calls)), float(np.median(calls))
    if len(base_runs) >= 2 and runs:
        p_runs, bound = run_level_test(base_runs, runs, alpha)
        test = (f"one-sided t prediction test on run medians, {len(base_runs)} baseline runs vs {len(runs)}; "
                f"calls' interval by bootstrap{scale.note}:")
        return (Regression(function, "execute_median_s", *medians, ratio, test, p_runs, interval, bound),
                p_runs < alpha and interval[0] > 1.0)
    test = (f"one-sided permutation test on {len(base_calls)} vs {len(calls)} calls' times (one baseline run: "
            f"run-to-run noise not measured){scale.note}:")
    return (Regression(function, "execute_median_s", *medians, ratio, test, p_calls, interval, 1.0),
            p_calls < alpha and interval[0] > 1.0)


def _compile(function: str, base: dict[str, list[float]], now: dict[str, list[float]], scale: Scale,
             alpha: float) -> tuple[Regression, bool] | None:
    runs = [v / scale.compile for v in now["compile_samples_s"] if v > 0]
    base_runs = [v for v in base["compile_samples_s"] if v > 0]
    if len(base_runs) < 2 or not runs:
        return None
    p_runs, bound = run_level_test(base_runs, runs, alpha)
    medians = float(np.median(base_runs)), float(np.median(runs))
    test = f"one-sided t prediction test on compile times, {len(base_runs)} baseline runs vs {len(runs)}{scale.note}:"
    return (Regression(function, "compile_s", *medians, medians[1] / medians[0], test, p_runs, None, bound),
            p_runs < alpha)
