"""Benchmark what the jit layer and each of its hooks add to one call of a tiny jitted function, in one process.

A tiny function (``x * 2 + 1`` on 16 floats) is called in a loop, plain (``jax.jit``, jax's C++ dispatch) and
jitted under one configuration of jaxdbg's hooks, in alternating rounds of ``--calls`` calls; each round gives
the added wall time per call and the added CPU time of the calling thread per call (the tiny program runs on
the calling thread on CPU, so the thread's CPU time is the whole cost, and it moves less than wall time on a
machine shared with other work). Printed: the median of the rounds' differences and their spread (min..max).

Configurations:
  count-only      a hook that sees no call (``watches`` False): the layer's counter alone
  sampled-unseen  a hook that samples (``wants``) and declines every call: counter, sampling question, compile
                  watch
  profile         profile's recorder (``--sync-every 8``): most calls run ahead unseen, one in 8 is timed, and
                  after 8 of those one in ~100 (a sample no sooner than 100x its execution after the last)
  profile-timed   profile's recorder timing every call (``--sync-every 1``): a call that waits for its outputs
  watch           ``jaxdbg.watch()``: every call checked for NaN/Inf (its companion program), read late
  watch+profile   both at once

Targets (issue 22): count-only, sampled-unseen and profile at most +3 us per call; profile-timed and watch at
most +10 us per call.

``--baseline DIR`` runs the same configurations with another jaxdbg source tree first on PYTHONPATH (e.g. main,
from ``git archive``), in a process of its own right after this one: before/after figures from one run.

``--instructions`` runs it under valgrind's callgrind and also prints the instructions executed per call (plain
and hooked): a count that neither the machine nor its load moves (use ``--rounds 1 --calls 500``: it is slow).

Usage: python scripts/bench_layer.py [--rounds 9] [--calls 2000] [--only watch,profile] [--baseline DIR]
       [--instructions]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_summary import record  # noqa: E402 - the scripts folder first

CONFIGS = ("count-only", "sampled-unseen", "profile", "profile-timed", "watch", "watch+profile")
TARGET_US = {"count-only": 3.0, "sampled-unseen": 3.0, "profile": 3.0, "profile-timed": 10.0, "watch": 10.0,
             "watch+profile": 10.0}

PROGRAM = textwrap.dedent('''
    import contextlib, json, sys, tempfile, time
    import jax, jax.numpy as jnp
    import jaxdbg
    from jaxdbg import jit_layer

    configs, rounds, calls = sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3])

    class Nothing(jit_layer.JitHook):
        def watches(self, function):
            return False

    class Declines(jit_layer.JitHook):
        def wants(self, function, index):
            return False

    def hooks(config, stack, out):
        from jaxdbg.profile.instrument import Recorder, compile_listener, tracking_jit

        if config == "count-only":
            stack.enter_context(jit_layer.installed(Nothing()))
        if config == "sampled-unseen":
            stack.enter_context(jit_layer.installed(Declines()))
        if config.startswith("watch"):
            stack.enter_context(jaxdbg.watch(out=out))
        if "profile" in config:
            recorder = Recorder(lambda message: None, out, sync_every=1 if config == "profile-timed" else 8)
            stack.enter_context(compile_listener(recorder))
            stack.enter_context(tracking_jit(recorder))

    COUNTER = None  # --instructions: valgrind's callgrind counts the instructions of each measured loop
    if len(sys.argv) > 4:
        import ctypes

        import jaxdbg.nan.watch

        COUNTER = ctypes.CDLL(sys.argv[4])
        # Under valgrind a call takes ~50x longer: the watch's read of finished calls every 50 ms (a batch of 16
        # in a real run of tiny calls) would come at every call.
        jaxdbg.nan.watch.READ_EVERY_S = float("inf")

    def per_call(f, x, label=b""):
        """(wall, CPU of this thread) per call over ``calls`` calls, in microseconds."""
        r = f(x)
        r.block_until_ready()
        if COUNTER is not None and label:
            COUNTER.cg_start()
        t, c = time.perf_counter(), time.thread_time()
        for _ in range(calls):
            r = f(x)
        r.block_until_ready()
        wall, cpu = (time.perf_counter() - t) / calls * 1e6, (time.thread_time() - c) / calls * 1e6
        if COUNTER is not None and label:
            COUNTER.cg_dump(label)
        return wall, cpu

    def main():  # functions in locals: a global of __main__ would be adopted by the watch, plain included
        x = jnp.ones((16,))
        plain = jax.jit(lambda x: x * 2.0 + 1.0)
        found = {}
        for config in configs:
            with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory() as out:
                hooks(config, stack, out)
                hooked = jax.jit(lambda x: x * 2.0 + 1.0)
                for _ in range(3):  # warm-up: compiles, the watch's first reads
                    per_call(plain, x), per_call(hooked, x)
                found[config] = [(per_call(plain, x, f"{config}:plain".encode()),
                                  per_call(hooked, x, f"{config}:hooked".encode())) for _ in range(rounds)]
        found["jaxdbg"] = jaxdbg.__file__
        print(json.dumps(found))

    main()
''')


COUNTER_C = """
#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_START_INSTRUMENTATION; CALLGRIND_ZERO_STATS; }
void cg_dump(const char *name) { CALLGRIND_DUMP_STATS_AT(name); CALLGRIND_STOP_INSTRUMENTATION; }
"""


def run(root: str, configs: list[str], args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as work:
        if os.environ.get("BENCH_LAYER_KEEP"):  # keep callgrind's files there (callgrind_annotate them)
            work = os.environ["BENCH_LAYER_KEEP"] + ("-baseline" if root != ROOT else "")
            os.makedirs(work, exist_ok=True)
        program = os.path.join(work, "tiny_calls.py")  # a file: with -c the working folder's jaxdbg came first
        with open(program, "w") as handle:
            handle.write(PROGRAM)
        argv = [sys.executable, program, ",".join(configs), str(args.rounds), str(args.calls)]
        if args.instructions:
            argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                    f"--callgrind-out-file={work}/counts", *argv, _counter_library(work)]
        done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": root},
                              timeout=7200)
        if done.returncode != 0:
            raise SystemExit(f"bench failed under {root}:\n{done.stderr[-3000:]}")
        found = json.loads(done.stdout.strip().splitlines()[-1])
        if args.instructions:
            found["instructions"] = _instructions(work, args.calls)
    return found


def _counter_library(work: str) -> str:
    """A tiny C library whose functions start and dump callgrind's counts (valgrind's client requests)."""
    source, library = os.path.join(work, "counter.c"), os.path.join(work, "libcounter.so")
    with open(source, "w") as handle:
        handle.write(COUNTER_C)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", library, source], check=True)
    return library


def _instructions(work: str, calls: int) -> dict[str, list[float]]:
    """Instructions per call of each measured loop, by its label ('watch:hooked'), from callgrind's dumps."""
    found: dict[str, list[float]] = {}
    for name in sorted(os.listdir(work)):
        if not name.startswith("counts"):
            continue
        label, total = None, None
        with open(os.path.join(work, name)) as handle:
            for line in handle:
                if line.startswith("desc: Trigger: Client Request: "):
                    label = line.split(": ", 3)[-1].strip()
                elif line.startswith(("summary:", "totals:")):
                    total = int(line.split()[1])
        if label and total is not None:
            found.setdefault(label, []).append(total / calls)
    return found


def summary(rows: list) -> tuple[float, float, float, float, float]:
    """(plain wall us, added wall median, added CPU median, added CPU min, added CPU max) over the rounds."""
    wall = sorted(hooked[0] - plain[0] for plain, hooked in rows)
    cpu = sorted(hooked[1] - plain[1] for plain, hooked in rows)
    plain_wall = sorted(plain[0] for plain, _ in rows)
    return plain_wall[len(rows) // 2], wall[len(rows) // 2], cpu[len(rows) // 2], cpu[0], cpu[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--only", help=f"comma-separated configurations (default: all of {', '.join(CONFIGS)})")
    parser.add_argument("--baseline", help="another jaxdbg source tree: the same configurations with it")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions per call under valgrind's callgrind (needs valgrind and a C "
                             "compiler; slow): a figure that neither the machine nor its load changes")
    args = parser.parse_args()
    configs = args.only.split(",") if args.only else list(CONFIGS)
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        raise SystemExit(f"unknown configuration {unknown[0]!r}: use some of {', '.join(CONFIGS)}")
    results = {"this": run(ROOT, configs, args)}
    if args.baseline:
        results["baseline"] = run(args.baseline, configs, args)
    load = os.getloadavg()[0]
    print(f"per call of a tiny jitted function, {args.rounds} rounds of {args.calls} calls alternating with plain "
          f"jax.jit (load {load:.1f})")
    for tree, found in results.items():
        print(f"  {tree}: {found['jaxdbg']}")
    print(f"  {'configuration':16s} {'tree':9s} {'plain':>8s} {'+wall':>8s} {'+CPU':>8s}  CPU spread   target")
    for config in configs:
        for tree, found in results.items():
            plain, wall, cpu, low, high = summary(found[config])
            print(f"  {config:16s} {tree:9s} {plain:6.1f}us {wall:+6.1f}us {cpu:+6.1f}us  "
                  f"{low:+.1f}..{high:+.1f}  <= +{TARGET_US[config]:.0f}us")
            if tree == "this":
                record("layer", f"added per tiny call: {config} (CPU of the thread)", cpu,
                       f"<= +{TARGET_US[config]:.0f}", f"{low:+.1f}..{high:+.1f}", unit="us")
    if args.instructions:
        print("\ninstructions per call (callgrind; the same on any machine, whatever its load)")
        for config in configs:
            for tree, found in results.items():
                counts = found["instructions"]
                plain = min(counts.get(f"{config}:plain", [0.0]))
                hooked = min(counts.get(f"{config}:hooked", [0.0]))
                print(f"  {config:16s} {tree:9s} plain {plain:8.0f}   hooked {hooked:8.0f}   "
                      f"added {hooked - plain:+8.0f} ({hooked / plain if plain else 0:.2f}x)")


if __name__ == "__main__":
    main()
