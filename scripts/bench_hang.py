"""Benchmark hang-hunt's flight recorder and the time from a stall to its verdict, in one run.

(a) Overhead, in one process (the least load-sensitive figure on a shared machine): a steady training loop
    (a small conv net with optax's Adam on a fresh host batch each step, the loss read every 10 steps) plain,
    and the same loop jitted under the flight recorder with its watchdog thread running (what ``jaxdbg
    hang-hunt`` and ``jaxdbg.watch(stall_after=...)`` add), chunks of ``--chunk`` steps alternating, for
    ``--rounds`` rounds. The watchdog runs only during the recorded chunks. Printed: the median ratio of
    recorded to plain seconds per step over the rounds, with its spread (the rounds' 10th-90th percentile),
    wall and CPU time of the whole process. Target: <= 1.03x.
(a') Per call: a tiny jitted function (16 floats) called in a loop, plain and recorded, alternating: the
    recorder's fixed cost per call in microseconds.
(b) From stall to verdict: ``jaxdbg hang-hunt`` on a loop whose data loader stops answering at step 3 (one
    process), and on a 2-process job whose process 1 does (``--processes 2``); the program writes the time it
    got stuck, and the bench measures until the report is written and until the command has exited
    (everything stopped). The floor is ``--stall``; the rest is the verdict's own cost.

Usage: python scripts/bench_hang.py [--rounds 20] [--chunk 40] [--stall 5] [--skip-verdict]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LOOP = textwrap.dedent('''
    import json, sys, time
    import jax, jax.numpy as jnp, numpy as np, optax
    from jaxdbg import jit_layer
    from jaxdbg.hang.recorder import Recorder
    from jaxdbg.hang.watchdog import Settings, Watchdog

    rounds, chunk, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]

    def build():
        """run_step(step) -> loss: a conv net's training step on that step's fresh host batch."""
        k = jax.random.split(jax.random.key(0), 3)
        params = {"conv": jax.random.normal(k[0], (3, 3, 1, 16)) * 0.1,
                  "dense": jax.random.normal(k[1], (14 * 14 * 16, 10)) * 0.01}
        tx = optax.adam(1e-3)
        state = [params, tx.init(params)]

        def loss_fn(params, x, y):
            h = jax.lax.conv_general_dilated(x, params["conv"], (1, 1), "SAME",
                                             dimension_numbers=("NHWC", "HWIO", "NHWC"))
            h = jax.nn.relu(h).reshape(x.shape[0], 14, 2, 14, 2, 16).mean(axis=(2, 4)).reshape(x.shape[0], -1)
            return optax.softmax_cross_entropy_with_integer_labels(h @ params["dense"], y).mean()

        @jax.jit
        def train_step(params, opt_state, x, y):
            loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

        rng = np.random.default_rng(0)
        images = rng.normal(size=(64 * 32, 28, 28, 1)).astype(np.float32)
        labels = rng.integers(0, 10, size=(64 * 32,)).astype(np.int32)

        def run_step(step):
            i = (step % 64) * 32
            state[0], state[1], loss = train_step(state[0], state[1], images[i:i + 32], labels[i:i + 32])
            return loss
        return run_step

    def timed(run_step, n):
        t, c = time.perf_counter(), time.process_time()
        for step in range(n):
            loss = run_step(step)
            if step % 10 == 0:
                float(loss)
        loss.block_until_ready()
        return (time.perf_counter() - t) / n, (time.process_time() - c) / n

    def tiny_rows(n=2000):
        """Called inside the recorder's context: plain was jitted outside it, recorded inside."""
        recorded = jax.jit(lambda x: x * 2 + 1)
        x = jnp.ones(16)
        for f in (plain_tiny, recorded, plain_tiny, recorded):
            f(x).block_until_ready()
        rows = []
        for _ in range(5):
            pair = []
            for f in (plain_tiny, recorded):
                t = time.perf_counter()
                for _ in range(n):
                    y = f(x)
                y.block_until_ready()
                pair.append((time.perf_counter() - t) / n)
            rows.append(pair)
        return rows

    recorder = Recorder()
    plain = build()
    plain_tiny = jax.jit(lambda x: x * 2 + 1)
    timed(plain, 10)
    rows = []
    # One context for the whole run: a function jitted under the recorder stays recorded only while it is installed.
    with jit_layer.installed(recorder), recorder.listening():
        recorded = build()
        timed(recorded, 10)
        for _ in range(rounds):
            p = timed(plain, chunk)
            watchdog = Watchdog(recorder, Settings(stall_s=3600, native=False), lambda facts: None)
            watchdog.start()
            r = timed(recorded, chunk)
            watchdog.stop()
            rows.append((p, r))
        tiny = tiny_rows()
    json.dump({"rows": rows, "tiny": tiny, "recorded_calls": recorder.calls}, open(out, "w"))
''')

STUCK = textwrap.dedent('''
    import os, sys, time
    import jax, jax.numpy as jnp
    if os.environ.get("JAX_COORDINATOR_ADDRESS"):
        jax.distributed.initialize()
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import numpy as np
    mesh = Mesh(np.array(jax.devices()), ("data",))
    sharding = NamedSharding(mesh, P("data"))
    stamp = sys.argv[1]

    @jax.jit
    def step(w, x):
        return w - 0.1 * (x.T @ jnp.tanh(x @ w)) / x.shape[0]

    w = jnp.ones((8, 8)) * 0.1
    for i in range(6):
        local = np.full((4 * jax.local_device_count(), 8), 0.1 * i, np.float32)
        if i == 3 and jax.process_index() == jax.process_count() - 1:
            open(stamp, "w").write(repr(time.time()))
            time.sleep(10 ** 6)  # the stuck read
        w = step(w, jax.make_array_from_process_local_data(sharding, local))
        w.block_until_ready()
''')


def overhead(args: argparse.Namespace, workdir: str) -> None:
    program, out = os.path.join(workdir, "loop.py"), os.path.join(workdir, "loop.json")
    with open(program, "w") as handle:
        handle.write(LOOP)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
    subprocess.run([sys.executable, program, str(args.rounds), str(args.chunk), out], env=env, check=True)
    found = json.loads(Path(out).read_text())
    wall = sorted(r[1][0] / r[0][0] for r in found["rows"])
    cpu = sorted(r[1][1] / r[0][1] for r in found["rows"])
    plain_ms = statistics.median(r[0][0] for r in found["rows"]) * 1e3

    def spread(values: list[float]) -> str:
        return f"[{values[len(values) // 10]:.3f}-{values[(len(values) * 9) // 10]:.3f}]"

    print(f"(a) steady loop, {args.rounds} rounds of {args.chunk} steps, plain {plain_ms:.2f} ms/step:")
    print(f"    recorded / plain, wall: median {statistics.median(wall):.3f}x {spread(wall)}; "
          f"CPU: median {statistics.median(cpu):.3f}x {spread(cpu)}  (target <= 1.03x)")
    tiny = [(r[1] - r[0]) * 1e6 for r in found["tiny"]]
    print(f"(a') per call of a tiny function: +{statistics.median(tiny):.1f} us recorded "
          f"(plain {statistics.median(r[0] for r in found['tiny']) * 1e6:.1f} us)")


def to_verdict(args: argparse.Namespace, workdir: str, processes: int) -> None:
    program = os.path.join(workdir, "stuck.py")
    with open(program, "w") as handle:
        handle.write(STUCK)
    stamp, folder = os.path.join(workdir, f"stuck-{processes}"), os.path.join(workdir, f"out-{processes}")
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
           "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
    launcher = ["--processes", str(processes)] if processes > 1 else []
    done = subprocess.run([sys.executable, "-m", "jaxdbg", *launcher, "hang-hunt", program, "--stall",
                           str(args.stall), "--out", folder, "-q", "--", stamp], env=env, capture_output=True,
                          text=True, timeout=600)
    ended = time.time()
    stuck_at = float(Path(stamp).read_text())
    report = os.path.join(folder, "process-0" if processes > 1 else "", "report.json")
    result = json.loads(Path(report).read_text())["result"]
    written = os.path.getmtime(report)
    print(f"(b) {processes} process(es), --stall {args.stall:g}: stuck -> report written {written - stuck_at:.1f} s, "
          f"-> command exited {ended - stuck_at:.1f} s (exit {done.returncode}; {result['kind']}, stuck "
          f"{result['stuck']}); over the stall: {written - stuck_at - args.stall:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--chunk", type=int, default=40)
    parser.add_argument("--stall", type=float, default=5.0)
    parser.add_argument("--skip-verdict", action="store_true", help="run (a) and (a') only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-hang-") as workdir:
        overhead(args, workdir)
        if not args.skip_verdict:
            for processes in (1, 2):
                to_verdict(args, workdir, processes)


if __name__ == "__main__":
    main()
