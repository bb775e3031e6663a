"""What the processes of one ``jax.distributed`` job tell each other, through JAX's own coordination service.

Every process runs the same jaxdbg command; process 0's report speaks for the job. Each process publishes
small JSON summaries under ``jaxdbg/<command>/<what>/<process index>`` in the coordination service's
key-value store (the job's own runtime: no port or shared filesystem of jaxdbg's), each under a typed
:class:`Topic` that says what travels, and process 0 gathers them with a deadline, so a process that died or
hangs is named, with where it last stood, instead of waited for. A :class:`Heartbeat` keeps each process's
"where I stand" fresh while the program runs.

Nothing here starts JAX's backend: call it once the program has joined the job (``jax.distributed``).

Example:
    >>> job() is None   # not in a multi-process job
    True
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from jaxdbg import _compat, jit_layer
from jaxdbg._errors import JobMismatchError
from jaxdbg.launch import COMMAND_VARIABLE, HANG_MARK, LOST_MARK, SILENT_S, naming_process

HEARTBEAT_S = 1.0
HUNG_S = 60.0  # a peer alive but whose program has not moved for this long, while this one waits too: hung


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


def naming_this_process(line: str) -> str:
    """``line`` prefixed with this process, in a job of several processes (:func:`jaxdbg.launch.naming_process`).

        >>> naming_this_process("nan first made by log")   # not in a job
        'nan first made by log'
    """
    place = job()
    return naming_process(line, None if place is None else (place.index, place.count))


def process_folder(out_dir: str) -> str:
    """This process's part of the output folder: ``out_dir/process-<index>`` in a job, else ``out_dir``."""
    place = job()
    return out_dir if place is None else os.path.join(out_dir, f"process-{place.index}")


def _key(command: str, what: str, index: int) -> str:
    return f"jaxdbg/{command}/{what}/{index}"


V = TypeVar("V")


@dataclass(frozen=True)
class Topic(Generic[V]):
    """What the processes of a job share under one name, and its type: :func:`publish` takes a ``V``;
    :func:`gather`, :func:`peek` and :func:`wait_for` give ``V`` s back. A dataclass (of JSON-able fields)
    travels as the JSON object of its fields and is built again on the other side (JSON arrays as tuples, as
    frozen dataclasses hold sequences); anything else as JSON.

    Example:
        >>> @dataclass(frozen=True)
        ... class Summary:
        ...     found: bool
        ...     origin: str | None = None
        >>> topic = Topic("nan-hunt", "finding", Summary)
        >>> topic.key(1), topic.decode(topic.encode(Summary(True, "log at a.py:3")))
        ('jaxdbg/nan-hunt/finding/1', Summary(found=True, origin='log at a.py:3'))
    """

    command: str
    what: str
    kind: type[V]

    def key(self, index: int) -> str:
        return _key(self.command, self.what, index)

    def encode(self, value: V) -> str:
        fields = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value  # type: ignore[arg-type]
        return json.dumps(fields)

    def decode(self, text: str) -> V:
        data = json.loads(text)
        if dataclasses.is_dataclass(self.kind):
            return cast(V, self.kind(**{name: _tuples(value) for name, value in data.items()}))
        return cast(V, data)


def _tuples(value: Any) -> Any:
    return tuple(_tuples(item) for item in value) if isinstance(value, list) else value


def publish(topic: Topic[V], value: V) -> bool:
    """Publish this process's ``value`` under ``topic``; False when the job's runtime is gone."""
    client, place = _compat.distributed_client(), job()
    if client is None or place is None:
        return False
    try:
        client.key_value_set(topic.key(place.index), topic.encode(value), allow_overwrite=True)
    except Exception:  # noqa: BLE001 - the coordination service went away (the job is ending)
        return False
    return True


def gather(topic: Topic[V], timeout_s: float) -> dict[int, V]:
    """On process 0: every process's value of ``topic``, waiting at most ``timeout_s`` in all; a process that did not
    publish in time is missing from the answer."""
    client, place = _compat.distributed_client(), job()
    if client is None or place is None:
        return {}
    deadline = time.monotonic() + timeout_s
    found: dict[int, V] = {}
    for index in range(place.count):
        while index not in _silent:  # in slices, so a peer the heartbeat finds lost is not waited for to the end
            left_ms = int((deadline - time.monotonic()) * 1000)
            try:
                found[index] = topic.decode(client.blocking_key_value_get(topic.key(index), max(min(left_ms, 1000), 1)))
                break
            except Exception:  # noqa: BLE001 - not published yet: dead, hung or still busy
                if left_ms <= 1000:
                    _silent.add(index)
    return found


def wait_for(topic: Topic[V], index: int, timeout_s: float) -> V | None:
    """Process ``index``'s value of ``topic``, waiting at most ``timeout_s`` for it (None if it never came)."""
    client = _compat.distributed_client()
    if client is None:
        return None
    try:
        return topic.decode(client.blocking_key_value_get(topic.key(index), max(int(timeout_s * 1000), 1)))
    except Exception:  # noqa: BLE001 - not published in time
        return None


def global_value(value: Any) -> Any:
    """A host copy of ``value``; for a ``jax.Array`` sharded over devices of other processes, the whole global
    array, gathered from every process. A collective: every process of the job must call it, in the same
    order, on the same arrays (a replay or capture of an SPMD program does)."""
    import jax
    import numpy as np

    if not isinstance(value, jax.Array) or value.is_fully_addressable or value.is_fully_replicated:
        return value
    from jax.experimental import multihost_utils

    from jaxdbg.storable import is_key, key_name, restore

    with jit_layer.internal():  # the gather's own jitted function is jaxdbg's, not the program's
        if is_key(value):  # typed PRNG keys travel as their key data
            data = multihost_utils.process_allgather(jax.random.key_data(value), tiled=True)
            return restore(np.asarray(data), key_name(value))
        return np.asarray(multihost_utils.process_allgather(value, tiled=True))


# Larger values (a profiler capture) travel in chunks: the coordination service carries each key's value in
# one gRPC message (4 MiB by default), and it holds every value in process 0's memory until deleted.
CHUNK_BYTES = 1 << 20
MAX_SHARED_BYTES = 64 << 20


def publish_bytes(command: str, what: str, data: bytes) -> bool:
    """Publish this process's ``data`` in chunks, then its size (so a reader that sees the size finds every
    chunk); False when the job's runtime is gone."""
    client, place = _compat.distributed_client(), job()
    if client is None or place is None:
        return False
    key = _key(command, what, place.index)
    try:
        chunks = range(0, len(data), CHUNK_BYTES)
        for number, start in enumerate(chunks):
            client.key_value_set_bytes(f"{key}/{number}", data[start:start + CHUNK_BYTES], allow_overwrite=True)
        client.key_value_set(key, json.dumps({"chunks": len(chunks), "bytes": len(data)}), allow_overwrite=True)
    except Exception:  # noqa: BLE001 - the coordination service went away (the job is ending)
        return False
    return True


def fetch_bytes(command: str, what: str, index: int, timeout_s: float, remove: bool = True) -> bytes | None:
    """Process ``index``'s published bytes (waiting at most ``timeout_s`` for them to be announced), removed
    from the store once read unless ``remove`` is False (bytes every process reads); None if they never came."""
    client = _compat.distributed_client()
    if client is None or index in _silent:
        return None
    key = _key(command, what, index)
    try:
        size = json.loads(client.blocking_key_value_get(key, max(int(timeout_s * 1000), 1)))
        parts = [client.blocking_key_value_get_bytes(f"{key}/{n}", 10_000) for n in range(size["chunks"])]
    except Exception:  # noqa: BLE001 - not published in time: dead, hung or busy
        return None
    for n in range(size["chunks"] if remove else 0):
        with contextlib.suppress(Exception):
            client.key_value_delete(f"{key}/{n}")
    return b"".join(parts)


# Processes that failed to answer a gather, or whose heartbeat stopped: not waited for again.
_silent: set[int] = set()
_lost_peers: set[int] = set()  # of those, the ones whose heartbeat stopped


def mark_silent(index: int) -> None:
    """Stop waiting for process ``index`` in gathers and fetches (another watcher found it lost)."""
    _silent.add(index)
    _lost_peers.add(index)


def peek(topic: Topic[V], index: int) -> V | None:
    """Another process's latest value of ``topic`` without waiting (None if it never published one)."""
    client = _compat.distributed_client()
    if client is None:
        return None
    try:
        return topic.decode(client.key_value_try_get(topic.key(index)))
    except Exception:  # noqa: BLE001 - not there
        return None


class Heartbeat:
    """Publishes ``state()`` (a dict with a ``text``, a ``progress`` mark and ``in_call``: inside a jitted call)
    with the main thread's user frame under ``where`` every second from a daemon thread while the program
    runs, and watches the other processes' heartbeats: one that stops moving for ``SILENT_S`` (the process
    died, or froze) is passed once to ``on_lost(index, line)``. This thread keeps beating while the program's
    own thread waits in a collective for a peer, so a live process never looks lost. Once programs (progress
    and frame) stand still for ``hung_s``, this one's too, the process the job hangs on (this one, possibly:
    :func:`hung_processes`) is passed once to ``on_lost`` with a line saying where it stands. A process whose
    program has ended (``ended`` in its state) never hangs: one that stands still inside a call while another's
    program has ended waits for a collective that one never joins, and is passed so
    (:func:`waits_for_ended_line`)."""

    def __init__(self, command: str, state: Callable[[], dict], on_lost: Callable[[int, str], None] | None = None,
                 hung_s: float = HUNG_S):
        self.command, self.state, self.on_lost, self.hung_s = command, state, on_lost, hung_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._beats = 0
        self._seen: dict[int, tuple[Any, float]] = {}  # peer -> (its latest beat, when it last moved)
        self._lost: set[int] = set()
        self._moved: dict[int, tuple[Any, float]] = {}  # process -> (where its program stands, since when)
        self._hung: set[int] = set()

    def start(self) -> None:
        if self._thread is None:
            self._beat()  # at once: a process that dies in its first second has still said where it was
            self._thread = threading.Thread(target=self._run, name="jaxdbg-heartbeat", daemon=True)
            self._thread.start()

    def beat(self) -> None:
        """Publish where this process stands now (the thread does every second; a caller that is about to start
        something it may not come back from, e.g. a new function's first call, does at once)."""
        self._beat()

    def _beat(self) -> None:
        self._beats += 1
        state = self.state()
        frame = main_thread_frame()
        if frame:
            state = {**state, "frame": frame, "text": f"{state.get('text', '')}, at {frame}".lstrip(", ")}
        publish(where_topic(self.command), {**state, "beat": self._beats})

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            self._beat()
            if self.on_lost is not None:
                self._watch()

    def _watch(self) -> None:
        place = job()
        if place is None:
            return
        now = time.monotonic()
        topic = where_topic(self.command)
        states: dict[int, Any] = {place.index: peek(topic, place.index)}
        for peer in range(place.count):
            if peer == place.index or peer in self._lost:
                continue
            where = states[peer] = peek(topic, peer)
            beat = where.get("beat") if isinstance(where, dict) else None
            last = self._seen.get(peer)
            if last is None or last[0] != beat:
                self._seen[peer] = (beat, now)
            elif now - last[1] >= SILENT_S:
                self._lost.add(peer)
                _silent.add(peer)
                _lost_peers.add(peer)
                del states[peer]
                stood = f"; last seen {where['text']}" if isinstance(where, dict) and where.get("text") else ""
                assert self.on_lost is not None
                self.on_lost(peer, f"process {peer}{LOST_MARK}{now - last[1]:.0f} s ago (it died or froze){stood}")
        stalled = {index: where for index, where in states.items() if self._stalled(index, where, now)}
        for index, waiter in hung_processes(place.index, stalled):
            if index not in self._hung:
                self._hung.add(index)
                assert self.on_lost is not None
                self.on_lost(index, hung_line(index, stalled[index], now - self._moved[index][1], waiter,
                                              stalled[waiter]))
        ended = {i: where for i, where in states.items() if isinstance(where, dict) and where.get("ended")}
        for index, where in stalled.items():  # a call that waits for a process whose program has ended waits forever
            beating = index == place.index or now - self._seen.get(index, (None, 0.0))[1] <= 3 * HEARTBEAT_S
            if ended and beating and where.get("in_call") and index not in self._hung and index not in ended:
                self._hung.add(index)
                assert self.on_lost is not None
                self.on_lost(index, waits_for_ended_line(index, where, now - self._moved[index][1], ended))

    def _stalled(self, index: int, where: Any, now: float) -> bool:
        """Whether process ``index``'s program (not its heartbeat) has stood still for ``hung_s``."""
        if not isinstance(where, dict) or where.get("ended"):  # its program ended: it waits for nothing of ours
            return False
        mark = (where.get("progress"), where.get("frame"))
        last = self._moved.get(index)
        if last is None or last[0] != mark:
            self._moved[index] = (mark, now)
            return False
        return now - last[1] >= self.hung_s

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._beat()


class HeartbeatOnceJoined:
    """A :class:`Heartbeat` started once the program has joined a job: a command that has no hook at the
    moment the program calls ``jax.distributed.initialize()`` (nan-hunt's watch) looks every half second
    from a daemon thread, so nothing is added to the program's own calls. ``stop()`` stops both.

    Example:
        >>> waiting = HeartbeatOnceJoined("nan-hunt", lambda: {"text": "", "progress": 0, "in_call": False})
        >>> waiting.start(); waiting.stop(); waiting.heartbeat is None   # never joined a job here
        True
    """

    def __init__(self, command: str, state: Callable[[], dict], on_lost: Callable[[int, str], None] | None = None,
                 hung_s: float = HUNG_S):
        self._arguments = (command, state, on_lost, hung_s)
        self.heartbeat: Heartbeat | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._wait_for_the_job, name="jaxdbg-join-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _wait_for_the_job(self) -> None:
        while not self._stop.wait(0.5):
            if job() is not None:
                self.heartbeat = Heartbeat(*self._arguments)
                self.heartbeat.start()
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if self.heartbeat is not None:
            self.heartbeat.stop()


def hung_processes(me: int, stalled: dict[int, dict]) -> list[tuple[int, int]]:
    """Which processes the job hangs on, each with one that waits for it, given where the processes whose
    program stands still are (``in_call``: inside a jitted call). Only while this process stands still too.
    A process inside a jitted call while another stands outside one waits in a collective for it: the one
    outside is named; where this process is the only one outside, it names itself.

    Example:
        >>> inside, outside = {"in_call": True}, {"in_call": False}
        >>> hung_processes(0, {0: inside, 1: outside})    # process 0 waits in the all-reduce for process 1
        [(1, 0)]
        >>> hung_processes(1, {0: inside, 1: outside})    # process 1 does not blame the process that waits for it
        [(1, 0)]
        >>> hung_processes(0, {0: outside, 1: inside, 2: inside})  # process 0 is the one the others wait for
        [(0, 1)]
        >>> hung_processes(0, {0: outside, 1: outside}), hung_processes(0, {1: outside})
        ([(1, 0)], [])
        >>> hung_processes(0, {0: outside})   # no other process stands still: nothing hangs on this one
        []
    """
    if me not in stalled or len(stalled) < 2:
        return []
    inside = [i for i, where in stalled.items() if where.get("in_call")]
    outside = [i for i in stalled if i not in inside]
    if not outside:  # every one waits inside a call (collectives that do not match): each names the others
        return [(i, me) for i in inside if i != me]
    waiter = inside[0] if inside else me
    named = [i for i in outside if i != me] if me in outside and len(outside) > 1 else outside
    return [(i, waiter) for i in named]


def hung_wait(timeout: float | None) -> float:
    """How long a program must stand still to be called hung: ``HUNG_S``, or well within ``--timeout`` so the
    line is written before the run is stopped.

        >>> hung_wait(None), hung_wait(24)
        (60.0, 6.0)
    """
    return HUNG_S if timeout is None else max(min(HUNG_S, 0.25 * timeout), 2.0)


def main_thread_frame() -> str:
    """Where the program's main thread stands: its innermost frame in user code, as ``file:line (function)``
    ("" where none is: the thread is inside jax or jaxdbg only). Read from another thread (the heartbeat's),
    so it names the line of a program that is stuck in host code or blocked in a collective."""
    import sys

    from jaxdbg._source import is_user_file

    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    while frame is not None and not is_user_file(frame.f_code.co_filename):
        frame = frame.f_back
    return "" if frame is None else f"{frame.f_code.co_filename}:{frame.f_lineno} ({frame.f_code.co_name})"


def hung_line(peer: int, where: dict, still_s: float, me: int, mine: dict) -> str:
    """One line naming a process that is alive (its heartbeat runs) but whose program stopped moving.

    Example:
        >>> line = hung_line(1, {"text": "after step call 2, at train.py:30 (<module>)"}, 12.0, 0,
        ...                  {"text": "in step call 3, at train.py:33 (<module>)"})
        >>> line.partition(";")[0]
        'process 1 hangs: alive (its heartbeat runs) but its program has not moved for 12 s'
        >>> line.partition("; ")[2].partition(" (process")[0]
        'it stands after step call 2, at train.py:30 (<module>)'
    """
    waits = f" (process {me} waits {mine['text']})" if mine.get("text") else ""
    return (f"process {peer}{HANG_MARK} (its heartbeat runs) but its program has not moved for {still_s:.0f} s; "
            f"it stands {where.get('text') or 'at an unknown place'}{waits}")


def waits_for_ended_line(index: int, where: dict, still_s: float, ended: dict[int, dict]) -> str:
    """One line naming a process that waits inside a call (a collective) for processes whose programs have ended:
    they will never join it.

    Example:
        >>> waits_for_ended_line(1, {"text": "in sync call 0, at t.py:9 (<module>)"}, 8.0,
        ...                      {0: {"text": "its program finished, after step call 4"}})
        'process 1 hangs: alive (its heartbeat runs) but its program has not moved for 8 s; it stands in sync call 0, \
at t.py:9 (<module>), waiting for process 0, which will never join it (its program finished, after step call 4)'
    """
    said = "; ".join(f"process {i}, which will never join it ({w.get('text') or 'its program ended'})"
                     for i, w in sorted(ended.items()))
    return (f"process {index}{HANG_MARK} (its heartbeat runs) but its program has not moved for {still_s:.0f} s; "
            f"it stands {where.get('text') or 'at an unknown place'}, waiting for {said}")


DONE = Topic("job", "done", bool)  # a process is done and leaves the job (leave_job)


def where_topic(command: str) -> Topic[dict]:
    """Where a process of ``command`` stands, as its heartbeat says (a JSON object: ``text``, ``progress``,
    ``beat``, and what else the command's ``state()`` adds)."""
    return Topic(command, "where", dict)


def leave_job(wait_s: float = 10.0) -> None:
    """Leave the job together: every process says it is done and waits (bounded) for the others, then all
    shut the distributed runtime down as jax's own exit handler would. A process that exits alone while
    others still run takes the coordination service with it (process 0) or is reported missing (the others),
    and the runtime aborts the processes left behind. Where a process never says it is done (it died), the
    others do not wait on it longer than ``wait_s`` (nor at all for one that already failed to answer)."""
    place = job()
    if place is None:
        return
    publish(DONE, True)
    if _silent:
        return
    if len(gather(DONE, wait_s)) == place.count:
        import jax

        with contextlib.suppress(Exception):  # leaving is best effort: the process exits right after
            jax.distributed.shutdown()


def missing_line(command: str, index: int, count: int, waited_s: float) -> str:
    """One line about a process that did not report (it died, hangs, or is still busy), and where it last
    stood. (The coordination service's own liveness query can block for its heartbeat timeout: not used.)"""
    where = peek(where_topic(command), index)
    stood = f"; last seen {where['text']}" if isinstance(where, dict) and where.get("text") else ""
    lost = index in _lost_peers
    why = ("it stopped answering: it died or froze" if lost
           else f"none within {waited_s:.0f} s: it died, hangs or is busy")
    return f"process {index} sent no report ({why}){stood}"


# Options that may differ between the processes of a job (a per-host --out, --json); every other word must not.
PER_PROCESS_OPTIONS = {"--out": 1, "--json": 1, "-q": 0, "--quiet": 0, "-v": 0, "--verbose": 0}
AGREE_WAIT_S = 60.0
_agreed: list[bool] = []


def comparable_command(argv: list[str]) -> list[str]:
    """The words of a jaxdbg command line that every process of a job must share: not the per-process options,
    and not the script's ``-- ARGS`` (a launch script often passes each process its id there).

    Example:
        >>> comparable_command(["profile", "train.py", "--out", "/tmp/h1", "-q", "--json=/tmp/a.json"])
        ['profile', 'train.py']
        >>> comparable_command(["nan-hunt", "train.py", "--timeout", "60", "--", "--process-id", "1"])
        ['nan-hunt', 'train.py', '--timeout', '60']
    """
    kept: list[str] = []
    skip = 0
    for word in argv:
        if skip:
            skip -= 1
            continue
        if word == "--":  # the script's own arguments: they may differ per process
            break
        name = word.partition("=")[0]
        if name in PER_PROCESS_OPTIONS:
            skip = PER_PROCESS_OPTIONS[name] if "=" not in word else 0
            continue
        kept.append(word)
    return kept


@dataclass(frozen=True)
class CommandLine:
    """What a process of the job runs: its jaxdbg version and the words of its command every process shares."""

    version: str
    command: tuple[str, ...]


COMMAND_LINE = Topic("job", "command", CommandLine)


def agree_at_first_call() -> None:
    """Install the job agreement (:func:`agree_on_command`) as the jit layer's first-call action: at the program's
    first jitted call it has joined its job, if it has one (a contained child of a jaxdbg command does this)."""
    jit_layer.on_first_call(agree_on_command)


def agree_on_command(wait_s: float = AGREE_WAIT_S) -> None:
    """Once, when this process has joined a job: publish the jaxdbg command it runs and compare it with every
    other process's (each waited for at most ``wait_s``). Different commands, targets, options or jaxdbg
    versions (a launch-line typo, an old install on one host) would each wait in the other's collectives:
    raise :class:`~jaxdbg._errors.JobMismatchError` naming the difference (every process sees the same
    pair, so every process stops with the same line)."""
    line = os.environ.get(COMMAND_VARIABLE)
    place = job()
    if line is None or place is None or _agreed:
        return
    _agreed.append(True)
    from jaxdbg._version import __version__

    mine = CommandLine(__version__, tuple(comparable_command(json.loads(line))))
    if not publish(COMMAND_LINE, mine):
        return  # the runtime is gone: nothing to compare with
    deadline = time.monotonic() + wait_s
    for peer in range(place.count):
        if peer == place.index:
            continue
        theirs = wait_for(COMMAND_LINE, peer, max(deadline - time.monotonic(), 0.001))
        if theirs is None:  # not there in time: the heartbeat and the gathers report a silent peer
            continue
        if theirs != mine:
            first, second = sorted([(place.index, mine), (peer, theirs)], key=lambda pair: pair[0])
            raise JobMismatchError(mismatch_line(first, second))


def mismatch_line(first: tuple[int, CommandLine], second: tuple[int, CommandLine]) -> str:
    """One line naming how two processes' commands differ.

    Example:
        >>> line = mismatch_line((0, CommandLine("1", ("profile", "a.py"))),
        ...                      (1, CommandLine("1", ("nan-hunt", "a.py"))))
        >>> line.partition(": ")[2].partition(";")[0]
        "process 0 runs 'jaxdbg profile a.py', process 1 runs 'jaxdbg nan-hunt a.py'"
    """
    (a, mine), (b, theirs) = first, second
    if mine.version != theirs.version:
        return (f"the job's processes run different jaxdbg versions: process {a} runs jaxdbg {mine.version}, "
                f"process {b} runs jaxdbg {theirs.version}; install the same version on every host")
    said = [f"process {i} runs 'jaxdbg {' '.join(c.command)}'" for i, c in ((a, mine), (b, theirs))]
    return (f"the job's processes run different jaxdbg commands: {said[0]}, {said[1]}; every process must run "
            "the same command on the same target (check the launch line)")
