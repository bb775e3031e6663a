"""A multi-process job's captures as one xprof session: every process's ``xplane.pb`` in process 0's ``--out``.

xprof opens a logdir's ``plugins/profile/<run>/`` as one session and each ``<host>.xplane.pb`` in it as one
host. The processes of a job each capture their own run (named by their own clock, and on one machine all
named after the same host), in their own folders, with no shared filesystem assumed: so each other process
sends its file to process 0 through the job's coordination service (in chunks, up to
:data:`~jaxdbg.multihost.MAX_SHARED_BYTES` a process), and process 0 writes them all under its own run's name,
as ``process-<index>.xplane.pb``, in ``<--out>/trace/`` (``xprof --logdir <--out>/trace``).

Example:
    >>> session_file("out/trace", "2026_01_01_00_00_00", 3)
    'out/trace/plugins/profile/2026_01_01_00_00_00/process-3.xplane.pb'
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable

from jaxdbg import multihost
from jaxdbg.profile.messages import JobCapture, ProfileNote
from jaxdbg.protocol import Message

WHAT = "xplane"


def session_file(logdir: str, run: str, index: int) -> str:
    """Where process ``index``'s capture lies in the job's session."""
    return os.path.join(logdir, "plugins", "profile", run, f"process-{index}.xplane.pb")


def share_capture(send: Callable[[Message], None], xplane: str | None, out_dir: str, wait_s: float) -> None:
    """Every process of a job: send this process's capture to process 0 (others), or gather them all into
    one session in ``out_dir/trace`` (process 0, waiting at most ``wait_s`` for each)."""
    place = multihost.job()
    if place is None:
        return
    if place.index != 0:
        mine = b""
        if xplane is not None and os.path.getsize(xplane) <= multihost.MAX_SHARED_BYTES:
            with open(xplane, "rb") as handle:
                mine = handle.read()
        multihost.publish_bytes("profile", WHAT, mine)  # empty: no capture to send (process 0 says why)
        return
    if xplane is None:
        send(ProfileNote("no capture of process 0: the job's xprof session was not assembled"))
        return
    logdir = os.path.join(out_dir, "trace")
    run = os.path.basename(os.path.dirname(xplane))
    os.makedirs(os.path.dirname(session_file(logdir, run, 0)), exist_ok=True)
    shutil.copyfile(xplane, session_file(logdir, run, 0))
    hosts = [0]
    for index in range(1, place.count):
        data = multihost.fetch_bytes("profile", WHAT, index, wait_s)
        if not data:
            why = ("it sent none: no capture, or one over "
                   f"{multihost.MAX_SHARED_BYTES >> 20} MiB (it is in that process's own --out)"
                   if data is not None else "it sent none in time")
            send(ProfileNote(f"the job's xprof session lacks process {index}'s capture ({why})"))
            continue
        with open(session_file(logdir, run, index), "wb") as handle:
            handle.write(data)
        hosts.append(index)
    send(JobCapture(logdir, run, tuple(hosts)))
