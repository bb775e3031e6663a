"""Hints that fit what ``jaxdbg memory`` found, each with the bytes it saves per device where that can be
computed: donation (an argument the loop replaces by the function's output), rematerialisation (forward
activations kept for the backward pass), a smaller dtype or sharding for the largest arrays (when something
does not fit), and leaks moved out of the loop. For donation and rematerialisation the saving is an upper
bound: measured on CPU, donating a two-matrix parameter pytree saved one matrix (XLA kept a copy of the other).

Example:
    >>> from jaxdbg.memory.result import Held, ProgramMemory
    >>> step = ProgramMemory("train_step", None, 0, 0, "", 2**30, 2**30, 0, 0, 0, 2**31,
    ...                      held=(Held("params", 0, 2**30, 8, threaded=True),))
    >>> print(donation_hints([step])[0].text)  # doctest: +NORMALIZE_WHITESPACE
    train_step: donating params would save up to 1.0 GiB per call: the loop passes its outputs back in that place,
    so XLA can write them over the arguments (less any copy it must keep); jax.jit(..., donate_argnums=(0,))
"""

from __future__ import annotations

from collections.abc import Sequence

from jaxdbg.frameworks import donation_option
from jaxdbg.memory.result import Buffer, Hint, Leak, OutOfMemory, ProgramMemory
from jaxdbg.memory.units import format_bytes
from jaxdbg.report import relative_or_absolute

REMAT_MIN_SHARE = 0.25  # forward activations must be at least this share of the program's peak to hint
# A donation must save at least this share of the run's peak (per device) to be worth a hint: a metrics tuple
# or a step counter threaded through the loop saves bytes nobody needs (and donating them costs a line of code).
DONATE_MIN_SHARE = 0.05
_NARROW = {"f64": ("f32", 2), "f32": ("bf16", 2), "c128": ("c64", 2)}
_HALF = {"bf16": "bfloat16", "f16": "float16"}
UPCAST_MIN_SHARE = 0.1  # float32 copies of half-precision arguments must hold this share of the peak to hint


def hints_for(programs: Sequence[ProgramMemory], leaks: Sequence[Leak], oom: OutOfMemory | None,
              devices: int, backend: str = "", peak_bytes: int | None = None) -> tuple[Hint, ...]:
    """Every hint, largest saving first; ``peak_bytes``: the run's peak per device. A donation's saving is
    weighed against that peak less what leaked (the run's own need once the leak is fixed), or the largest
    program's own peak where that is higher."""
    latest = latest_programs(programs)
    needed = (peak_bytes or 0) - sum(leak.bytes for leak in leaks)
    reference = max([needed, *(p.peak_bytes for p in latest)])
    found = [*donation_hints(latest, reference), *remat_hints(latest, backend), *leak_hints(leaks),
             *upcast_hints(latest)]
    tight = [p for p in latest if p.fits is False]
    if oom is not None and oom.program is not None:
        tight.append(oom.program)
    for program in _unique(tight):
        found.extend(tightening_hints(program, devices))
    return tuple(sorted(found, key=lambda h: -(h.saves_bytes or 0)))


def latest_programs(programs: Sequence[ProgramMemory]) -> list[ProgramMemory]:
    """The latest analysed compile of each function."""
    by_name: dict[str, ProgramMemory] = {}
    for program in programs:
        by_name[program.name] = program
    return list(by_name.values())


def _unique(programs: list[ProgramMemory]) -> list[ProgramMemory]:
    seen, kept = set(), []
    for program in programs:
        if (program.name, program.compile_index) not in seen:
            seen.add((program.name, program.compile_index))
            kept.append(program)
    return kept


def donation_hints(programs: Sequence[ProgramMemory], reference: int = 0) -> list[Hint]:
    """Arguments the loop replaces by the function's own outputs: donating them lets XLA reuse their buffers.
    Only where it matters: a saving under :data:`DONATE_MIN_SHARE` of ``reference`` (the run's peak) is left out.

    Example:
        >>> from jaxdbg.memory.result import Held, ProgramMemory
        >>> metrics = ProgramMemory("update_metrics", None, 0, 0, "", 8, 8, 0, 0, 0, 16,
        ...                         held=(Held("metrics", 0, 8, 2, threaded=True),))
        >>> donation_hints([metrics], reference=2**30), len(donation_hints([metrics], reference=16))
        ([], 1)
    """
    found = []
    for program in programs:
        threaded = [h for h in program.held if h.threaded]
        saves = sum(h.bytes for h in threaded)
        if not threaded or saves < DONATE_MIN_SHARE * reference:
            continue
        how = donation_option(program.jit, [h.argnum for h in threaded if h.argnum is not None],
                              program.passed_again)
        names = ", ".join(h.argument for h in threaded)
        found.append(Hint("donate", f"{program.name}: donating {names} would save up to {format_bytes(saves)} per "
                          "call: the loop passes its outputs back in that place, so XLA can write them over the "
                          f"arguments (less any copy it must keep); {how}", saves, program.name, program.source))
    return found


def remat_hints(programs: Sequence[ProgramMemory], backend: str = "") -> list[Hint]:
    """Forward activations held at the peak of a gradient program: checkpointing recomputes them instead.

    The saving is an upper bound: it is realised where the compiler schedules the recomputation late, next to
    its use in the backward pass. XLA:GPU and XLA:TPU schedule for memory; XLA:CPU does not (measured: a
    12-layer tanh MLP kept 52 MiB of temporaries with or without ``jax.checkpoint`` on groups of layers)."""
    found = []
    caveat = ("; XLA:CPU does not schedule for memory, so measure the gain on the GPU/TPU" if backend == "cpu"
              else "; rerun jaxdbg memory to measure it")
    for program in programs:
        kept = program.forward_kept_bytes
        peak = program.schedule_peak_bytes or program.peak_bytes
        if kept <= 0 or kept < REMAT_MIN_SHARE * peak:
            continue
        forward = [b for b in program.largest if b.pass_ == "forward" and b.kind == "temp"]
        largest = max((b.bytes for b in forward), default=0)
        lines = _lines(forward)
        saves = max(kept - largest, 0)
        kept_words = (f"{program.name} keeps {format_bytes(kept)} of forward-pass activations{lines} alive for the "
                      f"backward pass ({kept / max(peak, 1):.0%} of its peak)")
        if program.checkpointed:  # advising the jax.checkpoint it already has would be no advice at all
            advice = ("although it already uses jax.checkpoint: what stays is what its policy saves and the inputs "
                      "of every checkpointed block (in a scan: the carry of each layer); a policy that saves less "
                      "(jax.checkpoint_policies.nothing_saveable) or checkpointing groups of layers (a scan over "
                      "groups) keeps less")
            stacked = [b for b in forward if b.stacked or b.op == "dynamic_update_slice"]
            if stacked:  # a loop writing one slice per iteration: a scan's ys, or the residuals it saves
                advice += (f"; {len(stacked)} of them{_lines(stacked)} are stacked one slice per loop iteration: a "
                           "scan's outputs (`return carry, y` keeps every step's y) or the residuals it saves; where "
                           "only a sum of the ys is used (a loss over every step), accumulate it in the carry instead")
        else:
            advice = ("jax.checkpoint around groups of layers (e.g. "
                      "policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable) recomputes them in the "
                      "backward pass instead")
        found.append(Hint(
            "remat", f"{kept_words}: {advice}, at most {format_bytes(saves)} to gain{caveat}", saves or None,
            program.name, forward[0].source if forward else program.source))
    return found


def _lines(buffers: Sequence[Buffer], before: str = " (made at ", after: str = ")") -> str:
    """Where the buffers were made, the first three user lines: `` (made at train.py:11)``, or ''."""
    places = []
    for buffer in buffers:
        if buffer.source is not None:
            where = f"{relative_or_absolute(buffer.source.file)}:{buffer.source.line}"
            if where not in places:
                places.append(where)
    return f"{before}{', '.join(places[:3])}{after}" if places else ""


def tightening_hints(program: ProgramMemory, devices: int) -> list[Hint]:
    """For a program that does not fit: a smaller dtype for its largest buffer, sharding its largest argument."""
    found = []
    narrowest = _narrowable(program.largest)
    if narrowest:
        dtype = narrowest[0].shape.split("[", 1)[0]
        narrow, factor = _NARROW[dtype]
        size = sum(b.bytes for b in narrowest)
        saves = size - size // factor
        first = narrowest[0]
        makers = ", ".join(sorted({b.argument or b.output or b.op or b.kind for b in narrowest}))
        what = (first.argument or first.output or f"the {first.op or 'value'} result") if len(narrowest) == 1 else (
            f"{len(narrowest)} {first.shape} buffers ({makers})")
        shape = f"{first.shape}, " if len(narrowest) == 1 else ""
        them = "it" if len(narrowest) == 1 else "them"
        found.append(Hint("dtype", f"{program.name}: at its peak it holds {what} ({shape}{format_bytes(size)}"
                          f"{_lines(narrowest, ', made at ', '')}); holding {them} in {narrow} saves "
                          f"{format_bytes(saves)}", saves, program.name, first.source))
    arguments = [b for b in program.largest if b.kind == "argument"]
    biggest = max(arguments, key=lambda b: b.bytes, default=None)
    if biggest is not None and devices > 1 and program.devices == 1:
        saves = biggest.bytes - biggest.bytes // devices
        found.append(Hint("shard", f"{program.name} runs on one device: sharding {biggest.argument or biggest.name} "
                          f"({biggest.shape}, {format_bytes(biggest.bytes)}) over the {devices} devices (e.g. "
                          "jax.device_put(x, NamedSharding(mesh, P('data')))) holds "
                          f"{format_bytes(biggest.bytes // devices)} on each, saving {format_bytes(saves)} per device",
                          saves, program.name, program.source))
    chunk = vmap_chunk_hint(program)
    if chunk is not None:
        found.append(chunk)
    if program.over_bytes:
        found.append(Hint("fit", f"{program.name} needs {format_bytes(program.needs_bytes)} "
                          f"({format_bytes(program.live_before_bytes)} live when it was called, "
                          f"{format_bytes(program.temp_bytes)} of temporaries): cut "
                          f"{format_bytes(program.over_bytes)}, e.g. a smaller batch", program.over_bytes,
                          program.name, program.source))
    return found


def vmap_chunk_hint(program: ProgramMemory) -> Hint | None:
    """For a program over its budget whose temporaries at the peak are mostly made under ``jax.vmap`` (one value
    per example: per-example gradients, activations): map over the batch in chunks, which holds a chunk's share.

    Example:
        >>> grads = Buffer("t", "temp", 2**30, "f32[1024,512,512]", "transpose",
        ...                "jit(f)/vmap(transpose(jvp()))/transpose")
        >>> f = ProgramMemory("f", None, 0, 0, "", 2**22, 2**12, 0, 2**30, 0, 2**30 + 2**22 + 2**12, None, None, 1,
        ...                   (grads,), over_bytes=600 * 2**20)
        >>> hint = vmap_chunk_hint(f)
        >>> hint.text[:60], "batch_size=256" in hint.text, hint.saves_bytes == 3 * 2**28  # 1/4 of them: 600 MiB over
        ('f: 1.0 GiB of its peak is per-example values made under jax.', True, True)
    """
    if not program.over_bytes:
        return None
    mapped = [b for b in program.largest if b.kind == "temp" and "vmap(" in b.op_name]
    size = sum(b.bytes for b in mapped)
    if size < program.over_bytes:
        return None
    dims = mapped[0].shape.split("[", 1)[-1].rstrip("]").split(",")
    batch = int(dims[0]) if dims[0].strip().isdigit() else 0
    parts = 2
    while size - size // parts < program.over_bytes and parts < max(batch, 2):
        parts *= 2
    chunk = f"batch_size={batch // parts}" if batch >= parts else f"batch_size=B/{parts}"
    return Hint("fit", f"{program.name}: {format_bytes(size)} of its peak is per-example values made under "
                f"jax.vmap (the largest {mapped[0].shape}{_lines(mapped[:1], ', made at ', '')}): map over the "
                "batch in chunks, "
                f"jax.lax.map(per_example_fn, xs, {chunk}) (vmap inside each chunk), to hold 1/{parts} of them, "
                f"saving {format_bytes(size - size // parts)}", size - size // parts, program.name,
                mapped[0].source)


def upcast_hints(programs: Sequence[ProgramMemory]) -> list[Hint]:
    """For a program whose largest buffers include float32 arrays of the very shape of its bfloat16/float16
    arguments (a cast of the weights, ``w.astype(jnp.float32)``: a float32 copy of each, and float32 gradients):
    keep them in half precision and ask for float32 results instead; saves half of those bytes.

    Example:
        >>> from jaxdbg.memory.result import Buffer, ProgramMemory
        >>> bufs = (Buffer("a", "argument", 2**23, "bf16[512,8192]", argument="params['unembed']"),
        ...         Buffer("t", "temp", 2**24, "f32[512,8192]", op="transpose"))
        >>> step = ProgramMemory("train_step", None, 0, 0, "", 2**23, 0, 0, 2**24, 0, 2**25, largest=bufs)
        >>> upcast_hints([step])[0].text.split(" (")[0]
        "train_step: at its peak it holds float32 arrays of the shape of its bfloat16 argument params['unembed']"
    """
    found = []
    for program in programs:
        halves: dict[str, list[Buffer]] = {}
        for buffer in program.largest:
            dtype, _, dims = buffer.shape.partition("[")
            if buffer.kind == "argument" and dtype in _HALF:
                halves.setdefault(dims, []).append(buffer)
        copies = [b for b in program.largest if b.kind != "argument" and b.shape.startswith("f32[")
                  and b.shape[4:] in halves]
        size = sum(b.bytes for b in copies)
        if not copies or size < UPCAST_MIN_SHARE * program.peak_bytes:
            continue
        originals = [a for b in copies for a in halves[b.shape[4:]]]
        names = list(dict.fromkeys(a.argument or a.name for a in originals))
        dtype = _HALF[originals[0].shape.split("[", 1)[0]]
        plural = "s" if len(names) > 1 else ""
        shapes = ", ".join(dict.fromkeys(b.shape for b in copies))
        cast = next((b for b in copies if "convert" in (b.op or b.name)), copies[0])
        found.append(Hint("dtype", f"{program.name}: at its peak it holds float32 arrays of the shape of its {dtype} "
                          f"argument{plural} {', '.join(names[:3])} ({shapes}, {format_bytes(size)}"
                          f"{_lines(copies, ', made at ', '')}): a cast of the weights (w.astype(jnp.float32)) keeps "
                          f"a float32 copy of each and makes their gradients float32; keep them in {dtype} and ask for "
                          "float32 results where precision matters (jnp.dot(x, w, preferred_element_type="
                          f"jnp.float32)), saving up to {format_bytes(size // 2)}", size // 2, program.name,
                          cast.source))
    return found


def _narrowable(buffers: Sequence[Buffer]) -> list[Buffer]:
    """The buffers of one shape and dtype that together hold the most bytes, among the dtypes a smaller one can
    replace (f64, f32, c128)."""
    by_shape: dict[str, list[Buffer]] = {}
    for buffer in buffers:
        if buffer.shape.split("[", 1)[0] in _NARROW:
            by_shape.setdefault(buffer.shape, []).append(buffer)
    return max(by_shape.values(), key=lambda group: sum(b.bytes for b in group), default=[])


def leak_hints(leaks: Sequence[Leak]) -> list[Hint]:
    found = []
    for leak in leaks:
        where = (f" at {relative_or_absolute(leak.kept_at.file)}:{leak.kept_at.line}" if leak.kept_at else "")
        keeper = leak.kept_by or "something"
        found.append(Hint("leak", f"{keeper}{where} keeps the outputs of every {leak.producer} call "
                          f"({format_bytes(leak.per_call_bytes)} each, {format_bytes(leak.bytes)} now): keep a host "
                          "copy (float(x), np.asarray(x)) or only the latest, or move it out of the loop",
                          leak.bytes, leak.producer, leak.kept_at or leak.source))
    return found
