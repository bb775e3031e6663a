"""Benchmark: jaxdbg's answers on the real-program corpus (tests/corpus/), side by side with what JAX's own
switches say on the same programs.

Per case, the answer checked against the one written down here (found by hand; lines by a marker comment):

- NaN cases: `jaxdbg nan-hunt` names the right op, line and pass (forward/backward) of the NaN's birth;
  beside it, the program run with `JAX_DEBUG_NANS=1 JAX_DEBUG_INFS=1`: the op and user line of the
  FloatingPointError jax raises (or nothing).
- recompile cases: `jaxdbg profile` names the right main cause and argument of the function's recompiles;
  beside it, the program run with `JAX_EXPLAIN_CACHE_MISSES=1`: whether jax's explanations of that
  function's cache misses name the argument.
- repro cases: `jaxdbg repro` at its default settings writes a reproducer that is verified, imports only
  jax/numpy, has at most 15 code lines, fails when run alone in an empty folder, and is done within 120 s
  (with the right failing op and user line where the failure is an exception).
- input cases: `jaxdbg profile`'s input-pipeline verdict (highly / moderately / not input-bound) and, where a
  marker names it, the sync at that line once per step; beside it, a plain timing of the loop's parts (building
  batches, copying them, executing the step, each waited for) and the verdict that timing implies.
- pmap cases: `jaxdbg profile` names the pmap'd function (kind pmap, its compiles, the main cause of its
  recompiles, its calls and devices); beside it, the program run with `JAX_EXPLAIN_CACHE_MISSES=1` and its
  backend compiles counted by a `jax.monitoring` listener: how many compiles jax made, and how many it explained.

    python scripts/bench_real_programs.py                       # every case (long: ~20-40 min on 2 cores)
    python scripts/bench_real_programs.py --cases vae_fori_nan,linen_lm_heads --kinds repro --json b.json
    python scripts/bench_real_programs.py --matrix              # the compatibility matrix's NaN programs
                                                                # (tests/compat/, 8 CPU devices; ~5-10 min)

Prints one row per case and totals.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CORPUS = os.path.join(ROOT, "tests", "corpus")
REPRO_TARGET_S = 120.0
REPRO_MAX_LINES = 15


@dataclass(frozen=True)
class Case:
    program: str
    kind: str  # nan | recompile | repro
    op: str | None = None  # nan: the primitive of the NaN's birth; repro: the failing primitive / call
    marker: str | None = None  # a comment on the expected line
    pass_: str | None = None  # nan: forward | backward
    function: str | None = None  # recompile: the jitted function
    cause: str | None = None  # recompile: the main cause's kind (shape, static, dtype, ...)
    argument: str | None = None  # recompile: an argument named in the recompiles (the user's name)
    script: str | None = None  # the program, relative to the repository (default: the corpus's train.py)
    devices: int | None = None  # CPU devices the program needs (XLA_FLAGS)
    args: tuple[str, ...] = ()  # the program's own arguments
    verdict: str | None = None  # input: the input-pipeline verdict expected

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.program}" + (f" {' '.join(self.args)}" if self.args else "")


CASES = [
    Case("nnx_mnist_nan", "nan", "mul", "# the bug", "forward"),
    Case("eqx_pairwise_nan", "nan", "mul", "# includes each point", "backward"),
    Case("linen_masked_mean_nan", "nan", "div", "# the bug: 0 / 0", "forward"),
    Case("optax_eager_lr_nan", "nan", "add", "# the NaN: applied eagerly", "forward"),
    Case("nnx_scan_rnn_nan", "nan", "dot_general", "# the NaN: gradient", "backward"),
    Case("nnx_vmap_ensemble_nan", "nan", "add", "# the NaN: log(0)", "forward"),
    Case("nnx_schedule_nan", "nan", "mul", "# the NaN: inf learning rate", "forward"),
    Case("eqx_rnn_poisson_nan", "nan", "div", "# forward-safe", "backward"),
    Case("vae_fori_nan", "nan", "mul", "# the NaN: 0 * log(0)", "forward"),
    Case("optax_multisteps_l2sp_nan", "nan", "mul", "# the NaN: d sqrt at 0", "backward"),
    Case("nnx_dropout_focal_nan", "nan", "mul", "# the bug", "backward"),  # typed PRNG keys among the inputs
    Case("optax_eager_sgd_growth", "nan", "add", "# the NaN: inf + (-inf)", "forward"),  # no jit: eager growth
    Case("shmap_dp_normalise_nan", "nan", "div", "# the bug", "forward"),  # shard_map: device and shard
    Case("pmap_poisson_nan", "nan", "log", "# the NaN", "forward"),  # pmap: device and mapped index
    Case("f16_attention_overflow", "nan", "sub", "# the NaN", "forward"),  # root cause: an f16 matmul overflow
    Case("f16_layernorm_overflow", "nan", "div", "# the NaN", "forward"),  # root cause: f16 x * x, through zeros
    Case("mnist_ragged_batch", "recompile", function="update", cause="shape", argument="batch[0]"),
    Case("linen_trainstate_padding", "recompile", function="train_step", cause="shape", argument="batch['tokens']"),
    Case("eqx_annealed_temperature", "recompile", function="make_step", cause="static", argument="temperature"),
    Case("nnx_forgot_train_mode", "recompile", function="train_step", cause="static",
         argument="model.bn.use_running_average"),
    Case("nnx_lm_shape", "repro", "dot_general", "# attention output projection"),
    Case("eqx_gru_shape", "repro", "dot_general", "# one GRU step per time step"),
    Case("nnx_cnn_sibling", "repro", "dot_general"),
    Case("linen_lm_heads", "repro", "Array.reshape", "# split into heads"),
    Case("vae_fori_nan", "repro", "mul"),
    Case("optax_multisteps_l2sp_nan", "repro", "div"),
    Case("eqx_callback_logger", "repro", marker="# the bug"),  # a jax.debug.callback logger raising KeyError there
    Case("optax_frozen_dropout", "repro"),  # jit vs op-by-op: a np.random mask frozen at trace time
    Case("linen_mnist_numpy_feed", "input", marker="# the host waits for every step here", function="train_step",
         verdict="highly input-bound"),
    Case("linen_mnist_numpy_feed", "input", function="train_steps_on_device", verdict="not input-bound",
         args=("--feed", "device")),
    Case("pmap_data_parallel", "pmap", function="update", cause="sharding", argument="params[0][0]"),
]
PMAP_DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}


@dataclass
class Row:
    case: str
    right: bool = False
    answer: str = ""
    wall_s: float = 0.0
    anchor: str = ""
    anchor_right: bool | None = None
    details: dict = field(default_factory=dict)


def script_of(case: Case) -> str:
    return os.path.join(ROOT, case.script) if case.script else os.path.join(CORPUS, case.program, "train.py")


def environment(case: Case, extra: dict | None = None) -> dict:
    devices = {"XLA_FLAGS": f"--xla_force_host_platform_device_count={case.devices}"} if case.devices else {}
    return {**os.environ, **devices, **(extra or {})}


def matrix_cases() -> list[Case]:
    """The compatibility matrix's rows (tests/compat/compat_matrix.py) as NaN cases: its nan-hunt column's
    answers, side by side with JAX_DEBUG_NANS on the same programs."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("compat_matrix", os.path.join(ROOT, "tests", "compat",
                                                                                "compat_matrix.py"))
    assert spec is not None and spec.loader is not None
    matrix = importlib.util.module_from_spec(spec)
    sys.modules["compat_matrix"] = matrix
    spec.loader.exec_module(matrix)
    return [Case(row.name, "nan", row.origin.primitive, row.origin.marker, row.origin.pass_,
                 script=os.path.join("tests", "compat", f"{row.name}.py"), devices=matrix.DEVICES)
            for row in matrix.ROWS]


def line_of(case: Case) -> int | None:
    if case.marker is None:
        return None
    with open(script_of(case)) as handle:
        return next(i for i, text in enumerate(handle, start=1) if case.marker in text)


def jaxdbg(command: str, case: Case, work: str, *extra: str, timeout: float = 900,
           env: dict | None = None) -> tuple[dict, float]:
    """`python -m jaxdbg COMMAND program --json ... --out ... -- ARGS`: its report and wall time."""
    report = os.path.join(work, f"{command}.json")
    argv = [sys.executable, "-m", "jaxdbg", command, script_of(case), "--json", report, "--out",
            os.path.join(work, command), "-q", *extra, *(("--", *case.args) if case.args else ())]
    started = time.perf_counter()
    subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                   env=environment(case, {"PYTHONPATH": ROOT, **(env or {})}))
    wall = time.perf_counter() - started
    try:
        with open(report) as handle:
            return json.load(handle), wall
    except (OSError, json.JSONDecodeError):
        return {}, wall


def run_program(case: Case, env: dict, timeout: float = 600, python: tuple[str, ...] | None = None
                ) -> subprocess.CompletedProcess:
    """The program itself, as its user runs it, with ``env`` added (``python``: what follows the interpreter,
    by default the program's own file)."""
    script = script_of(case)
    argv = python if python is not None else (os.path.basename(script),)
    return subprocess.run([sys.executable, *argv, *case.args], cwd=os.path.dirname(script),
                          capture_output=True, text=True, timeout=timeout, env=environment(case, env))


# ---- NaN: nan-hunt vs JAX_DEBUG_NANS / JAX_DEBUG_INFS -------------------------------------------------------


def bench_nan(case: Case, work: str) -> Row:
    report, wall = jaxdbg("nan-hunt", case, work)
    first = (report.get("result") or {}).get("first") or {}
    got = (first.get("primitive"), first.get("pass"), (first.get("source") or {}).get("line"))
    want = (case.op, case.pass_, line_of(case))
    row = Row(case.name, got == want, f"{got[0]} {got[1]} line {got[2]}", wall)
    flagged = run_program(case, {"JAX_DEBUG_NANS": "1", "JAX_DEBUG_INFS": "1"})
    op, line = debug_flags_blame(flagged.stderr, script_of(case))
    row.anchor = f"{op} line {line}" if op else "nothing raised"
    row.anchor_right = (op, line) == (case.op, want[2])
    row.details = {"expected": f"{case.op} {case.pass_} line {want[2]}"}
    return row


def debug_flags_blame(stderr: str, script: str) -> tuple[str | None, int | None]:
    """The op of the last FloatingPointError jax raised and the deepest line of ``script`` in its traceback."""
    ops = re.findall(r"FloatingPointError: .*?encountered in (\w+)", stderr)
    if not ops:
        return None, None
    tail = stderr[stderr.rfind("Traceback"):] if "Traceback" in stderr else stderr
    name = re.escape(os.path.basename(script))
    lines = re.findall(rf'File "(?:{re.escape(os.path.dirname(script))}/)?{name}", line (\d+)', tail)
    return ops[-1], int(lines[-1]) if lines else None


# ---- recompiles: profile vs jax_explain_cache_misses ------------------------------------------------------


def bench_recompile(case: Case, work: str) -> Row:
    report, wall = jaxdbg("profile", case, work, "--trace-calls", "0")
    result = report.get("result") or {}
    function: dict = next((f for f in result.get("functions", []) if f.get("name") == case.function), {})
    hint = next((h for h in result.get("hints", []) if h.startswith(f"{case.function} compiled")), "")
    cause = re.search(r"recompiles: (\w+) changes", hint)
    arguments = {c["argument"] for r in function.get("recompiles", []) for c in r.get("changes", [])}
    got_cause = cause.group(1) if cause else None
    row = Row(case.name, got_cause == case.cause and case.argument in arguments,
              f"{got_cause} ({', '.join(sorted(arguments))[:60]})", wall)
    logged = run_program(case, {"JAX_EXPLAIN_CACHE_MISSES": "1"})
    explained = explain_cache_misses(logged.stderr, case.function or "")
    names = [p for p in re.split(r"[.\[\]']+", case.argument or "") if p and not p.isdigit()]
    row.anchor = f"{len(explained)} explained: {explained[0][:100]}" if explained else "no explanation logged"
    row.anchor_right = bool(explained) and all(names[-1] in text for text in explained)
    row.details = {"expected": f"{case.cause} ({case.argument})", "jax_explanations": explained}
    return row


def explain_cache_misses(stderr: str, function: str) -> list[str]:
    """jax's explanation of each tracing cache miss of ``function`` after its first (the differences it lists,
    ``* at ...`` lines, or else its first reason)."""
    found = []
    for block in re.split(r"(?=TRACING CACHE MISS)", stderr):
        body = [line.strip() for line in block.splitlines()[1:] if line.strip()]
        if not block.startswith("TRACING CACHE MISS") or not any(f"for {function} defined" in b for b in body):
            continue
        differences = [line for line in body if line.startswith("* ")]
        reasons = [line for line in body if not line.startswith(("for ", "all previously seen"))]
        found.append(" ".join(differences) or (reasons[0] if reasons else ""))
    return found


# ---- repro: a verified, standalone, jax/numpy-only reproducer within 120 s -------------------------------


def bench_repro(case: Case, work: str) -> Row:
    report, wall = jaxdbg("repro", case, work)
    result = report.get("result") or {}
    repro = os.path.join(work, "repro", "repro.py")
    imports = imports_of(repro) if os.path.exists(repro) else {"(none)"}
    lines = (result.get("minimized") or {}).get("lines")
    alone = fails_alone(repro) if os.path.exists(repro) else False
    location = (result.get("signature") or {}).get("location") or {}
    op_ok = case.op is None or case.op in (result.get("failing_primitives") or [])
    line_ok = case.marker is None or location.get("line") == line_of(case)
    ok = bool(result.get("verified")) and imports <= {"jax", "numpy"} and lines is not None \
        and lines <= REPRO_MAX_LINES and alone and wall <= REPRO_TARGET_S and op_ok and line_ok
    answer = (f"{result.get('strategy')} {lines} lines {','.join(result.get('failing_primitives') or [])} "
              f"imports {'/'.join(sorted(imports))}{' alone-fails' if alone else ' ALONE-PASSES'}")
    row = Row(case.name, ok, answer, wall, anchor="-")
    row.details = {"verified": result.get("verified"), "lines": lines, "standalone": alone, "imports": sorted(imports),
                   "op_right": op_ok, "line_right": line_ok, "within_120s": wall <= REPRO_TARGET_S}
    return row


def imports_of(path: str) -> set[str]:
    with open(path) as handle:
        tree = ast.parse(handle.read())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return names | {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}


def fails_alone(repro: str) -> bool:
    """repro.py (and inputs.npz) copied into an empty folder fails when run there."""
    folder = tempfile.mkdtemp(prefix="alone-")
    for name in ("repro.py", "inputs.npz"):
        if os.path.exists(os.path.join(os.path.dirname(repro), name)):
            shutil.copy(os.path.join(os.path.dirname(repro), name), folder)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    try:
        run = subprocess.run([sys.executable, "repro.py"], cwd=folder, capture_output=True, text=True, timeout=300,
                             env=env)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return run.returncode != 0


# ---- input-bound: profile's verdict vs a plain timing of the loop's parts ----------------------------------

# Times the parts of a corpus program's loop plainly, each waited for; prints {"host_s", "transfer_s", "execute_s"}.
LOOP_PARTS = {"linen_mnist_numpy_feed": '''
import json, runpy, sys, time
import numpy as np
import jax, jax.numpy as jnp
program = runpy.run_path("train.py", run_name="bench")  # its functions; the training under __main__ does not run
rng = np.random.default_rng(0)
images, labels = program["synthetic_digits"](2048, rng)
state = program["create_state"](jax.random.key(0))
parts = {"host_s": 0.0, "transfer_s": 0.0, "execute_s": 0.0}
clock = time.perf_counter
if "--feed" in sys.argv and sys.argv[sys.argv.index("--feed") + 1] == "device":
    step, calls = program["train_steps_on_device"], 13
    images, labels = jax.device_put(images.astype(np.float32)), jax.device_put(labels)
    starts = jnp.arange(program["STEPS_PER_CALL"]) * program["BATCH"]
    for call in range(calls):
        t0 = clock(); begin = jax.block_until_ready((starts + call * 128) % (2048 - 128)); t1 = clock()
        state, loss = jax.block_until_ready(step(state, images, labels, begin)); t2 = clock()
        if call:  # the first call compiles
            parts["host_s"] += t1 - t0; parts["execute_s"] += t2 - t1
else:
    for call in range(13):
        t0 = clock(); index = rng.integers(0, 2048, 128); batch = program["augment"](images[index], rng); t1 = clock()
        batch, targets = jax.block_until_ready((jnp.asarray(batch), jnp.asarray(labels[index]))); t2 = clock()
        state, loss = jax.block_until_ready(program["train_step"](state, batch, targets)); t3 = clock()
        if call:
            parts["host_s"] += t1 - t0; parts["transfer_s"] += t2 - t1; parts["execute_s"] += t3 - t2
print(json.dumps(parts))
'''}


def verdict_of(idle_fraction: float) -> str:
    return ("highly input-bound" if idle_fraction >= 0.2 else "moderately input-bound" if idle_fraction >= 0.05
            else "not input-bound")


def bench_input(case: Case, work: str) -> Row:
    report, wall = jaxdbg("profile", case, work, "--trace-calls", "0")
    result = report.get("result") or {}
    pipeline = result.get("input_pipeline") or {}
    got = (pipeline.get("function"), pipeline.get("verdict"))
    right = got == (case.function, case.verdict)
    calls = next((f["execute"]["calls"] for f in result.get("functions", []) if f["name"] == case.function), 0)
    if case.marker:
        line = line_of(case)
        syncs = [s for s in result.get("syncs", []) if (s.get("source") or {}).get("line") == line]
        right = right and len(syncs) == 1 and syncs[0]["count"] == calls
    answer = (f"{got[1]} ({100 * pipeline.get('device_idle_fraction', 0):.0f}% idle; "
              f"{(pipeline.get('fixes') or ['no fix'])[0].split(':')[0]})")
    row = Row(case.name, right, answer, wall)
    harness = os.path.join(work, "parts.py")
    with open(harness, "w") as handle:
        handle.write(LOOP_PARTS[case.program])
    timed = run_program(case, {}, python=(harness,))
    try:
        parts = json.loads(timed.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        row.anchor = f"plain timing failed: {timed.stderr.strip().splitlines()[-1:]}"
        return row
    host = parts["host_s"] + parts["transfer_s"]  # each step waits for the last: the device idles meanwhile
    share = host / max(host + parts["execute_s"], 1e-9)
    row.anchor = (f"plain: batches {parts['host_s']:.2f} s, transfers {parts['transfer_s']:.2f} s, "
                  f"executions {parts['execute_s']:.2f} s -> {verdict_of(share)}")
    row.anchor_right = verdict_of(share) == case.verdict
    row.details = {"expected": case.verdict, "pipeline": pipeline, "plain_parts": parts}
    return row


# ---- pmap: profile vs jax_explain_cache_misses and jax.monitoring's compile count -------------------------

COUNT_COMPILES = '''
import collections, runpy, sys
import jax.monitoring
compiles = collections.Counter()
jax.monitoring.register_event_duration_secs_listener(
    lambda event, secs, **kw: compiles.update([kw.get("fun_name")])
    if event == "/jax/core/compile/backend_compile_duration" else None)
runpy.run_path("train.py", run_name="__main__")
print("COMPILES", dict(compiles), file=sys.stderr)
'''


def bench_pmap(case: Case, work: str) -> Row:
    report, wall = jaxdbg("profile", case, work, "--trace-calls", "3", env=PMAP_DEVICES)
    result = report.get("result") or {}
    function: dict = next((f for f in result.get("functions", []) if f.get("name") == case.function), {})
    changes = {(c["argument"], c["kind"]) for r in function.get("recompiles") or [] for c in r.get("changes", [])}
    right = function.get("kind") == "pmap" and (case.argument, case.cause) in changes
    answer = (f"{function.get('kind')} {case.function}: {function.get('compiles')} compiles, "
              f"{case.cause if right else '?'} ({case.argument}), {(function.get('execute') or {}).get('calls')} "
              f"calls on {len(function.get('devices') or [])} devices")
    row = Row(case.name, right, answer, wall)
    harness = os.path.join(work, "count_compiles.py")
    with open(harness, "w") as handle:
        handle.write(COUNT_COMPILES)
    logged = run_program(case, {"JAX_EXPLAIN_CACHE_MISSES": "1", **PMAP_DEVICES}, python=(harness,))
    counted = re.search(r"COMPILES (\{.*\})", logged.stderr)
    compiles = ast.literal_eval(counted.group(1)).get("jit(_fun)", 0) if counted else 0
    explained = explain_cache_misses(logged.stderr, "_fun") + explain_cache_misses(logged.stderr, case.function or "")
    row.anchor = f"{compiles} backend compiles of jit(_fun); {len(explained)} explained"
    row.anchor_right = bool(explained) and any((case.argument or "").split("[")[0] in text for text in explained)
    row.details = {"expected": f"{case.cause} ({case.argument})", "jax_explanations": explained}
    return row


# ---- the table --------------------------------------------------------------------------------------------

BENCHES = {"nan": bench_nan, "recompile": bench_recompile, "repro": bench_repro, "input": bench_input,
           "pmap": bench_pmap}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="", help="comma-separated program names (default: all)")
    parser.add_argument("--kinds", default="nan,recompile,repro,input,pmap",
                        help="comma-separated: nan, recompile, repro, input, pmap")
    parser.add_argument("--json", default=None, help="also write the rows here")
    parser.add_argument("--matrix", action="store_true", help="the compatibility matrix's programs instead")
    args = parser.parse_args()
    wanted = {c for c in args.cases.split(",") if c}
    kinds = {k for k in args.kinds.split(",") if k}
    cases = [c for c in (matrix_cases() if args.matrix else CASES) if (not wanted or c.program in wanted)
             and c.kind in kinds]
    if not cases:
        print(f"no case matches --cases {args.cases!r} --kinds {args.kinds!r}", file=sys.stderr)
        return 2
    rows = []
    header = f"{'case':38} {'jaxdbg':4} {'time':>7}  {'jaxdbg answer':58} {'jax flags':5}  jax's own answer"
    print(header)
    print("-" * len(header))
    for case in cases:
        with tempfile.TemporaryDirectory(prefix="bench-real-") as work:
            row = BENCHES[case.kind](case, work)
        rows.append(row)
        anchor_mark = "-" if row.anchor_right is None else ("ok" if row.anchor_right else "WRONG")
        print(f"{row.case:38} {'ok' if row.right else 'WRONG':4} {row.wall_s:6.1f}s  {row.answer[:58]:58} "
              f"{anchor_mark:5}  {row.anchor}", flush=True)
    print()
    for kind in sorted({c.kind for c in cases}):
        mine = [r for r in rows if r.case.startswith(kind + ":")]
        anchored = [r for r in mine if r.anchor_right is not None]
        line = f"{kind:10} jaxdbg right {sum(r.right for r in mine)}/{len(mine)}"
        if anchored:
            line += f"; jax's own switches right {sum(bool(r.anchor_right) for r in anchored)}/{len(anchored)}"
        if kind == "repro":
            times = sorted(r.wall_s for r in mine)
            line += (f"; within {REPRO_TARGET_S:.0f} s {sum(t <= REPRO_TARGET_S for t in times)}/{len(times)}, "
                     f"median {times[len(times) // 2]:.1f} s, max {times[-1]:.1f} s")
        print(line)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump([asdict(r) for r in rows], handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
