"""How the real executor's messages travel: between stages of this process, or to a stage of another process.

The executor (:mod:`jaxdbg.pipeline.real`) is the same in both cases; only its transport differs.

- :class:`LocalTransport`: every stage in this process. A message's value is placed on the receiving
  stage's devices with ``jax.device_put`` and queued in that stage's inbox.
- :class:`ProcessTransport`: the stages of a ``jax.distributed`` job split over its processes in contiguous
  blocks (``stage_owners``: with 4 stages and 2 processes, stages 0-1 on process 0 and 2-3 on process 1, as
  hosts that each hold consecutive stages). A message to a stage of another process goes by
  ``jax.experimental.transfer``: the sender offers the array with ``TransferServer.await_pull`` under a
  unique id and posts a small note (the id, shape, dtype, task, times) in the job's coordination-service
  key-value store; a listener thread of the receiving process reads the notes in order, pulls the array with
  ``TransferConnection.pull`` onto the receiving stage's device and queues it like a local message. Control
  messages (a blocking send's acknowledgement) are notes alone. The transfer server is a port jaxdbg opens:
  it binds ``127.0.0.1`` (processes on one host) unless the user names an interface (``--transfer-bind``).
  Each process keeps what it sent until the run ends (an offered array must live until it is pulled).
  Every note, and with ``--message-auth full`` every array, carries an HMAC with the job's key, and a
  receiver refuses what does not verify (:mod:`jaxdbg.pipeline.seal`: what is protected, what is not).

Runs start together: the processes meet at a coordination-service barrier and process 0 publishes the run's
start as wall-clock time, so every timeline shares one clock (exact on one host; across hosts as close as
their clocks are). After a run each process publishes its part (its stages' tasks, waits and gradients) and
every process merges all parts, so each report holds the whole job's timeline.

Example:
    >>> stage_owners(stages=4, processes=2)
    [0, 0, 1, 1]
    >>> LocalTransport().owners(3)
    [0, 0, 0]
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import threading
import time
from typing import Any

from jaxdbg import _compat
from jaxdbg._errors import TargetFailedError, UsageError
from jaxdbg.pipeline.seal import AUTH as AUTH
from jaxdbg.pipeline.seal import ENV_SECRET, Seal, agree

_NOTE_WAIT_MS = 200  # a listener's longest wait for the next note before it looks at the abort flag again
KEY = "jaxdbg/pipeline-bench"


def stage_owners(stages: int, processes: int) -> list[int]:
    """The process of each stage: contiguous blocks, as even as the counts allow."""
    return [w * processes // stages for w in range(stages)]


class LocalTransport:
    """Every stage in this process: messages are ``jax.device_put`` and a queue."""

    index, count = 0, 1

    def owners(self, stages: int) -> list[int]:
        return stage_owners(stages, self.count)

    def begin(self, state: Any) -> float:
        """Set up one run's inboxes; returns its start on this process's ``time.perf_counter`` clock."""
        self.state = state
        self.inbox: dict[int, queue.SimpleQueue] = {w: queue.SimpleQueue() for w in state.local_workers}
        return time.perf_counter() + 0.01

    def send(self, receiver: int, message: tuple, sender_task: int = -1) -> None:
        """Queue ``message`` for stage ``receiver``: ``("data", arrival, task, value, delay)``,
        ``("offer", task, value, sender stage, delay)`` or ``("ack", arrival)``; a value is placed on the
        receiving model stage's devices."""
        self.inbox[receiver].put(self._placed(message))

    def _placed(self, message: tuple) -> tuple:
        import jax

        kind = message[0]
        if kind == "ack":
            return message
        task = message[2] if kind == "data" else message[1]
        at = 3 if kind == "data" else 2
        sharding = self.state.pipe.activation[self.state.pipe.shape.decode(task)[1]]
        return (*message[:at], jax.device_put(message[at], sharding), *message[at + 1:])

    def end(self, part: dict, timeout: float) -> list[dict]:
        """Every process's part of the run (here: this one's)."""
        return [part]

    def abort(self, reason: str = "") -> None:
        """Stop this run (``reason``: why this process failed, for the others)."""
        return None


class ProcessTransport(LocalTransport):
    """The stages split over the processes of a ``jax.distributed`` job; messages between processes carried
    by ``jax.experimental.transfer``, their notes by the coordination service."""

    def __init__(self, bind: str = "127.0.0.1", timeout: float = 300.0, auth: str = "full"):
        import jax
        from jax.experimental import transfer

        self.client = _compat.distributed_client()
        self.index, self.count = jax.process_index(), jax.process_count()
        self.timeout = timeout
        self.seal: Seal = agree(self.client, f"{KEY}/auth", self.index, self.count, auth, self._wait_for,
                                os.environ.get(ENV_SECRET))
        device = jax.local_devices()[0]
        self.server = transfer.start_transfer_server(device.client, f"{bind}:0", [f"{bind}:0"])
        self.client.key_value_set(f"{KEY}/transfer/{self.index}", self.server.address(), allow_overwrite=True)
        self.connections: dict[int, Any] = {}
        for peer in range(self.count):
            if peer != self.index:
                address = self._wait_for(f"{KEY}/transfer/{peer}", f"process {peer}'s transfer server")
                self.connections[peer] = self.server.connect(address)
        self._ids = itertools.count()
        self._runs = itertools.count()
        self.run = -1
        self._lock = threading.Lock()
        self.sent: list[Any] = []  # offered arrays, kept until the run ends
        self._stop = threading.Event()

    def begin(self, state: Any) -> float:
        super().begin(state)
        self.run = next(self._runs)
        self.owner = state.pipe.owner
        self.seq = dict.fromkeys(self.connections, 0)
        self._stop.clear()
        self.listeners = [threading.Thread(target=self._listen, args=(peer, self._expected(peer, state)),
                                           name=f"notes-from-{peer}", daemon=True) for peer in self.connections]
        for thread in self.listeners:
            thread.start()
        # Start together (a barrier of notes, so that a process that failed is named rather than waited for).
        self.client.key_value_set(f"{KEY}/ready/{self.run}/{self.index}", "1", allow_overwrite=True)
        for peer in self.connections:
            self._wait_for(f"{KEY}/ready/{self.run}/{peer}", f"process {peer} to start run {self.run}")
        key = f"{KEY}/t0/{self.run}"
        if self.index == 0:
            self.client.key_value_set(key, repr(time.time() + 0.05), allow_overwrite=True)
        t0_wall = float(self._wait_for(key, f"process 0 to start run {self.run}"))
        return time.perf_counter() + (t0_wall - time.time())

    def _wait_for(self, key: str, what: str) -> str:
        """The value of ``key`` once a peer posts it; stops early when a process says it failed."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return str(self.client.blocking_key_value_get(key, _NOTE_WAIT_MS))
            except Exception:  # noqa: BLE001 - not posted yet
                self._check_peer()
                if time.monotonic() > deadline:
                    raise TargetFailedError(f"waited {self.timeout:.0f} s for {what}: it died or hangs") from None

    def _expected(self, peer: int, state: Any) -> int:
        """How many notes ``peer`` sends this process in one run: a message per task whose result goes from
        one of its stages to one of ours, and (blocking sends) an acknowledgement per message we send it."""
        graph, owner = state.arbiter.graph, self.owner
        count = 0
        for task, receiver in enumerate(graph.remote):
            if receiver < 0:
                continue
            src, dst = owner[graph.worker[task]], owner[graph.worker[receiver]]
            count += (src, dst) == (peer, self.index)
            count += state.comm == "sync" and (src, dst) == (self.index, peer)
        return count

    def send(self, receiver: int, message: tuple, sender_task: int = -1) -> None:
        import jax

        peer = self.owner[receiver]
        if peer == self.index:
            return super().send(receiver, message)
        note: dict[str, Any] = {"kind": message[0], "to": receiver, "sender_task": sender_task}
        array = None  # what the note's HMAC (with --message-auth full) also covers, by its digest
        if message[0] == "ack":
            note["arrival"] = message[1]
        else:
            data = message[0] == "data"
            value = message[3] if data else message[2]
            if not value.is_fully_replicated:  # (weights split over a stage's devices split its output too)
                pipe = self.state.pipe
                value = jax.device_put(value, pipe.activation[pipe.shape.decode(sender_task)[1]])
            shard = array = value.addressable_shards[0].data  # replicated on the sending stage: one copy travels
            uuid = next(self._ids) * self.count + self.index  # unique in the job
            with self._lock:
                self.sent.append(shard)
            self.server.await_pull(uuid, shard)
            note.update(uuid=uuid, shape=list(shard.shape), dtype=str(shard.dtype))
            if data:
                note.update(arrival=message[1], task=message[2], delay=message[4])
            else:
                note.update(task=message[1], worker=message[3], delay=message[4])
        with self._lock:
            seq = self.seq[peer]
            self.seq[peer] += 1
        text = self.seal.wrap(note, self._context(self.index, peer, seq), array)
        self.client.key_value_set(self._note_key(self.index, peer, seq), text)

    def _context(self, src: int, dst: int, seq: int) -> str:
        """Where a note sits in the job, as its HMAC covers it (a note replayed elsewhere does not verify)."""
        return f"run {self.run}: process {src} -> {dst} #{seq}"

    def _note_key(self, src: int, dst: int, seq: int) -> str:
        return f"{KEY}/note/{self.run}/{src}-{dst}/{seq}"

    def _listen(self, peer: int, expected: int) -> None:
        try:
            for seq in range(expected):
                key = self._note_key(peer, self.index, seq)
                while True:
                    if self._stop.is_set():
                        return
                    try:
                        text = self.client.blocking_key_value_get(key, _NOTE_WAIT_MS)
                        break
                    except Exception:  # noqa: BLE001 - not posted yet: the peer may have failed
                        self._check_peer()
                self.client.key_value_delete(key)
                context = self._context(peer, self.index, seq)
                self._receive(peer, self.seal.unwrap(text, context, f"process {peer}"), context)
        except BaseException as err:  # noqa: BLE001 - handed to the run, which stops and re-raises it
            self.state.error = self.state.error or err
            self.state.abort.set()

    def _receive(self, peer: int, note: dict, context: str) -> None:
        import jax
        import numpy as np
        from jax.sharding import SingleDeviceSharding

        state, receiver = self.state, note["to"]
        if note["kind"] == "ack":
            self.inbox[receiver].put(("ack", note["arrival"]))
            return
        pipe = state.pipe
        sharding = pipe.activation[pipe.shape.decode(note["task"])[1]]
        first = sorted(sharding.device_set, key=lambda d: d.id)[0]
        wanted = jax.ShapeDtypeStruct(tuple(note["shape"]), np.dtype(note["dtype"]),
                                      sharding=SingleDeviceSharding(first))
        pulled = self.connections[peer].pull(note["uuid"], wanted)
        self.seal.check_array(note, pulled, f"process {peer}", context)
        value = jax.device_put(pulled, sharding)
        if note["kind"] == "offer":
            self.inbox[receiver].put(("offer", note["task"], value, note["worker"], note["delay"]))
            return
        # The message is there when both its drawn delay has passed and the transfer has ended.
        sent_at = note["arrival"] - note["delay"]
        arrival = max(note["arrival"], state.now())
        state.delay[note["sender_task"]] = arrival - sent_at
        self.inbox[receiver].put(("data", arrival, note["task"], value, arrival - sent_at))

    def end(self, part: dict, timeout: float) -> list[dict]:
        from jaxdbg import multihost

        for thread in self.listeners:
            thread.join(timeout)
        run = f"run-{self.run}"
        parts_of_run = multihost.Topic("pipeline-bench", run, str)  # each sealed (pipeline.seal)
        multihost.publish(parts_of_run, self.seal.wrap(part, f"{run}: part of process {self.index}"))
        parts = {i: self.seal.unwrap(text, f"{run}: part of process {i}", f"process {i}")
                 for i, text in multihost.gather(parts_of_run, timeout).items()}
        with self._lock:
            self.sent.clear()
        missing = sorted(set(range(self.count)) - set(parts))
        if missing:
            raise TargetFailedError(
                f"process(es) {', '.join(map(str, missing))} sent no part of real run {self.run} within "
                f"{timeout:.0f} s (died or hung); see their logs")
        return [parts[i] for i in range(self.count)]

    def abort(self, reason: str = "") -> None:
        """Stop this run's listeners and, with a ``reason``, tell the other processes this one failed."""
        self._stop.set()
        if reason:
            with contextlib.suppress(Exception):  # set already (the first failure stays), or the service is gone
                self.client.key_value_set(f"{KEY}/failed", f"process {self.index}: {reason}")

    def _check_peer(self) -> None:
        try:
            why = self.client.key_value_try_get(f"{KEY}/failed")
        except Exception:  # noqa: BLE001 - no peer failed
            return
        raise TargetFailedError(f"the real run stopped: {why}")


def join_job(bind: str, timeout: float, auth: str = "full") -> LocalTransport:
    """The transport for this process: across processes when it was launched as one of several (``jaxdbg
    --processes N``, srun, mpirun), after joining the job with ``jax.distributed.initialize()``; else local."""
    import os

    size = int(os.environ.get("SLURM_NTASKS") or os.environ.get("OMPI_COMM_WORLD_SIZE") or 1)
    if _compat.detected_cluster() is None or size <= 1:
        return LocalTransport()
    import jax

    jax.distributed.initialize()
    if jax.process_count() <= 1:
        return LocalTransport()
    from jaxdbg import multihost

    multihost.agree_on_command(min(timeout, multihost.AGREE_WAIT_S))  # a launch-line typo stops every process
    if not bind:
        raise UsageError("--transfer-bind: give an interface address, e.g. 127.0.0.1")
    return ProcessTransport(bind, timeout, auth)
