"""Parent side: read failures out of contained runs, and the interestingness test built on them.

A :class:`Failure` is a signature plus the evidence that the failure is still *the JAX failure*: where it
happened, whether the exception came from inside JAX, which jitted function ran last, whether JAX did any
work at all. :class:`Checker` runs candidate scripts contained (in parallel) and accepts one only if it
fails with the same signature, from the protected statement, with the same evidence, and is not a
``raise``/``assert`` of constants.

Example:
    >>> failures = observe(run_contained(RunRequest(script="bug.py"), env=CHILD_ENV))   # doctest: +SKIP
    >>> failures[0].signature.kind                                                           # doctest: +SKIP
    'exception'
"""

from __future__ import annotations

import ast
import os
import re
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from jaxdbg._source import SourceLocation
from jaxdbg._tracebacks import embedded_raise
from jaxdbg.repro.determinism import deterministic
from jaxdbg.repro.forkserver import ForkServer
from jaxdbg.repro.frames import in_jax
from jaxdbg.repro.jobs import CHILD_ENV, RunRequest
from jaxdbg.repro.messages import CheckFired, FailureSeen, JaxWork, JitCallSeen, LastJit
from jaxdbg.repro.signature import Criterion, FailureSignature, matches_pattern, without_frames
from jaxdbg.repro.source import State, find_statement, is_constant_raise, parse, statement_lines
from jaxdbg.runner import Outcome, first_line, run_contained

# Preference when a run shows several failures and --kind does not say: what the user saw end the run first.
PRIORITY = ("exception", "crash", "timeout", "nonfinite", "mismatch")
STILL_FAILS_WITHOUT_JIT = "it fails the same way with jit disabled, unlike the original"


@dataclass(frozen=True)
class Failure:
    """One failure seen in a contained run, with the evidence that ties it to JAX."""

    signature: FailureSignature
    raw: str
    location: SourceLocation | None
    raised_in_jax: bool = False
    last_jit: str | None = None
    jax_work: bool = False
    seen: FailureSeen | None = None  # what the jit watch reported, for failures it saw
    check: CheckFired | None = None  # a runtime check that fired inside jit: what its condition read

    def describe(self) -> str:
        where = f" at {self.location}" if self.location else ""
        return f"{self.raw}{where}"


_TB_FILE = re.compile(r'^\s*File "([^"]+)", line \d+', re.M)


def raised_inside_jax(traceback_text: str) -> bool:
    """True when the innermost frame of a (full) traceback lies in jax or jaxlib."""
    files = _TB_FILE.findall(traceback_text or "")
    return bool(files) and in_jax(files[-1])


def headline(message: str | None) -> str:
    """The line that says what an exception is: its first line, with the next one joined in when the first
    ends announcing it. JAX does so ("... The error was:" of a non-hashable static argument, "... but they
    differ:" of a scan carry): the first line alone drops the cause, and repro's texts would quote it so.

    Example:
        >>> headline("Non-hashable static arguments are not supported. The error was:\\nTypeError: unhashable type")
        'Non-hashable static arguments are not supported. The error was: TypeError: unhashable type'
        >>> headline("index 9 out of bounds\\nsome detail")
        'index 9 out of bounds'
    """
    text = without_frames(message).strip()
    line, lines = first_line(text), [x.strip() for x in text.splitlines() if x.strip()]
    if line.endswith(":") and len(lines) > 1 and line == lines[0]:
        return first_line(f"{line} {lines[1]}")
    return line


def observe(outcome: Outcome) -> list[Failure]:
    """Every failure one contained run showed: the one that ended it first, then those the watch saw."""
    jax_work = bool(outcome.all(JaxWork))
    calls = outcome.all(JitCallSeen)
    last = outcome.last(LastJit)
    last_jit = (last.function if last else None) or (calls[-1].function if calls else None)
    common: dict[str, Any] = {"last_jit": last_jit, "jax_work": jax_work}
    found: list[Failure] = []
    if outcome.status == "exception" and outcome.exception is not None:
        exc = outcome.exception
        # A host callback's exception comes back as text: it was raised where its own traceback says.
        where = embedded_raise(exc.message) or exc.user_frame
        sig = FailureSignature.of(Criterion.exception(exc.type, exc.message), location=where)
        fired = outcome.all(CheckFired)
        found.append(Failure(sig, f"{exc.type}: {headline(exc.message)}", where,
                             raised_inside_jax(exc.traceback), check=fired[0] if fired else None, **common))
    elif outcome.status == "crash":
        found.append(Failure(FailureSignature("crash", signal=outcome.signal), f"crash with {outcome.signal}",
                             outcome.crash_frame, **common))
    elif outcome.status == "timeout":
        found.append(Failure(FailureSignature("timeout"), f"timeout after {outcome.elapsed_s:.1f}s",
                             outcome.crash_frame, **common))
    elif outcome.status == "exit":
        found.append(Failure(FailureSignature("crash", message=f"exit status {outcome.returncode}"),
                             f"exit status {outcome.returncode}", None, **common))
    for event in outcome.all(FailureSeen):
        if event.kind == "nonfinite":
            criterion = Criterion.nonfinite(event.what or "NaN")
        else:
            criterion = Criterion.mismatch(event.reference or "op-by-op")
        loc = event.location
        found.append(Failure(FailureSignature.of(criterion, event.function, loc),
                             f"{event.message} in jit({event.function})", loc, True, event.function, True, event))
    return found


def choose(failures: Sequence[Failure], kind: str | None, pattern: str | None) -> Failure | None:
    """The failure to keep: of ``kind`` (if given), matching ``pattern`` (if given), by PRIORITY."""
    ranked = sorted(failures, key=lambda f: PRIORITY.index(f.signature.kind))
    for failure in ranked:
        if kind and failure.signature.kind != kind:
            continue
        if not matches_pattern(failure.signature, failure.raw, pattern):
            continue
        return failure
    return None


class Checker:
    """The interestingness test: run candidate scripts contained and compare with the target failure."""

    def __init__(self, target: Failure, request: RunRequest, *, script_name: str, work_dir: str,
                 original_path: str | None, timeout: float | None, jobs: int = 2, companions: dict | None = None,
                 env: dict | None = None, jit_sensitive: bool = False, flaky: bool = False, cwd: str | None = None,
                 preload: Sequence[str] = ()):
        self.target, self.request = target, request
        self.cwd = cwd  # where candidates run (a scratch mirror of the user's folder, see core.scratch_folder)
        self.flaky = flaky
        # The original stops failing with jit disabled: a candidate must too (else it no longer needs jit).
        self.jit_sensitive = jit_sensitive
        # That op-by-op run costs two to three times a jitted one (every operation lowered and compiled alone) and
        # almost never rejects: a reducer may ask it of a few accepted candidates only (SourceReducer.slow_test).
        self.defer_jit = False
        self.env = env if env is not None else CHILD_ENV
        self.companions = dict(companions or {})  # files every candidate needs beside it (inputs.npz)
        self.script_name, self.work_dir = script_name, work_dir
        self.original_path = original_path
        self.timeout, self.jobs = timeout, max(1, jobs)
        # While a reduction runs: its deadline. A candidate still running then is stopped (it could no longer be
        # used), so --max-time and repro_source.py's budget hold instead of being overrun by whole candidate runs.
        self.deadline: float | None = None
        self.checks = 0
        self.last_rejections: list[str] = []
        self.original_degenerate = False
        self.original_constant_checks = 0
        if original_path:
            with open(original_path) as handle:
                original = handle.read()
            self.original_constant_checks = constant_checks(original)
            if target.location is not None:
                self.original_degenerate = raises_constants(original, target.location, original_path)
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=self.jobs)
        self._follow_ups = ThreadPoolExecutor(max_workers=self.jobs)
        self._server = ForkServer(self.env, preload)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._follow_ups.shutdown(wait=True)
        self._server.close()

    def run(self, path: str, disable_jit: bool = False) -> Outcome:
        """A contained run of a candidate, forked from the warm server (fresh processes if it is gone)."""
        request = replace(self.request, script=path, disable_jit=disable_jit)
        timeout = self._run_timeout()
        if self._server.alive:
            try:
                return self._server.run(request, timeout=timeout, cwd=self.cwd)
            except RuntimeError:
                pass  # the server is gone: fresh processes from here on
        return run_contained(request, timeout=timeout, env=self.env, cwd=self.cwd)

    def _run_timeout(self) -> float | None:
        """The run's limit: ``timeout``, cut at the deadline, except for a hang (stopped, it would look like one)."""
        if self.deadline is None or self.target.signature.kind == "timeout":
            return self.timeout
        left = max(0.5, self.deadline - time.perf_counter())
        return left if self.timeout is None else min(self.timeout, left)

    def __call__(self, states: Sequence[State]) -> list[bool]:
        lines = [statement_lines(state) for state in states]
        return list(self._pool.map(self.check_text, [s.text for s in states], lines))

    def _written(self, text: str) -> str:
        """A new folder holding the candidate (and its companions); returns the script's path."""
        with self._lock:
            self.checks += 1
            folder = os.path.join(self.work_dir, f"c{self.checks}")
        os.makedirs(folder, exist_ok=True)
        for name, source in self.companions.items():
            os.symlink(source, os.path.join(folder, name))
        path = os.path.join(folder, self.script_name)
        with open(path, "w") as handle:
            handle.write(text)
        return path

    def check_text(self, text: str, lines: tuple[int, int] | None) -> bool:
        """Write the candidate, run it contained, and say whether it fails the same way (with ``defer_jit``, that
        it still needs jit is left to :meth:`still_needs_jit`, asked by the reducer now and then)."""
        path = self._written(text)
        if not self.accepts(self.run(path), path, text, lines):
            return False
        # The follow-up runs of an accepted candidate are independent: at once, a check waits for one, not two
        # (while they run, the batch's other candidates are done and their workers idle).
        follow_ups = [run for run, wanted in ((self.confirm, self.needs_confirm(text)),
                                              (self.needs_jit, self.jit_sensitive and not self.defer_jit)) if wanted]
        if len(follow_ups) < 2:
            return all(run(path, text, lines) for run in follow_ups)
        verdicts = list(self._follow_ups.map(lambda run: run(path, text, lines), follow_ups))
        return all(verdicts)

    def needs_confirm(self, text: str) -> bool:
        """Whether an accepted candidate runs a second time: not for hangs (each run costs the whole timeout), not
        for a flaky original (it would not pass), not for a program whose two runs cannot differ
        (:mod:`jaxdbg.repro.determinism`: the original failed the same way in every detection run)."""
        return not (self.target.signature.kind == "timeout" or self.flaky or deterministic(text))

    def confirm(self, path: str, text: str, lines: tuple[int, int] | None) -> bool:
        """A second run must fail the same way: an edit can make a candidate fail by luck (an unseeded RNG)."""
        with self._lock:
            self.checks += 1
        if self.accepts(self.run(path), path, text, lines):
            return True
        self.last_rejections = ["it failed only once in two runs (flaky)"]
        return False

    def still_needs_jit(self, state: State) -> bool:
        """Whether an accepted candidate still needs jit (its op-by-op run does not fail the same way)."""
        return self.needs_jit(self._written(state.text), state.text, statement_lines(state))

    def needs_jit(self, path: str, text: str, lines: tuple[int, int] | None) -> bool:
        """Run again op by op (jax_disable_jit): the failure must go away, as it did for the original."""
        with self._lock:
            self.checks += 1
        outcome = self.run(path, disable_jit=True)
        if self.accepts(outcome, path, text, lines, evidence=False):
            self.last_rejections = [STILL_FAILS_WITHOUT_JIT]
            return False
        return True

    def accepts(self, outcome: Outcome, path: str, text: str, lines: tuple[int, int] | None,
                evidence: bool = True) -> bool:
        """Whether the run failed the target's way (``evidence=False``: same signature and place suffice)."""
        self.last_rejections = []
        for failure in observe(outcome):
            why = self.difference(failure, path, text, lines, evidence)
            if why is None:
                return True
            self.last_rejections.append(why)
        if not self.last_rejections:
            self.last_rejections.append(f"it {outcome.describe()}")
        return False

    def difference(self, failure: Failure, path: str, text: str, lines: tuple[int, int] | None,
                   evidence: bool = True) -> str | None:
        """None if ``failure`` is the target failure; else why not. Same signature, from the protected
        statement, with the same JAX evidence, and not a raise/assert of constants."""
        target = self.target
        if not failure.signature.same_as(target.signature):
            return f"different failure ({failure.signature.describe()})"
        if target.location is not None:
            if failure.location is None:
                return "no location"
            if self.original_path and _same_file(target.location.file, self.original_path):
                if not _same_file(failure.location.file, path):
                    return f"raised elsewhere ({failure.location})"
                if lines is not None and not lines[0] <= failure.location.line <= lines[1]:
                    return (f"raised at line {failure.location.line}, not by the kept statement "
                            f"(lines {lines[0]}-{lines[1]})")
            elif (failure.location.file, failure.location.line) != (target.location.file, target.location.line):
                return f"raised elsewhere ({failure.location})"
        if not evidence:
            return None
        if target.signature.kind == "exception" and failure.raised_in_jax != target.raised_in_jax:
            return "raised from inside JAX" if failure.raised_in_jax else "no longer raised from inside JAX"
        if target.last_jit is not None and failure.last_jit != target.last_jit:
            return f"the jitted function that ran last is {failure.last_jit}, not {target.last_jit}"
        if target.jax_work and not failure.jax_work:
            return "JAX did no work"
        if not self.original_degenerate and raises_constants(text, failure.location, path):
            return "the failing statement raises constants (degenerate)"
        if constant_checks(text) > self.original_constant_checks:
            return "a runtime check's condition became a constant (degenerate)"
        return other_check_values(target.check, failure.check)


def other_check_values(target: CheckFired | None, seen: CheckFired | None) -> str | None:
    """Why a candidate's runtime check did not fire on what the original's did (None: it did, or there was none).

    The check's message is fixed: only the values its condition read tell that it fired for the user's reason.

    Example:
        >>> from jaxdbg._source import SourceLocation
        >>> here = SourceLocation("a.py", 3, "loss")
        >>> bug = CheckFired(here, ("targets",), ((0.01111, 0.9111),))
        >>> other_check_values(bug, CheckFired(here, ("targets",), ((0.0, 1.0),)))
        'its runtime check fired on other values (targets: 0.0, 1.0, not 0.01111, 0.9111): the cause was cut'
        >>> other_check_values(bug, bug) is None
        True
        >>> one_hot = CheckFired(here, ("labels",), ((0.0, 1.0),), ((0.9, 0.1),))   # width 10
        >>> narrowed = CheckFired(here, ("labels",), ((0.0, 1.0),), ((0.5, 0.5),))   # width 2
        >>> other_check_values(one_hot, narrowed)[:90]
        'its runtime check fired on the same values in other shares (labels: 0.0 50%, 1.0 50%, not '
        >>> other_check_values(one_hot, one_hot) is None
        True
        >>> rows = CheckFired(here, ("targets",), ((0.01111, 0.9111),), ((0.9, 0.1),), ((4, 10),))
        >>> other_check_values(rows, replace(rows, shapes=((1, 10),))) is None   # fewer rows
        True
        >>> other_check_values(rows, replace(rows, shapes=((4, 2),)))
        'its runtime check read targets of shape (4, 2), not rows of shape (10,) ((4, 10)): what it tested was changed'
        >>> probs = CheckFired(here, ("probs",), (("range", 0.01, 0.9, 288),), ((),), ((4, 6, 12),))
        >>> other_check_values(probs, replace(probs, values=(("range", 0.02, 0.8, 72),), shapes=((1, 6, 12),)))
        >>> other_check_values(probs, replace(probs, values=(("range", 0.02, 0.8, 72),), shapes=((4, 1, 12),)))[:66]
        'its runtime check fired on other values (probs: 72 values in [0.02'

    """
    if target is None:
        return None
    if seen is None:
        return "its runtime check did not fire (another statement raised the same message)"
    same = seen.names == target.names
    shapes = zip(target.shapes, seen.shapes) if same and len(target.shapes) == len(seen.shapes) else ()
    fewer = [_fewer_rows(want, got) for want, got in shapes] or [False] * len(target.names)
    for name, want, got, smaller in zip(target.names, target.values, seen.values if same else (), fewer):
        if tuple(want) != tuple(got) and not (smaller and _within(want, got)):
            return (f"its runtime check fired on other values ({name}: {_values(got)}, not {_values(want)}): "
                    "the cause was cut")
    for name, want_shape, got_shape in zip(target.names, target.shapes, seen.shapes if same else ()):
        if len(want_shape) >= 2 and tuple(got_shape[-(len(want_shape) - 1):]) != tuple(want_shape[1:]):
            # a smaller batch keeps every other axis: the rows' width, a sequence's length
            return (f"its runtime check read {name} of shape {_shape(got_shape)}, not rows of shape "
                    f"{_shape(want_shape[1:])} ({_shape(want_shape)}): what it tested was changed")
    for name, values, want, got in zip(target.names, target.values, target.shares,
                                       seen.shares if seen.names == target.names else ()):
        if want and got and not _alike(want, got):
            return (f"its runtime check fired on the same values in other shares ({name}: {_shares(values, got)}, "
                    f"not {_shares(values, want)}): what it tested was changed")
    if seen.names != target.names:
        return f"its runtime check read {', '.join(seen.names)}, not {', '.join(target.names)}"
    return None


def _fewer_rows(want: Sequence[int], got: Sequence[int]) -> bool:
    """Whether ``got`` is ``want`` with fewer rows (a smaller leading axis, or none): a smaller batch.

        >>> _fewer_rows((8, 6), (2, 6)), _fewer_rows((8, 6), (6,)), _fewer_rows((8, 6), (8, 3))
        (True, True, False)
    """
    rest = tuple(want[1:])
    return len(want) >= 1 and (tuple(got) == rest or (
        len(got) == len(want) and tuple(got[1:]) == rest and 0 < got[0] < want[0]))


def _within(want: Sequence, got: Sequence) -> bool:
    """Whether values summarised as a range (too many to list) are what fewer rows of them would read: values
    (listed, or a range of no more of them) inside the original range. Listed values must stay the same.

        >>> _within(("range", 0.0, 1.0, 40), ("range", 0.1, 0.9, 12)), _within(("range", 0.0, 1.0, 40), (0.5, 2.0))
        (True, False)
    """
    if not want or want[0] != "range":
        return False
    low, high, count = want[1], want[2], want[3]
    if got and got[0] == "range":
        return bool(low <= got[1] and got[2] <= high and got[3] <= count)
    return all(isinstance(v, (int, float)) and low <= v <= high for v in got)


SHARE_FACTOR = 1.5  # how far a value's share of the elements may move (a subset of rows moves it a little)


def _alike(want: Sequence[float], got: Sequence[float]) -> bool:
    """Whether each value holds about the same share of the elements: within SHARE_FACTOR of each other.

        >>> _alike((0.9, 0.1), (0.875, 0.125)), _alike((0.9, 0.1), (0.5, 0.5))
        (True, False)
    """
    return len(want) == len(got) and all(max(a, b) <= SHARE_FACTOR * min(a, b) + 0.01 for a, b in zip(want, got))


def _shape(shape: Sequence[int]) -> str:
    return f"({', '.join(str(n) for n in shape)}{',' if len(shape) == 1 else ''})"


def _shares(values: Sequence, shares: Sequence[float]) -> str:
    return ", ".join(f"{v} {s:.0%}" for v, s in zip(values, shares))


def _values(summary: Sequence) -> str:
    if summary and summary[0] == "range":
        return f"{summary[3]} values in [{summary[1]}, {summary[2]}]"
    return ", ".join(str(v) for v in summary)


# Libraries imported once in the warm fork server when the program imports them: candidates then start in
# milliseconds instead of seconds. Only ones known to start no thread and no XLA backend at import (a fork
# after either is unsafe).
PRELOADABLE = ("flax", "flax.nnx", "flax.linen", "optax", "equinox", "chex", "jaxtyping", "einops")


def preloadable(source: str) -> tuple[str, ...]:
    """The PRELOADABLE libraries ``source`` imports (the package and the submodule it names)."""
    try:
        tree = parse(source)
    except SyntaxError:
        return ()
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return tuple(dict.fromkeys(n for n in names if n in PRELOADABLE))


def raises_constants(text: str, location: SourceLocation | None, path: str) -> bool:
    """True when the failing statement of ``text`` raises constants with nothing computed to decide it.

    ``assert 0, "jit and op-by-op disagree"`` is degenerate; ``if not np.allclose(a, b): raise
    AssertionError("...")`` is not (the guard computes), nor is ``assert np.allclose(a, b), "..."``.
    """
    if location is None or not _same_file(location.file, path):
        return False
    try:
        tree = parse(text)
    except SyntaxError:
        return True
    stmt = find_statement(tree, location.line)
    if not is_constant_raise(stmt):
        return False
    parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    node = parents.get(id(stmt))
    while node is not None:
        if isinstance(node, (ast.If, ast.While)) and not is_constant_raise(ast.Assert(test=node.test)):
            return False
        node = parents.get(id(node))
    return True


# Checks that raise from inside a jitted computation, and which argument is the condition they test: a reduction
# that turns that condition into a constant keeps the message but drops the computation that failed.
RUNTIME_CHECKS = {"error_if": 1, "branched_error_if": 1, "check": 0}


def constant_checks(text: str) -> int:
    """How many runtime checks in ``text`` (``eqx.error_if(x, pred, msg)``, ``checkify.check(pred, msg)``) test a
    constant condition, computed from nothing: a degenerate reproducer of the check's message.

    Example:
        >>> constant_checks("import jax.numpy as jnp\\ny = eqx.error_if(y, jnp.abs(1) > 1e-3, 'bad')\\n"
        ...                 "z = eqx.error_if(z, z.sum() > 1, 'bad')")
        1
    """
    try:
        tree = parse(text)
    except SyntaxError:
        return 0
    modules = {(alias.asname or alias.name).split(".")[0] for node in ast.walk(tree)
               if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    found = 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        at = RUNTIME_CHECKS.get(name or "")
        if at is not None and at < len(node.args) and all(
                n.id in modules for n in ast.walk(node.args[at]) if isinstance(n, ast.Name)):
            found += 1  # (its names are imported modules and functions only: `jnp.abs(1) > 1e-3`)
    return found


def _same_file(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)
