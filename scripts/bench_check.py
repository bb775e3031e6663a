"""Benchmark ``jaxdbg check``: the time it adds over running the same checks' commands plainly.

A three-check suite (a clean nan-hunt script, a nan-hunt script that makes a NaN, a profile of a function
with a budget) runs as ``jaxdbg check`` and, plainly, as the three ``python -m jaxdbg <command> ...`` lines a
CI script runs one after another today (each with ``--json``). Target: check over plain at most 1.2 with
``--jobs 1`` (the same sequential work plus the suite's own: config, subprocesses, findings, JUnit, table);
the default ``--jobs`` (the CPU count) runs the checks at once and is shown beside it.

Runs alternate (``--pairs``); the headline ratio compares the best of each side (the usual estimate on a
machine where other work slows single runs down); the median of the per-pair ratios is printed beside it.
CPU time (user + system of every process started, targets included) is printed too: on a shared machine it
moves less with the other work than wall time does.

Usage: python scripts/bench_check.py [--pairs 5]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAD = "import jax\nimport jax.numpy as jnp\n\n\n@jax.jit\n"
FILES = {
    "clean.py": HEAD + "def step(x):\n    return jnp.tanh(x) * 0.5\n\n\nx = jnp.ones(64)\nfor _ in range(20):\n"
                       "    x = step(x)\nprint(float(x.sum()))\n",
    "nan.py": HEAD + "def loss(x):\n    return jnp.log(x - 2.0).sum()\n\n\nprint(loss(jnp.ones(4)))\n",
    "work.py": "import jax.numpy as jnp\n\n\ndef matmul(x):\n    return jnp.tanh(x @ x).sum()\n",
}
CHECKS = [  # name, command, argv after the command
    ("clean", "nan-hunt", ["clean.py"]),
    ("no-nan", "nan-hunt", ["nan.py"]),
    ("step-budget", "profile", ["--budget", "execute_median_ms<=50", "--args", "f32[128,128]", "--runs", "10",
                                "work.py::matmul"]),
]


def _project(folder: Path) -> None:
    for name, text in FILES.items():
        (folder / name).write_text(text)
    table = []
    for name, command, argv in CHECKS:
        words = argv[:-1]
        budget = ""
        if "--budget" in words:  # the table's budget key, not an option
            at = words.index("--budget")
            budget = f'budget = "{words[at + 1]}"\n'
            words = words[:at] + words[at + 2:]
        options = ", ".join(f'"{a}"' for a in words)
        table.append(f'[tool.jaxdbg.check.{name}]\ncommand = "{command}"\ntarget = "{argv[-1]}"\n{budget}'
                     f"options = [{options}]\n")
    (folder / "pyproject.toml").write_text("\n".join(table))


def _cpu_s() -> float:
    """CPU time of the children waited for so far (a child's own waited-for children included)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _timed(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, int]:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    return time.perf_counter() - start, done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    pairs = parser.parse_args().pairs
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GITHUB_ACTIONS", None)
    python = [sys.executable, "-m", "jaxdbg"]
    plain_s, serial_s, parallel_s = [], [], []
    plain_cpu, serial_cpu, parallel_cpu = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        _project(folder)
        for i in range(pairs):
            start, cpu = time.perf_counter(), _cpu_s()
            codes = []
            for name, command, argv in CHECKS:
                out = folder / f"plain-{i}-{name}"
                codes.append(_timed([*python, command, *argv, "--json", f"{out}.json", "--out", str(out), "-q"],
                                    folder, env)[1])
            plain_s.append(time.perf_counter() - start)
            plain_cpu.append(_cpu_s() - cpu)
            assert codes == [0, 1, 0], codes
            cpu = _cpu_s()
            took, code = _timed([*python, "check", "--jobs", "1", "--out", str(folder / f"serial-{i}"),
                                 "--junit", str(folder / f"junit-{i}.xml")], folder, env)
            assert code == 1, code
            serial_s.append(took)
            serial_cpu.append(_cpu_s() - cpu)
            cpu = _cpu_s()
            took, code = _timed([*python, "check", "--out", str(folder / f"parallel-{i}")], folder, env)
            assert code == 1, code
            parallel_s.append(took)
            parallel_cpu.append(_cpu_s() - cpu)
    print(f"cores: {os.cpu_count()}, pairs: {pairs}, checks: {len(CHECKS)}")
    print(f"plain (3 commands in a row): best {min(plain_s):.2f} s, median {statistics.median(plain_s):.2f} s")
    for label, runs, cpus in (("check --jobs 1", serial_s, serial_cpu),
                              ("check (default --jobs)", parallel_s, parallel_cpu)):
        per_pair = statistics.median(r / p for r, p in zip(runs, plain_s))
        print(f"{label}: best {min(runs):.2f} s, median {statistics.median(runs):.2f} s; "
              f"ratio to plain: best {min(runs) / min(plain_s):.3f}, median per pair {per_pair:.3f}; "
              f"CPU {statistics.median(cpus):.2f} s vs plain {statistics.median(plain_cpu):.2f} s (medians), "
              f"ratio {statistics.median(cpus) / statistics.median(plain_cpu):.3f}")
    print("target: check --jobs 1 over plain <= 1.2")


if __name__ == "__main__":
    main()
