"""``jaxdbg.watch``: a context manager and decorator that watches a running program's jitted functions.

While active, every function jitted or pmap'd meanwhile (or before, at module level: see
:func:`jaxdbg.jit_layer.adopted`) has its outputs checked for NaN/Inf (compiled into its program, or for a pmap'd
function run right behind it on each device; read late: see :mod:`jaxdbg.live.hook`) and its compiles
counted. At the first non-finite output the origin is localised in this process by nan-hunt's own analysis
and written, with nan-hunt's ``result``, to ``out/report.json`` (``"command": "watch"``; later findings of an
``action="log"`` run to ``report-2.json``, ...); then :class:`NonFiniteError` is raised
(``action="raise"``) or one line is logged and the run goes on (``action="log"``). With ``max_compiles=N``
a function compiled more than N times raises :class:`RecompileError` (or logs), naming each recompile's cause
as profile's ``recompiles`` do. ``metrics_port=N`` serves the live figures at http://127.0.0.1:N/metrics.
In a multi-process job each process writes to ``out/process-<i>/``.

Example:
    >>> import jax, jax.numpy as jnp
    >>> @watch(out="/tmp/jaxdbg-watch-doc", max_compiles=1, action="log")
    ... def run():
    ...     step = jax.jit(lambda batch: batch.sum())
    ...     return [float(step(jnp.ones(n))) for n in (2, 2, 3)]
    >>> run()
    [2.0, 2.0, 3.0]
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import logging
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Literal

from jaxdbg._errors import UsageError
from jaxdbg._source import SourceLocation
from jaxdbg.live.errors import NonFiniteError, RecompileError, WatchError

log = logging.getLogger("jaxdbg")
ACTIONS = ("raise", "log")


@dataclass(frozen=True)
class RecompileResult:
    """``result`` of a watch report for a function that compiled more than ``max_compiles`` times."""

    function: str
    source: SourceLocation | None  # where the function is defined
    compiles: int
    max_compiles: int
    recompiles: tuple = ()  # profile's entries: {call_index, reason, changes, source}
    hints: tuple[str, ...] = ()  # the usual fix of the main cause (profile's words)
    kind: Literal["recompiles"] = "recompiles"

    def essential_line(self) -> str | None:
        last = self.recompiles[-1]
        at = f" at {last.source.file.rsplit('/', 1)[-1]}:{last.source.line}" if last.source else ""
        calls = [r.call_index for r in self.recompiles]
        # A recompile at every call since the first compile is a cause that changes with each call (a step
        # counter, a schedule's value as a static argument), not an odd batch.
        steady = len(calls) > 1 and calls == list(range(calls[0], calls[-1] + 1))
        every = f", every call since call {calls[0]}" if steady else ""
        fix = f"; fix: {self.hints[0]}" if self.hints else ""
        return (f"{self.function} compiled {self.compiles} times (max_compiles={self.max_compiles}{every}); "
                f"call {last.call_index}{at}: {last.reason}{fix}")


@dataclass
class _State:
    hook: Any
    stack: contextlib.ExitStack
    reported: list = field(default_factory=list)


def _noted(kind: type) -> bool:
    """Whether the program's own exception ending a watched block gets the watch's finding as a note: an error it
    raised, often on seeing the NaN itself (``if not np.isfinite(loss): raise ...``, ``sys.exit(...)``), before the
    watch read that call's flags; not an interrupt, and not a finding of a watch inside this one."""
    return issubclass(kind, (Exception, SystemExit)) and not issubclass(kind, WatchError)


def _note_finding(hook: Any, error: BaseException) -> None:
    """Read the calls not yet read; a finding is analysed and written as usual, and its one line is added to the
    program's exception as a note (its type, message and traceback stay as they are), not raised in its place."""
    found: list[WatchError] = []
    try:
        hook.flush()
    except WatchError as err:
        found.append(err)
    if hook.held is not None:
        found.append(hook.held[1])
        hook.held = None
    for finding in found:
        error.add_note(finding.message)


class watch(contextlib.ContextDecorator):
    """Watch jitted functions for NaN/Inf outputs and recompiles (see the module docstring).

    Args:
        out: folder of ``report.json`` and the analysis artifacts (created when something is found).
        nans: check outputs for NaN/Inf.
        max_compiles: more compiles than this of one function is a finding (None: only counted).
        action: ``"raise"`` the finding's error, or ``"log"`` one line (logger ``jaxdbg``) and go on.
        metrics_port: serve the live figures on http://127.0.0.1:PORT/metrics (Prometheus text format).
        stall_after: no progress for this many seconds is a stall: hang-hunt's verdict is written, then
            ``stall_action`` (``"raise"`` :class:`jaxdbg.StallError`, ``"exit"`` with status 75, ``"log"``);
            see :mod:`jaxdbg.hang.watch`.
    """

    def __init__(self, out: str = "jaxdbg-out/watch", nans: bool = True, max_compiles: int | None = None,
                 action: str = "raise", metrics_port: int | None = None, stall_after: float | None = None,
                 stall_action: str = "raise"):
        if action not in ACTIONS:
            raise UsageError(f"jaxdbg.watch(action={action!r}): unknown action; use 'raise' or 'log'")
        if max_compiles is not None and (not isinstance(max_compiles, int) or max_compiles < 1):
            raise UsageError(f"jaxdbg.watch(max_compiles={max_compiles!r}): give a whole number >= 1, or None")
        if metrics_port is not None and (not isinstance(metrics_port, int) or not 0 <= metrics_port < 65536):
            raise UsageError(f"jaxdbg.watch(metrics_port={metrics_port!r}): give a TCP port number, or None")
        self.out = os.fspath(out)
        self.nans = nans
        self.max_compiles = max_compiles
        self.action = action
        self.metrics_port = metrics_port
        self.stall: Any = None
        if stall_after is not None:  # hang-hunt's recorder and watchdog (checked here: bad values fail at once)
            from jaxdbg.hang.watch import StallWatch

            self.stall = lambda: StallWatch(stall_after, stall_action, lambda result, artifacts: self._write(
                self._folder(), result, artifacts), out=self.out)
            self.stall()
        self.reports: list[str] = []  # report.json paths written (the latest finding last)
        self.metrics_url: str | None = None
        self._states: list[_State] = []

    def __call__(self, func: Any) -> Any:
        """As a decorator. A generator function (a data pipeline, a training loop that yields its metrics) is
        watched while it is iterated: ContextDecorator alone would end the watch as soon as the generator object
        is made, before any of its code ran, and nothing would be checked."""
        if not inspect.isgeneratorfunction(func):
            return super().__call__(func)

        @functools.wraps(func)
        def watched(*args: Any, **kwargs: Any) -> Any:
            with self._recreate_cm():
                return (yield from func(*args, **kwargs))

        return watched

    # -- the context ---------------------------------------------------------------------------------------

    def __enter__(self) -> watch:
        from jaxdbg import jit_layer
        from jaxdbg.live.hook import LiveHook

        hook = LiveHook(self.nans)
        hook.on_nonfinite = functools.partial(self._nonfinite, hook)
        hook.on_compile = functools.partial(self._compiled, hook)
        stack = contextlib.ExitStack()
        stack.callback(hook.stop_holding_freed)
        stack.enter_context(jit_layer.installed(hook))
        stack.enter_context(jit_layer.adopted())  # functions jitted before, at module level: watched too
        if self.stall is not None:
            stack.enter_context(self.stall())
        if self.metrics_port is not None:
            from jaxdbg.live.metrics import WatchCollector
            from jaxdbg.metrics.live import serve

            try:
                self.metrics_url = stack.enter_context(serve(WatchCollector(hook.figures), self.metrics_port,
                                                                 "jaxdbg.watch(metrics_port={port})"))
            except BaseException:
                stack.close()
                raise
        for outer in _OPEN:
            outer.inner += 1
        _OPEN.append(hook)
        stack.callback(_closed, hook)
        self._states.append(_State(hook, stack))
        return self

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> None:
        state = self._states[-1]
        try:
            if kind is None:
                try:
                    state.hook.flush()  # the unread calls' flags: may raise NonFiniteError
                except WatchError as found:
                    raise found.with_traceback(None) from None  # from the block's end, not from jaxdbg's reading
                if state.hook.held is not None:  # another thread's finding that thread did not call again to get
                    held, state.hook.held = state.hook.held[1], None
                    raise held
                if not any(row.calls for row in state.hook.figures.functions.values()):  # no watched call
                    log.warning("jaxdbg.watch: no jitted call was watched, so nothing was checked: %s",
                                _why_nothing_was_watched(state.hook))
            elif _noted(kind):
                _note_finding(state.hook, error)
        finally:
            self._states.pop()
            state.stack.close()

    # -- findings ------------------------------------------------------------------------------------------

    def _nonfinite(self, hook: Any, finding: Any) -> None:
        from jaxdbg import jit_layer, multihost
        from jaxdbg.nan.api import HuntOptions
        from jaxdbg.nan.session import analyse_finding

        names = tuple(dict.fromkeys(f.name for f in hook.functions))
        with jit_layer.internal():  # every step after the origin is guarded: a failed one is a warning in it
            result, artifacts = analyse_finding(finding, hook, HuntOptions(out_dir=self.out), names)
        for warning in result.warnings:
            log.warning("jaxdbg.watch: %s", warning.line())
        path = self._write_or_warn(result, artifacts)
        line = result.essential_line(job=multihost.job() is not None) or "a jitted call returned NaN/Inf"
        line = multihost.naming_this_process(line)
        said = f" (report: {path})" if path else " (no report could be written)"
        self._act(hook, NonFiniteError(f"jaxdbg.watch: {line}{said}", _jsonable(result), path), hook.finding_thread)

    def _compiled(self, hook: Any, function: Any, count: int, recompile: Any) -> None:
        if self.max_compiles is None or count <= self.max_compiles or recompile is None:
            return
        seen = hook.compiles[function.record.id]
        from jaxdbg import multihost
        from jaxdbg.profile.hints import recompile_fix

        fix = recompile_fix(seen.recompiles, function.is_pmap)[2]
        result = RecompileResult(function.name, function.record.source, count, self.max_compiles,
                                 tuple(seen.recompiles), (fix,))
        path = self._write_or_warn(result, {})
        said = f" (report: {path})" if path else " (no report could be written)"
        line = multihost.naming_this_process(result.essential_line() or "")
        self._act(hook, RecompileError(f"jaxdbg.watch: {line}{said}", _jsonable(result), path))

    def _act(self, hook: Any, error: Exception, thread: int | None = None) -> None:
        if self.action == "raise":
            if thread is not None and thread != threading.get_ident():
                # Read late, another thread's call may read the finding: raised there, it would stop a healthy
                # worker and leave the one that made the NaN running. It is raised at that thread's next watched
                # call instead, or when the block ends.
                hook.held = (thread, error)
                return
            if hook.inner:
                # A watch entered inside this one is still open: it sees the same calls and raises its own error
                # with its own report. This one's report is written; its error waits for its next call after the
                # inner watch ended, or its own block's end (it goes if the inner error ends this block too).
                hook.held = (threading.get_ident(), error)
                return
            raise error
        log.warning("%s", error)

    def _folder(self) -> str:
        from jaxdbg import multihost

        folder = multihost.process_folder(self.out)
        os.makedirs(folder, exist_ok=True)
        return folder

    def _write_or_warn(self, result: Any, artifacts: dict) -> str | None:
        """Write the finding's report; one that cannot be written (``out`` unwritable) is a warning line, and the
        finding's error is still raised (it carries ``report``), without a path."""
        try:
            return self._write(self._folder(), result, artifacts)
        except OSError as err:
            log.warning("jaxdbg.watch: could not write the report into %r (%s: %s); the error raised carries it",
                        self.out, type(err).__name__, err)
            return None

    def _write(self, folder: str, result: Any, artifacts: dict) -> str:
        from jaxdbg.report import Report

        name = "report.json" if not self.reports else f"report-{len(self.reports) + 1}.json"  # action="log" goes on
        path = os.path.join(folder, name)
        report = Report("watch", _program(), result, 1, {**artifacts, "report": path})
        with open(path, "w") as handle:
            json.dump(report.to_dict(), handle, indent=2, allow_nan=False)
            handle.write("\n")
        self.reports.append(path)
        return path


# The hooks of the watches open now, the first entered first (a watch knows how many were entered inside it).
_OPEN: list[Any] = []


def _closed(hook: Any) -> None:
    if hook in _OPEN:
        for outer in _OPEN[:_OPEN.index(hook)]:
            outer.inner -= 1
        _OPEN.remove(hook)


def _jsonable(result: Any) -> dict:
    from jaxdbg.report import to_jsonable

    return to_jsonable(result)


def _program() -> str | None:
    """The running program, as a target would name it (its script), or None (an interactive session)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return os.path.relpath(path) if path and not os.path.relpath(path).startswith("..") else path


def _why_nothing_was_watched(hook: Any) -> str:
    """What the program did instead of calling a watched function, and what to do (the warning of a watch that saw
    no call)."""
    import jax

    from jaxdbg import _compat, jit_layer

    traced = {f.name: f.record.traced_by for f in hook.functions if f.record.traced_by and not f.record.calls}
    if traced:
        name, how = next(iter(traced.items()))
        names = ", ".join(traced)
        example = f"jax.jit({how}({name}))" if how in ("jax.grad", "jax.vmap", "jax.jvp") else "jax.jit(outer)"
        return (f"{names} ran only inside {how} applied outside jit, which traces it: its work ran as operations "
                f"outside any jitted call, and those are not checked. Apply jax.jit to the transformed function inside "
                f"the watch ({example}), or run the program under `jaxdbg nan-hunt`, which checks operations run "
                f"outside jit too")
    found: dict[str, list[str]] = {"compiled": [], "pmapped": []}
    for namespace in jit_layer.user_namespaces():
        for name, value in list(namespace.items()):
            if isinstance(value, jax.stages.Compiled):
                found["compiled"].append(name)
            elif _compat.is_pmapped(value):
                found["pmapped"].append(name)
    reasons = []
    if found["compiled"]:
        reasons.append(f"{', '.join(found['compiled'])}: compiled ahead of time (jax.jit(f).lower(...).compile()) "
                       "before the watch began, so its calls cannot be watched; compile inside the watch (its calls "
                       "are then watched)")
    if found["pmapped"]:
        reasons.append(f"jax.pmap'd functions ({', '.join(found['pmapped'])}) made before the watch began with both "
                       "static and donated arguments cannot be rebuilt to be watched; apply jax.pmap inside the watch")
    if reasons:
        return "; ".join(reasons) + ", or run the program under `jaxdbg nan-hunt`"
    return ("functions jitted before the watch began are watched only when bound to a global name or a class "
            "attribute of the program's modules, or to an attribute of an object of its classes held there or in a "
            "local variable of the code entering the watch (one held in a local variable itself is not): "
            "enter the watch before jax.jit is applied to the others (decorate main), or run the program under "
            "`jaxdbg nan-hunt`")
