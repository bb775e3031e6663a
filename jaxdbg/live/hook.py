"""The hook behind :func:`jaxdbg.watch`: nan-hunt's :class:`~jaxdbg.nan.watch.Watch` made cheap enough for a run
of days, plus a compile counter that names each recompile's cause as profile does.

- NaN/Inf: the jit layer's check (``max(|x|)`` per floating output, compiled into the same program),
  read late (nan-hunt's ``Watch(read_late=True)``): at each call, the flags of the earlier calls that have
  finished are read, oldest first, and the host never waits in the steady state (a sync per step, even one
  call late, cost ~15% on a CPU training loop); in a multi-process job, call k's at call k+1. The inputs of
  the unread calls are kept, so the first bad call is still found and replayed exactly (NNX calls too: the
  replay enters NNX's update context, :func:`jaxdbg.frameworks.tracing_context`); the error is raised from
  a later call (or when the watch ends). Eager operations are not checked (nan-hunt's eager check sends
  every eager jitted call through Python dispatch) and arguments are not measured for growth: outputs are.
- Compiles: a watched call during which ``jax.monitoring`` reported trace / lower / compile spans (the jit
  layer files them in ``call.spans``) compiled. Its signature is diffed against the function's earlier compiles by
  :mod:`jaxdbg.profile.signature`, the same words as profile's ``recompiles``.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from jaxdbg import jit_layer
    >>> seen = []
    >>> hook = LiveHook(nans=False, on_compile=lambda fn, count, why: seen.append((count, why and why.reason)))
    >>> with jit_layer.installed(hook):
    ...     f = jax.jit(lambda batch: batch * 2)
    ...     _ = f(jnp.ones(3)); _ = f(jnp.ones(3)); _ = f(jnp.ones(4))
    >>> seen
    [(1, None), (2, "argument 'batch' shape changed (3,) -> (4,)")]
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from jaxdbg import jit_layer
from jaxdbg._source import caller_user_frame
from jaxdbg.jit_layer import InstrumentedJit, JitCall
from jaxdbg.live.errors import WatchError
from jaxdbg.live.figures import Figures
from jaxdbg.nan.watch import EagerFinding, JitFinding, Watch
from jaxdbg.profile.model import Recompile
from jaxdbg.profile.signature import Signature, call_signature, explain, parameter_names
from jaxdbg.runner import first_line

_KEEP_SIGNATURES = 32
log = logging.getLogger("jaxdbg")


def _shown(found: WatchError) -> WatchError:
    """A finding as the program sees it: raised from the watched call (or the block's end), its traceback without
    the dozen frames of jaxdbg's reading and analysis that came up with it (they are jaxdbg's, not the program's)."""
    return found.with_traceback(None)


class _Compiles:
    """One function's compiles: how many, and the signatures and callables jax compiled for."""

    def __init__(self) -> None:
        self.count = 0
        self.signatures: list[Signature] = []
        self.callables: list[Any] = []  # strong refs: an id() could be reused by a later lambda
        self.recompiles: list[Recompile] = []
        self.cleared = False  # jax's caches were cleared by jaxdbg since its latest compile


class LiveHook(Watch):
    """A :class:`Watch` without eager checks, with a one-call-late host read, and a compile counter.

    ``on_nonfinite(finding)`` is called at the first non-finite call (then the NaN check stops; later bad
    calls are only counted); ``on_compile(function, count, recompile_or_None)`` after each compile. Calls of
    pmap'd functions are watched too (``sees_pmap``): their outputs are checked in the same program, per device
    (see :meth:`jaxdbg.jit_layer.InstrumentedPmap.checked`), and a finding is replayed as nan-hunt replays a
    pmap, naming the device.
    """

    sees_pmap = True

    def __init__(self, nans: bool = True,
                 on_nonfinite: Callable[[JitFinding | EagerFinding], None] | None = None,
                 on_compile: Callable[[InstrumentedJit, int, Recompile | None], None] | None = None,
                 figures: Figures | None = None):
        super().__init__(eager=False, after_inf=0, read_late=True, hold_freed=True)
        self.check_outputs = nans
        self.nans = nans
        self.on_nonfinite = on_nonfinite
        self.on_compile = on_compile
        self.figures = figures if figures is not None else Figures()
        self.compiles: dict[int, _Compiles] = {}
        self.active = nans
        self.stopped = False  # an internal failure stopped the watch (see stop)
        self.finding_thread: int | None = None  # the thread whose call made the finding being read
        self.held: tuple[int, BaseException] | None = None  # (thread, error): raised at that thread's next call
        self.inner = 0  # watches entered inside this one and still open: this one's error waits for them to end
        # The unread calls are one queue for every thread: two threads reading it at once popped the same entry
        # (IndexError), and the watch stopped. Re-entrant: a compile's flush and a finding's analysis read it too.
        self._lock = threading.RLock()

    # -- one call ------------------------------------------------------------------------------------------

    def watches(self, function: InstrumentedJit) -> bool | None:
        return not self.stopped and super().watches(function)  # once stopped, calls go straight to jax

    def around(self, call: JitCall, run: Callable[[], Any]) -> Any:
        """One watched call, written out on one path: it runs on every call of every watched function. jaxdbg's
        own part is guarded (see :meth:`_failed`); the user's call raises what it raises, unchanged."""
        if self.stopped:  # planned before the stop
            return run()
        if self.held is not None and self.held[0] == threading.get_ident() and not self.inner:
            held, self.held = self.held[1], None
            raise held
        # The earlier calls that have finished, before this one allocates. The lock is taken only to read (and
        # not by `with`: an RLock's acquire() and release() cost half as many instructions).
        lock = self._lock
        if self._pending and self.active and (due := self._reads_due()):
            try:
                lock.acquire()
                try:
                    self._read_finished(due)
                finally:
                    lock.release()
            except WatchError as found:
                raise _shown(found) from None
            except Exception as err:  # noqa: BLE001 - jaxdbg's own failure: see _failed
                self._failed(err)
        active = self.active
        # Kept for the replay: device copies, before the call deletes them (made once: nested watches share them).
        if active and call.function.donates and "nan_copies" not in call.notes:
            try:
                if jit_layer.donates_arrays(call):
                    call.notes["nan_copies"] = jit_layer.device_copies((call.args, call.kwargs))
                    call.notes["copied"] = True
            except Exception as err:  # noqa: BLE001 - jaxdbg's own failure: see _failed
                self._failed(err)
        try:
            out = run()
        except BaseException as err:
            self._guarded(self.on_exception, call, err)
            raise
        try:
            lock.acquire()
            try:
                self._finish(call, out, active)
            finally:
                lock.release()
        except WatchError as found:
            raise _shown(found) from None
        except Exception as err:  # noqa: BLE001 - never the user's exception, never the end of the user's run
            self._failed(err)
        return out

    def _finish(self, call: JitCall, out: Any, active: bool) -> None:
        function = call.function
        row = self.figures.functions.get(function.name) or self.figures.function(function.name)
        row.called(call.started)  # its start: the interval between two calls' starts is the step
        if call.spans:
            if self.active:  # the calls before it come first: a NaN they made is reported before a recompile
                self.flush()
            self._compiled(call, [end - start for _, start, end in call.spans], row)
        if call.magnitudes is None or self.stopped:  # nans=False: compiles only
            return
        site = caller_user_frame(5)  # the caller of InstrumentedJit.__call__ when no other hook wraps this one
        if active and self.active:
            self.keep_inputs(call)
            seen = self._watched.get(function.record.id)
            if seen is None or seen.leaf_names is None:
                self.seen(function, out, site)  # at the first call: output names from its line
        call.notes["thread"] = threading.get_ident()  # the finding's error goes to this thread: see watch._act
        self.defer(call, site)  # not its outputs: holding them too would keep one more copy of a model

    def on_compile_ahead(self, call: JitCall) -> None:
        """``jax.jit(f).lower(...).compile()``: one more compile of ``f`` (``max_compiles`` counts it)."""
        try:
            with self._lock:
                if not self.stopped:
                    self._compiled(call, [end - start for _, start, end in call.spans],
                                   self.figures.function(call.function.name))
        except WatchError as found:
            raise _shown(found) from None
        except Exception as err:  # noqa: BLE001 - jaxdbg's own failure: see _failed
            self._failed(err)

    def flush(self) -> None:
        with self._lock:
            self._guarded(super().flush)

    def _guarded(self, work: Callable[..., None], *args: Any) -> None:
        """Run jaxdbg's own part of a call. Its findings (NonFiniteError, RecompileError) reach the program; any
        other failure is jaxdbg's: see :meth:`_failed`."""
        if self.stopped:
            return
        try:
            work(*args)
        except WatchError:
            raise
        except Exception as err:  # noqa: BLE001 - never the user's exception, never the end of the user's run
            self._failed(err)

    def _failed(self, err: Exception) -> None:
        """A failure of jaxdbg's own: one warning line, and the watch stops (the program goes on unwatched)."""
        self.stop(f"{type(err).__name__}: {first_line(str(err))}")
        log.debug("jaxdbg.watch stopped by this error", exc_info=err)

    def stop(self, why: str) -> None:
        """Stop watching for good after an internal failure: one warning line, nothing more is checked; calls go
        straight to jax's dispatch from the next one on (the layer plans them again)."""
        if self.stopped:  # another thread's call failed first: said once
            return
        self.stopped, self.active = True, False
        self._pending.clear()
        self._to_copy.clear()
        self._kept_bytes = 0
        jit_layer.replan()
        log.warning("jaxdbg.watch: stopped watching after a failure of its own (%s); the program goes on unwatched "
                    "(logger 'jaxdbg' at DEBUG level has the traceback)", why)

    def _check(self, call: JitCall) -> None:
        """Read one unread call's flags: counted even after the finding; the steady state is growth only."""
        host = call.host_magnitudes()
        finite = bool(np.isfinite(host).all())
        if not finite:
            self.figures.function(call.function.name).nonfinite += 1
        if not self.active:
            return
        seen = self._watched.get(call.function.record.id)
        if finite and seen is not None and seen.leaf_names is not None:  # the steady state: growth only
            self.calls += 1
            self.growth.update(call.function.name, seen.leaf_names, host, call.index, seen.call_site,
                               key=self.series_key(call.function))
            return
        self.finding_thread = call.notes.get("thread")
        self.read(call, None, call.notes.get("site"))  # nan-hunt's reading (growth, the finding and its replay)

    def _measure_fresh_arguments(self, call: JitCall, leaves: list | None = None) -> None:
        return None  # an extra reduction per call: left to nan-hunt

    def found(self, finding: JitFinding | EagerFinding, final: bool = False) -> int:
        self.finding = finding
        self.active = False  # the first finding is the answer; later calls are only counted
        for seen in self.compiles.values():  # its analysis clears jax's caches: the next compile is jaxdbg's
            seen.cleared = True
        if self.on_nonfinite is not None:
            self.on_nonfinite(finding)
        return 0

    # -- compiles ------------------------------------------------------------------------------------------

    def _compiled(self, call: JitCall, spans: list[float], row: Any) -> None:
        function = call.function
        seen = self.compiles.setdefault(function.record.id, _Compiles())
        try:
            signature = call_signature(function.fun, call.args, call.kwargs, function.static_argnums,
                                       function.static_argnames, parameter_names(function.fun))
        except Exception:  # noqa: BLE001 - an odd argument must not break the user's run
            signature = Signature(())
        if seen.cleared and signature in seen.signatures and any(f is function.fun for f in seen.callables):
            seen.cleared = False  # compiled again only because the analysis of a finding cleared jax's caches
            return
        seen.cleared = False
        recompile = None
        if seen.signatures:
            site = str(function.record.source) if function.record.source else ""
            same = any(f is function.fun for f in seen.callables)
            recompile = explain(seen.signatures, signature, same_callable=same, call_index=call.index,
                                callable_site=site)
            recompile = dataclasses.replace(recompile, source=caller_user_frame(2))  # the line that called it
            seen.recompiles.append(recompile)
        seen.signatures = [*seen.signatures, signature][-_KEEP_SIGNATURES:]
        seen.callables = [*seen.callables, function.fun][-_KEEP_SIGNATURES:]
        seen.count += 1
        row.compiles += 1
        row.compile_s += sum(spans)
        if self.on_compile is not None:
            self.on_compile(function, seen.count, recompile)
