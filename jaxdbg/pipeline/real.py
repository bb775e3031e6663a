"""Real pipeline execution: an MLP split into stages on separate JAX devices, one worker thread per stage.

Each model stage is a few ``tanh(x @ w + b)`` layers; the last one also computes the mean squared error.
A forward runs ``jax.vjp`` under ``jax.jit`` and keeps the returned VJP (a pytree of residuals on the
stage's devices); a backward applies it to the incoming gradient and adds the weight gradient to the
stage's accumulator. With a split backward, ``I`` keeps only the input gradient and ``W`` only the weight
gradient (XLA drops the unused half of each). Activations and gradients travel between stages as
messages carried by a transport (:mod:`jaxdbg.pipeline.transport`): ``jax.device_put`` within a process,
``jax.experimental.transfer`` to a stage of another process of a ``jax.distributed`` job, where each
process runs its own stages and readiness waits on messages from the others. A stage may span several
devices (``devices_per_stage``): its weights are then sharded over a one-axis mesh, and its one SPMD
program issues the stage's collectives on all of its devices alike.

Each worker thread drives its stage through the same :class:`~jaxdbg.pipeline.arbiter.Arbiter` as the
simulator. Variability is injected on top of the real compute: a task that finishes before its realised
duration sleeps for the rest (on a 2-core host, this also emulates devices that really run in parallel);
a message is held back for its realised delay. After a run, the accumulated gradients are compared with
``jax.grad`` of the whole model on one device.

Example:
    >>> pipe = RealPipeline(PipelineShape(2, 4), ModelSpec())                  # doctest: +SKIP
    >>> result = pipe.run(make_policies("ready", pipe.shape, hint="bf"), d)    # doctest: +SKIP
    >>> result.max_abs_grad_diff < 1e-5                                        # doctest: +SKIP
    True
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import math
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from jaxdbg._errors import UsageError
from jaxdbg.pipeline.arbiter import Arbiter, RunRecord
from jaxdbg.pipeline.simulate import simulate
from jaxdbg.pipeline.tasks import BACKWARD, FORWARD, PipelineShape
from jaxdbg.pipeline.transport import LocalTransport
from jaxdbg.pipeline.variability import Durations

_POLL_S = 0.05  # longest a waiting worker sleeps before it looks at the abort flag again


@dataclass(frozen=True)
class ModelSpec:
    """The MLP: ``width`` features, ``rows`` examples per microbatch, ``layers`` per model stage."""

    width: int = 32
    rows: int = 8
    layers: int = 2
    seed: int = 0


@dataclass(frozen=True)
class RealRun:
    """One real run: its timeline, how far its gradients are from the reference, what it measured."""

    record: RunRecord
    max_abs_grad_diff: float
    max_abs_grad: float
    measured: np.ndarray  # seconds each task actually took
    message_delay: np.ndarray  # seconds from the end of a task to the arrival of its message (0: none)


def init_params(spec: ModelSpec, model_stages: int) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """Per model stage, its layers' ``(w, b)`` as host arrays (scaled so tanh stays out of saturation)."""
    rng = np.random.default_rng(spec.seed)
    scale = 1.0 / np.sqrt(spec.width)
    return [
        [
            (rng.normal(0, scale, (spec.width, spec.width)).astype(np.float32),
             rng.normal(0, 0.1, spec.width).astype(np.float32))
            for _ in range(spec.layers)
        ]
        for _ in range(model_stages)
    ]


def make_batch(spec: ModelSpec, microbatches: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(spec.seed + 1)
    x = rng.normal(size=(microbatches, spec.rows, spec.width)).astype(np.float32)
    y = rng.normal(size=(microbatches, spec.rows, spec.width)).astype(np.float32)
    return x, y


def stage_apply(params, x):
    import jax.numpy as jnp

    for w, b in params:
        x = jnp.tanh(x @ w + b)
    return x


def stage_loss(params, x, target, scale):
    import jax.numpy as jnp

    return scale * jnp.mean((stage_apply(params, x) - target) ** 2)


def reference_grads(spec: ModelSpec, params, x: np.ndarray, y: np.ndarray, device) -> list:
    """``jax.grad`` of the mean loss over all microbatches, the whole model on one device."""
    import jax

    def loss(all_params, xs, ys):
        h = xs
        for stage in all_params:
            h = stage_apply(stage, h)
        return jax.numpy.mean((h - ys) ** 2)

    placed = jax.device_put((params, x, y), device)
    return jax.device_get(jax.jit(jax.grad(loss))(*placed))


def pick_devices(count: int, owners: list[int] | None = None) -> list:
    """``count`` devices of the default backend, or of the CPU when it has more; else an error. With
    ``owners`` (the process of each of ``count`` slots), each slot gets a device of its process, in order."""
    import jax

    owners = owners if owners is not None else [0] * count
    for devices in (jax.devices(), jax.devices("cpu")):
        by_process: dict[int, list] = {}
        for device in devices:
            by_process.setdefault(device.process_index, []).append(device)
        wanted = {q: owners.count(q) for q in set(owners)}
        if all(len(by_process.get(q, [])) >= n for q, n in wanted.items()):
            taken = {q: iter(by_process[q]) for q in wanted}
            return [next(taken[q]) for q in owners]
    per_process = max(owners.count(q) for q in set(owners))
    raise UsageError(
        f"real mode needs {count} devices but jax sees {len(jax.local_devices())} in this process; lower --stages "
        f"or --devices-per-stage, or set XLA_FLAGS=--xla_force_host_platform_device_count={per_process} before "
        "jax starts"
    )


@functools.lru_cache(maxsize=1)
def _programs() -> _Programs:
    return _Programs()


class _Programs:
    """The jitted programs of the stages (compiled once per stage placement, shared by every pipeline)."""

    def __init__(self):
        import jax

        def forward(params, x):
            return jax.vjp(stage_apply, params, x)

        def forward_last(params, x, target, scale):
            return jax.vjp(lambda p, h: stage_loss(p, h, target, scale), params, x)

        def add(acc, grads):
            return jax.tree_util.tree_map(lambda a, g: a + g, acc, grads)

        self.forward = jax.jit(forward)
        self.forward_last = jax.jit(forward_last)
        self.backward = jax.jit(lambda vjp, dy, acc: (add(acc, vjp(dy)[0]), vjp(dy)[1]))
        self.backward_first = jax.jit(lambda vjp, dy, acc: add(acc, vjp(dy)[0]))
        self.input_grad = jax.jit(lambda vjp, dy: vjp(dy)[1])
        self.weight_grad = jax.jit(lambda vjp, dy, acc: add(acc, vjp(dy)[0]))


class RealPipeline:
    """A model placed stage by stage on devices, ready to run any policy against realised durations."""

    def __init__(self, shape: PipelineShape, spec: ModelSpec, devices_per_stage: int = 1, devices: list | None = None,
                 transport: LocalTransport | None = None):
        import jax
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        self.shape, self.spec = shape, spec
        p, S, m = shape.stages, shape.model_stages, shape.microbatches
        self.transport = transport or LocalTransport()
        if p < self.transport.count:
            raise UsageError(f"--stages {p}: real mode across {self.transport.count} processes needs a stage or "
                             "more per process; raise --stages or lower --processes")
        self.owner = self.transport.owners(p)  # the process of each stage
        self.local_workers = [w for w in range(p) if self.owner[w] == self.transport.index]
        local = [k for k in range(S) if k % p in self.local_workers]  # this process's model stages
        devices = devices or pick_devices(
            p * devices_per_stage, [q for q in self.owner for _ in range(devices_per_stage)])
        if len(devices) < p * devices_per_stage:
            raise UsageError(f"real mode needs {p * devices_per_stage} devices, got {len(devices)}")
        if spec.width % devices_per_stage:
            raise UsageError(f"--devices-per-stage {devices_per_stage} must divide the model width {spec.width}")
        self.devices = devices
        meshes = [Mesh(np.array(devices[w * devices_per_stage:(w + 1) * devices_per_stage]), ("tp",)) for w in range(p)]
        # Activations replicated on a stage's devices; weights split by output feature across them.
        self.activation = [NamedSharding(meshes[k % p], PartitionSpec()) for k in range(S)]
        weight = [NamedSharding(meshes[k % p], PartitionSpec(None, "tp")) for k in range(S)]
        bias = [NamedSharding(meshes[k % p], PartitionSpec("tp")) for k in range(S)]
        self.local_model_stages = local
        self.host_params = init_params(spec, S)
        # Weights and accumulators only where this process runs the model stage (None elsewhere).
        self.params: list[Any] = [
            [(jax.device_put(w, weight[k]), jax.device_put(b, bias[k])) for w, b in self.host_params[k]]
            if k in local else None for k in range(S)
        ]
        x, y = make_batch(spec, m)
        self.inputs = [jax.device_put(x[j], self.activation[0]) for j in range(m)] if 0 in local else []
        self.targets = [jax.device_put(y[j], self.activation[S - 1]) for j in range(m)] if S - 1 in local else []
        self.scale = np.float32(1.0 / m)
        self.reference = reference_grads(spec, self.host_params, x.reshape(-1, spec.width), y.reshape(-1, spec.width),
                                         devices[self.local_workers[0] * devices_per_stage])
        self.programs = _programs()
        self._zeros = [jax.tree_util.tree_map(jax.numpy.zeros_like, self.params[k]) if k in local else None
                       for k in range(S)]
        self._warm_up()

    def _warm_up(self) -> None:
        """Compile this process's stage programs: each model stage forward and back on a stand-in input."""
        import jax

        S, prog, spec = self.shape.model_stages, self.programs, self.spec
        for k in self.local_model_stages:
            h = jax.device_put(np.zeros((spec.rows, spec.width), np.float32), self.activation[k])
            if k == S - 1:
                _, vjp = prog.forward_last(self.params[k], h, self.targets[0], self.scale)
                dy: Any = np.float32(1.0)
            else:
                out, vjp = prog.forward(self.params[k], h)
                dy = jax.device_put(np.ones(out.shape, out.dtype), self.activation[k])
            acc = self._zeros[k]
            jax.block_until_ready(prog.weight_grad(vjp, dy, acc))
            jax.block_until_ready(prog.input_grad(vjp, dy))
            jax.block_until_ready(prog.backward_first(vjp, dy, acc) if k == 0 else prog.backward(vjp, dy, acc))

    def run(
        self, policies: list, durations: Durations, comm: str = "async", annotate: str | None = None,
        timeout: float = 300.0,
    ) -> RealRun:
        """Run every task with one thread per stage of this process; ``annotate`` names jax.profiler
        annotations. Across processes every process calls this together and gets the whole job's run."""
        import jax

        shape = self.shape
        n = shape.num_tasks
        arbiter = Arbiter(shape, policies, comm, simulator=simulate)  # dry runs on the expected durations
        state = _RunState(self, arbiter, durations, comm, annotate, n)
        arbiter.start()
        threads = [threading.Thread(target=state.work, args=(w,), name=f"stage-{w}", daemon=True)
                   for w in self.local_workers]
        state.t0 = self.transport.begin(state)
        for t in threads:
            t.start()
        deadline = time.monotonic() + timeout
        for t in threads:
            t.join(max(deadline - time.monotonic(), 0.0))
        if any(t.is_alive() for t in threads):
            state.abort.set()
            self.transport.abort(f"timed out ({state.describe_progress()})")
            for t in threads:
                t.join(1.0)
            raise TimeoutError(f"the real run did not finish in {timeout:.0f}s ({state.describe_progress()})")
        if state.error is not None:
            self.transport.abort(f"{type(state.error).__name__}: {state.error}".splitlines()[0])
            raise state.error
        local = self.local_model_stages
        grads = jax.device_get([state.acc[k] for k in local])
        reference = [self.reference[k] for k in local]
        diff = max(float(np.max(np.abs(np.asarray(g) - np.asarray(r))))
                   for g, r in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(reference)))
        biggest = max(float(np.max(np.abs(np.asarray(r)))) for r in jax.tree_util.tree_leaves(self.reference))
        mine = [self.owner[w] == self.transport.index for w in arbiter.graph.worker]
        part = {
            "start": [t if own else 0.0 for t, own in zip(state.start, mine)],
            "end": [t if own else 0.0 for t, own in zip(state.end, mine)],
            "delay": state.delay, "blocked": state.blocked, "memory_wait": list(arbiter.memory_wait),
            "peak": list(arbiter.peak), "decisions": sum(arbiter.decisions), "decision_ns": sum(arbiter.decision_ns),
            "grad_diff": diff,
        }
        return _merged(arbiter, self.transport.end(part, timeout), biggest)


def _merged(arbiter: Arbiter, parts: list[dict], biggest: float) -> RealRun:
    """One run from each process's part: each task's times from the process that ran it, each stage's waits
    from its process, a message's delay as its receiver saw it (at least the drawn delay)."""
    start, end = (np.sum([p[key] for p in parts], axis=0) for key in ("start", "end"))
    blocked, memory_wait = (np.sum([p[key] for p in parts], axis=0).tolist() for key in ("blocked", "memory_wait"))
    record = RunRecord(
        arbiter.shape, start, end, tuple(blocked), tuple(memory_wait),
        tuple(np.max([p["peak"] for p in parts], axis=0).tolist()),
        sum(p["decisions"] for p in parts), sum(p["decision_ns"] for p in parts),
    )
    delay = np.max([p["delay"] for p in parts], axis=0)
    return RealRun(record, max(p["grad_diff"] for p in parts), biggest, end - start, delay)


class _RunState:
    """The mutable side of one real run: inboxes, saved residuals, accumulators, the timeline."""

    def __init__(self, pipe: RealPipeline, arbiter: Arbiter, durations: Durations, comm: str, annotate: str | None,
                 n: int):
        self.pipe, self.arbiter, self.comm, self.annotate = pipe, arbiter, comm, annotate
        self.target = durations.task.tolist()
        self.comm_delay = durations.comm.tolist()
        p = pipe.shape.stages
        self.local_workers = pipe.local_workers
        self.transport = pipe.transport
        self.start, self.end, self.delay = [0.0] * n, [0.0] * n, [0.0] * n
        self.blocked = [0.0] * p
        self.acc = list(pipe._zeros)
        self.values: dict[int, Any] = {}  # task -> the input its message brought
        self.saved: dict[tuple[int, int], Any] = {}  # (model stage, microbatch) -> VJP
        self.cotangents: dict[tuple[int, int], Any] = {}  # kept from I for W
        self.remaining = [0] * p
        for w in arbiter.graph.worker:
            self.remaining[w] += 1
        self.abort = threading.Event()
        self.error: BaseException | None = None
        self.t0 = 0.0
        self._one = np.float32(1.0)  # the loss's cotangent

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def describe_progress(self) -> str:
        return ", ".join(f"stage {w}: {self.remaining[w]} tasks left" for w in self.local_workers if self.remaining[w])

    def work(self, w: int) -> None:
        try:
            self._loop(w)
        except BaseException as err:  # noqa: BLE001 - handed to the main thread, which re-raises it
            self.error = self.error or err
            self.abort.set()

    def _loop(self, w: int) -> None:
        arbiter, inbox = self.arbiter, self.transport.inbox[w]
        pending: list[tuple[float, int, int, Any, float]] = []  # in flight: (arrival, seq, task, value, delay)
        offers: dict[int, tuple[Any, int, float]] = {}  # blocking sends waiting for our receive
        blocked_on: list[float] = []  # sync: when our own send began (empty when not sending)
        acked_until: list[float] = []
        seq = 0
        time.sleep(max(self.t0 - time.perf_counter(), 0.0))  # all stages start together
        while (self.remaining[w] or blocked_on) and not self.abort.is_set():
            wake = math.inf  # when to look again without a message: the next arrival, or a policy's hold
            while True:  # take in every message that is already there
                try:
                    message = inbox.get_nowait()
                except queue.Empty:
                    break
                if message[0] == "data":
                    seq += 1
                    heapq.heappush(pending, (message[1], seq, message[2], message[3], message[4]))
                elif message[0] == "offer":
                    offers[message[1]] = message[2:]
                else:
                    acked_until.append(message[1])
            now = self.now()
            while pending and pending[0][0] <= now:
                _, _, task, value, delay = heapq.heappop(pending)
                self.values[task] = value
                arbiter.satisfy(task, delay)
            for task in list(offers):  # not computing now: a posted receive can pair with a send
                if arbiter.wants(w, task):
                    value, sender, delay = offers.pop(task)
                    arrival = now + delay
                    seq += 1
                    heapq.heappush(pending, (arrival, seq, task, value, delay))
                    self.transport.send(sender, ("ack", arrival))
            if blocked_on:
                if acked_until:
                    self._sleep_until(acked_until.pop())  # the transfer itself
                    self.blocked[w] += self.now() - blocked_on.pop()
                    continue
            elif self.remaining[w]:
                task = arbiter.pick(w, self.now())
                if task >= 0:
                    arbiter.resume(w, self.start_task(task))
                    self._run(w, task, blocked_on)
                    continue
                arbiter.idle(w, now)
                wake = arbiter.wake_at(w)
            if pending:
                wake = min(wake, pending[0][0])
            self._wait(inbox, None if wake == math.inf else max(wake - self.now(), 0.0))

    def start_task(self, task: int) -> float:
        self.start[task] = self.now()
        return self.start[task]

    def _wait(self, inbox: queue.SimpleQueue, timeout: float | None) -> None:
        """Block until a message comes in (put back for the loop) or the next arrival is due."""
        try:
            message = inbox.get(timeout=_POLL_S if timeout is None else min(timeout, _POLL_S))
        except queue.Empty:
            return
        inbox.put(message)

    def _sleep_until(self, when: float) -> None:
        rest = when - self.now()
        if rest > 0:
            time.sleep(rest)

    def _run(self, w: int, task: int, blocked_on: list[float]) -> None:
        import jax

        shape = self.pipe.shape
        began = self.start[task]
        name = shape.name(task)
        context = jax.profiler.TraceAnnotation(f"{self.annotate} {name}") if self.annotate else contextlib.nullcontext()
        with context:
            out = self._compute(task)
        self._sleep_until(began + self.target[task])  # the realised duration, if longer than the compute
        self.end[task] = self.now()
        self.remaining[w] -= 1
        receiver_task = self.arbiter.finish(task, self.end[task])
        if receiver_task < 0:
            return
        receiver = self.arbiter.graph.worker[receiver_task]
        self.delay[task] = self.comm_delay[task]
        if self.comm == "sync":
            blocked_on.append(self.end[task])
            self.transport.send(receiver, ("offer", receiver_task, out, w, self.comm_delay[task]), task)
        else:
            self.transport.send(
                receiver, ("data", self.end[task] + self.comm_delay[task], receiver_task, out, self.comm_delay[task]),
                task)

    def _compute(self, task: int) -> Any:
        """Run one task's jitted program; returns what goes to the next stage (None if nothing)."""
        import jax

        pipe, prog = self.pipe, self.pipe.programs
        kind, k, j = pipe.shape.decode(task)
        last = k == pipe.shape.model_stages - 1
        if kind == FORWARD:
            x = pipe.inputs[j] if k == 0 else self.values.pop(task)
            if last:
                out, vjp = prog.forward_last(pipe.params[k], x, pipe.targets[j], pipe.scale)
                self.saved[k, j] = vjp
                jax.block_until_ready(out)
                return None
            out, vjp = prog.forward(pipe.params[k], x)
            self.saved[k, j] = vjp
            return jax.block_until_ready(out)
        if kind == BACKWARD:
            dy = self._one if last else self.values.pop(task)
            if pipe.shape.split:
                self.cotangents[k, j] = dy
                dx = jax.block_until_ready(prog.input_grad(self.saved[k, j], dy))
                return dx if k > 0 else None
            vjp = self.saved.pop((k, j))
            if k == 0:
                self.acc[k] = jax.block_until_ready(prog.backward_first(vjp, dy, self.acc[k]))
                return None
            self.acc[k], dx = jax.block_until_ready(prog.backward(vjp, dy, self.acc[k]))
            return dx
        self.acc[k] = jax.block_until_ready(
            prog.weight_grad(self.saved.pop((k, j)), self.cotangents.pop((k, j)), self.acc[k]))
        return None
