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

Where a check's time goes, and jaxdbg before/after (another source tree, e.g. main from ``git archive``):

    python scripts/bench_repro.py --phases PROGRAM.py          # one run's cost: python, jax import, fork, compile
    python scripts/bench_repro.py --baseline DIR --targets A.py,B.py [--max-time 300]

``--phases`` times a fresh interpreter, ``import jax``, a contained run of PROGRAM in a fresh process and one
forked from the warm server (split by jax.monitoring into trace, lowering and compile), then runs ``jaxdbg
repro`` on it and adds up its contained runs by role: a candidate's first run, its second run (the check
that it does not fail by luck) and its op-by-op run (that it still needs jit). ``--baseline`` runs ``jaxdbg
repro`` on each target with both trees, alternating which goes first, and prints wall time, checks and size
with the ratio (each run in a process of its own, the tree first on PYTHONPATH).

Tools that cannot be installed are reported as such (pysource-minimize: pip; C-Vise: apt-get install cvise).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import json
import os
import resource
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

from jaxdbg.repro import ReproOptions, failures, reproduce  # noqa: E402
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

# A program run as the candidates are, timing itself: jax's compile events and the time outside them.
PROBE = """\
import runpy, sys, time
import jax
from jax import monitoring
spent = {}
monitoring.register_event_duration_secs_listener(lambda e, d, **k: spent.__setitem__(e, spent.get(e, 0) + d))
started = time.perf_counter()
jax.devices()
backend = time.perf_counter() - started
try:
    runpy.run_path(sys.argv[1], run_name="__main__")
except BaseException:
    pass
total = time.perf_counter() - started
print("PHASES", repr({"backend": backend, "total": total, **{k.rsplit("/", 1)[-1]: v for k, v in spent.items()}}))
"""


def _timed(command: list[str], env: dict | None = None, cwd: str | None = None) -> float:
    return _cost(command, env, cwd)[0]


def _cost(command: list[str], env: dict | None = None, cwd: str | None = None) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the command and every process it waited for): on a shared machine the CPU
    time is the figure that does not move with the load."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(command, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def phases(program: str, rounds: int, max_time: float) -> dict:
    """Where one candidate run's time goes, and where a whole reduction's goes (see the module docstring)."""
    program = os.path.abspath(program)
    work = tempfile.mkdtemp(prefix="bench-repro-phases-")
    env = {**os.environ, **reduction_env(os.path.join(work, "jax-cache"))}
    probe = os.path.join(work, "probe.py")
    with open(probe, "w") as handle:
        handle.write(PROBE)
    report: dict = {"python_s": min(_timed([sys.executable, "-c", "pass"]) for _ in range(rounds)),
                    "import_jax_s": min(_timed([sys.executable, "-c", "import jax"], env) for _ in range(rounds))}
    request = RunRequest(sys_path=(os.path.dirname(program),), watch=WatchConfig(nonfinite=False))
    fresh = [run_contained(replace(request, script=program), timeout=120, env=env) for _ in range(rounds + 1)]
    report["fresh_run_s"] = min(o.elapsed_s for o in fresh[1:])  # (the first fills the compilation cache)
    imports = {a.name for n in ast.walk(ast.parse(Path(program).read_text()))
               if isinstance(n, (ast.Import, ast.ImportFrom)) for a in getattr(n, "names", [])}
    with ForkServer(env, tuple(sorted(imports & set(failures.PRELOADABLE)))) as server:
        forked = [server.run(replace(request, script=program), timeout=120) for _ in range(rounds)]
        report["forked_run_s"] = min(o.elapsed_s for o in forked)
        split = []
        for _ in range(rounds):
            outcome = server.run(RunRequest(script=probe, argv=(program,), sys_path=(os.path.dirname(program),)),
                                 timeout=120)
            said = [line for line in outcome.stdout.splitlines() if line.startswith("PHASES ")]
            if said:
                split.append(ast.literal_eval(said[-1][len("PHASES "):]))
    if split:
        best = min(split, key=lambda d: d["total"])
        compiled = {k: best.get(k, 0.0) for k in ("jaxpr_trace_duration", "jaxpr_to_mlir_module_duration",
                                                  "backend_compile_duration")}
        report["forked_split_s"] = {"backend_init": best["backend"], **compiled,
                                    "run_and_rest": best["total"] - best["backend"] - sum(compiled.values())}
    roles: dict[str, list[float]] = {"first": [], "second (not by luck)": [], "op by op (needs jit)": []}
    original_run = failures.Checker.run

    def timed_run(self, path: str, disable_jit: bool = False):
        started = time.perf_counter()
        outcome = original_run(self, path, disable_jit)
        seen = getattr(self, "_bench_seen", None) or set()
        self._bench_seen = seen
        role = "op by op (needs jit)" if disable_jit else "second (not by luck)" if path in seen else "first"
        seen.add(path)
        roles[role].append(time.perf_counter() - started)
        return outcome

    failures.Checker.run = timed_run  # type: ignore[method-assign]
    try:
        started = time.perf_counter()
        result, _ = reproduce(parse_target(program), ReproOptions(max_time=max_time), os.path.join(work, "out"))
        report["repro"] = {"wall_s": time.perf_counter() - started, "checks": result.checks,
                           "lines": result.minimized.lines, "verified": result.verified}
    finally:
        failures.Checker.run = original_run  # type: ignore[method-assign]
        shutil.rmtree(work, ignore_errors=True)
    report["candidate_runs"] = {role: {"runs": len(t), "total_s": sum(t), "mean_s": sum(t) / len(t) if t else 0.0}
                                for role, t in roles.items()}
    return report


def compare(targets: list[str], baseline: str, max_time: float, rounds: int) -> list[dict]:
    """`jaxdbg repro` on each target with this tree and ``baseline``, alternating which runs first."""
    rows = []
    for target in targets:
        target = os.path.abspath(target)
        for round_ in range(rounds):
            order = [("this", os.path.dirname(HERE)), ("baseline", baseline)]
            for label, root in order if round_ % 2 == 0 else order[::-1]:
                with tempfile.TemporaryDirectory(prefix="bench-repro-cmp-") as out:
                    report = os.path.join(out, "report.json")
                    env = {**os.environ, "PYTHONPATH": root}
                    wall, cpu = _cost([sys.executable, "-m", "jaxdbg", "repro", target, "--out", out, "--json",
                                       report, "--max-time", str(max_time)], env, cwd=os.path.dirname(target))
                    data = json.loads(Path(report).read_text()) if os.path.exists(report) else {}
                    repro = Path(out, "repro.py").read_text() if os.path.exists(os.path.join(out, "repro.py")) else ""
                result = data.get("result", {})
                rows.append({"target": os.path.basename(target), "tree": label, "round": round_, "wall_s": wall,
                             "cpu_s": cpu,
                             "checks": result.get("checks"), "lines": (result.get("minimized") or {}).get("lines"),
                             "verified": result.get("verified"), "repro": repro})
                print(f"  {os.path.basename(target):24s} {label:8s} wall {wall:6.1f}s cpu {cpu:6.1f}s "
                      f"checks {result.get('checks')} "
                      f"lines {(result.get('minimized') or {}).get('lines')} verified {result.get('verified')}",
                      flush=True)
    for target in dict.fromkeys(r["target"] for r in rows):
        for figure in ("wall_s", "cpu_s", "checks"):
            mine = [r[figure] or 0 for r in rows if r["target"] == target and r["tree"] == "this"]
            base = [r[figure] or 0 for r in rows if r["target"] == target and r["tree"] == "baseline"]
            print(f"{target} {figure}: baseline {sum(base) / len(base):.1f} / this {sum(mine) / len(mine):.1f} = "
                  f"{sum(base) / max(sum(mine), 1e-9):.2f}x")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget", type=float, default=25.0, help="seconds per tool and recipe")
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--tools", default=",".join(TOOLS))
    parser.add_argument("--json", default=None, help="also write the rows as JSON here")
    parser.add_argument("--phases", default=None, help="a program: where one check's time goes (no tools compared)")
    parser.add_argument("--baseline", default=None, help="another jaxdbg source tree: `jaxdbg repro` with both")
    parser.add_argument("--targets", default=None, help="programs for --baseline (comma-separated)")
    parser.add_argument("--max-time", type=float, default=300.0, help="repro's --max-time (--phases, --baseline)")
    parser.add_argument("--rounds", type=int, default=None, help="--phases: runs per figure (3); --baseline: (1)")
    args = parser.parse_args()
    if args.phases:
        report = phases(args.phases, args.rounds or 3, args.max_time)
        print(json.dumps(report, indent=2, default=str))
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2, default=str))
        return 0
    if args.baseline:
        targets = (args.targets or "").split(",") if args.targets else [
            os.path.join(os.path.dirname(HERE), "recipes", r, RECIPES[r]) for r in args.recipes.split(",")]
        compared = compare(targets, os.path.abspath(args.baseline), args.max_time, args.rounds or 1)
        if args.json:
            Path(args.json).write_text(json.dumps(compared, indent=2))
        return 0
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
