"""Benchmark ``jaxdbg memory`` against a plain run, and its peak estimate against the measured peak, in one run.

(a) Overhead: an Optax MLP training loop (``--steps`` steps, a step of a few milliseconds on a CPU), run plainly
    (``python train.py``) and as ``jaxdbg memory train.py`` (as the command runs by default: CSVs and
    memory.html; ``--plot`` passes ``--plot``, memory.png too), each in fresh processes, alternating
    (``--pairs``). Per run: the loop's own time (the script times its steps after the first call: what the
    recorder adds per call), the whole command's wall time and the CPU time of every process it started (on a
    machine shared with other work CPU time moves less than wall time). Printed: per-pair ratios (median
    [min, max]) of the loop time, the command's wall time and its CPU time, and the median seconds the command
    adds. Target: the whole command <= 1.2x the plain run's wall time.
(b) Peak estimate vs measured peak: a program whose step sorts an [N, N] matrix of scores (a large temporary) on inputs
    it makes with a jitted function first (off CPU, measured by the device allocator's own counts: ``peak_bytes_in_use``
    after the step - ``bytes_in_use`` before the inputs; on an H200 VmHWM read 8 MiB). Run plainly, it compiles both
    ahead (from shapes) and starts the runtime's threads with a tiny call, resets the process's peak resident memory
    (``/proc/self/clear_refs``) and reads its resident memory, then makes the inputs and runs the step, then reads its
    peak resident memory (``VmHWM``): measured = peak - before, i.e. the live inputs plus what the call allocated, with
    the compiler's and the runtime's own memory left out. Run under ``jaxdbg memory``, the run's peak estimate is
    ``result.peak.bytes`` (live arrays at the call + what the call adds, from XLA's memory analysis). Target: within
    10%.
(c) In one process (the least load-sensitive figure on a shared machine): the same step jitted plainly and
    jitted under the recorder (the jit layer's hook ``jaxdbg memory`` installs), chunks of ``--chunk`` steps
    alternating for ``--rounds`` rounds; the median ratio of wall and of CPU time (XLA's threads included) per
    round: the recorder's cost per call (tagging outputs, snapshots within their share of the run).

Usage: python scripts/bench_memory.py [--pairs 3] [--steps 300] [--plot] [--rounds 15] [--chunk 20] [--n 4096]
       [--only overhead|interleaved|peak]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LOOP = textwrap.dedent('''
    import sys, time
    import jax, jax.numpy as jnp, optax

    WIDTH, DEPTH, BATCH, STEPS = 256, 4, 128, int(sys.argv[1])

    def loss_fn(params, x, y):
        for layer in params:
            x = jax.nn.relu(x @ layer["w"] + layer["b"])
        return jnp.mean((x - y) ** 2)

    optimizer = optax.adam(1e-3)

    @jax.jit
    def train_step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    keys = jax.random.split(jax.random.PRNGKey(0), DEPTH + 2)
    params = [{"w": jax.random.normal(k, (WIDTH, WIDTH)) / WIDTH ** 0.5, "b": jnp.zeros(WIDTH)} for k in keys[:DEPTH]]
    opt_state = optimizer.init(params)
    x, y = jax.random.normal(keys[-2], (BATCH, WIDTH)), jax.random.normal(keys[-1], (BATCH, WIDTH))
    params, opt_state, loss = train_step(params, opt_state, x, y)
    loss.block_until_ready()
    start = time.perf_counter()
    for step in range(STEPS):
        params, opt_state, loss = train_step(params, opt_state, x, y)
    loss.block_until_ready()
    print(f"LOOP_S {time.perf_counter() - start:.6f}")
''')

INTERLEAVED = textwrap.dedent('''
    import statistics, sys, tempfile, time
    import jax, jax.numpy as jnp, optax
    from jaxdbg import jit_layer
    from jaxdbg.memory.recorder import MemoryRecorder, compile_spans

    WIDTH, DEPTH, BATCH, ROUNDS, CHUNK = 256, 4, 128, int(sys.argv[1]), int(sys.argv[2])

    def loss_fn(params, x, y):
        for layer in params:
            x = jax.nn.relu(x @ layer["w"] + layer["b"])
        return jnp.mean((x - y) ** 2)

    optimizer = optax.adam(1e-3)

    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    keys = jax.random.split(jax.random.PRNGKey(0), DEPTH + 2)
    params = [{"w": jax.random.normal(k, (WIDTH, WIDTH)) / WIDTH ** 0.5, "b": jnp.zeros(WIDTH)} for k in keys[:DEPTH]]
    state = (params, optimizer.init(params))
    x, y = jax.random.normal(keys[-2], (BATCH, WIDTH)), jax.random.normal(keys[-1], (BATCH, WIDTH))
    plain = jax.jit(step)
    recorder = MemoryRecorder(lambda message: None, tempfile.mkdtemp())
    with compile_spans(recorder), jit_layer.installed(recorder):
        hooked = jax.jit(step)

        def chunk(fn, state):
            wall, cpu = time.perf_counter(), time.process_time()
            params, opt_state = state
            for _ in range(CHUNK):
                params, opt_state, loss = fn(params, opt_state, x, y)
            loss.block_until_ready()
            return (params, opt_state), time.perf_counter() - wall, time.process_time() - cpu

        for fn in (plain, hooked):
            state = chunk(fn, state)[0]  # compiled and warm
        walls, cpus = [], []
        for _ in range(ROUNDS):
            state, plain_wall, plain_cpu = chunk(plain, state)
            state, hooked_wall, hooked_cpu = chunk(hooked, state)
            walls.append(hooked_wall / plain_wall)
            cpus.append(hooked_cpu / plain_cpu)
    print(f"INTERLEAVED wall {statistics.median(walls):.3f} [{min(walls):.3f}, {max(walls):.3f}] "
          f"cpu {statistics.median(cpus):.3f} [{min(cpus):.3f}, {max(cpus):.3f}] "
          f"step_ms {plain_wall / CHUNK * 1e3:.2f} samples {recorder.samples}")
''')

PEAK = textwrap.dedent('''
    import json, sys
    import jax, jax.numpy as jnp

    N, D = int(sys.argv[1]), 256

    def status(key):
        with open("/proc/self/status") as handle:
            return int(next(line.split()[1] for line in handle if line.startswith(key))) * 1024

    @jax.jit
    def make(value):
        return jnp.full((N, D), value, jnp.float32)  # written in place: no temporary

    @jax.jit
    def top_scores(q, k):
        return jnp.sort(q @ k.T, axis=1)[:, -8:]

    shape = jax.ShapeDtypeStruct((N, D), jnp.float32)
    make.lower(jnp.float32(0)).compile()  # compiled ahead: the compiler's own memory is not the program's
    top_scores.lower(shape, shape).compile()
    jax.jit(lambda v: v + 1)(jnp.ones(8)).block_until_ready()  # the runtime's threads started
    device = jax.devices()[0]
    if device.platform != "cpu":  # off CPU the arrays are in device memory: its allocator's own counts
        stats = device.memory_stats() or {}
        before, peak_before = stats.get("bytes_in_use", 0), stats.get("peak_bytes_in_use", 0)
    else:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")  # reset VmHWM to the current resident size
        before = status("VmRSS:")
    q, k = make(jnp.float32(0.5)), make(jnp.float32(0.25))
    top_scores(q, k).block_until_ready()
    if device.platform != "cpu":  # a peak no higher than before the step (compile-time autotuning): unknown
        peak = (device.memory_stats() or {}).get("peak_bytes_in_use", 0)
        print("PEAK_JSON " + json.dumps({"before": before, "peak": peak if peak > peak_before else None,
                                         "how": "device peak_bytes_in_use - bytes_in_use before the inputs"}))
    else:
        print("PEAK_JSON " + json.dumps({"before": before, "peak": status("VmHWM:"),
                                         "how": "VmHWM - VmRSS before the inputs"}))
''')


def run(argv: list[str], env: dict | None = None) -> tuple[float, float, str]:
    """(wall s, CPU s of the process and everything it started, stdout)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):
        raise SystemExit(f"{argv} failed ({done.returncode}): {done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout


def env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}


def overhead(folder: str, pairs: int, steps: int, plot: bool = False) -> None:
    script = os.path.join(folder, "train.py")
    with open(script, "w") as handle:
        handle.write(LOOP)
    rows: dict[str, list[tuple[float, float, float]]] = {"plain": [], "memory": []}
    for i in range(pairs):
        for variant in ("plain", "memory"):
            argv = [sys.executable, script, str(steps)] if variant == "plain" else [
                sys.executable, "-m", "jaxdbg", "memory", script, "--out", os.path.join(folder, f"o{i}"), "-q",
                *(["--plot"] if plot else []), "--", str(steps)]
            wall, cpu, out = run(argv, env())
            if variant == "memory":
                with open(os.path.join(folder, f"o{i}", "target.stdout.txt")) as handle:
                    out = handle.read()
            found = re.search(r"LOOP_S ([0-9.]+)", out)
            assert found, f"no LOOP_S line in the {variant} run's output: {out[-2000:]}"
            loop = float(found.group(1))
            rows[variant].append((loop, wall, cpu))
            print(f"  pair {i} {variant:>6}: loop {loop:.3f} s  wall {wall:.2f} s  cpu {cpu:.2f} s", flush=True)
    pictures = "--plot: memory.png too" if plot else "as by default: CSVs and memory.html"
    print(f"(a) overhead of `jaxdbg memory train.py` ({pictures}) on an Optax MLP loop of {steps} steps, {pairs} pairs "
          "(median of per-pair ratios [min, max]; seconds added, median [min, max]):")
    for k, name in enumerate(("loop time", "command wall", "command CPU")):
        ratios = [m[k] / p[k] for p, m in zip(rows["plain"], rows["memory"])]
        added = [m[k] - p[k] for p, m in zip(rows["plain"], rows["memory"])]
        plain = statistics.median(p[k] for p in rows["plain"])
        print(f"  {name:>12}: {statistics.median(ratios):.3f}x  [{min(ratios):.3f}, {max(ratios):.3f}]   "
              f"+{statistics.median(added):.2f} s [{min(added):+.2f}, {max(added):+.2f}] over {plain:.2f} s plain")


def interleaved(folder: str, rounds: int, chunk: int) -> None:
    script = os.path.join(folder, "interleaved.py")
    with open(script, "w") as handle:
        handle.write(INTERLEAVED)
    _, _, out = run([sys.executable, script, str(rounds), str(chunk)], env())
    figures = out.split("INTERLEAVED ", 1)[1].strip()
    print(f"(c) in one process, chunks of {chunk} steps alternating plain / under the recorder, {rounds} rounds "
          f"(median ratio [min, max]): {figures}")


def peak(folder: str, n: int) -> None:
    script = os.path.join(folder, "peak.py")
    with open(script, "w") as handle:
        handle.write(PEAK)
    _, _, out = run([sys.executable, script, str(n)], env())
    measured = json.loads(out.split("PEAK_JSON ", 1)[1])
    report = os.path.join(folder, "peak.json")
    run([sys.executable, "-m", "jaxdbg", "memory", script, "--out", os.path.join(folder, "peak"), "-q", "--no-plot",
         "--json", report, "--", str(n)], env())
    with open(report) as handle:
        result = json.load(handle)["result"]
    estimate = result["peak"]["bytes"]
    program = next(f for f in result["functions"] if f["name"] == "top_scores")
    if measured["peak"] is None:
        print(f"(b) peak of a [{n}, {n}] sort step: the device's peak did not rise above its peak before the step "
              f"(compile-time autotuning); estimated {estimate / 2**20:.1f} MiB")
        return
    grown = measured["peak"] - measured["before"]
    print(f"(b) peak of a [{n}, {n}] sort step: measured {grown / 2**20:.1f} MiB ({measured['how']}), "
          f"estimated {estimate / 2**20:.1f} MiB ({result['peak']['live_bytes'] / 2**20:.1f} MiB live + "
          f"{result['peak']['program_bytes'] / 2**20:.1f} MiB the call adds: temporaries "
          f"{program['temp_bytes'] / 2**20:.1f} MiB, outputs {program['output_bytes'] / 2**20:.1f} MiB): "
          f"estimate / measured = {estimate / grown:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--plot", action=argparse.BooleanOptionalAction, default=False,
                        help="run `jaxdbg memory --plot` (memory.png too); --no-plot: as by default")
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--chunk", type=int, default=20)
    parser.add_argument("--only", choices=("overhead", "interleaved", "peak"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as folder:
        if args.only in (None, "overhead"):
            overhead(folder, args.pairs, args.steps, args.plot)
        if args.only in (None, "interleaved"):
            interleaved(folder, args.rounds, args.chunk)
        if args.only in (None, "peak"):
            peak(folder, args.n)


if __name__ == "__main__":
    main()
