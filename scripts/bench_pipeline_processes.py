"""Benchmark: real pipeline mode with its stages in one process against the same stages split over two
processes of a local ``jax.distributed`` job (messages between processes carried by jax.experimental.transfer,
their notes by the coordination service). Same options, same draws; prints each run's makespan in both, the
ratio, and how long the messages that crossed processes took against their drawn delay.

    /work/venv/bin/python scripts/bench_pipeline_processes.py            # ~1 minute on 2 cores
    /work/venv/bin/python scripts/bench_pipeline_processes.py --task-ms 20

The single-process run is the anchor: same executor, messages placed with jax.device_put.
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


def run(processes: int, args: argparse.Namespace, folder: str) -> dict:
    report = os.path.join(folder, f"p{processes}.json")
    per_process = args.stages // processes
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={per_process}"}
    prefix = ["--processes", str(processes)] if processes > 1 else []
    command = [sys.executable, "-m", "jaxdbg", *prefix, "pipeline-bench", "--mode", "real", "--stages",
               str(args.stages), "--microbatches", str(args.microbatches), "--comm", "async,sync",
               "--variability", "jitter:cv=0.3", "--seeds", str(args.seeds), "--task-ms", str(args.task_ms),
               "--out", os.path.join(folder, f"out{processes}"), "--json", report, "-q"]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr[-2000:]}")
    with open(report) as handle:
        data = json.load(handle)
    folder_out = os.path.join(folder, f"out{processes}", "process-0" if processes > 1 else "")
    with open(os.path.join(folder_out, "durations.json")) as handle:
        data["durations"] = json.load(handle)
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--task-ms", type=float, default=4.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        one, two = run(1, args, folder), run(2, args, folder)
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


if __name__ == "__main__":
    main()
