"""Benchmark: real pipeline mode with its stages in one process against the same stages split over two
processes of a local ``jax.distributed`` job (messages between processes carried by jax.experimental.transfer,
their notes by the coordination service). Same options, same draws; prints each run's makespan in both, the
ratio, and how long the messages that crossed processes took against their drawn delay. Then the cost of
authenticating those messages (``--message-auth``): the two-process job with ``off``, ``notes`` and ``full``
side by side, and the sealing and checking of one message alone.

    /work/main/.venv/bin/python scripts/bench_pipeline_processes.py            # ~3 minutes on 2 cores
    /work/main/.venv/bin/python scripts/bench_pipeline_processes.py --task-ms 20

The single-process run is the anchor: same executor, messages placed with jax.device_put; for the
authentication, the same job with ``--message-auth off``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np


def run(processes: int, args: argparse.Namespace, folder: str, auth: str = "full") -> dict:
    report = os.path.join(folder, f"p{processes}-{auth}.json")
    per_process = args.stages // processes
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={per_process}"}
    prefix = ["--processes", str(processes)] if processes > 1 else []
    command = [sys.executable, "-m", "jaxdbg", *prefix, "pipeline-bench", "--mode", "real", "--stages",
               str(args.stages), "--microbatches", str(args.microbatches), "--comm", "async,sync",
               "--variability", "jitter:cv=0.3", "--seeds", str(args.seeds), "--task-ms", str(args.task_ms),
               "--message-auth", auth, "--out", os.path.join(folder, f"out{processes}-{auth}"), "--json", report, "-q"]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr[-2000:]}")
    with open(report) as handle:
        data = json.load(handle)
    folder_out = os.path.join(folder, f"out{processes}-{auth}", "process-0" if processes > 1 else "")
    with open(os.path.join(folder_out, "durations.json")) as handle:
        data["durations"] = json.load(handle)
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--task-ms", type=float, default=4.0)
    parser.add_argument("--pairs", type=int, default=2, help="repeats of the off/notes/full comparison")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        one, two = run(1, args, folder), run(2, args, folder)
        authenticated = [{auth: run(2, args, folder, auth) for auth in ("off", "notes", "full")}
                         for _ in range(args.pairs)]
    print(f"{args.stages} stages x {args.microbatches} microbatches, task {args.task_ms} ms, jitter cv 0.3, "
          f"{args.seeds} seeds; 2 processes: stages {args.stages // 2} per process")
    print(f"{'run':44s} {'1 proc ms':>9s} {'2 proc ms':>9s} {'ratio':>6s}")
    ratios = []
    for a, b in zip(one["result"]["runs"], two["result"]["runs"]):
        policy = "fixed" if a["hint"] is None else f"ready/{a['hint']} {a['memory_cap']:g}x"
        ratio = b["makespan_s"] / a["makespan_s"]
        ratios.append(ratio)
        label = f"{a['schedule']} {policy} {a['comm']} seed {a['seed']}"
        print(f"{label:44s} {a['makespan_s'] * 1e3:9.1f} {b['makespan_s'] * 1e3:9.1f} {ratio:6.3f}")
    print(f"median ratio 2 processes / 1 process: {statistics.median(ratios):.3f}")
    # Messages of the first run (fixed, async): those between the processes' stage blocks crossed.
    boundary = args.stages // 2 - 1  # its forward goes to the next process, the next stage's backward back
    for name, data in (("1 process", one), ("2 processes", two)):
        comm = np.asarray(data["durations"]["comm"])  # [kind][model stage][microbatch], seconds
        crossing = np.concatenate([comm[0][boundary], comm[1][boundary + 1]])
        others = np.concatenate([np.delete(comm[0], boundary, axis=0).ravel(),
                                 np.delete(comm[1], boundary + 1, axis=0).ravel()])
        print(f"{name}: message delay between stages {boundary} and {boundary + 1}: median "
              f"{np.median(crossing) * 1e3:.2f} ms; other messages median {np.median(others[others > 0]) * 1e3:.2f} ms "
              "(drawn: 0.2 ms base)")
    print(f"gradients: 1 process max |diff| {one['result']['correctness']['max_abs_grad_diff']:.2e}, 2 processes "
          f"{two['result']['correctness']['max_abs_grad_diff']:.2e} (ok: {two['result']['correctness']['ok']})")
    print_auth_cost(authenticated, args)


def print_auth_cost(jobs: list[dict], args: argparse.Namespace) -> None:
    """Makespans of the two-process job with each --message-auth mode over off's (same draws, run one after
    another in each pair), and what sealing and checking one message costs in this process."""
    print(f"\nmessage authentication, 2 processes ({len(jobs)} pairs of jobs; ratios over --message-auth off):")
    for auth in ("notes", "full"):
        ratios = [b["makespan_s"] / a["makespan_s"] for job in jobs
                  for a, b in zip(job["off"]["result"]["runs"], job[auth]["result"]["runs"])]
        print(f"  {auth:5s} makespan / off: median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, "
              f"max {max(ratios):.3f}, {len(ratios)} runs)")
    for auth in ("off", "notes", "full"):
        ok = all(job[auth]["result"]["correctness"]["ok"] for job in jobs)
        recorded = jobs[0][auth]["result"]["config"]["message_auth"]
        print(f"  {auth:5s} gradients ok: {ok}; config message_auth {recorded}")
    import timeit

    from jaxdbg.pipeline.seal import Seal

    array = np.random.default_rng(0).normal(size=(8, 32)).astype(np.float32)  # one activation of the default MLP
    note = {"kind": "data", "to": 2, "sender_task": 5, "uuid": 7, "shape": [8, 32], "dtype": "float32",
            "arrival": 0.125, "task": 9, "delay": 0.0002}
    for auth in ("off", "notes", "full"):
        seal = Seal(b"k" * 32, auth)
        text = seal.wrap(note, "run 0: process 0 -> 1 #0", array)

        def both(seal=seal, text=text):
            seal.wrap(note, "run 0: process 0 -> 1 #0", array)
            body = seal.unwrap(text, "run 0: process 0 -> 1 #0", "process 0")
            seal.check_array(body, array, "process 0", "run 0: process 0 -> 1 #0")

        best = min(timeit.repeat(both, number=2000, repeat=5)) / 2000
        print(f"  {auth:5s} seal + check of one (8, 32) float32 message: {best * 1e6:.1f} us")


if __name__ == "__main__":
    main()
