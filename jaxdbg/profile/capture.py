"""Captures of jobs jaxdbg did not start: ``--attach HOST:PORT,...`` and ``--from-capture DIR``.

- :func:`parse_addresses` reads ``HOST:PORT[,HOST:PORT...]`` (bad input raises UsageError, exit 2).
- :func:`attach` asks every listed process (each one called ``jax.profiler.start_server(PORT)``) for a
  capture of ``duration_s`` seconds, all at once, with xprof's own capture client (the one behind
  ``python -m jax.collect_profile``): one run folder, one ``<host>_<port>.xplane.pb`` per process.
- :func:`find_run` finds the run folder of an existing capture (a logdir, its ``plugins/profile`` or the
  run itself) and :func:`copy_run` copies its xplane files under ``--out``: xprof's converters write cache
  files beside the files they read, and the user's capture folder must stay as it was.

Example:
    >>> parse_addresses("10.0.0.1:9999,10.0.0.2:9999")
    (('10.0.0.1', 9999), ('10.0.0.2', 9999))
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import time

from jaxdbg._errors import TargetFailedError, UsageError

CONNECT_TIMEOUT_S = 3.0
TRACING_ATTEMPTS = 3  # as jax.collect_profile: a capture that comes back empty is asked for again


def parse_addresses(text: str) -> tuple[tuple[str, int], ...]:
    """``HOST:PORT[,HOST:PORT...]`` -> ``((host, port), ...)``; an IPv6 host goes in brackets (``[::1]:9999``)."""
    found = []
    for part in text.split(","):
        host, sep, port = part.strip().rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise UsageError(f"--attach '{text}': cannot read '{part.strip()}'; write HOST:PORT (the port the job "
                             "passed to jax.profiler.start_server), several joined with commas")
        found.append((host, int(port)))
    return tuple(found)


def check_listening(addresses: tuple[tuple[str, int], ...]) -> None:
    """Fail fast (exit 2) on an address where nothing accepts a connection, before the capture waits on it."""
    for host, port in addresses:
        try:
            socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
        except OSError as err:
            raise UsageError(f"--attach {host}:{port}: nothing answers there ({err.strerror or err}); start the job "
                             f"with jax.profiler.start_server({port}) and check the host and port") from None


def attach(addresses: tuple[tuple[str, int], ...], duration_s: float, logdir: str) -> str:
    """Capture ``duration_s`` seconds of every process at once into ``logdir``; returns the run folder."""
    from jaxdbg.profile.ops import quiet_native_stderr

    if not duration_s > 0:
        raise UsageError(f"--duration {duration_s:g}: give a positive number of seconds to capture, e.g. 2")
    check_listening(addresses)
    try:
        from xprof.convert import _pywrap_profiler_plugin as client
    except ImportError:
        raise UsageError("--attach needs xprof's capture client: pip install xprof") from None
    os.makedirs(logdir, exist_ok=True)
    service = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in addresses)
    # The Python tracer records every Python call of the job: off, as in a profiled run (--python-tracer).
    options = {"host_tracer_level": 2, "device_tracer_level": 1, "python_tracer_level": 0}
    started = time.monotonic()
    try:
        with quiet_native_stderr(fds=(1, 2)):
            client.trace(service, logdir, "", True, int(duration_s * 1000), TRACING_ATTEMPTS, options)
    except Exception as err:  # noqa: BLE001 - xprof raises plain exceptions with the gRPC status
        why = str(err).strip().splitlines()[0].rstrip(".") if str(err).strip() else type(err).__name__
        raise TargetFailedError(f"--attach {service}: the capture failed after {time.monotonic() - started:.1f} s: "
                                f"{why}; check that the job is still running JAX work and called "
                                "jax.profiler.start_server on that port") from None
    return find_run(logdir, option="--attach")


def find_run(path: str, option: str = "--from-capture") -> str:
    """The run folder holding ``*.xplane.pb`` under ``path`` (the newest run of a logdir)."""
    if not os.path.isdir(path):
        raise UsageError(f"{option} {path}: no such folder; give the logdir the capture was written to "
                         "(it holds plugins/profile/RUN/*.xplane.pb)")
    candidates = [path, os.path.join(path, "*"), os.path.join(path, "plugins", "profile", "*")]
    runs = [d for pattern in candidates for d in glob.glob(pattern)
            if os.path.isdir(d) and glob.glob(os.path.join(d, "*.xplane.pb"))]
    if not runs:
        raise UsageError(f"{option} {path}: no *.xplane.pb files there nor in plugins/profile/*/; give the logdir "
                         "of a jax.profiler capture (jax.profiler.trace(DIR), or a job's start_server capture)")
    return max(runs, key=os.path.getmtime)


def copy_run(run: str, out_dir: str) -> str:
    """Copy a run's xplane files to ``out_dir/capture/plugins/profile/<run>/``; returns the copy's run folder."""
    target = os.path.join(out_dir, "capture", "plugins", "profile", os.path.basename(os.path.normpath(run)))
    os.makedirs(target, exist_ok=True)
    for path in sorted(glob.glob(os.path.join(run, "*.xplane.pb"))):
        shutil.copy2(path, target)
    return target


def host_label(xplane_path: str) -> str:
    """A process's label: its file's name without ``.xplane.pb`` (``host_port`` for an attached one).

        >>> host_label("/logdir/plugins/profile/run/10.0.0.2_9999.xplane.pb")
        '10.0.0.2_9999'
    """
    return os.path.basename(xplane_path)[: -len(".xplane.pb")]
