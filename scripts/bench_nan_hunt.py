"""Benchmark ``jaxdbg nan-hunt`` against ``jax_debug_nans`` + ``jax_debug_infs``, side by side in one run.

(a) Per recipe (``recipes/nan_*``): each tool runs the unmodified script in a fresh process. Did it name
    the origin's operation, its source line (the one marked ``# <- origin``) and the pass (forward or
    backward), as the recipe's expected.json says? Wall time to the answer. The debug flags never report a
    pass, a loop iteration or values; an operation they name inside a loop is the loop (``scan``).
(b) Watch overhead: a clean classifier (MLP) training loop timed by itself (median seconds per step over chunks of
    steps) run plainly, under ``jaxdbg nan-hunt``, and with the debug flags on. Target: jaxdbg <= 1.3x.
    Plain and watched runs alternate (``--pairs``); the headline ratio compares the best of each side.

Usage: python scripts/bench_nan_hunt.py [--pairs 3] [--steps 150] [--recipes nan_scan,nan_cond]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_summary import record  # noqa: E402 - the scripts folder first

RECIPES = os.path.join(ROOT, "recipes")
DEBUG_FLAGS = {"JAX_DEBUG_NANS": "1", "JAX_DEBUG_INFS": "1"}

LOOP = textwrap.dedent('''
    """A clean classifier training loop that times itself: median seconds per step over chunks of steps."""
    import json, sys, time
    import jax, jax.numpy as jnp

    def layer(key, fan_in, fan_out):
        return {"w": jax.random.normal(key, (fan_in, fan_out)) * fan_in ** -0.5, "b": jnp.zeros(fan_out)}

    def logits(params, x):
        hidden = jax.nn.relu(x @ params["in"]["w"] + params["in"]["b"])
        hidden = jax.nn.relu(hidden @ params["mid"]["w"] + params["mid"]["b"])
        return hidden @ params["out"]["w"] + params["out"]["b"]

    def cross_entropy(params, x, labels):
        log_p = jax.nn.log_softmax(logits(params, x))
        return -jnp.mean(jnp.take_along_axis(log_p, labels[:, None], axis=1))

    @jax.jit
    def train_step(params, x, labels):
        loss, grads = jax.value_and_grad(cross_entropy)(params, x, labels)
        return jax.tree.map(lambda p, g: p - 0.05 * g, params, grads), loss

    k = jax.random.split(jax.random.key(0), 5)
    params = {"in": layer(k[0], 128, 256), "mid": layer(k[1], 256, 256), "out": layer(k[2], 256, 10)}
    x = jax.random.normal(k[3], (128, 128))
    y = jax.random.randint(k[4], (128,), 0, 10)
    steps, chunk, out = int(sys.argv[1]), 10, sys.argv[2]
    for _ in range(10):  # compile and warm up
        params, loss = train_step(params, x, y)
    loss.block_until_ready()
    per_step = []
    for start in range(0, steps, chunk):
        t = time.perf_counter()
        for step in range(chunk):
            params, loss = train_step(params, x, y)
            if step % 10 == 0:
                float(loss)  # what a loop that logs does
        loss.block_until_ready()
        per_step.append((time.perf_counter() - t) / chunk)
    per_step.sort()
    with open(out, "w") as handle:
        json.dump({"median_step_s": per_step[len(per_step) // 2], "loss": float(loss)}, handle)
''')


def _run(argv: list[str], env: dict | None = None, cwd: str | None = None,
         timeout: float = 600) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=timeout,
                          env={**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})})
    return time.perf_counter() - started, done


def _jaxdbg(*args: str) -> list[str]:
    return [sys.executable, "-m", "jaxdbg", "nan-hunt", *args]


# -- (a) recipes -------------------------------------------------------------------------------------------


def _expected(name: str) -> dict:
    with open(os.path.join(RECIPES, name, "expected.json")) as handle:
        expected = json.load(handle)
    source = expected.get("source")
    if source:
        with open(os.path.join(RECIPES, name, source["file"])) as handle:
            marked = [i for i, text in enumerate(handle, 1) if text.rstrip().endswith("# <- origin")]
        expected["line"] = (source["file"], marked[0])
    return expected


def _verdict(expected: dict, op: str | None, where: tuple[str, int] | None, pass_: str | None,
             argument: str | None = None) -> dict:
    if not expected["found"]:
        return {"op": op is None, "line": where is None, "pass": pass_ is None}
    if expected.get("kind") == "input":  # right answer: "it came in through batch['x']"
        return {"op": argument == expected["argument"], "line": argument == expected["argument"],
                "pass": argument == expected["argument"]}
    return {"op": op == expected.get("primitive", op) and op is not None,
            "line": "line" not in expected or where == expected["line"],
            "pass": "pass" in expected and pass_ == expected["pass"]}


def run_jaxdbg(name: str, workdir: str) -> dict:
    expected = _expected(name)
    report_path = os.path.join(workdir, f"{name}.json")
    extra = ["--precision"] if expected.get("options", {}).get("precision") else []
    wall, done = _run(_jaxdbg(os.path.join(RECIPES, name, "train.py"), "--json", report_path, "-q",
                              "--out", os.path.join(workdir, name), *extra))
    result = json.loads(Path(report_path).read_text())["result"] if os.path.exists(report_path) else {"found": None}
    first = result.get("first") or {}
    source = first.get("source")
    where = (os.path.basename(source["file"]), source["line"]) if source else None
    return {"wall_s": wall, "exit": done.returncode, "named": first.get("primitive") or first.get("argument"),
            "path": "/".join(first.get("path", [])[1:]),
            **_verdict(expected, first.get("primitive"), where, first.get("pass"), first.get("argument"))}


_FLOATING = re.compile(r"FloatingPointError: (?:invalid value \((?:nan|inf)\) encountered in (\w+)|(.*))")
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def run_debug_flags(name: str) -> dict:
    expected = _expected(name)
    folder = os.path.join(RECIPES, name)
    wall, done = _run([sys.executable, "train.py"], env=DEBUG_FLAGS, cwd=folder)
    match = _FLOATING.search(done.stderr)
    op = match.group(1) if match and match.group(1) else None
    frames = [(os.path.basename(f), int(n)) for f, n in _FRAME.findall(done.stderr)
              if os.path.dirname(os.path.abspath(f)) == folder]
    where = frames[-1] if frames else None
    if match is None:
        verdict = _verdict(expected, None, None, None)
    elif expected.get("kind") == "input" or not expected["found"]:
        verdict = {"op": False, "line": False, "pass": False}  # the flags never name an argument
    else:
        verdict = _verdict(expected, op, where, None)
    named = op or ("not reproduced op by op" if match else None)
    return {"wall_s": wall, "exit": done.returncode, "named": named, **verdict}


def bench_recipes(names: list[str], workdir: str) -> list[dict]:
    rows = []
    for name in names:
        rows.append({"recipe": name, "jaxdbg": run_jaxdbg(name, workdir), "flags": run_debug_flags(name)})
        _print_row(rows[-1])
    return rows


def _mark(value: bool) -> str:
    return "yes" if value else "no"


def _print_row(row: dict) -> None:
    j, f = row["jaxdbg"], row["flags"]
    print(f"{row['recipe']:<19} jaxdbg: {j['named']!s:<22} op {_mark(j['op']):<3} line {_mark(j['line']):<3} "
          f"pass {_mark(j['pass']):<3} {j['wall_s']:5.1f}s | debug flags: {f['named']!s:<24} op {_mark(f['op']):<3} "
          f"line {_mark(f['line']):<3} pass {_mark(f['pass']):<3} {f['wall_s']:5.1f}s", flush=True)


# -- (b) overhead ------------------------------------------------------------------------------------------


def bench_overhead(pairs: int, steps: int, workdir: str) -> dict:
    script = os.path.join(workdir, "clean_loop.py")
    with open(script, "w") as handle:
        handle.write(LOOP)
    plain, watched, flags = [], [], []
    for i in range(pairs):
        out = os.path.join(workdir, f"plain{i}.json")
        _run([sys.executable, script, str(steps), out])
        plain.append(json.loads(Path(out).read_text())["median_step_s"])
        out = os.path.join(workdir, f"watched{i}.json")
        _, done = _run(_jaxdbg(script, "-q", "--out", os.path.join(workdir, f"w{i}"), "--", str(steps), out))
        assert done.returncode == 0, done.stderr[-2000:]
        watched.append(json.loads(Path(out).read_text())["median_step_s"])
    out = os.path.join(workdir, "flags.json")
    _run([sys.executable, script, str(steps), out], env=DEBUG_FLAGS)
    flags.append(json.loads(Path(out).read_text())["median_step_s"])
    return {"plain_s": plain, "watched_s": watched, "flags_s": flags,
            "watch_over_plain": min(watched) / min(plain),
            "median_pair_ratio": statistics.median(w / p for w, p in zip(watched, plain)),
            "flags_over_plain": min(flags) / min(plain)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--recipes", default="", help="comma-separated recipe folders (default: all nan_*)")
    args = parser.parse_args()
    names = [n for n in args.recipes.split(",") if n] or sorted(
        d for d in os.listdir(RECIPES)
        if d.startswith("nan_") and os.path.exists(os.path.join(RECIPES, d, "expected.json")))
    with tempfile.TemporaryDirectory(prefix="bench-nan-") as workdir:
        print("(a) where is the first NaN/Inf born?  (answer per tool; 'op/line/pass' right?; wall time)")
        rows = bench_recipes(names, workdir)
        for tool in ("jaxdbg", "flags"):
            right = {k: sum(r[tool][k] for r in rows) for k in ("op", "line", "pass")}
            total = sum(r[tool]["wall_s"] for r in rows)
            print(f"  {tool:<7} right op {right['op']}/{len(rows)}, line {right['line']}/{len(rows)}, "
                  f"pass {right['pass']}/{len(rows)}; total wall {total:.1f}s")
        ratio = sum(r["jaxdbg"]["wall_s"] for r in rows) / max(sum(r["flags"]["wall_s"] for r in rows), 1e-9)
        print(f"  time to answer, jaxdbg / debug flags (all recipes): {ratio:.2f}x")
        print(f"(b) watch overhead on a clean training loop ({args.steps} steps, {args.pairs} pairs)")
        overhead = bench_overhead(args.pairs, args.steps, workdir)
        print(f"  step time plain {min(overhead['plain_s']) * 1e3:.3f} ms, under jaxdbg "
              f"{min(overhead['watched_s']) * 1e3:.3f} ms, with debug flags {min(overhead['flags_s']) * 1e3:.3f} ms")
        print(f"  jaxdbg / plain = {overhead['watch_over_plain']:.2f}x "
              f"(median pair {overhead['median_pair_ratio']:.2f}x; target <= 1.30); "
              f"debug flags / plain = {overhead['flags_over_plain']:.2f}x")
        record("nan-hunt", "(b) watch step time / plain, best of pairs", overhead["watch_over_plain"], "<= 1.05",
               f"median pair {overhead['median_pair_ratio']:.2f}")
        record("nan-hunt", "(a) time to the answers / debug flags", ratio, "",
               f"right op {sum(r['jaxdbg']['op'] for r in rows)}/{len(rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
