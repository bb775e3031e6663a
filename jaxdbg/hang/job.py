"""The processes of one job agree on a verdict, through JAX's own coordination service (its key-value store:
no port or shared folder of jaxdbg's), as :mod:`jaxdbg.multihost` does for the other commands.

Each process's watchdog publishes, every second, where it stands (``where``: progress, idle time, its user
line, its last call, the new checkpoints of its step sequence). The *merger*, the lowest process still
answering (process 0 unless it is lost), watches them all:

- a stall: every unfinished process idle for ``--stall``; or a process asked (SIGUSR1, its deadline); or every
  process ended. The merger publishes ``collect``; each process publishes its record; the merger gathers them
  (a process that sent none is named with where it was last seen), publishes the job's facts and
  ``verdict``, and every process hands the same facts to its verdict;
- a divergence, while the job runs: each process's step sequence (the programs of its calls that span
  several processes) is hashed in a chain; the digests at every :data:`CHECKPOINT`-th step are compared, and
  where they first differ the merger asks (``detail-request``) for the steps of that stretch, and finds the
  first step whose programs differ. A job that diverged and went on is reported at its end.

A process whose heartbeat stops for ``lost_s`` is lost: dead, or frozen with its Python threads blocked.

Example:
    >>> sequence = Sequence()
    >>> for key in ["step(x: f32[4])"] * 17:
    ...     sequence.add(key, ("step", 0, None))
    >>> sequence.count, [count for count, _ in sequence.checkpoints]
    (17, [16])
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any

from jaxdbg import multihost
from jaxdbg.hang.messages import ACK_WAIT_S
from jaxdbg.hang.verdict import facts_from_json, facts_json

COMMAND = "hang-hunt"


@dataclass(frozen=True)
class DetailRequest:
    """The merger asks every process for its steps ``lo..hi`` (request ``id``)."""

    id: str
    lo: int
    hi: int


@dataclass(frozen=True)
class Detail:
    """A member's answer to request ``id``: its steps by number (:meth:`Sequence.detail`)."""

    id: str
    rows: dict[str, dict]


@dataclass(frozen=True)
class Collect:
    """The merger collects every process's record (collection ``id``), for a stall, a request or the end."""

    id: str
    reason: str


@dataclass(frozen=True)
class Verdict:
    """The job's facts of collection ``id`` are published (``multihost.fetch_bytes(COMMAND, "facts", ...)``)."""

    id: str


# What the processes tell each other. Each beat is a JSON object shared with the other commands' heartbeats
# (multihost.where_topic): {beat, time, idle_s, busy, finished, asked, user, ..., text}.
WHERE = multihost.where_topic(COMMAND)
DETAIL_REQUEST = multihost.Topic(COMMAND, "detail-request", DetailRequest)
DETAIL = multihost.Topic(COMMAND, "detail", Detail)
COLLECT = multihost.Topic(COMMAND, "collect", Collect)
VERDICT = multihost.Topic(COMMAND, "verdict", Verdict)
ACK = multihost.Topic(COMMAND, "ack", bool)  # a member took the verdict
BEAT_S = 1.0
CHECKPOINT = 16
FIRST_BEAT_S = 60.0  # a process that joined but has not beaten yet (its backend still starting) is not lost sooner
FACTS_FOR_ALL = 16  # in jobs up to this size every process reads the whole job's facts (larger: its own part)


class Sequence:
    """A process's step sequence: the fingerprints of its global calls, hashed in a chain."""

    def __init__(self) -> None:
        self.count = 0
        self.digest = bytes(8)
        self.checkpoints: list[tuple[int, str]] = []
        self.rows: list[tuple[str, tuple]] = []  # per step: (fingerprint, (function, call index, site))
        self._published = 0

    def add(self, key: str, row: tuple) -> None:
        self.digest = hashlib.blake2b(self.digest + key.encode(), digest_size=8).digest()
        self.rows.append((key, row))
        self.count += 1
        if self.count % CHECKPOINT == 0:
            self.checkpoints.append((self.count, self.digest.hex()))

    def update(self, recorder: Any) -> None:
        """Hash the steps the recorder added since the last update."""
        steps = recorder.steps_program
        while self.count < len(steps):
            program = recorder.programs[steps[self.count]]
            site = recorder.sites[recorder.steps_site[self.count]]
            self.add(program.key, (program.function, recorder.steps_index[self.count],
                                   site.as_dict() if site else None))

    def new_checkpoints(self) -> list[tuple[int, str]]:
        found = self.checkpoints[self._published:][-64:]
        self._published = len(self.checkpoints)
        return found

    def known(self) -> dict[int, str]:
        """Count -> digest at every checkpoint, and at the current count."""
        return {**dict(self.checkpoints), self.count: self.digest.hex()}

    def detail(self, lo: int, hi: int) -> dict[str, dict]:
        """Steps ``lo..hi`` (as published for a detail request)."""
        return {str(step): {"key": key, "function": row[0], "index": row[1], "site": row[2]}
                for step, (key, row) in enumerate(self.rows[lo:hi + 1], start=lo)}


def first_mismatch(known: dict[int, dict[int, str]]) -> tuple[int, int] | None:
    """``(lo, hi)``: the stretch of steps holding the first divergence, from each process's digests at step
    counts; None while every count seen by several processes agrees.

    Example:
        >>> first_mismatch({0: {16: "a", 32: "b"}, 1: {16: "a", 32: "c"}})
        (16, 31)
        >>> first_mismatch({0: {16: "a"}, 1: {16: "a", 20: "x"}}) is None
        True
    """
    counts = sorted({count for digests in known.values() for count in digests})
    agreed = 0
    for count in counts:
        seen = {digests[count] for digests in known.values() if count in digests}
        holders = sum(1 for digests in known.values() if count in digests)
        if holders > 1 and len(seen) > 1:
            return agreed, count - 1
        if holders > 1:
            agreed = count
    return None


def first_different_step(details: dict[int, dict[str, dict]]) -> dict | None:
    """``{"step", "rows": {process: row}}`` at the first step whose fingerprints differ between processes."""
    steps = sorted({int(step) for rows in details.values() for step in rows})
    for step in steps:
        rows = {index: rows[str(step)] for index, rows in details.items() if str(step) in rows}
        if len(rows) > 1 and len({row["key"] for row in rows.values()}) > 1:
            return {"step": step, "rows": rows}
    return None


class JobLink:
    """This process's part in the job's protocol (see the module docstring), driven by its watchdog's ticks."""

    def __init__(self, watchdog: Any, index: int, count: int):
        self.watchdog, self.index, self.count = watchdog, index, count
        self.sequence = Sequence()
        # A loaded machine can delay a beat by seconds (and a collect pauses every process's beats while it
        # reads its own stacks): a peer is lost only after 10 s (or --stall, up to 15 s) without one.
        self.lost_s = max(10.0, min(multihost.SILENT_S, watchdog.settings.stall_s))
        self.collecting = False
        self.beats = 0
        self.beat_at = 0.0
        self.states: dict[int, dict] = {}
        self.seen: dict[int, tuple[Any, float]] = {}
        self.lost: set[int] = set()
        self.known: dict[int, dict[int, str]] = {}
        self.finished = False
        self.outcome: dict | None = None
        self.asked: str | None = None
        self.divergence: dict | None = None
        self.requests = 0
        self.handled: dict[str, Any] = {}
        # (collect id, since, the record sent) while a member waits for the verdict
        self.waiting: tuple[Any, float, dict] | None = None

    def merger(self) -> int:
        return min(i for i in range(self.count) if i not in self.lost)

    # -- every tick ------------------------------------------------------------------------------------------

    def tick(self, now: float, asked: str | None) -> None:
        self.sequence.update(self.watchdog.recorder)
        if asked is not None:
            self.asked = self.asked or asked
        if now - self.beat_at >= BEAT_S:
            self.beat_at = now
            self._beat(now)
            self._watch(now)
            if self.merger() == self.index:
                self._evaluate(now)
        if self.merger() != self.index:
            self._answer(now)

    def finish(self, outcome: dict) -> None:
        self.outcome, self.finished = outcome, True

    def _beat(self, now: float) -> None:
        from jaxdbg.hang.record import main_thread_user_frame

        self.beats += 1
        recorder, activity = self.watchdog.recorder, self.watchdog.activity
        last = recorder._latest_call()
        multihost.publish(WHERE, {
            "beat": self.beats, "time": now, "idle_s": activity.idle_s(now), "busy": activity.busy,
            "finished": self.finished, "asked": self.asked, "user": main_thread_user_frame(),
            "in_call": bool(recorder.inflight), "steps": self.sequence.count,
            "last": None if last is None else {"function": last.function, "index": last.index, "seq": last.seq,
                                               "step": last.step},
            "checkpoints": [*self.sequence.new_checkpoints(), (self.sequence.count, self.sequence.digest.hex())],
            "text": f"after {last.function} call {last.index}" if last else "before its first jitted call"})
        self.known[self.index] = self.sequence.known()

    def _watch(self, now: float) -> None:
        """Read the others' beats; a beat that stopped moving for ``lost_s`` is a lost process (not while a
        collect is under way: every process is then busy reading its own stacks, and the merger is chosen)."""
        judging = not (self.collecting or self.waiting is not None)
        for peer in range(self.count):
            if peer == self.index or peer in self.lost:
                continue
            where = multihost.peek(WHERE, peer)
            beat = where.get("beat") if isinstance(where, dict) else None
            last = self.seen.get(peer)
            if last is None or last[0] != beat:
                self.seen[peer] = (beat, now)
            elif judging and now - last[1] >= (self.lost_s if beat is not None else max(4 * self.lost_s, FIRST_BEAT_S)):
                self.lost.add(peer)
                multihost.mark_silent(peer)
                continue
            if isinstance(where, dict):
                self.states[peer] = where
                digests = self.known.setdefault(peer, {})
                digests.update({int(count): digest for count, digest in where.get("checkpoints") or ()})

    # -- the merger ------------------------------------------------------------------------------------------

    def _evaluate(self, now: float) -> None:
        if self.divergence is None:
            stretch = first_mismatch(self.known)
            if stretch is not None:
                self.divergence = self._find_divergence(*stretch) or {"step": stretch[0], "rows": {}}
                if self.watchdog.on_divergence is not None:
                    self.watchdog.on_divergence(self.divergence)
        live = [i for i in range(self.count) if i not in self.lost]
        asked = self.asked or next((self.states[i]["asked"] for i in live if i != self.index
                                    and self.states.get(i, {}).get("asked")), None)
        if asked is not None:
            self._collect(asked)
            return
        running = [i for i in live if not (self.finished if i == self.index else
                                           self.states.get(i, {}).get("finished"))]
        if not running:
            self._collect("end")
            return
        idle = [self.watchdog.activity.idle_s(now) if i == self.index else
                float(self.states.get(i, {}).get("idle_s", 0)) for i in running]
        heard = all(i == self.index or i in self.states for i in running)
        if heard and all(seconds >= self.watchdog.settings.stall_s for seconds in idle):
            self._collect("stall")

    def _find_divergence(self, lo: int, hi: int) -> dict | None:
        """Ask every process for its steps ``lo..hi`` and find the first that differs."""
        self.requests += 1
        hi = min(hi, lo + 255)
        request = DetailRequest(f"{self.index}-{self.requests}", lo, hi)
        multihost.publish(DETAIL_REQUEST, request)
        details = {self.index: self.sequence.detail(lo, hi)}
        deadline = time.time() + 10.0
        for peer in range(self.count):
            while peer != self.index and peer not in self.lost and time.time() < deadline:
                answer = multihost.peek(DETAIL, peer)
                if answer is not None and answer.id == request.id:
                    details[peer] = answer.rows
                    break
                time.sleep(0.1)
        return first_different_step(details)

    def _collect(self, reason: str) -> None:
        """Gather every process's record and hand the job's facts to the verdict (every process's)."""
        from jaxdbg.hang.verdict import JobFacts

        self.collecting = True
        cid = f"{self.index}-{time.time():.6f}"
        multihost.publish(COLLECT, Collect(cid, reason))
        if reason == "end" and self.divergence is None:
            self._evaluate_end()
        records = {self.index: self._own_record(reason)}
        deadline = time.time() + self.watchdog.settings.collect_s
        for peer in range(self.count):
            if peer == self.index or peer in self.lost:
                continue
            data = multihost.fetch_bytes(COMMAND, f"record-{cid}", peer, max(deadline - time.time(), 0.1))
            if data is not None:
                records[peer] = json.loads(data)
        silent = {peer: self.states.get(peer) or {} for peer in range(self.count) if peer not in records}
        outcomes = {index: record["outcome"] for index, record in records.items() if record.get("outcome")}
        facts = JobFacts(self.count, None if reason == "end" else reason, self.watchdog.settings.stall_s, records,
                         outcomes, silent, self.divergence, list(self.watchdog._notes))
        multihost.publish_bytes(COMMAND, "facts", json.dumps(facts_json(facts)).encode())
        multihost.publish(VERDICT, Verdict(cid))
        deadline = time.time() + ACK_WAIT_S
        for peer in records:
            if peer != self.index:
                multihost.wait_for(ACK, peer, max(deadline - time.time(), 0.05))
        self.watchdog.deliver(facts)

    def _evaluate_end(self) -> None:
        for peer in range(self.count):  # the finished processes' final digests, from their last beats
            where = self.states.get(peer) or {}
            self.known.setdefault(peer, {}).update({int(c): d for c, d in where.get("checkpoints") or ()})
        stretch = first_mismatch(self.known)
        if stretch is not None:
            self.divergence = self._find_divergence(*stretch) or {"step": stretch[0], "rows": {}}

    def _own_record(self, reason: str) -> dict:
        extra = {"outcome": self.outcome} if self.outcome else {}
        return self.watchdog.record(reason, index=self.index, count=self.count, extra=extra)

    # -- a member ---------------------------------------------------------------------------------------------

    def _answer(self, now: float) -> None:
        merger = self.merger()
        request = multihost.peek(DETAIL_REQUEST, merger)
        if request is not None and self.handled.get("detail") != request.id:
            self.handled["detail"] = request.id
            multihost.publish(DETAIL, Detail(request.id, self.sequence.detail(request.lo, request.hi)))
        collect = multihost.peek(COLLECT, merger)
        if collect is not None and self.handled.get("collect") != collect.id:
            self.handled["collect"] = collect.id
            record = self._own_record(collect.reason or "stall")
            multihost.publish_bytes(COMMAND, f"record-{collect.id}", json.dumps(record).encode())
            self.waiting = (collect.id, now, record)
        if self.waiting is not None:
            self._take_verdict(merger, now)

    def _take_verdict(self, merger: int, now: float) -> None:
        from jaxdbg.hang.verdict import JobFacts

        assert self.waiting is not None
        cid, since, record = self.waiting
        verdict = multihost.peek(VERDICT, merger)
        timed_out = now - since > self.watchdog.settings.collect_s + 30.0
        if not (verdict is not None and verdict.id == cid) and not timed_out:
            return
        facts = None
        if not timed_out and self.count <= FACTS_FOR_ALL:
            data = multihost.fetch_bytes(COMMAND, "facts", merger, 10.0, remove=False)
            facts = facts_from_json(json.loads(data)) if data else None
        if facts is None:
            note = (f"process {merger} did not send the job's verdict" if timed_out else
                    f"process {merger}'s report holds the job's verdict (this report: this process only)")
            facts = JobFacts(self.count, record.get("reason") if record.get("reason") != "end" else None,
                             self.watchdog.settings.stall_s, {self.index: record},
                             {self.index: record["outcome"]} if record.get("outcome") else {}, notes=[note])
        multihost.publish(ACK, True)
        self.waiting = None
        self.watchdog.deliver(facts)
