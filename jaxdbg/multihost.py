"""What the processes of one ``jax.distributed`` job tell each other, through JAX's own coordination service.

Every process runs the same jaxdbg command; process 0's report speaks for the job. Each process publishes
small JSON summaries under ``jaxdbg/<command>/<what>/<process index>`` in the coordination service's
key-value store (the job's own runtime: no port or shared filesystem of jaxdbg's), and process 0 gathers
them with a deadline, so a process that died or hangs is named, with where it last stood, instead of waited
for. A :class:`Heartbeat` keeps each process's "where I stand" fresh while the program runs.

Nothing here starts JAX's backend: call it once the program has joined the job (``jax.distributed``).

Example:
    >>> job() is None   # not in a multi-process job
    True
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jaxdbg import _compat

HEARTBEAT_S = 1.0


@dataclass(frozen=True)
class Job:
    """This process's place in the job."""

    index: int
    count: int


def job() -> Job | None:
    """This process's place, if it is one of several processes of a ``jax.distributed`` job (else None)."""
    client = _compat.distributed_client()
    if client is None or not _compat.backend_started():
        return None
    import jax

    count = jax.process_count()
    return Job(jax.process_index(), count) if count > 1 else None


def process_folder(out_dir: str) -> str:
    """This process's part of the output folder: ``out_dir/process-<index>`` in a job, else ``out_dir``."""
    place = job()
    return out_dir if place is None else os.path.join(out_dir, f"process-{place.index}")


def _key(command: str, what: str, index: int) -> str:
    return f"jaxdbg/{command}/{what}/{index}"


def publish(command: str, what: str, value: Any) -> bool:
    """Publish this process's ``value`` (JSON-able); False when the job's runtime is gone."""
    client, place = _compat.distributed_client(), job()
    if client is None or place is None:
        return False
    try:
        client.key_value_set(_key(command, what, place.index), json.dumps(value), allow_overwrite=True)
    except Exception:  # noqa: BLE001 - the coordination service went away (the job is ending)
        return False
    return True


def gather(command: str, what: str, timeout_s: float) -> dict[int, Any]:
    """On process 0: every process's ``what``, waiting at most ``timeout_s`` in all; a process that did not
    publish in time is missing from the answer."""
    client, place = _compat.distributed_client(), job()
    if client is None or place is None:
        return {}
    deadline = time.monotonic() + timeout_s
    found: dict[int, Any] = {}
    for index in range(place.count):
        left_ms = max(int((deadline - time.monotonic()) * 1000), 1)
        try:
            found[index] = json.loads(client.blocking_key_value_get(_key(command, what, index), left_ms))
        except Exception:  # noqa: BLE001 - not published in time: dead, hung or still busy
            continue
    return found


def peek(command: str, what: str, index: int) -> Any:
    """Another process's latest ``what`` without waiting (None if it never published one)."""
    client = _compat.distributed_client()
    if client is None:
        return None
    try:
        return json.loads(client.key_value_try_get(_key(command, what, index)))
    except Exception:  # noqa: BLE001 - not there
        return None


def live_processes(count: int) -> set[int] | None:
    """The processes the coordination service still hears from (None where it cannot say)."""
    client = _compat.distributed_client()
    try:
        return set(client.get_live_nodes(list(range(count)))) if client is not None else None
    except Exception:  # noqa: BLE001 - older runtimes or a coordinator that is gone
        return None


class Heartbeat:
    """Publishes ``state()`` under ``where`` every second from a daemon thread while the block runs."""

    def __init__(self, command: str, state: Callable[[], Any]):
        self.command, self.state = command, state
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="jaxdbg-heartbeat", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            publish(self.command, "where", self.state())

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        publish(self.command, "where", self.state())


def missing_line(command: str, index: int, count: int, waited_s: float) -> str:
    """One line about a process that did not report: dead or hung, and where it last stood."""
    alive = live_processes(count)
    state = "died" if alive is not None and index not in alive else "did not finish (hung or still running)"
    where = peek(command, "where", index)
    stood = f"; last seen {where['text']}" if isinstance(where, dict) and where.get("text") else ""
    return f"process {index} {state}: no report within {waited_s:.0f} s{stood}"
