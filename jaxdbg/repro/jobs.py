"""Contained-run jobs of ``jaxdbg repro`` (they run in the child process started by ``run_contained``).

- :func:`target_job` runs a script (the original, a candidate, or the final reproducer) or a function
  target under the :mod:`jit watch <jaxdbg.repro.watch>` and reports what it saw on the channel.
- :func:`cut_job` runs the target until the failing jitted call, captures its jaxpr and inputs, cuts the
  computation down (:mod:`jaxdbg.repro.cut`) and writes the reproducer into a work folder.
- with ``operation_dir``, :func:`target_job` also writes the JAX operation an exception came from alone
  (:mod:`jaxdbg.repro.operation`), as the exception passes: its frames are gone once it is reported.

Messages: :mod:`jaxdbg.repro.messages`; ``progress`` is a file (not a message) so the parent can poll it.

Example:
    >>> outcome = run_contained(RunRequest(script="bug.py"))   # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import jax
import jax.monitoring

from jaxdbg import jit_layer, multihost
from jaxdbg.protocol import Request, handles
from jaxdbg.repro.callback import cut_callback, recorded_callbacks
from jaxdbg.repro.checks import recorded_checks
from jaxdbg.repro.cutting import OVERRUN_S, OverrunGuard, cut_captured
from jaxdbg.repro.messages import CutFinished, InputsBuilt, JaxWork, LastJit
from jaxdbg.repro.operation import cut_operation
from jaxdbg.repro.signature import Criterion
from jaxdbg.repro.watch import JitWatch, StopRun, WatchConfig
from jaxdbg.target import TargetSpec, flatten_inputs, load_function, load_inputs, run_script

CUT_DONE = multihost.Topic("repro", "cut", bool)  # process 0 has cut the job's computation: the others may leave
# Full tracebacks (with JAX's frames) tell whether an exception came from inside JAX.
CHILD_ENV = {"JAX_TRACEBACK_FILTERING": "off"}


def reduction_env(cache_dir: str) -> dict[str, str]:
    """Environment of the many runs of one reduction: a shared persistent compilation cache.

    Candidates repeat most of the original's (eager and jitted) compilations; on disk they cost milliseconds
    instead of seconds (measured 5.5 s -> 2.0 s per run of the shape-error recipe). A cache the user set up
    is left alone. The final verification runs without it, as ``python repro.py`` would.
    """
    env = dict(CHILD_ENV)
    if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        env.update(JAX_COMPILATION_CACHE_DIR=cache_dir, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                   JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1")
    return env


@dataclass(frozen=True)
class RunRequest(Request):
    """What a contained run executes: a script (``script``, ``argv``) or a function target (``function``)."""

    script: str | None = None
    argv: tuple[str, ...] = ()
    sys_path: tuple[str, ...] = ()
    function: TargetSpec | None = None  # a function target: run as jax.jit(func)(*inputs)
    inputs: str | None = None
    args: str | None = None
    seed: int = 0
    watch: WatchConfig | None = None
    disable_jit: bool = False  # run op by op, as JAX_DISABLE_JIT=1 would
    operation_dir: str | None = None  # on an exception, write its failing operation alone in a folder here


@dataclass(frozen=True)
class CutRequest(Request):
    """A cut: run ``run`` (its watch captures the failure), cut for ``budget_s``, write into ``work_dir``."""

    run: RunRequest
    work_dir: str
    progress_path: str
    budget_s: float
    rtol: float = 1e-3
    atol: float = 1e-5


@dataclass(frozen=True)
class InputsRequest(Request):
    """Build a function target's inputs (``--inputs file.py::make_inputs`` or ``--args``) in a child."""

    inputs: str | None = None
    args: str | None = None
    seed: int = 0


@handles(RunRequest)
def target_job(request: RunRequest, channel: Any) -> None:
    """Run the target; exceptions propagate (the child reports them) after naming the last jitted call and,
    with ``operation_dir``, writing the JAX operation that raised alone (:mod:`jaxdbg.repro.operation`)."""
    with (_jax_work_listener(channel), _watched(request, channel) as watch, recorded_callbacks() as callbacks,
          recorded_checks(channel, _script_text(request))):
        try:
            _run(request, channel)
        except StopRun:
            return
        except BaseException as err:
            last = watch.last if watch is not None else None
            if watch is not None:
                channel.send(LastJit(last))
            if request.operation_dir is not None and isinstance(err, Exception):
                failed = callbacks.failure if callbacks.failure and callbacks.failure.explains(err) else None
                _cut_operation(err, request.operation_dir, last, channel, failed)
            raise


def _cut_operation(err: Exception, folder: str, last_jit: str | None, channel: Any, callback: Any = None) -> None:
    """Cut the exception to its operation (or to the host callback it was raised in, when ``callback`` says
    which) while its frames are still alive (right where it was caught)."""
    try:
        os.makedirs(folder, exist_ok=True)
        where, origin = tempfile.mkdtemp(dir=folder), f"jit({last_jit})" if last_jit else ""
        criterion = Criterion.exception(type(err).__name__, str(err))
        with jit_layer.internal():  # the check runs the written program: not a jitted call of the target's
            summary = (cut_operation(err, where, criterion, origin) if callback is None
                       else cut_callback(callback, where, criterion, origin))
        channel.send(summary)
    except Exception as failure:  # noqa: BLE001 - the run's own exception is what must reach the parent
        channel.send(CutFinished(False, reason=f"{type(failure).__name__}: {failure}"))


@handles(CutRequest)
def cut_job(request: CutRequest, channel: Any) -> None:
    """Capture the failing jitted call, cut it, and write repro.py (+ inputs.npz, repro.stablehlo.mlir)."""
    started = time.perf_counter()
    with _watched(request.run, channel) as watch:
        try:
            _run(request.run, channel)
        except StopRun:
            pass
        except Exception:  # noqa: BLE001 - the target failed some other way before the call was seen
            pass
    if watch is None or watch.captured is None:
        reason = (watch.capture_error if watch else None) or "the failing jitted call was not seen again"
        channel.send(CutFinished(False, reason=reason))
        return
    deadline = started + request.budget_s
    place = multihost.job()
    if place is not None and place.index != 0:
        # The capture holds the job's whole inputs in every process: process 0 alone cuts them (one process,
        # no collective left), while this one stays in the job until it is done (a process that leaves early
        # is reported lost by the job's runtime, which then stops the others).
        channel.send(CutFinished(False, reason=f"process 0 cuts the job's computation (this is process {place.index})"))
        multihost.wait_for(CUT_DONE, 0, max(deadline - time.perf_counter(), 1.0) + 60)
        return
    guard = OverrunGuard(deadline + OVERRUN_S, channel.send) if place is None else None
    try:
        summary = cut_captured(watch.captured, request, deadline, guard)
        if guard is None:
            channel.send(summary)
        else:
            guard.deliver(summary)
    finally:
        if place is not None:
            multihost.publish(CUT_DONE, True)


def _run(request: RunRequest, channel: Any) -> None:
    for folder in reversed(request.sys_path):
        sys.path.insert(0, folder)
    if request.disable_jit:
        jax.config.update("jax_disable_jit", True)
    if request.script is not None:
        spec = TargetSpec("script", request.script, path=os.path.abspath(request.script), script_args=request.argv)
        run_script(spec)
        return
    assert request.function is not None, "a RunRequest names a script or a function"
    func = load_function(request.function)
    inputs = load_inputs(request.inputs, request.args, request.seed)
    jax.jit(func)(*inputs)


def _script_text(request: RunRequest) -> str | None:
    """The script's source (which runtime-check libraries it uses: :mod:`jaxdbg.repro.checks`)."""
    path = request.script or (request.function.path if request.function is not None else None)
    try:
        with open(path or "") as handle:
            return handle.read()
    except OSError:
        return None


@contextlib.contextmanager
def _watched(request: RunRequest, channel: Any) -> Iterator[Any]:
    if request.watch is None:
        yield None
        return
    with JitWatch(request.watch, channel).installed() as watch:
        yield watch


@contextlib.contextmanager
def _jax_work_listener(channel: Any) -> Iterator[None]:
    """Tell the parent once that JAX traced or compiled something (a failure before that is not a JAX bug)."""
    sent: list[bool] = []

    def listener(event: str, *args: Any, **kwargs: Any) -> None:
        if not sent and event.startswith("/jax/core/compile"):
            sent.append(True)
            channel.send(JaxWork(event))

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            jax.monitoring.unregister_event_duration_listener(listener)


@handles(InputsRequest)
def inputs_job(request: InputsRequest, channel: Any) -> None:
    """Build a function target's inputs (``--inputs file.py::make_inputs`` runs user code) and send them."""
    inputs = load_inputs(request.inputs, request.args, request.seed)
    channel.send(InputsBuilt(flatten_inputs(inputs)))
