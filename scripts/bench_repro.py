"""Benchmark: `jaxdbg repro` against pysource-minimize and C-Vise on the repro recipes, side by side.

Every tool gets the same interestingness test: the candidate, run contained (forked from the same warm
server, so a check costs the same for everyone), shows the same failure signature as the original (kind,
exception type and normalised message, fatal signal, timeout, or NaN in the same jitted function).
jaxdbg adds its own guards on top (raising statement kept, same JAX evidence, still needs jit).

For each result: size (code lines; equations for a cut jaxpr), checks run, wall time, whether it still
fails the same way in a fresh process, and whether it is degenerate (a raise/assert of constants at the
failing line, a failure that no longer needs jit although the original did, or no JAX work at all).

    python scripts/bench_repro.py                 # all recipes, 25 s per tool and recipe (~6 minutes)
    python scripts/bench_repro.py --budget 60 --recipes repro_jit_mismatch --json bench.json

Tools that cannot be installed are reported as such (pysource-minimize: pip; C-Vise: apt-get install cvise).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from multiprocessing.connection import Listener
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from jaxdbg.repro import ReproOptions, reproduce  # noqa: E402
from jaxdbg.repro.failures import choose, observe, raises_constants  # noqa: E402
from jaxdbg.repro.forkserver import ForkServer  # noqa: E402
from jaxdbg.repro.jobs import CHILD_ENV, RunRequest, reduction_env  # noqa: E402
from jaxdbg.repro.program import count_lines  # noqa: E402
from jaxdbg.repro.watch import WatchConfig  # noqa: E402
from jaxdbg.runner import run_contained  # noqa: E402
from jaxdbg.target import parse_target  # noqa: E402

RECIPES = {
    "repro_shape_error": "model_init.py",
    "repro_nan_graph": "train.py",
    "repro_jit_mismatch": "features.py",
    "repro_callback_crash": "host_stats.py",
    "repro_hang": "prefetch.py",
}
HANG_TIMEOUT = 2.0


@dataclass
class Row:
    recipe: str
    tool: str
    lines: int | None = None
    equations: int | None = None
    checks: int = 0
    wall_s: float = 0.0
    fresh_same: bool | None = None
    degenerate: str = ""
    note: str = ""


class OutOfBudget(Exception):
    """Raised by the shared test once a tool's time is up."""


class Interestingness:
    """The shared test: same signature as the original, in a contained run forked from a warm server."""

    def __init__(self, path: str, work: str):
        self.path, self.work = path, work
        self.name = os.path.basename(path)
        self.timeout = HANG_TIMEOUT if "hang" in path else 30.0
        self.request = RunRequest(sys_path=(os.path.dirname(path),), watch=WatchConfig(nonfinite=True))
        self.env = reduction_env(os.path.join(work, "jax-cache"))
        self.server = ForkServer(self.env)
        outcome = run_contained(replace(self.request, script=path), timeout=self.timeout, env=self.env)
        target = choose(observe(outcome), None, None)
        if target is None:
            raise SystemExit(f"{path} does not fail: nothing to reproduce")
        self.target = target
        self.jit_sensitive = self._jit_sensitive()
        self.checks, self._lock = 0, threading.Lock()
        self.deadline: float | None = None

    def _jit_sensitive(self) -> bool:
        if self.target.signature.kind != "exception":
            return False
        outcome = run_contained(replace(self.request, script=self.path, disable_jit=True), timeout=self.timeout,
                                env=self.env)
        return not any(f.signature.same_as(self.target.signature) for f in observe(outcome))

    def start(self, budget: float, source: str) -> None:
        self.checks, self.deadline, self.best = 0, time.perf_counter() + budget, source

    def __call__(self, text: str) -> bool:
        if self.deadline is not None and time.perf_counter() > self.deadline:
            raise OutOfBudget()  # the tool stops; its smallest interesting candidate is in self.best
        with self._lock:
            self.checks += 1
            folder = os.path.join(self.work, f"t{self.checks}-{threading.get_ident()}")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, self.name)
        with open(path, "w") as handle:
            handle.write(text)
        verdict = self.same(self.server.run(replace(self.request, script=path), timeout=self.timeout))
        with self._lock:
            if verdict and count_lines(text) < count_lines(self.best):
                self.best = text
        return verdict

    def same(self, outcome) -> bool:
        return any(f.signature.same_as(self.target.signature) and
                   (self.target.signature.kind not in ("nonfinite", "mismatch") or f.last_jit == self.target.last_jit)
                   for f in observe(outcome))

    def judge(self, text: str, path: str) -> tuple[bool, str]:
        """(fails the same way in a fresh process, degenerate reason or '')."""
        with open(path, "w") as handle:
            handle.write(text)
        outcome = run_contained(replace(self.request, script=path), timeout=self.timeout, env=CHILD_ENV)
        failures = [f for f in observe(outcome) if f.signature.same_as(self.target.signature)]
        if not failures:
            return False, ""
        failure = failures[0]
        if raises_constants(text, failure.location, path):
            return True, "raises constants"
        if self.target.jax_work and not failure.jax_work:
            return True, "no JAX work"
        if self.jit_sensitive:
            plain = run_contained(replace(self.request, script=path, disable_jit=True), timeout=self.timeout,
                                  env=CHILD_ENV)
            if self.same(plain):
                return True, "fails without jit too"
        return True, ""

    def close(self) -> None:
        self.server.close()


def run_jaxdbg(recipe: str, path: str, test: Interestingness, budget: float, work: str) -> Row:
    out = os.path.join(work, "jaxdbg-out")
    os.makedirs(out, exist_ok=True)
    started = time.perf_counter()
    timeout = HANG_TIMEOUT if "hang" in recipe else None
    result, artifacts = reproduce(parse_target(path), ReproOptions(max_time=budget, timeout=timeout), out)
    wall = time.perf_counter() - started
    text = Path(artifacts["repro"]).read_text()
    if result.strategy == "computation":  # an emitted program: its own assertion is the check
        fresh, degenerate = result.verified, ""
    else:
        fresh, degenerate = test.judge(text, os.path.join(work, os.path.basename(path)))
    return Row(recipe, "jaxdbg", count_lines(text), result.minimized.equations, result.checks, round(wall, 1), fresh,
               degenerate, f"{result.strategy}; verified={result.verified}")


def run_pysource_minimize(recipe: str, path: str, test: Interestingness, budget: float, work: str) -> Row:
    try:  # (by name: an optional anchor, not a dependency, so mypy looks for no stubs of it)
        minimize = importlib.import_module("pysource_minimize").minimize
    except ImportError:
        return Row(recipe, "pysource-minimize", note="not installed (pip install pysource-minimize)")
    source = Path(path).read_text()
    test.start(budget, source)
    started, note = time.perf_counter(), ""
    try:
        text = minimize(source, test)
    except OutOfBudget:
        text, note = test.best, "stopped at the budget"
    except Exception as err:  # noqa: BLE001 - a tool failure is a result too
        return Row(recipe, "pysource-minimize", checks=test.checks, note=f"failed: {type(err).__name__}: {err}")
    wall = time.perf_counter() - started
    fresh, degenerate = test.judge(text, os.path.join(work, os.path.basename(path)))
    return Row(recipe, "pysource-minimize", count_lines(text), None, test.checks, round(wall, 1), fresh, degenerate,
               note)


def run_cvise(recipe: str, path: str, test: Interestingness, budget: float, work: str) -> Row:
    cvise = shutil.which("cvise")
    if cvise is None:
        return Row(recipe, "C-Vise", note="not installed (apt-get install cvise)")
    folder = os.path.join(work, "cvise")
    os.makedirs(folder, exist_ok=True)
    candidate = os.path.join(folder, os.path.basename(path))
    shutil.copyfile(path, candidate)
    address = os.path.join(folder, "check.sock")
    listener = Listener(address, family="AF_UNIX")
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn = listener.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    def answer(conn) -> None:
        try:
            verdict = test(conn.recv())
        except (OutOfBudget, EOFError, OSError):
            verdict = False
        with contextlib.suppress(OSError):  # C-Vise already killed this test
            conn.send(verdict)
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    script = os.path.join(folder, "interesting.sh")
    client = ("import sys; from multiprocessing.connection import Client; c = Client(sys.argv[1], family='AF_UNIX'); "
              "c.send(open(sys.argv[2]).read()); sys.exit(0 if c.recv() else 1)")
    with open(script, "w") as handle:
        handle.write(f"#!/bin/sh\nexec {sys.executable} -c \"{client}\" {address} {os.path.basename(path)}\n")
    os.chmod(script, 0o755)
    test.start(budget, Path(path).read_text())
    started = time.perf_counter()
    note = ""
    proc = subprocess.Popen([cvise, "--n", "2", "--timeout", str(int(test.timeout) + 30), "--not-c", "--tidy", script,
                             os.path.basename(candidate)], cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=budget + 5)
        if proc.returncode:
            note = "failed: " + (err.strip().splitlines() or ["?"])[-1][:120]
    except subprocess.TimeoutExpired:  # C-Vise keeps its best variant in the file as it goes
        note = "stopped at the budget"
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=5)
                break
    wall = time.perf_counter() - started
    stop.set()
    listener.close()
    text = Path(candidate).read_text()
    fresh, degenerate = test.judge(text, os.path.join(work, os.path.basename(path)))
    return Row(recipe, "C-Vise", count_lines(text), None, test.checks, round(wall, 1), fresh, degenerate, note)


TOOLS = {"jaxdbg": run_jaxdbg, "pysource-minimize": run_pysource_minimize, "cvise": run_cvise}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget", type=float, default=25.0, help="seconds per tool and recipe")
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--tools", default=",".join(TOOLS))
    parser.add_argument("--json", default=None, help="also write the rows as JSON here")
    args = parser.parse_args()
    rows: list[Row] = []
    root = os.path.join(os.path.dirname(HERE), "recipes")
    for recipe in args.recipes.split(","):
        path = os.path.join(root, recipe, RECIPES[recipe])
        with tempfile.TemporaryDirectory(prefix="bench-repro-") as work:
            test = Interestingness(path, work)
            original = count_lines(Path(path).read_text())
            print(f"\n{recipe}: {original} lines; target {test.target.signature.describe()}"
                  + ("; needs jit" if test.jit_sensitive else ""), flush=True)
            try:
                for tool in args.tools.split(","):
                    with tempfile.TemporaryDirectory(dir=work) as tool_work:
                        row = TOOLS[tool](recipe, path, test, args.budget, tool_work)
                    rows.append(row)
                    print(_format(row), flush=True)
            finally:
                test.close()
    print("\nsummary (lines; equations for a cut jaxpr; fresh = fails the same way in a fresh process)")
    for row in rows:
        print(_format(row))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump([asdict(r) for r in rows], handle, indent=2)
    return 0


def _format(row: Row) -> str:
    size = "-" if row.lines is None else f"{row.lines} lines" + (f"/{row.equations} eqns" if row.equations else "")
    fresh = {None: "-", True: "yes", False: "NO"}[row.fresh_same]
    bad = f" DEGENERATE ({row.degenerate})" if row.degenerate else ""
    return (f"  {row.recipe:22s} {row.tool:18s} {size:18s} checks {row.checks:4d}  {row.wall_s:6.1f}s  "
            f"fresh {fresh}{bad}  {row.note}")


if __name__ == "__main__":
    sys.exit(main())
