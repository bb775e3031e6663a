"""Peak memory of ``jaxdbg nan-hunt`` against the plain program, for NaNs and Infs born deep in a training step.

The program: a deep residual MLP trained with a jitted ``value_and_grad`` step. Its input layer divides by
``1 + ||z||`` per row; from step 2 the batch carries padding rows. Where the first non-finite value is born
(``--origin``):
  backward-end      all-zero padding rows: the forward pass stays finite but the gradient of the norm at zero is
                    NaN, born in the backward pass of the first layer, among the last equations of the step.
                    ``nan-hunt`` must replay the whole step op by op to reach it: the worst case for what the
                    replay holds in memory.
  inf-backward-end  padding rows of 1e-30: ``||z||^2`` underflows to 0, and the norm's gradient there is an Inf
                    (not a NaN), born at the same place; a NaN follows from it later in the backward pass (the
                    NaN's chain names the Inf).
  forward-early     all-zero padding rows, and the input layer divides by ``||z||`` itself: 0/0 in the forward
                    pass, at its first operations (the replay stops at once).
  forward-middle    all-zero padding rows, and the middle block normalises ``h`` by its norm: 0/0 in the forward
                    pass, half way through it.
  forward-late      the same 0/0 in the last block: the whole forward pass is replayed, not the backward.
  backward-middle   all-zero padding rows, and the middle block divides ``h`` by ``1 + ||h||``: the forward stays
                    finite, the norm's gradient at zero is NaN half way through the backward pass.
How the step is written (``--structure``):
  flat              ``jax.jit(train_step)`` around ``value_and_grad(loss_fn)``: one jaxpr, forward and backward inline.
  jit-loss          ``loss_fn`` jitted on its own as well (as a library's jitted model is): the step's jaxpr holds
                    the forward pass as one inner jit and the backward pass as another, which takes every residual
                    of the forward pass as an input.
``--depth``, ``--width``, ``--origin`` and ``--structure`` take comma-separated lists: every combination is measured.
The default (12 cases: 8 and 32 blocks, width 256 and 768, NaN at the start and the end of the forward pass and at
the end of the backward pass) takes about 2.5 minutes of CPU; the deep case of issue 22 is
``--depth 48 --width 1024 --origin backward-end,inf-backward-end --structure flat,jit-loss`` (~1 minute a case).

Runs, side by side in one run, each in a fresh process, ``--pairs N`` times per case, alternating:
(a) the plain program;
(b) ``jaxdbg nan-hunt`` on it, with this checkout's jaxdbg, and with ``--before DIR``'s too (a checkout or
    ``git archive`` of an older commit) for a before/after comparison.
Each run sits under a small wrapper process; the peak is ``ru_maxrss``. For nan-hunt the wrapper runs the
command line in-process, so the wrapper's own peak is jaxdbg's parent and its children's peak is the
contained child process that runs the program and replays the failing step (the one that matters).
The ratio is taken per pair (the plain run's own peak moves by up to 15% from run to run); with several pairs,
their median and range are printed.
Target (issues 14 and 22): nan-hunt's child <= 1.3x the plain program, in every pair.

Usage: python scripts/bench_nan_memory.py [--depth 8,32] [--width 256,768] [--batch 1024]
       [--origin forward-early,forward-late,backward-end] [--structure flat] [--pairs 1] [--before DIR]
       (--depth 12,48 --width 256,1024 --origin backward-end,inf-backward-end --structure flat,jit-loss: every
       combination)
Example (before/after): git archive main jaxdbg | tar -x -C /tmp/before && \
    python scripts/bench_nan_memory.py --before /tmp/before
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_summary import record  # noqa: E402 - the scripts folder first

TARGET = 1.3
STRUCTURES = ("flat", "jit-loss")
ORIGINS = ("backward-end", "inf-backward-end", "backward-middle", "forward-early", "forward-middle", "forward-late")
# What nan-hunt must find for each origin: (pass, call index, a kind the origin or its chain names or None). The Inf
# turns into a NaN later in the same backward pass; the NaN's chain goes back to it.
EXPECTED = {"backward-end": ("backward", 2, None), "inf-backward-end": ("backward", 2, "inf"),
            "backward-middle": ("backward", 2, None), "forward-early": ("forward", 2, None),
            "forward-middle": ("forward", 2, None), "forward-late": ("forward", 2, None)}

MODEL = textwrap.dedent('''
    """A deep residual MLP; from step 2 the batch has zero padding rows and the input layer's gradient is NaN."""
    import sys
    import jax, jax.numpy as jnp

    DEPTH, WIDTH, BATCH, STEPS = map(int, sys.argv[1:5])
    ORIGIN = sys.argv[5] if len(sys.argv) > 5 else "backward-end"
    STRUCTURE = sys.argv[6] if len(sys.argv) > 6 else "flat"
    PADDING = 1e-30 if ORIGIN == "inf-backward-end" else 0.0


    def init(key):
        keys = jax.random.split(key, 2 * DEPTH + 2)
        scale = WIDTH ** -0.5
        return {
            "in": jax.random.normal(keys[0], (WIDTH, WIDTH)) * scale,
            "blocks": [{"w1": jax.random.normal(keys[2 * i + 1], (WIDTH, WIDTH)) * scale,
                        "w2": jax.random.normal(keys[2 * i + 2], (WIDTH, WIDTH)) * scale * 0.1}
                       for i in range(DEPTH)],
            "out": jax.random.normal(keys[-1], (WIDTH, WIDTH)) * scale,
        }


    def forward(params, x):
        z = x @ params["in"]
        if ORIGIN == "forward-early":  # <- origin: 0/0 on the padding rows
            z = z / jnp.sqrt(jnp.sum(z * z, axis=-1, keepdims=True))
        h = z / (1.0 + jnp.linalg.norm(z, axis=-1, keepdims=True))  # <- origin: d||z|| at z = 0 is NaN
        for i, block in enumerate(params["blocks"]):
            h = h + jnp.tanh(h @ block["w1"]) @ block["w2"]
            if i == (DEPTH - 1 if ORIGIN == "forward-late" else DEPTH // 2):
                if ORIGIN in ("forward-middle", "forward-late"):  # <- origin: 0/0 on the padding rows
                    h = h / jnp.sqrt(jnp.sum(h * h, axis=-1, keepdims=True))
                elif ORIGIN == "backward-middle":  # <- origin: d||h|| at h = 0 is NaN
                    h = h / (1.0 + jnp.linalg.norm(h, axis=-1, keepdims=True))
        return h @ params["out"]


    def loss_fn(params, x, y):
        return jnp.mean((forward(params, x) - y) ** 2)


    if STRUCTURE == "jit-loss":  # the backward pass becomes one inner jit taking every residual
        loss_fn = jax.jit(loss_fn)


    @jax.jit
    def train_step(params, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        return jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads), loss


    params = init(jax.random.key(0))
    for step in range(STEPS):
        kx, ky = jax.random.split(jax.random.key(step + 1))
        x = jax.random.normal(kx, (BATCH, WIDTH))
        if step >= 2:
            x = x.at[-BATCH // 8:].set(PADDING)  # padding rows
        y = jax.random.normal(ky, (BATCH, WIDTH))
        params, loss = train_step(params, x, y)
        print(f"step {step}: loss {float(loss):.4f}", flush=True)
''')

WRAPPER = textwrap.dedent('''
    import json, resource, subprocess, sys
    mode, root, report, argv = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    if mode == "plain":
        code = subprocess.call([sys.executable, *argv], stdout=subprocess.DEVNULL)
        where = None
    else:
        sys.path.insert(0, root)
        import jaxdbg
        from jaxdbg.cli import main
        code = main(["nan-hunt", *argv])
        where = jaxdbg.__file__
    with open(report, "w") as handle:
        json.dump({"code": code, "jaxdbg": where, "own_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                   "child_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}, handle)
''')

def _env() -> dict:
    # XLA:CPU's YNNPACK fusions compute reduce_max without propagating NaN (jax 0.10.2 and 0.11.2), which hides
    # the NaN from nan-hunt's watch (a max(|x|) per output leaf) until it comes back in as an input. Off for
    # every run alike, so that the replay this benchmark is about happens.
    flags = os.environ.get("XLA_FLAGS", "")
    if "ynn_fusion_type" not in flags:
        flags = f"{flags} --xla_cpu_experimental_ynn_fusion_type=".strip()
    return {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": "", "XLA_FLAGS": flags}


def measure(mode: str, root: str, workdir: str, label: str, model_argv: list[str]) -> dict:
    """Peak RSS (MiB) of one run: the program itself (plain) or jaxdbg's contained child (nan-hunt)."""
    report = os.path.join(workdir, f"{label}.json")
    if mode == "plain":
        argv = model_argv
    else:
        found = os.path.join(workdir, f"{label}-result.json")
        argv = [model_argv[0], "--json", found, "-q", "--out", os.path.join(workdir, label), "--", *model_argv[1:]]
    done = subprocess.run([sys.executable, "-c", WRAPPER, mode, root, report, *argv], env=_env(), cwd=workdir,
                          capture_output=True, text=True, timeout=3600, check=False)
    if not os.path.exists(report):
        raise SystemExit(f"{label}: the run failed\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    with open(report) as handle:
        got = json.load(handle)
    row = {"label": label, "code": got["code"], "peak_mib": got["child_kib"] / 1024,
           "jaxdbg_parent_mib": got["own_kib"] / 1024 if mode != "plain" else None, "jaxdbg": got["jaxdbg"]}
    if mode != "plain":
        with open(found) as handle:
            result = json.load(handle)["result"]
        first = result.get("first") or {}
        source = first.get("source") or {}
        row["origin"] = (f"{first.get('kind')} {first.get('primitive')} ({first.get('pass')}) at line "
                         f"{source.get('line')}, call {first.get('call_index')}")
        chain = [origin.get("kind") for origin in result.get("chain") or []]
        expected = EXPECTED[model_argv[5] if len(model_argv) > 5 else "backward-end"]
        row["replayed"] = (first.get("pass"), first.get("call_index")) == expected[:2] and (
            expected[2] is None or expected[2] in chain or first.get("kind") == expected[2])
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", default="8,32", help="residual blocks (a comma-separated list: each is measured)")
    parser.add_argument("--width", default="256,768", help="width (a comma-separated list: each is measured)")
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--origin", default="forward-early,forward-late,backward-end",
                        help=f"where the first NaN/Inf is born, a comma-separated list of {', '.join(ORIGINS)}")
    parser.add_argument("--structure", default="flat",
                        help=f"how the step is written, a comma-separated list of {', '.join(STRUCTURES)}")
    parser.add_argument("--steps", type=int, default=3, help="training steps (the padding starts at step 2)")
    parser.add_argument("--pairs", type=int, default=1,
                        help="runs of each side per case, alternating (the ratio of each pair, then their spread)")
    parser.add_argument("--before", help="a folder holding an older jaxdbg package, run for comparison")
    parser.add_argument("--json", help="write the rows here too")
    args = parser.parse_args(argv)
    origins = args.origin.split(",")
    if any(origin not in ORIGINS for origin in origins):
        parser.error(f"--origin: use some of {', '.join(ORIGINS)}")
    structures = args.structure.split(",")
    if any(structure not in STRUCTURES for structure in structures):
        parser.error(f"--structure: use some of {', '.join(STRUCTURES)}")
    if args.pairs < 1:
        parser.error("--pairs: at least 1")
    cases = [(int(depth), int(width), origin, structure) for depth in args.depth.split(",")
             for width in args.width.split(",") for origin in origins for structure in structures]
    found, verdict = [], True
    for depth, width, origin, structure in cases:
        runs, sizes = measure_case(depth, width, origin, structure, args)
        print(f"\n{'pair':<6}{'run':<18}{'peak MiB':>10}{'vs plain':>10}{'jaxdbg parent MiB':>19}  "
              "origin found / jaxdbg used")
        for pair, rows in enumerate(runs):
            plain = rows[0]["peak_mib"]
            for row in rows:
                row["ratio"] = row["peak_mib"] / plain
                parent = f"{row['jaxdbg_parent_mib']:.0f}" if row["jaxdbg_parent_mib"] is not None else "-"
                detail = f"{row.get('origin', '')}  {os.path.dirname(os.path.dirname(row['jaxdbg'] or ''))}".strip()
                print(f"{pair:<6}{row['label']:<18}{row['peak_mib']:>10.0f}{row['ratio']:>9.2f}x{parent:>19}  {detail}")
            for row in rows[1:]:
                if not row["replayed"]:
                    print(f"{row['label']}: did not find the expected origin; its peak is no replay's")
        case = {"depth": depth, "width": width, "origin": origin, "structure": structure, "sizes": sizes,
                "pairs": runs, "labels": [row["label"] for row in runs[0]]}
        case["ratios"] = {label: [rows[i]["ratio"] for rows in runs] for i, label in enumerate(case["labels"])}
        case["replayed"] = all(row["replayed"] for rows in runs for row in rows[1:])
        verdict = verdict and max(case["ratios"]["nan-hunt"]) <= TARGET and case["replayed"]
        found.append(case)
    print(f"\nnan-hunt peak / plain peak, median [range] of {args.pairs} pair(s) (target: every pair <= {TARGET}x), "
          f"batch {args.batch}:")
    for case in found:
        plain = [rows[0]["peak_mib"] for rows in case["pairs"]]
        others = "  ".join(f"{label} {_spread(case['ratios'][label])}" for label in case["labels"][2:])
        print(f"  depth {case['depth']:>3} width {case['width']:>5} {case['origin']:<17} {case['structure']:<9} plain "
              f"{min(plain):5.0f}-{max(plain):<5.0f} MiB  nan-hunt {_spread(case['ratios']['nan-hunt'])}"
              f"{'' if case['replayed'] else ' (origin not found)'}  {others}")
        ratios = case["ratios"]["nan-hunt"]
        record("nan-memory", f"peak / plain: depth {case['depth']} width {case['width']} {case['origin']} "
               f"{case['structure']}", statistics.median(ratios), f"<= {TARGET}",
               f"{min(ratios):.2f}-{max(ratios):.2f}" + ("" if case["replayed"] else " origin not found"))
    print(f"{'met' if verdict else 'NOT met'} in every case" if len(found) > 1 else
          f"{'met' if verdict else 'NOT met'}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"cases": found, "target": TARGET}, handle, indent=1)
    return 0 if verdict else 1


def _spread(ratios: list[float]) -> str:
    """``1.12x`` for one pair, ``1.12x [1.05-1.20]`` (median [range]) for several."""
    if len(ratios) == 1:
        return f"{ratios[0]:.2f}x"
    return f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]"


def measure_case(depth: int, width: int, origin: str, structure: str,
                 args: argparse.Namespace) -> tuple[list[list[dict]], dict]:
    """The plain run and nan-hunt's (and --before's) for one model and origin, ``args.pairs`` times, alternating."""
    with tempfile.TemporaryDirectory(prefix="bench-nan-memory-") as workdir:
        script = os.path.join(workdir, "deep_train.py")
        with open(script, "w") as handle:
            handle.write(MODEL)
        model_argv = [script, str(depth), str(width), str(args.batch), str(args.steps), origin, structure]
        # float32 (width, width) matrices: two per block, the input and output layers
        sizes = {"params_mib": (2 * depth + 2) * width * width * 4 / 2**20,
                 "activation_mib": args.batch * width * 4 / 2**20}
        print(f"\nmodel: {depth} residual blocks, width {width}, batch {args.batch}: parameters "
              f"{sizes['params_mib']:.0f} MiB, one activation {sizes['activation_mib']:.0f} MiB; origin {origin}, "
              f"{structure} (padding from step 2)", flush=True)
        runs = []
        for _ in range(args.pairs):
            rows = [measure("plain", ROOT, workdir, "plain", model_argv)]
            rows.append(measure("nan-hunt", ROOT, workdir, "nan-hunt", model_argv))
            if args.before:
                rows.append(measure("nan-hunt", os.path.abspath(args.before), workdir, "nan-hunt-before", model_argv))
            runs.append(rows)
    return runs, sizes


if __name__ == "__main__":
    sys.exit(main())
