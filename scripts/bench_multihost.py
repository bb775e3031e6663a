"""Multi-process jobs: jaxdbg's cost and answers against the plain job, side by side in one run.

For 2 and 4 local processes (``jaxdbg --processes N``, CPU devices, gloo collectives), on the data-parallel
step of tests/corpus/multihost_dp made longer (``--steps``):

- overhead: the job's wall time plain (each process started with the same environment as
  ``jaxdbg --processes N`` gives, running the program itself) against ``profile`` and ``nan-hunt`` (its
  watch: every jitted call checked) on the same job; ratios of the best of ``--pairs`` runs;
- the straggler found (tests/corpus/multihost_straggler: process 1's input pipeline is slow);
- the NaN's process, device and shard found (tests/corpus/multihost_nan: one bad example on process 1).

Usage:
    python scripts/bench_multihost.py                 # 2 and 4 processes, 3 pairs each (~3-5 min on 2 cores)
    python scripts/bench_multihost.py --processes 2 --pairs 2 --steps 200
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_summary import record  # noqa: E402 - the scripts folder first

CORPUS = os.path.join(ROOT, "tests", "corpus")


def job_script(folder: str, steps: int) -> str:
    """The data-parallel corpus program with more steps, timing its training loop into $BENCH_LOOP_FILE.N
    (the plain job and jaxdbg run exactly this)."""
    source = Path(CORPUS, "multihost_dp", "train.py").read_text().replace("range(5)", f"range({steps})")
    source = source.replace("for i in range(", "import os, time\nstarted = time.perf_counter()\nfor i in range(", 1)
    source += ("\nwith open(f\"{os.environ['BENCH_LOOP_FILE']}.{jax.process_index()}\", 'w') as f:\n"
               "    f.write(str(time.perf_counter() - started))\n")
    path = os.path.join(folder, f"dp_{steps}.py")
    with open(path, "w") as handle:
        handle.write(source)
    return path


LOOP_FILE = os.path.join(tempfile.gettempdir(), f"jaxdbg-bench-loop-{os.getpid()}")


def env_for(devices: int) -> dict[str, str]:
    return {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "PYTHONPATH": ROOT,
            "BENCH_LOOP_FILE": LOOP_FILE}


def loop_s(processes: int) -> float:
    """The slowest process's training-loop time in the last run."""
    return max(float(open(f"{LOOP_FILE}.{i}").read()) for i in range(processes))


def run_plain(script: str, processes: int, devices: int) -> float:
    """The job without jaxdbg: the same local launch (one task of a SLURM step each), the program itself."""
    from jaxdbg.launch import free_port, task_environment

    port = free_port()
    started = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, script], env=task_environment(i, processes, port, env_for(devices)),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(processes)]
    codes = [p.wait(timeout=600) for p in procs]
    if any(codes):
        raise SystemExit(f"the plain job failed: exit codes {codes}")
    return time.perf_counter() - started


def run_jaxdbg(argv: list[str], processes: int, devices: int) -> tuple[float, int]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "jaxdbg", "--processes", str(processes), *argv], env=env_for(devices),
                          capture_output=True, text=True, timeout=900)
    if done.returncode not in (0, 1):
        sys.stderr.write(done.stderr[-3000:])
    return time.perf_counter() - started, done.returncode


def overhead(folder: str, processes: int, devices: int, steps: int, pairs: int) -> None:
    script = job_script(folder, steps)
    walls: dict[str, list[float]] = {"plain": [], "profile": [], "nan-hunt": []}
    loops: dict[str, list[float]] = {"plain": [], "profile": [], "nan-hunt": []}
    for pair in range(pairs):
        walls["plain"].append(run_plain(script, processes, devices))
        loops["plain"].append(loop_s(processes))
        for command in ("profile", "nan-hunt"):
            out = os.path.join(folder, f"{command}-{processes}-{pair}")
            wall, code = run_jaxdbg([command, script, "--out", out, "-q"], processes, devices)
            if code != 0:
                raise SystemExit(f"jaxdbg {command} on the clean job exited {code}")
            walls[command].append(wall)
            loops[command].append(loop_s(processes))
    for label, figures in (("training loop", loops), ("whole job", walls)):
        best = {k: min(v) for k, v in figures.items()}
        print(f"{processes} processes x {devices} device(s), {steps} steps, {label}, best of {pairs}: plain "
              f"{best['plain']:.2f} s, profile {best['profile']:.2f} s ({best['profile'] / best['plain']:.2f}x), "
              f"nan-hunt {best['nan-hunt']:.2f} s ({best['nan-hunt'] / best['plain']:.2f}x)"
              + ("   target <= 1.15x" if label == "training loop"
                 else "   (start-up, capture reading, calibration included)"))
        if label == "training loop":
            for command in ("profile", "nan-hunt"):
                record("multihost", f"{processes} processes: {command} training loop / plain",
                       best[command] / best["plain"], "<= 1.15", f"best of {pairs}")


def answers(folder: str, processes: int, devices: int) -> None:
    out = os.path.join(folder, f"straggler-{processes}")
    report = os.path.join(folder, f"straggler-{processes}.json")
    run_jaxdbg(["profile", os.path.join(CORPUS, "multihost_straggler", "train.py"), "--out", out, "-q",
                "--json", report], processes, devices)
    result = json.loads(Path(report).read_text())["result"]
    hint = next((h for h in result["hints"] if "is the straggler" in h), "no straggler hint")
    print(f"  straggler: found {result['stragglers']} (expected [1]); {hint}")
    record("multihost", f"{processes} processes: straggler found", None, "[1]", str(result["stragglers"]))
    out = os.path.join(folder, f"nan-{processes}")
    report = os.path.join(folder, f"nan-{processes}.json")
    run_jaxdbg(["nan-hunt", os.path.join(CORPUS, "multihost_nan", "train.py"), "--out", out, "-q", "--json", report],
               processes, devices)
    first = json.loads(Path(report).read_text())["result"]["first"]
    print(f"  NaN origin: {first['primitive']} line {first['source']['line']} call {first['call_index']}, process "
          f"{first['process']}, device {first['device']}, shard {first['shard']} (expected log, process 1)")
    record("multihost", f"{processes} processes: NaN origin", None, "log, proc 1",
           f"{first['primitive']}, process {first['process']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, nargs="*", default=[2, 4])
    parser.add_argument("--devices", type=int, default=1, help="CPU devices per process")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="jaxdbg-bench-multihost-") as folder:
        for processes in args.processes:
            overhead(folder, processes, args.devices, args.steps, args.pairs)
            answers(folder, processes, args.devices)


if __name__ == "__main__":
    main()
