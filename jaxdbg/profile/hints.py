"""Plain-words hints from a profile: what dominates the run, and the usual fix for it.

Example:
    >>> hints_for([], Totals(10.0, 8.0, 1.0, 0.5, 0.5), [])[0][:40]
    'compilation takes 80% of the run (8.00 s'
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from itertools import pairwise
from typing import Any

from jaxdbg.profile.host_bound import BLOCKED, MODERATE
from jaxdbg.profile.model import FunctionProfile, InputPipeline, Recompile, Totals, Transfer
from jaxdbg.profile.signature import main_cause

_FIXES = {
    "shape": "pad inputs to a few fixed shapes (bucketing), or drop the ragged last batch",
    "static": "each new value of a static argument compiles again: pass it as an array, or use fewer values",
    "weak_type": "mixing Python scalars and arrays changes weak types: pass jnp.asarray(x, dtype) consistently",
    "dtype": "cast inputs to one dtype before the call",
    "callable": "jax.jit is applied to a new function object each time: jit once, outside the loop",
    "sharding": "inputs arrive with different shardings: device_put them with one sharding",
    "structure": "the pytree structure of an argument changes between calls: keep the same keys/lengths",
    "type": ("an argument switches kind (a Python scalar and an array; a typed PRNG key from jax.random.key and a "
             "raw uint32 one from jax.random.PRNGKey): pass the same kind each call"),
}

# A pmap's first call often gets arguments on one device (replicated with jnp.stack or broadcast_to) and every later
# call its own outputs, split over the devices: two compiles of the same program.
_PMAP_SHARDING_FIX = ("the first call's arguments sit on one device and later calls get the pmap's own outputs, "
                      "split over its devices: put them there from the start, jax.device_put(x, NamedSharding("
                      "Mesh(jax.local_devices()[:n], (axis_name,)), P(axis_name)))")


def eager_matters(eager: Mapping[str, Any], totals: Totals) -> bool:
    """Whether the compiles of operations run outside jit deserve their own line: a tenth of all compile
    time or more (a model built eagerly compiles each initialiser on its own, often for seconds)."""
    seconds = float(eager.get("total_s") or 0.0)
    return bool(eager.get("count")) and seconds >= 0.05 and seconds >= 0.1 * (totals.compile_s or 0.0)


# Names of jax.random's samplers as eager compiles show them (jit(_truncated_normal), jit(_uniform), ...).
_INITIALISERS = re.compile(r"normal|uniform|orthogonal|threefry|random_bits|_gamma|bernoulli")


# jax's own functions behind eager compiles whose names say nothing of the user's code that ran them.
_EAGER_CALLERS = {"jit(stage)": "jnp.asarray/jnp.array of host data, once per new shape"}


def eager_label(name: str) -> str:
    """An eager compile's name, with what runs it where jax's name does not say.

        >>> eager_label("jit(stage)"), eager_label("jit(_normal)")
        ('jit(stage) (jnp.asarray/jnp.array of host data, once per new shape)', 'jit(_normal)')
    """
    caller = _EAGER_CALLERS.get(name)
    return f"{name} ({caller})" if caller else name


def _eager_hint(eager: Mapping[str, Any], totals: Totals) -> str | None:
    seconds = float(eager.get("total_s") or 0.0)
    if not eager_matters(eager, totals) or seconds < 0.5 or seconds < 0.1 * totals.wall_s:
        return None
    top = list(eager.get("top") or [])[:3]
    names = ", ".join(f"{eager_label(t['name'])} {t['compile_s']:.2f} s" for t in top)
    what = ("random initialisers (a model built outside jit compiles each initialiser once per parameter shape)"
            if any(_INITIALISERS.search(str(t["name"])) for t in top) else "setup work outside jit")
    # Eager compiles are mostly short, and the persistent cache skips compiles shorter than
    # jax_persistent_cache_min_compile_time_secs (1 s): the cache alone keeps few of them. With the threshold at
    # 0 a second run of the NNX LM in tests/corpus built its model in 0.9 s instead of 8.6 s.
    return (f"{eager['count']} operations run outside jit compiled one by one: {seconds:.2f} s, "
            f"{100 * seconds / max(totals.compile_s or 0.0, 1e-9):.0f}% of compile time"
            + (f" ({names})" if names else "") + f", mostly {what}. Keep them across runs with the persistent "
            "cache and its threshold lowered: JAX_COMPILATION_CACHE_DIR=DIR "
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 "
            "(by default it skips compiles under 1 s); building the model inside one jit (nnx.jit(create_model), "
            "jax.jit(model.init)) trades them for one larger compile")


def input_hint(pipeline: InputPipeline | None) -> str | None:
    """The input-pipeline verdict in words, with its fixes, when the device waits for the host 5% of a step or more.

        >>> hint = input_hint(InputPipeline("step", 50, 0.04, 0.01, 0.028, 0.002, 0.0, 0.0001, 0.03, 0.75, 0.0,
        ...                                 "highly input-bound", ("prefetch",)))
        >>> hint.split(" (")[0]
        'step is highly input-bound: the device waits for the host 75% of each step'
        >>> hint.split("; ", 1)[1]
        'host work 28 ms, transfers 2 ms, executions 10 ms). Fix: prefetch'
    """
    if pipeline is None or pipeline.device_idle_fraction < MODERATE:
        return None
    p = pipeline
    blocked = p.host_blocked_s or 0.0
    said = f" ({_ms(blocked)} of it blocked, off the CPU)" if blocked >= BLOCKED * p.host_s > 0 else ""
    parts = [f"host work {_ms(p.host_s)}{said}", f"transfers {_ms(p.transfer_s)}"]
    if p.sync_wait_s >= MODERATE * p.step_s:
        parts.append(f"waiting in syncs {_ms(p.sync_wait_s)}")
    if p.dispatch_s >= MODERATE * p.step_s and p.dispatch_s > p.device_s:
        parts.append(f"dispatching {_ms(p.dispatch_s)}")
    parts.append(f"executions {_ms(p.device_s)}")
    return (f"{p.function} is {p.verdict}: the device waits for the host {100 * p.device_idle_fraction:.0f}% of each "
            f"step ({_ms(p.device_idle_s)} of {_ms(p.step_s)} over {p.steps} steps; {', '.join(parts)})"
            + (". Fix: " + "; then ".join(p.fixes[:2]) if p.fixes else ""))


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.3g} ms"


def recompile_fix(recompiles: Sequence[Recompile], pmap: bool = False) -> tuple[str, int, str]:
    """The main cause of ``recompiles`` (the kind of change), on how many of them, and its usual fix.

    Example:
        >>> from jaxdbg.profile.model import ArgChange
        >>> recompile_fix([Recompile(1, "", (ArgChange("lr", "static", "0.1", "0.2"),))])[:2]
        ('static', 1)
    """
    kind, count = main_cause(recompiles)
    fix = _FIXES.get(kind, "check jax's caches and config between calls")
    if kind == "static" and _mode_flags_only(recompiles):
        fix = _MODE_FLAG_FIX
    return kind, count, _PMAP_SHARDING_FIX if kind == "sharding" and pmap else fix


# A bool static argument (train=True/False) is a mode switch: one compile per mode is by design, and jax keeps both
_MODE_FLAG_FIX = ("a bool static argument (a train/eval flag) compiles once per value, each kept in jax's cache: "
                  "expected for two modes; only a compile that comes back would need a look")


def _mode_flags_only(recompiles: Sequence[Recompile]) -> bool:
    """Every static change of ``recompiles`` is a bool flipping (True <-> False), and there is one at least.

        >>> from jaxdbg.profile.model import ArgChange
        >>> _mode_flags_only([Recompile(4, "", (ArgChange("train", "static", "True", "False"),))])
        True
    """
    changes = [c for r in recompiles for c in r.changes if c.kind == "static"]
    return bool(changes) and all({c.before, c.after} == {"True", "False"} for c in changes)


def hints_for(functions: list[FunctionProfile], totals: Totals, transfers: list[Transfer],
              eager: Mapping[str, Any] | None = None, pipeline: InputPipeline | None = None) -> tuple[str, ...]:
    """Hints in order of what to look at first; ``eager``: the eager compiles (ProfileResult.eager_compile),
    already counted in ``totals.compile_s``; ``pipeline``: whether the device waits for the host."""
    eager = eager or {}
    hints = []
    waiting = input_hint(pipeline)
    if waiting:
        hints.append(waiting)
    for function in functions:
        if not function.recompiles:
            continue
        kind, count, fix = recompile_fix(function.recompiles, function.kind == "pmap")
        hints.append(f"{function.name} compiled {function.compiles} times ({function.compile_total_s:.2f} s); "
                     f"the main cause, on {count} of {len(function.recompiles)} recompiles: {kind} changes. "
                     f"Fix: {fix}")
    hints.extend(hint for f in functions if (hint := growth_hint(f)))
    wall = totals.wall_s or 0.0
    compile_s, transfer_s = totals.compile_s or 0.0, totals.transfer_s or 0.0
    if wall > 0 and compile_s > 0.5 * wall:
        split = ""
        if eager_matters(eager, totals):
            jitted = max(compile_s - eager["total_s"], 0.0)
            split = (f": {jitted:.2f} s in jitted functions, {eager['total_s']:.2f} s in {eager['count']} "
                     "eager operations")
        hints.append(f"compilation takes {100 * compile_s / wall:.0f}% of the run ({compile_s:.2f} s"
                     f"{split}): reuse compiled code with the persistent cache (JAX_COMPILATION_CACHE_DIR), or "
                     "compile less (fewer shapes, smaller unrolled loops: lax.scan instead of Python loops)")
    eager_hint = _eager_hint(eager, totals)
    if eager_hint:
        hints.append(eager_hint)
    if wall > 0 and transfer_s > 0.2 * wall:
        hints.append(f"host<->device copies take {100 * transfer_s / wall:.0f}% of the run "
                     f"({transfer_s:.2f} s): keep data on the device between steps")
    by_kind = {t.kind: t for t in transfers}
    implicit = by_kind.get("implicit_args")
    if implicit and implicit.count >= 3 and implicit.total_s > 0.05 * max(wall, 1e-9):
        hints.append(f"numpy arrays were passed to jitted functions {implicit.count} times and copied to the device "
                     f"each time ({implicit.total_s:.2f} s, {implicit.bytes / 1e6:.1f} MB): move them once with "
                     "jax.device_put, or prefetch the next batch while the current step runs")
    reads = by_kind.get("to_host")
    if reads and reads.count >= 10 and reads.total_s > 0.05 * max(wall, 1e-9):
        hints.append(f"device values were read on the host {reads.count} times ({reads.total_s:.2f} s: float(x), "
                     ".item(), print): each read waits for the device; log every N steps instead")
    return tuple(hints) + op_hints(functions, wall)


# A host callback's custom call (jax.debug.print, jax.debug.callback, pure_callback, io_callback): its target
# (xla_ffi_python_cpu_callback, xla_python_gpu_callback, ...) or, where the expression is missing, its name.
_CALLBACK = re.compile(r'custom_call_target="[^"]*python[^"]*callback|^(?:debug_print|debug_callback|pure_callback|'
                       r'io_callback)\b')
CALLBACK_SHARE = 0.2  # a host callback taking this share of a function's op time gets its own hint


GROWTH = 2.0  # the last timed calls take this many times the first ones or more: the work per call grows


def growth_hint(function: FunctionProfile) -> str:
    """A function whose timed executions grow call after call (at least 5, three in four longer than the one
    before, the last two GROWTH times the first two): each call does more work, and the calls that ran ahead
    untimed, counted at the timed ones' mean, are understated. '' otherwise.

    Example:
        >>> from jaxdbg.profile.model import ExecuteStats
        >>> grows = ExecuteStats(calls=12, timed_calls=6, samples_s=(0.001, 0.0012, 0.0015, 0.002, 0.003, 0.004))
        >>> growth_hint(FunctionProfile("solve", None, 1, (), None, grows))[:64]
        "solve's execution grows call after call (1.1 ms -> 3.5 ms over 6"
    """
    samples = function.execute.samples_s
    if len(samples) < 5:
        return ""
    rises = sum(b > a for a, b in pairwise(samples))
    first, last = (samples[0] + samples[1]) / 2, (samples[-2] + samples[-1]) / 2
    if rises < 0.75 * (len(samples) - 1) or last < GROWTH * first:
        return ""
    untimed = function.execute.calls - function.execute.timed_calls
    estimate = (f"; its {untimed} calls that ran ahead untimed are counted at the timed ones' mean, so its execute "
                "total is low (--sync-every 1 times every call)" if untimed > 0 else "")
    return (f"{function.name}'s execution grows call after call ({_ms(first)} -> {_ms(last)} over {len(samples)} "
            "timed calls): each call does more work than the one before (a while_loop whose trip count grows, "
            f"sizes or iterations that depend on the data){estimate}")


def op_hints(functions: Iterable[FunctionProfile], wall: float) -> tuple[str, ...]:
    """One op that takes most of a function's time, in a function that matters: a profiled run and a capture.
    A host callback that takes a fifth of it or more is named as one: the step stops while Python runs on the host.

    Example:
        >>> from jaxdbg.profile.model import ExecuteStats, OpRow
        >>> op = OpRow("debug_print.1", "custom-call", 10, 0.009, 0.9, None,
        ...            expression='custom-call(%x), custom_call_target="xla_ffi_python_cpu_callback"')
        >>> step = FunctionProfile("train_step", None, 1, (), None, ExecuteStats(calls=10, total_s=0.01), ops=(op,))
        >>> op_hints([step], 0.02)[0].split(":")[0]
        'in train_step, a host callback takes 90% of the time'
    """
    hints = []
    for function in functions:
        if not function.ops or function.execute.total_s <= 0.05 * max(wall, 1e-9):
            continue
        callbacks = [op for op in function.ops if _CALLBACK.search(op.expression) or _CALLBACK.search(op.name)]
        share = sum(op.fraction for op in callbacks)
        if share >= CALLBACK_SHARE:
            lines = ", ".join(f"{op.name} at {op.source}" if op.source else op.name for op in callbacks[:3])
            hints.append(f"in {function.name}, a host callback takes {100 * share:.0f}% of the time: {lines}: each "
                         "call stops the computation while Python runs on the host (jax.debug.print, "
                         "jax.debug.callback, pure_callback); print or log every N steps (under lax.cond on the "
                         "step number), or return the values and read them outside the step every N steps")
        elif function.ops[0].fraction > 0.5:
            op = function.ops[0]
            where = f" at {op.source}" if op.source else ""
            hints.append(f"in {function.name}, one op takes {100 * op.fraction:.0f}% of the time: {op.name} "
                         f"({op.category}){where}")
    return tuple(hints)


def notes_for(mode: str, functions: list[FunctionProfile], gathered: Any, error: str | None,
              command_buffers_off: bool = False, stopped_in_call: bool = False) -> tuple[str, ...]:
    """``stopped_in_call``: the target failed (or was stopped) with a jitted call on its stack."""
    notes = []
    if command_buffers_off and (gathered.device or {}).get("backend") in ("gpu", "cuda", "rocm"):
        notes.append("XLA:GPU command buffers were off in the profiled process so that every kernel is tied to "
                     "its HLO op in the per-op table; launch overhead may differ a little from a default run "
                     "(--command-buffers keeps them, at the cost of ops inside them missing from the table)")
    if mode == "script" and not functions and error and stopped_in_call and gathered.names:
        names = ", ".join(sorted({meta.name for meta in gathered.names.values()})[:4])
        notes.append(f"the target stopped before any jitted function returned from its first call ({names}): "
                     "the failure is inside that first call (its compile or its run), where the stack above points")
    elif mode == "script" and not functions and error:
        # jitted functions defined (by the script or a library it imports) say nothing about where it stopped
        notes.append("the target failed before it called any jitted function, so there is nothing to profile: "
                     "the error line says where it stopped")
    elif mode == "script" and not functions:
        eager = gathered.eager_compile()
        notes.append(
            "the script ran no jitted function (nothing called a function made by jax.jit), so there is no "
            "compile/execute split to show"
            + (f"; {eager['count']} eager operations compiled in {eager['total_s']:.2f} s" if eager["count"] else "")
            + ". Wrap the step in jax.jit, or profile one function with file.py::func")
    if error and functions:
        notes.append("the target failed midway: the profile covers what ran before the failure")
    notes.extend(gathered.trace_errors)
    if gathered.trace is None and not error and functions:
        notes.append("no profiler capture was taken (--trace-calls 0), so there is no per-op table")
    sampled = [f for f in functions if mode == "script" and f.execute.timed_calls < f.execute.calls]
    if sampled:
        counts = ", ".join(f"{f.name} {f.execute.timed_calls} of {f.execute.calls}" for f in sampled[:4])
        notes.append(f"calls timed ({counts}): the first ones, those that compiled or ran in the capture window, "
                     "then one in --sync-every (after 8 of those, as often as keeps the waits near 1% of the "
                     "run); the others ran ahead unblocked as in a plain run, so execute totals are estimates "
                     "(--sync-every 1 times every call)")
    window = gathered.trace.calls_traced if gathered.trace is not None else 0
    notes.extend(f"{function.name}: no per-op rows; it did not run inside the capture window (the first "
                 f"{window} calls of the run): raise --trace-calls to include it"
                 for function in functions
                 if not function.ops and function.execute.calls and gathered.trace is not None)
    return tuple(dict.fromkeys(notes))
