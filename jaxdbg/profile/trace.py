"""jax.profiler captures: a window over the first calls of a run, the files it leaves, a Perfetto copy.

A capture costs time while it runs, so a script is traced from its start until ``max_calls`` tracked
calls have finished (each call inside one ``StepTraceAnnotation``, named after the function, numbered by
its call index), and then the profiler stops: the steady state after the window runs undisturbed.

Example:
    >>> window = TraceWindow("out/trace", max_calls=10, send=print)     # doctest: +SKIP
    >>> with window:                                                    # doctest: +SKIP
    ...     run_script(spec)
"""

from __future__ import annotations

import glob
import gzip
import json
import os
from collections.abc import Callable
from typing import Any

from jaxdbg.profile.messages import ProfileNote, TraceCaptured
from jaxdbg.profile.model import TraceFiles
from jaxdbg.protocol import Message


class TraceWindow:
    """Start a capture on enter; stop it after ``max_calls`` tracked calls or on exit, whichever is first."""

    def __init__(self, logdir: str, max_calls: int, send: Callable[[Message], None], python_tracer: bool = False):
        self.logdir = logdir
        self.python_tracer = python_tracer
        self.max_calls = max_calls
        self.send = send
        self.active = False
        self.calls = 0
        self.error: str | None = None
        self.files: TraceFiles | None = None
        self._saved: list = []

    def __enter__(self) -> TraceWindow:
        import jax

        self._yield_to_user_captures()
        options = jax.profiler.ProfileOptions()
        # The Python tracer records every Python call (isinstance, len, ...): a large trace and a slower
        # target. Off unless asked for (--python-tracer).
        options.python_tracer_level = 1 if self.python_tracer else 0
        try:
            jax.profiler.start_trace(self.logdir, profiler_options=options)
            self.active = True
        except Exception as err:  # noqa: BLE001 - a failed capture must not stop the profile
            self.error = f"jax.profiler could not start: {type(err).__name__}: {err}"
            self.send(ProfileNote(self.error))
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.stop()
        finally:
            for module, attr, original in self._saved:
                setattr(module, attr, original)

    def _yield_to_user_captures(self) -> None:
        """A script that starts its own capture would fail while ours runs ("already started"): stop ours
        first, so the script behaves as it does without jaxdbg."""
        from jaxdbg import _compat

        self._saved = [(module, attr, getattr(module, attr)) for module, attr in _compat.profiler_start_homes()]
        original = self._saved[0][2]

        def start_trace(*args: Any, **kwargs: Any) -> Any:
            if self.active:
                self.stop()
                self.send(ProfileNote(f"the script started its own jax.profiler capture after {self.calls} "
                                      "traced calls: jaxdbg's capture stopped there"))
            return original(*args, **kwargs)

        for module, attr, _ in self._saved:
            setattr(module, attr, start_trace)

    @staticmethod
    def annotation(name: str, index: int) -> Any:
        import jax

        return jax.profiler.StepTraceAnnotation(name, step_num=index)

    def after_call(self) -> None:
        self.calls += 1
        if self.calls >= self.max_calls:
            self.stop()

    def stop(self) -> None:
        if not self.active:
            return
        import jax

        self.active = False
        try:
            jax.profiler.stop_trace()
        except Exception as err:  # noqa: BLE001
            self.send(ProfileNote(f"jax.profiler could not stop: {type(err).__name__}: {err}"))
            return
        self.files = find_trace_files(self.logdir, self.calls)
        self.send(TraceCaptured(self.files))


def monitor_counters(events: list[dict]) -> list[dict]:
    """Counter tracks (Perfetto draws them as graphs under the process) from --monitor's annotations: the host's
    CPU use, and the MB it moved over the network and to/from disk since the run started.

    Example:
        >>> sample = {"ph": "X", "pid": 1, "ts": 5.0, "name": "jaxdbg monitor",
        ...           "args": {"host_cpu_percent": "80", "net_receive_mb": "1.5", "disk_read_mb": "0"}}
        >>> for counter in monitor_counters([sample]):
        ...     print(counter["ph"], counter["name"], counter["args"])
        C host CPU % {'host_cpu_percent': 80.0}
        C host I/O MB since start {'net_receive_mb': 1.5, 'disk_read_mb': 0.0}
    """
    from jaxdbg.profile.monitor import MONITOR_EVENT

    counters = []
    for event in events:
        if event.get("name") != MONITOR_EVENT or event.get("ph") != "X":
            continue
        args = {k: float(v) for k, v in (event.get("args") or {}).items()}
        for track, keys in (("host CPU %", [k for k in args if k.endswith("_percent")]),
                            ("host I/O MB since start", [k for k in args if k.endswith("_mb") and k != "host_rss_mb"])):
            if keys:
                counters.append({"ph": "C", "name": track, "pid": event["pid"], "ts": event["ts"],
                                 "args": {k: args[k] for k in keys}})
    return counters


def find_trace_files(logdir: str, calls: int = 0) -> TraceFiles:
    """The newest capture under ``logdir`` (``plugins/profile/<run>/<host>.xplane.pb`` and friends)."""
    runs = sorted(glob.glob(os.path.join(logdir, "plugins", "profile", "*")), key=os.path.getmtime)
    run = runs[-1] if runs else logdir
    xplanes = sorted(glob.glob(os.path.join(run, "*.xplane.pb")))
    traces = sorted(glob.glob(os.path.join(run, "*.trace.json.gz")))
    perfetto = os.path.join(run, "perfetto_trace.json.gz")
    return TraceFiles(logdir, xplanes[0] if xplanes else None, traces[0] if traces else None,
                      perfetto if os.path.exists(perfetto) else None, calls)


def write_perfetto(trace: TraceFiles) -> TraceFiles:
    """Write ``perfetto_trace.json.gz`` beside the capture: the Chrome trace without the ``metadata`` field
    Perfetto's importer rejects. Done after the run, so the target does not wait for it."""
    if trace.trace_json is None or trace.perfetto is not None:
        return trace
    with gzip.open(trace.trace_json, "rb") as handle:
        data = json.loads(handle.read())
    data.pop("metadata", None)
    data["traceEvents"] = data.get("traceEvents", []) + monitor_counters(data.get("traceEvents", []))
    path = os.path.join(os.path.dirname(trace.trace_json), "perfetto_trace.json.gz")
    with gzip.open(path, "wb", compresslevel=1) as handle:
        handle.write(json.dumps(data).encode())  # one C-encoder call: json.dump streams in Python, 10x slower
    return TraceFiles(trace.logdir, trace.xplane, trace.trace_json, path, trace.calls_traced)
