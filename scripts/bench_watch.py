"""Benchmark ``jaxdbg.watch`` (and nan-hunt's watch) against a plain run and ``jax_debug_nans``, in one run.

Two loops (``--model``): ``cnn``, the Flax NNX MNIST tutorial's loop (CNN, AdamW, ``nnx.MultiMetric``, a fresh
host batch of 32 each step: the realistic case) and ``mlp`` (a 3-layer MLP, SGD, the same device batch every step:
the least work per step, so the watch's fixed cost per call weighs most). ``--model both`` (default) runs both.

(a) Overhead: the clean Flax NNX training loop timed by itself (median seconds per
    step over chunks of steps, after warm-up), each variant in a fresh process, variants alternating
    (``--pairs``): plain; under ``jaxdbg.watch()``; under ``jaxdbg.watch(max_compiles=...)`` with metrics
    served; with ``jax_debug_nans`` + ``jax_debug_infs``; the unmodified script under ``jaxdbg nan-hunt``.
    Targets: watch <= 1.05x plain, nan-hunt <= 1.10x plain. Each run reports its median and its fastest chunk
    of 10 steps (on a shared machine the fastest chunk is the least disturbed); ratios compare the best run of
    each variant, by both.
(b) Time to the answer: the same loop with a learning-rate spike at a late step. From the call of the step
    that goes bad to (watch) the written report + NonFiniteError, and (debug flags) the FloatingPointError.
    Also whether each named the operation and the step.
(d) In one process (the least load-sensitive figure on a shared machine): the plain loop and the same loop
    jitted inside ``jaxdbg.watch()``, chunks of 40 steps alternating; median ratio per round, wall time and
    CPU time of the whole process (XLA's threads included), and the median minor page faults per step (plain ->
    watched).
(f) The check alone, no jaxdbg in the loop: the same step as a pure function (``nnx.split``/``merge``), jitted plain
    and with the output check compiled in (the watch's companion), alternating in one process: the part of (d)
    that is XLA's work on the outputs (``max(|x|)`` of every floating output), which no host-side change removes.
    Runs with (d).
(g) ``--read-cadence``: the watched loop of (d) read at least every 1 ms (the rule before 2026-12-03: a read per
    step of the MLP loop) and at the default cadence (``READ_EVERY_S``), chunks alternating with the plain loop in one
    process; page faults per step are means (the reads' cost is the ratio, the kept inputs' cost the faults).
(h) ``--own-time``: jaxdbg's own time on the main thread per watched call of the loop (the watch's work around
    the user's call, timed in place), and how many reads of finished calls it made and of how many calls each,
    the watched loop run straight for ``--steps`` steps; with ``--baseline``, the other tree's the same way,
    alternating (``--pairs``). A figure of host work: what the device's side costs is in (d).
(c) Per call: a tiny jitted function (x * 2 + 1 on 16 floats) called in a loop, plain (jax's C++ dispatch) and
    jitted inside ``jaxdbg.watch()``, in one process, alternating; the difference is the watch's cost per call.

(e) pmap'd functions, in one process with 4 CPU devices, alternating: a tiny pmap'd function (x * 0.5 + 1) per call,
    and a data-parallel MLP step (``lax.pmean`` of the gradients) per step, plain vs pmap'd inside
    ``jaxdbg.watch()`` (whose check of a pmap'd call is compiled into the pmap's program, a row per device).
    ``--only-pmap`` runs (e) alone.

``--baseline DIR`` also runs the watch and nan-hunt variants with another jaxdbg source tree (e.g. main, from
``git archive``) first on PYTHONPATH, in the same alternation: before/after figures from one run.

Usage: python scripts/bench_watch.py [--model both|cnn|mlp] [--pairs 3] [--steps 200] [--width 256] [--batch N]
       [--baseline DIR] [--only-interleaved] [--only-pmap] [--read-cadence] [--own-time]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_summary import record  # noqa: E402 - the scripts folder first

DEBUG_FLAGS = {"JAX_DEBUG_NANS": "1", "JAX_DEBUG_INFS": "1"}
BASELINE = " [baseline]"

PROGRAM = textwrap.dedent('''
    """A Flax NNX training loop that times itself; MODE: plain | watch | watch-full | spike-watch | spike-plain |
    interleaved."""
    import json, resource, sys, time
    from functools import partial
    import jax, jax.numpy as jnp, numpy as np, optax
    from flax import nnx
    import jaxdbg

    mode, steps, width, batch, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    kind = sys.argv[6]
    SPIKE_AT = steps - 5

    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.l1 = nnx.Linear(256, width, rngs=rngs)
            self.l2 = nnx.Linear(width, width, rngs=rngs)
            self.l3 = nnx.Linear(width, 10, rngs=rngs)

        def __call__(self, x):
            return self.l3(nnx.relu(self.l2(nnx.relu(self.l1(x)))))  # <- origin

    class CNN(nnx.Module):  # the Flax NNX MNIST tutorial's model
        def __init__(self, rngs):
            self.conv1 = nnx.Conv(1, 32, kernel_size=(3, 3), rngs=rngs)
            self.conv2 = nnx.Conv(32, 64, kernel_size=(3, 3), rngs=rngs)
            self.avg_pool = partial(nnx.avg_pool, window_shape=(2, 2), strides=(2, 2))
            self.linear1 = nnx.Linear(3136, width, rngs=rngs)
            self.linear2 = nnx.Linear(width, 10, rngs=rngs)

        def __call__(self, x):
            x = self.avg_pool(nnx.relu(self.conv1(x)))
            x = self.avg_pool(nnx.relu(self.conv2(x)))
            x = x.reshape(x.shape[0], -1)
            return self.linear2(nnx.relu(self.linear1(x)))  # <- origin

    def build():
        """(run_step, optimizer): run_step(step) runs one training step on that step's batch, returns its loss."""
        if kind == "cnn":
            model = CNN(nnx.Rngs(0))
            tx = optax.inject_hyperparams(optax.adamw)(learning_rate=0.005, b1=0.9)
        else:
            model = MLP(nnx.Rngs(0))
            tx = optax.inject_hyperparams(optax.sgd)(learning_rate=0.01)
        optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
        metrics = nnx.MultiMetric(accuracy=nnx.metrics.Accuracy(), loss=nnx.metrics.Average("loss"))

        @nnx.jit
        def train_step(model, optimizer, metrics, x, labels):
            def loss_fn(model):
                logits = model(x)
                return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(), logits
            (loss, logits), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
            if metrics is not None:
                metrics.update(loss=loss, logits=logits, labels=labels)
            optimizer.update(model, grads)
            return loss

        if kind == "cnn":  # a fresh host batch every step, as a data loader gives them
            rng = np.random.default_rng(0)
            images = rng.normal(size=(64 * batch, 28, 28, 1)).astype(np.float32)
            classes = rng.integers(0, 10, size=(64 * batch,)).astype(np.int32)

            def run_step(step):
                i = (step % 64) * batch
                loss = train_step(model, optimizer, metrics, images[i:i + batch], classes[i:i + batch])
                if step % 10 == 9:  # the tutorial's periodic metrics read-out (a host sync)
                    metrics.compute()
                    metrics.reset()
                return loss
        else:  # the same device batch every step: the least work per call
            k = jax.random.split(jax.random.key(0), 2)
            fixed = jax.random.normal(k[0], (batch, 256)), jax.random.randint(k[1], (batch,), 0, 10)

            def run_step(step):
                return train_step(model, optimizer, None, *fixed)
        return run_step, optimizer

    def timed_chunk(state, n=40, flush=None):
        """Seconds per step (wall, and CPU of the whole process), and minor page faults per step (whole process), over n
        steps of a loop that logs every 10.
        ``flush`` (the watched loop's) reads the flags still unread, inside the timing: left unread, the inputs
        kept for them slowed the plain chunk that followed as much as the watched one (measured 7.2-7.3 ms/step
        plain before and after the watch, 8.0-8.3 within it), hiding the watch's cost."""
        run_step = state[0]
        t, c, f = time.perf_counter(), time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for step in range(n):
            loss = run_step(step)
            if step % 10 == 0:
                float(loss)
        loss.block_until_ready()
        if flush is not None:
            flush()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f
        return (time.perf_counter() - t) / n, (time.process_time() - c) / n, faults / n

    def main():
        run_step, optimizer = build()
        for step in range(10):
            loss = run_step(step)
        loss.block_until_ready()
        if mode.startswith("spike"):
            try:
                for step in range(steps):
                    if step == SPIKE_AT:
                        optimizer.opt_state.hyperparams["learning_rate"][...] = jnp.asarray(1e36)
                        STARTED.append(time.perf_counter())
                    loss = run_step(step)
                loss.block_until_ready()
                return {"answer_s": None}
            except (jaxdbg.NonFiniteError, FloatingPointError) as err:
                return answer(err)
        chunk, per_step = 10, []
        for _ in range(0, steps, chunk):
            t = time.perf_counter()
            for step in range(chunk):
                loss = run_step(step)
                if step % 10 == 0:
                    float(loss)  # what a loop that logs does
            loss.block_until_ready()
            per_step.append((time.perf_counter() - t) / chunk)
        per_step.sort()
        return {"median_step_s": per_step[len(per_step) // 2], "best_step_s": per_step[0]}

    def answer(err):
        seconds = time.perf_counter() - STARTED[0]
        report = getattr(err, "report", None)
        first = report["first"] if report else {}
        return {"answer_s": seconds, "primitive": first.get("primitive"), "call_index": first.get("call_index"),
                "line": (first.get("source") or {}).get("line"), "error": str(err).splitlines()[0][:200]}

    STARTED = []
    if mode in ("watch", "spike-watch"):
        try:
            with jaxdbg.watch(out=out + ".d"):
                found = main()
        except jaxdbg.NonFiniteError as err:  # the flags are read late: a finding may come as the block ends
            found = answer(err)
    elif mode in ("interleaved", "read-cadence"):  # one process: the plain loop and the loop jitted inside the watch
        import jaxdbg.nan.watch as watch_module  # read-cadence: the watched loop read every 1 ms, then as by default

        cadences = (0.001, watch_module.READ_EVERY_S) if mode == "read-cadence" else (watch_module.READ_EVERY_S,)
        plain = build()
        timed_chunk(plain, 10)
        with jaxdbg.watch(out=out + ".d") as watcher:
            watched = build()
            timed_chunk(watched, 10)
            hook = watcher._states[-1].hook
            rows = []
            for _ in range(steps // 10):  # alternating: [plain, watched at each cadence]
                row = [timed_chunk(plain)]
                for every in cadences:
                    watch_module.READ_EVERY_S = every
                    row.append(timed_chunk(watched, flush=hook.flush))
                rows.append(row)
        found = {"cadences": cadences, "rows": rows}
    elif mode == "check-floor":  # the check alone: the step as a pure function, jitted without and with it
        from jaxdbg.nonfinite import with_magnitudes

        model = (MLP if kind == "mlp" else CNN)(nnx.Rngs(0))
        graph, state = nnx.split((model, nnx.Optimizer(model, optax.sgd(0.01), wrt=nnx.Param)))
        k = jax.random.split(jax.random.key(0), 2)
        shape = (batch, 256) if kind == "mlp" else (batch, 28, 28, 1)
        x, labels = jax.random.normal(k[0], shape), jax.random.randint(k[1], (batch,), 0, 10)

        def pure_step(state):
            model, optimizer = nnx.merge(graph, state)
            def loss_fn(model):
                return optax.softmax_cross_entropy_with_integer_labels(model(x), labels).mean()
            loss, grads = nnx.value_and_grad(loss_fn)(model)
            optimizer.update(model, grads)
            return nnx.state((model, optimizer)), loss

        plain_step = jax.jit(pure_step)
        checked_step = jax.jit(with_magnitudes(pure_step, "pure_step__checked_jaxdbg"))

        held = [state]  # the training state, carried from loop to loop

        def loop(checked, n=40):
            t, c = time.perf_counter(), time.process_time()
            for _ in range(n):
                held[0], loss = checked_step(held[0])[0] if checked else plain_step(held[0])
            loss.block_until_ready()
            return (time.perf_counter() - t) / n, (time.process_time() - c) / n

        loop(False, 10), loop(True, 10)
        found = {"rows": [(loop(False), loop(True)) for _ in range(steps // 10)]}
    elif mode == "own-time":  # jaxdbg's own main-thread time per watched call, and its reads, in a straight run
        from jaxdbg import jit_layer
        from jaxdbg.live import hook as live_hook
        import jaxdbg.nan.watch as watch_module

        spent = {"around": 0.0, "run": 0.0, "calls": 0, "reads": 0, "read_calls": 0, "cpu_around": 0.0,
                 "cpu_run": 0.0}
        around, call_run, read_batch = live_hook.LiveHook.around, jit_layer.JitCall.run, watch_module.Watch._read_batch

        # Wall time and the main thread's CPU time: on a machine whose cores XLA's threads keep busy, the main
        # thread is also preempted in jaxdbg's part (wall), while its CPU time is the work itself.
        def timed_around(self, call, inner):
            t, c = time.perf_counter(), time.thread_time()
            try:
                return around(self, call, inner)
            finally:
                spent["cpu_around"] += time.thread_time() - c
                spent["around"] += time.perf_counter() - t
                spent["calls"] += 1

        def timed_run(self):
            t, c = time.perf_counter(), time.thread_time()
            try:
                return call_run(self)
            finally:
                spent["cpu_run"] += time.thread_time() - c
                spent["run"] += time.perf_counter() - t

        def counted_read(self, count):
            spent["reads"] += 1
            spent["read_calls"] += count
            return read_batch(self, count)

        live_hook.LiveHook.around, jit_layer.JitCall.run = timed_around, timed_run
        watch_module.Watch._read_batch = counted_read
        with jaxdbg.watch(out=out + ".d"):
            run_step, _ = build()
            for step in range(20):
                loss = run_step(step)
            loss.block_until_ready()
            spent.update(around=0.0, run=0.0, calls=0, reads=0, read_calls=0, cpu_around=0.0, cpu_run=0.0)
            for step in range(steps):
                loss = run_step(step)
            loss.block_until_ready()
            found = dict(spent)
    elif mode == "watch-full":
        with jaxdbg.watch(out=out + ".d", max_compiles=2, metrics_port=0):
            found = main()
    else:
        found = main()
    with open(out, "w") as handle:
        json.dump(found, handle)
''')


TINY = textwrap.dedent('''
    import sys, time, jax, jax.numpy as jnp, jaxdbg

    def per_call_us(f, x, n=2000):
        for _ in range(20):
            r = f(x)
        r.block_until_ready()
        t = time.perf_counter()
        for _ in range(n):
            r = f(x)
        r.block_until_ready()
        return (time.perf_counter() - t) / n * 1e6

    def main():  # the plain function in a local: one bound to a global name of __main__ would be watched too
        x = jnp.ones((16,))
        plain = jax.jit(lambda x: x * 2.0 + 1.0)
        with jaxdbg.watch(out=sys.argv[1]):
            watched = jax.jit(lambda x: x * 2.0 + 1.0)
            rows = [(per_call_us(plain, x), per_call_us(watched, x)) for _ in range(int(sys.argv[2]))]
        print(min(p for p, _ in rows), min(w for _, w in rows))

    main()
''')


PMAP = textwrap.dedent('''
    import json, sys, time, jax, jax.numpy as jnp, numpy as np, jaxdbg

    def timed(f, state, rest, n, flush=None):
        """Seconds per call over n calls, each call's first output fed to the next (a training loop)."""
        state = f(state, *rest)[0]
        jax.block_until_ready(state)
        t = time.perf_counter()
        for _ in range(n):
            state = f(state, *rest)[0]
        jax.block_until_ready(state)
        if flush is not None:
            flush()
        return (time.perf_counter() - t) / n

    def tiny(x):
        return x * 0.5 + 1.0, x  # fed back each call: settles at 2

    def step(params, x, y):
        def loss(p):
            return jnp.mean((jnp.tanh(x @ p[0]) @ p[1] - y) ** 2)
        value, grads = jax.value_and_grad(loss)(params)
        grads = jax.lax.pmean(grads, "d")
        return [w - 0.01 * g for w, g in zip(params, grads)], jax.lax.pmean(value, "d")

    def main():  # the plain functions in locals: ones bound to global names of __main__ would be watched too
        rounds, width = int(sys.argv[2]), int(sys.argv[3])
        n, rng = jax.local_device_count(), np.random.default_rng(0)
        x = jnp.asarray(rng.normal(size=(n, 128, width)), jnp.float32)
        y = jnp.asarray(rng.normal(size=(n, 128, 1)), jnp.float32)
        params = [jnp.asarray(rng.normal(size=(n, width, width)) / width, jnp.float32),
                  jnp.asarray(rng.normal(size=(n, width, 1)) / width, jnp.float32)]
        small = jnp.ones((n, 16))
        plain_tiny, plain_step = jax.pmap(tiny), jax.pmap(step, axis_name="d")
        with jaxdbg.watch(out=sys.argv[1]) as watcher:
            watched_tiny, watched_step = jax.pmap(tiny), jax.pmap(step, axis_name="d")
            flush = watcher._states[-1].hook.flush
            rows = [((timed(plain_tiny, small, (), 500), timed(watched_tiny, small, (), 500, flush)),
                     (timed(plain_step, params, (x, y), 40), timed(watched_step, params, (x, y), 40, flush)))
                    for _ in range(rounds)]
        print(json.dumps(rows))

    main()
''')


def _run(argv: list[str], env: dict | None = None, timeout: float = 900,
         root: str = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": root, **(env or {})})


def variant(name: str, program: str, args: argparse.Namespace, workdir: str, mode: str | None = None) -> dict:
    root = ROOT
    if name.endswith(BASELINE):
        name, root = name[: -len(BASELINE)], args.baseline
    out = os.path.join(workdir, f"{name}{'-base' if root != ROOT else ''}.json")
    sizes = [*_sizes(args), out, args.kind]
    if name == "nan-hunt":
        argv = [sys.executable, "-m", "jaxdbg", "nan-hunt", program, "-q", "--out", out + ".d", "--", "plain", *sizes]
        env = None
    else:
        argv = [sys.executable, program, mode or name, *sizes]
        env = DEBUG_FLAGS if name.startswith("debug") else None
    started = time.perf_counter()
    done = _run(argv, env, root=root)
    if not os.path.exists(out):
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    with open(out) as handle:
        return {**json.load(handle), "wall_s": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, help="batch size (default: 32 for cnn, the tutorial's; 128 for mlp)")
    parser.add_argument("--model", choices=("both", "cnn", "mlp"), default="both")
    parser.add_argument("--baseline", help="another jaxdbg source tree: its watch and nan-hunt run too")
    parser.add_argument("--only-interleaved", action="store_true", help="run (d) alone")
    parser.add_argument("--only-pmap", action="store_true", help="run (e) alone")
    parser.add_argument("--read-cadence", action="store_true", help="run (g) too, after (d)")
    parser.add_argument("--own-time", action="store_true", help="run (h) too, after (d)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        if args.only_pmap:
            pmapped(args, workdir)
            return
        program = os.path.join(workdir, "nnx_loop.py")
        with open(program, "w") as handle:
            handle.write(PROGRAM)
        names = {"plain": "plain", "watch": "watch", "watch+compiles+metrics": "watch-full",
                 "debug_nans": "plain", "nan-hunt": None}
        if args.baseline:
            names.update({"watch" + BASELINE: "watch", "nan-hunt" + BASELINE: None})
        batch = args.batch
        for kind in ("cnn", "mlp") if args.model == "both" else (args.model,):
            args.kind, args.batch = kind, batch or (32 if kind == "cnn" else 128)
            print(f"\n=== {kind} loop ===", flush=True)
            if not args.only_interleaved:
                overhead_and_answer(program, names, args, workdir)
            interleaved(program, args, workdir)
            if args.read_cadence:
                read_cadence(program, args, workdir)
            if args.own_time:
                own_time(program, args, workdir)
            check_floor(program, args, workdir)
        if not args.only_interleaved:
            tiny_calls(args, workdir)
            pmapped(args, workdir)


def overhead_and_answer(program: str, names: dict, args: argparse.Namespace, workdir: str) -> None:
    """(a) and (b): each variant in its own process."""
    best: dict[str, float] = {}
    fastest: dict[str, float] = {}
    for pair in range(args.pairs):
        for name, mode in names.items():
            got = variant(name, program, args, workdir, mode)
            best[name] = min(best.get(name, got["median_step_s"]), got["median_step_s"])
            fastest[name] = min(fastest.get(name, got["best_step_s"]), got["best_step_s"])
            print(f"  pair {pair}: {name:24s} median {got['median_step_s'] * 1e3:8.3f} ms/step, fastest chunk "
                  f"{got['best_step_s'] * 1e3:8.3f}", flush=True)
    print(f"\n(a) overhead on a clean Flax NNX loop ({args.kind}, width {args.width}, batch {args.batch}, "
          f"best of {args.pairs})")
    for name in names:
        print(f"  {name:24s} median {best[name] * 1e3:8.3f} ms/step {best[name] / best['plain']:5.2f}x plain   "
              f"fastest chunk {fastest[name] * 1e3:8.3f} ms/step {fastest[name] / fastest['plain']:5.2f}x plain")
        if name in ("watch", "nan-hunt"):
            record("watch", f"(a) {args.kind} loop: {name} / plain, own processes", best[name] / best["plain"],
                   "<= 1.05" if name == "watch" else "<= 1.10",
                   f"fastest chunk {fastest[name] / fastest['plain']:.2f}")
    print("\n(b) from the bad step's call to the answer (learning-rate spike 5 steps before the end)")
    for name, mode, env in (("jaxdbg.watch", "spike-watch", None), ("debug_nans", "spike-plain", DEBUG_FLAGS)):
        out = os.path.join(workdir, f"{mode}.json")
        done = _run([sys.executable, program, mode, *_sizes(args), out, args.kind], env)
        if not os.path.exists(out):
            print(f"  {name:14s} failed: {done.stderr[-500:]}")
            continue
        with open(out) as handle:
            got = json.load(handle)
        shown = f"{got['answer_s']:.3f} s" if got.get("answer_s") is not None else "no answer"
        print(f"  {name:14s} {shown:>10s}  op={got.get('primitive')} call={got.get('call_index')} "
              f"line={got.get('line')}  [{got.get('error', '')[:110]}]")


def interleaved(program: str, args: argparse.Namespace, workdir: str) -> None:
    """(d): plain and watched loops in one process."""
    print(f"\n(d) {args.kind} loop in one process, chunks of 40 steps alternating ({args.steps // 10} rounds): "
          "plain vs jaxdbg.watch")
    for label, root in (("jaxdbg.watch", ROOT), ("jaxdbg.watch [baseline]", args.baseline)):
        if root is None:
            continue
        found = _in_one_process(program, "interleaved", args, workdir, f"  {label}", root)
        if found is None:
            continue
        rows = found["rows"]
        plain_ms = _median([p[0] for p, _ in rows]) * 1e3
        faults = f"{_median([p[2] for p, _ in rows]):.0f} -> {_median([w[2] for _, w in rows]):.0f}"
        print(f"  {label:24s} wall {_median_ratio(rows, 0):5.2f}x plain   CPU (process) "
              f"{_median_ratio(rows, 1):5.2f}x plain   (plain {plain_ms:.3f} ms/step; page faults per step {faults})")
        if root == ROOT:
            ratios = sorted(watched[0] / plain[0] for plain, watched in rows)
            record("watch", f"(d) {args.kind} loop ({plain_ms:.2f} ms steps), one process: watch / plain",
                   _median_ratio(rows, 0), "<= 1.05",
                   f"{ratios[len(ratios) // 10]:.2f}..{ratios[-1 - len(ratios) // 10]:.2f}, CPU "
                   f"{_median_ratio(rows, 1):.2f}")


def _in_one_process(program: str, mode: str, args: argparse.Namespace, workdir: str, label: str,
                    root: str = ROOT) -> dict | None:
    """Run the loop program in ``mode`` (with the jaxdbg of ``root``); what it found, or None (said as failed)."""
    out = os.path.join(workdir, f"{mode}-{abs(hash(root))}.json")
    _run([sys.executable, program, mode, *_sizes(args), out, args.kind], root=root)
    if not os.path.exists(out):
        print(f"{label}: failed")
        return None
    with open(out) as handle:
        return json.load(handle)


def read_cadence(program: str, args: argparse.Namespace, workdir: str) -> None:
    """(g): how often the watch reads its finished calls, in one process: the same watched loop read at least every
    1 ms (the rule before 2026-12-03) and at the default cadence, chunks alternating with the plain loop."""
    found = _in_one_process(program, "read-cadence", args, workdir, "  (g)")
    if found is None:
        return
    rows = found["rows"]
    print(f"(g) {args.kind} loop, watched, read every ... (plain {_median([r[0][0] for r in rows]) * 1e3:.3f} ms/step)")
    for index, every in enumerate(found["cadences"], 1):
        pairs = [(row[0], row[index]) for row in rows]
        print(f"  {every * 1e3:5.0f} ms   wall {_median_ratio(pairs, 0):5.3f}x plain   CPU (process) "
              f"{_median_ratio(pairs, 1):5.3f}x plain   page faults per step "
              f"{sum(w[2] for _, w in pairs) / len(pairs):.1f} (plain {sum(p[2] for p, _ in pairs) / len(pairs):.1f})")


def own_time(program: str, args: argparse.Namespace, workdir: str) -> None:
    """(h): jaxdbg's own time on the main thread per watched call (the watch's ``around`` less the user's call
    inside it) and how the finished calls were read, the watched loop run straight (no flush); with
    ``--baseline``, that tree's the same way, the two alternating ``--pairs`` times."""
    trees = [("this", ROOT)] + ([("baseline", args.baseline)] if args.baseline else [])
    rows: dict[str, list[dict]] = {name: [] for name, _ in trees}
    for _ in range(args.pairs):
        for name, root in trees:
            found = _in_one_process(program, "own-time", args, workdir, f"  (h) {name}", root=root)
            if found is not None and found["calls"]:
                rows[name].append(found)
    for name, runs in rows.items():
        if not runs:
            continue
        own = sorted((f["around"] - f["run"]) / f["calls"] * 1e6 for f in runs)
        cpu = sorted((f["cpu_around"] - f["cpu_run"]) / f["calls"] * 1e6 for f in runs)
        reads = _median([f["reads"] / f["calls"] * 1000 for f in runs])
        size = _median([f["read_calls"] / max(f["reads"], 1) for f in runs])
        print(f"(h) {args.kind} loop, {name}: jaxdbg's own main-thread time {_median(own):.1f} us per watched call "
              f"({', '.join(f'{o:.1f}' for o in own)}), its CPU time {_median(cpu):.1f} us "
              f"({', '.join(f'{o:.1f}' for o in cpu)}); {reads:.0f} reads per 1000 calls, {size:.1f} calls each")
        record("watch", f"(h) {args.kind} loop, jaxdbg's own time per watched call ({name})", _median(own),
               spread=f"{own[0]:.1f}..{own[-1]:.1f}", unit="us")


def check_floor(program: str, args: argparse.Namespace, workdir: str) -> None:
    """(f): what the check itself costs inside the program, with no jaxdbg in the loop: the same step as a pure
    function, jitted plain and with the output check compiled in (jaxdbg.watch's companion), alternating. The part
    of (d) that no host-side work can remove."""
    found = _in_one_process(program, "check-floor", args, workdir, "  (f)")
    if found is None:
        return
    rows = found["rows"]
    print(f"(f) the check compiled into the {args.kind} step, no jaxdbg in the loop: wall "
          f"{_median_ratio(rows, 0):5.2f}x plain   CPU (process) {_median_ratio(rows, 1):5.2f}x plain   "
          f"(plain {_median([p[0] for p, _ in rows]) * 1e3:.3f} ms/step)")
    record("watch", f"(f) {args.kind} step with the check compiled in / plain (no jaxdbg)", _median_ratio(rows, 0),
           "", f"CPU {_median_ratio(rows, 1):.2f}")


def tiny_calls(args: argparse.Namespace, workdir: str) -> None:
    """(c): the watch's cost per call of a tiny function."""
    tiny = os.path.join(workdir, "tiny.py")
    with open(tiny, "w") as handle:
        handle.write(TINY)
    done = _run([sys.executable, tiny, os.path.join(workdir, "tiny.d"), str(5 * args.pairs)])
    plain_us, watch_us = (float(v) for v in done.stdout.split())
    print(f"\n(c) per call of a tiny jitted function (best of {5 * args.pairs} rounds of 2000 calls)")
    print(f"  plain {plain_us:7.1f} us/call   jaxdbg.watch {watch_us:7.1f} us/call  (+{watch_us - plain_us:.1f})")
    record("watch", "(c) added per tiny call", watch_us - plain_us, "<= +10", f"plain {plain_us:.1f} us", unit="us")


def pmapped(args: argparse.Namespace, workdir: str) -> None:
    """(e): pmap'd functions, plain vs watched, in one process with 4 CPU devices."""
    program = os.path.join(workdir, "pmapped.py")
    with open(program, "w") as handle:
        handle.write(PMAP)
    rounds = 5 * args.pairs
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    done = _run([sys.executable, program, os.path.join(workdir, "pmapped.d"), str(rounds), str(args.width)],
                {"XLA_FLAGS": flags.strip(), "JAX_PLATFORMS": "cpu"})
    if done.returncode != 0:
        print(f"\n(e) pmap'd functions: failed\n{done.stderr[-3000:]}")
        return
    rows = json.loads(done.stdout.splitlines()[-1])
    plain_us, watch_us = min(t[0] for t, _ in rows) * 1e6, min(t[1] for t, _ in rows) * 1e6
    ratios = sorted(s[1] / s[0] for _, s in rows)
    plain_ms = _median([s[0] for _, s in rows]) * 1e3
    print(f"\n(e) pmap'd functions on 4 CPU devices, one process, alternating ({rounds} rounds)")
    print(f"  tiny pmap'd function: plain {plain_us:7.1f} us/call   jaxdbg.watch {watch_us:7.1f} us/call  "
          f"(+{watch_us - plain_us:.1f}, best of each)")
    print(f"  data-parallel MLP step (width {args.width}): jaxdbg.watch {_median(ratios):5.2f}x plain (median; "
          f"{ratios[0]:.2f}..{ratios[-1]:.2f}; plain {plain_ms:.3f} ms/step)")
    record("watch", "(e) added per tiny pmap'd call", watch_us - plain_us, "<= +10", f"plain {plain_us:.1f} us",
           unit="us")
    record("watch", "(e) pmap'd MLP step: watch / plain", _median(ratios), "<= 1.05",
           f"{ratios[0]:.2f}..{ratios[-1]:.2f}")


def _sizes(args: argparse.Namespace) -> list[str]:
    return [str(args.steps), str(args.width), str(args.batch)]


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def _median_ratio(rows: list, index: int) -> float:
    """Median over rounds of the watched chunk's time over the plain chunk's next to it."""
    return _median([watched[index] / plain[index] for plain, watched in rows])


if __name__ == "__main__":
    main()
