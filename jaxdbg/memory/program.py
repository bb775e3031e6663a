"""One compiled program's memory: ``Compiled.memory_analysis()``, XLA's buffer assignment and live ranges
(:mod:`jaxdbg.memory.buffers`), and the arguments a call holds although an output could have reused them.

The peak is what a call holds at once: its arguments, its outputs (less those aliased to donated arguments),
its temporaries and its code. XLA:CPU and XLA:GPU allocate the temporaries as one block for the whole call, so
this is what the runtime asks for; ``memory_analysis().peak_memory_in_bytes`` is kept as reported, but on CPU
it leaves the temporaries out (a 512 MiB sort buffer was missing from it). XLA's sequential peak from the live
ranges (``schedule_peak_bytes``) is the sum of the values live at the busiest point of the schedule; the
buffers listed are those values, largest first, each with its operation and user line.

Example:
    >>> import jax, jax.numpy as jnp, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> step = jax.jit(lambda x: jnp.sort(x * 2.0, axis=1),
    ...                compiler_options={"xla_dump_to": folder, "xla_dump_hlo_as_text": True})
    >>> compiled = step.lower(jnp.ones((256, 256))).compile()
    >>> program = analyse(compiled, ProgramInfo("sort_rows", None, 0, 0, "f32[256,256]"), folder)
    >>> program.argument_bytes, program.output_bytes, program.peak_bytes >= 2 * 256 * 256 * 4
    (262144, 262144, True)
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from jaxdbg._choices import choice
from jaxdbg._source import SourceLocation
from jaxdbg.memory.buffers import LISTED, Assignment, Value, find_dump, value_key
from jaxdbg.memory.loops import Loops
from jaxdbg.memory.result import Buffer, Held, JitKind, ProgramMemory
from jaxdbg.memory.units import format_bytes
from jaxdbg.profile.hlo import (
    HloModule,
    Instruction,
    entry_parameters,
    instruction_source,
    module_name,
    op_primitives,
    parameter_number,
    parse_hlo,
)

TOP_BUFFERS = 10


@dataclass(frozen=True)
class ProgramInfo:
    """What the caller knows of the compile: the function, the call that compiled it, its arguments."""

    name: str
    source: SourceLocation | None
    call_index: int
    compile_index: int
    signature: str
    parameter_names: tuple[str, ...] = ()
    static_argnums: tuple[int, ...] = ()
    positional: int = 0  # positional arguments of the call (static ones included)
    threaded: frozenset[int] = frozenset()  # argnums the run fed with this function's previous outputs
    jit: JitKind = "jax.jit"  # how the user jitted it (frameworks.jit_kind)
    # (jax's name, the user's) of arguments whose program names are a wrapper's: a pmap's flat_args[i],
    # filter_jit's dynamic_nodonate['rest'][13]
    argument_names: tuple[tuple[str, str], ...] = ()
    recompiled_because: str | None = None  # a recompile: what changed since an earlier compile
    called_as: str | None = None  # a multihost helper's jit: the call the user made (jaxdbg.multihost_calls)


def analyse(compiled: Any, info: ProgramInfo, dump_folder: str | None, after_module: int = -1,
            top: int = TOP_BUFFERS) -> ProgramMemory:
    """The memory of one compiled program; the dump folder's newest module of its name is its assignment."""
    from jaxdbg import _compat  # imports jax: the parent that assembles the report (this package) never does

    sizes = _compat.compiled_memory(compiled, with_peak=True) or {}
    arguments, outputs = sizes.get("argument_bytes", 0), sizes.get("output_bytes", 0)
    alias, temp, code = sizes.get("alias_bytes", 0), sizes.get("temp_bytes", 0), sizes.get("code_bytes", 0)
    text = compiled.as_text()
    found = find_dump(dump_folder, module_name(text), after_module) if dump_folder else None
    assignment, note = None, None
    if found is not None:
        try:
            assignment = found[1].read()
        except OSError as err:
            note = f"the buffer assignment could not be read: {err}"
    elif dump_folder:
        note = "XLA wrote no buffer assignment for this program; its buffers are not listed"
    module = parse_hlo(text) if assignment else None  # the buffers' ops and lines (a large module: 0.1-1 s)
    if module is not None and info.argument_names:
        name_arguments(module, dict(info.argument_names))
    loops = Loops(module) if module is not None else None
    returned = Outputs(module, assignment, output_names(compiled)) if assignment and module else None
    largest = (tuple(_buffer(v, module, assignment, loops, returned) for v in assignment.largest(top))
               if assignment and module and loops and returned else ())
    held, refused = donations(compiled, info)
    peak = arguments + outputs - alias + temp + code
    note = "; ".join(n for n in (note, refused_note(refused, peak)) if n) or None
    return ProgramMemory(
        name=info.name, source=info.source, call_index=info.call_index, compile_index=info.compile_index,
        signature=info.signature, recompiled_because=info.recompiled_because, argument_bytes=arguments,
        output_bytes=outputs, alias_bytes=alias, temp_bytes=temp, code_bytes=code, peak_bytes=peak,
        schedule_peak_bytes=assignment.peak_bytes if assignment else None, xla_peak_bytes=sizes.get("peak_bytes"),
        devices=_device_count(compiled), largest=largest, held=held,
        forward_kept_bytes=forward_kept(assignment, module, loops) if assignment and module and loops else 0,
        checkpointed=_CHECKPOINTED.search(text) is not None,
        dump=found[1].assignment if found else None, note=note, jit=info.jit, called_as=info.called_as,
    )


def name_arguments(module: HloModule, names: Mapping[str, str]) -> None:
    """Name the entry parameters that jax named after a wrapper's arguments (pmap's own jit: ``flat_args[1]``;
    filter_jit's inner function: ``dynamic_nodonate['rest'][13]``) by the user's (``names``: jax's -> user's),
    as a plain jitted function's parameters are named by jax itself.

    An instruction XLA made of a parameter alone (a bitcast or copy of it, which keeps its metadata) is renamed
    with it.

    Example:
        >>> from jaxdbg.profile.hlo import Instruction
        >>> module = HloModule("pmap_f", {"p.1": Instruction("p.1", "parameter", "main", op_name="flat_args[1]"),
        ...                               "b.2": Instruction("b.2", "bitcast", "main", op_name="flat_args[1]")},
        ...                    arguments={"p.1": "flat_args[1]"})
        >>> name_arguments(module, {"flat_args[0]": "xs", "flat_args[1]": "params['w']"})
        >>> module.arguments, module.instructions["p.1"].op_name, module.instructions["b.2"].op_name
        ({'p.1': "params['w']"}, "params['w']", "params['w']")
    """
    renamed = {}
    for parameter, written in module.arguments.items():
        name = names.get(written)
        if name is not None:
            module.arguments[parameter] = renamed[written] = name
    if not renamed:
        return
    for key, inst in module.instructions.items():
        if inst.op_name in renamed:
            module.instructions[key] = dataclasses.replace(inst, op_name=renamed[inst.op_name])
    for key, op in module.ops.items():
        if op.op_name in renamed:
            module.ops[key] = dataclasses.replace(op, op_name=renamed[op.op_name])


def dump_number(dump_folder: str | None, compiled: Any, after: int = -1) -> int:
    """The dump number of ``compiled``'s module (to look only at newer ones next time), or ``after``."""
    if not dump_folder:
        return after
    found = find_dump(dump_folder, module_name(compiled.as_text()), after)
    return found[0] if found else after


def _buffer(value: Value, module: HloModule, assignment: Assignment, loops: Loops, outputs: Outputs) -> Buffer:
    placed = loops.locate(value.name, value.index) if value.kind != "argument" else None
    output = outputs.of(value) if value.kind == "output" else None
    if placed is None and output is not None:
        # the output's block holds another value at the peak (a gradient the update then overwrites in place):
        # the block is the output, named by what the function returns in it
        value = output[0]
        placed = loops.locate(value.name, value.index)
    written = loops.producer(*placed) if placed is not None else None
    stacked = loops.element_role(*placed) if placed is not None and written is not None else None
    carry = loops.carried(*placed) if placed is not None and written is None else None
    # a loop's state is what the body writes into it: for a stacked buffer, what it stacks
    made_by = loops.written(written).name if written is not None else carry.name if carry else value.name
    inst = module.instructions.get(made_by)
    op = module.ops.get(made_by)
    op_name = (op.op_name if op else "") or (inst.op_name if inst else "")
    source = op.source if op else (instruction_source(module, inst) if inst else None)
    argument = _argument_name(value, module, assignment) if value.kind == "argument" else None
    # a value made of an argument alone (a bitcast or copy of it) carries the argument's name, not an operation's
    made = value.kind != "argument" and op_name not in module.arguments.values()
    primitive = (":".join(op_primitives(op_name)) or None) if made else None
    if stacked and placed is not None and primitive == "dynamic_update_slice":
        # the loop stacks a value carried in, not one it computes: the write's own line may be another function's
        # (jax lowers dynamic_update_index_in_dim once and reuses it), so the loop's line says where it is
        primitive, source = None, _loop_source(module, placed[0]) or source
    kind = choice(value.kind, LISTED)
    assert kind is not None, value.kind  # Assignment.largest lists no other
    return Buffer(value_key(value.name, value.index), kind, value.size, value.shape, primitive, op_name, source,
                  argument, pass_of(op_name), stacked, output[1] if output else None)


def _loop_source(module: HloModule, loop: Instruction) -> SourceLocation | None:
    op = module.ops.get(loop.name)
    return op.source if op and op.source else instruction_source(module, loop)


def output_names(compiled: Any) -> list[str]:
    """The function's outputs as the user reads them, one per leaf in order: ``output['w']``, ``output[1]``,
    ``output`` for a single array; empty where the executable cannot say."""
    import jax

    try:
        leaves = jax.tree_util.tree_flatten_with_path(compiled.out_info)[0]
    except Exception:  # noqa: BLE001 - an old jax or an odd executable: outputs unnamed
        return []
    return ["output" + jax.tree_util.keystr(path) for path, _ in leaves]


class Outputs:
    """The program's outputs by the block each ends in: the entry root's elements (through the loop results and
    tuples they take), named as the function returns them.

    Example:
        >>> import jax, jax.numpy as jnp, tempfile
        >>> from jaxdbg.memory.buffers import find_dump
        >>> folder = tempfile.mkdtemp()
        >>> step = jax.jit(lambda p: {"w": p["w"] * 2.0}, compiler_options={"xla_dump_to": folder})
        >>> compiled = step.lower({"w": jnp.ones((64, 64))}).compile()
        >>> assignment = find_dump(folder, module_name(compiled.as_text()))[1].read()
        >>> outputs = Outputs(parse_hlo(compiled.as_text()), assignment, output_names(compiled))
        >>> [outputs.of(v)[1] for v in assignment.values.values() if v.kind == "output" and v.shape == "f32[64,64]"]
        ["output['w']"]
    """

    def __init__(self, module: HloModule, assignment: Assignment, names: list[str]):
        entry = module.computations.get(module.entry) or []
        root = module.instructions.get(entry[-1]) if entry else None
        elements = list(root.operands) if root is not None and root.opcode == "tuple" else [root.name] if root else []
        skipped = len(elements) - len(names)  # jax's output tokens (ordered effects) come first
        self._blocks: dict[int, list[tuple[int, int, Value, str]]] = {}
        for i, element in enumerate(elements):
            value = assignment.values.get(_value_key_of(module, element))
            if value is None or value.kind != "output":
                continue
            name = names[i - skipped] if names and i >= skipped else f"output {i}"
            self._blocks.setdefault(value.allocation, []).append((value.offset, value.offset + value.size, value,
                                                                  name))

    def of(self, value: Value) -> tuple[Value, str] | None:
        """The output whose block holds ``value`` (itself, or a value the block held before it), and its name."""
        for start, end, output, name in self._blocks.get(value.allocation, ()):
            if start < value.offset + value.size and value.offset < end:
                return output, name
        return None


def _value_key_of(module: HloModule, name: str) -> str:
    """The HLO value an instruction returns, through get-tuple-element (which makes none of its own): the
    element of a loop's result is ``while.3{1}``."""
    index: list[str] = []
    inst = module.instructions.get(name)
    while inst is not None and inst.opcode == "get-tuple-element" and inst.operands:
        match = _TUPLE_INDEX.search(inst.text)
        if match is None:
            break
        index.insert(0, match.group(1))
        name = inst.operands[0]
        inst = module.instructions.get(name)
    return value_key(name, ",".join(index))


_TUPLE_INDEX = re.compile(r"\bindex=(\d+)")


def _argument_name(value: Value, module: HloModule, assignment: Assignment) -> str | None:
    """The user's argument whose buffer holds ``value``: the entry parameter itself, or the parameter of the
    donated buffer an output was written into in place (its value is then the output's instruction)."""
    named = module.arguments.get(value.name)
    number = assignment.parameter_of(value)
    if named is not None or number is None:
        return named
    return next((module.arguments.get(p.name) for p in entry_parameters(module) if parameter_number(p) == number),
                None)


def pass_of(op_name: str) -> Literal["forward", "backward"] | None:
    """'backward' for an operation of a transposed (cotangent) computation, 'forward' for one of the primal
    computation under differentiation, None outside any gradient.

    Example:
        >>> pass_of("jit(step)/jvp()/tanh"), pass_of("jit(step)/transpose(jvp())/dot_general"), pass_of("jit(f)/add")
        ('forward', 'backward', None)
    """
    if "transpose(" in op_name:
        return "backward"
    if "jvp(" in op_name:
        return "forward"
    return None


# jax names what jax.checkpoint (remat) wraps ``.../checkpoint/...`` (``remat`` in older versions) in op_name
_CHECKPOINTED = re.compile(r'op_name="[^"]*/(?:checkpoint|remat|rematted_computation)[/("]')


def forward_kept(assignment: Assignment, module: HloModule, loops: Loops) -> int:
    """Bytes of forward-pass values live at the peak of a program that also runs the backward pass: the
    activations kept for it (what rematerialisation trades for recomputation), a scan's saved residuals among them."""
    if not any("transpose(" in inst.op_name for inst in module.instructions.values()):
        return 0
    total = 0
    for name in assignment.peak_values:
        value = assignment.values.get(name)
        if value is None or value.kind != "temp":
            continue
        placed = loops.locate(value.name, value.index)
        op = module.ops.get(name)
        if (placed is not None and loops.element_role(*placed) == "residuals") or pass_of(
                op.op_name if op else "") == "forward":
            total += value.size
    return total


def donations(compiled: Any, info: ProgramInfo) -> tuple[tuple[Held, ...], tuple[Held, ...]]:
    """``(held, refused)``: the arguments not donated that an output of the same shape and dtype could have reused
    (first come, after the donated ones took theirs), and the donated ones that no output has the shape and dtype
    of (jax's "Some donated buffers were not usable": XLA cannot write an output over them, so their donation
    saves nothing); each grouped by top-level argument, with their per-device bytes."""
    import jax

    try:
        args_info, out_info, shardings = compiled.args_info, compiled.out_info, compiled.input_shardings
    except Exception:  # noqa: BLE001 - an old jax or an odd executable: nothing to say about donation
        return (), ()
    free = Counter((tuple(o.shape), str(o.dtype)) for o in jax.tree_util.tree_leaves(out_info)
                   if hasattr(o, "shape"))
    flat = jax.tree_util.tree_flatten_with_path(args_info)[0]
    flat_shardings = jax.tree_util.tree_leaves(shardings)
    rows: list[tuple[Any, Any, Any]] = []
    refused: dict[Any, list[int]] = {}
    for i, (path, arg) in enumerate(flat):
        key = (tuple(arg.shape), str(arg.dtype))
        sharding = flat_shardings[i] if len(flat_shardings) == len(flat) else None
        if not arg.donated:
            rows.append((path, arg, sharding))
        elif free[key] > 0:
            free[key] -= 1
        else:
            _add(refused, path, arg, sharding, info)
    held: dict[Any, list[int]] = {}
    for path, arg, sharding in rows:
        key = (tuple(arg.shape), str(arg.dtype))
        if free[key] <= 0:
            continue
        free[key] -= 1
        _add(held, path, arg, sharding, info)
    return _groups(held, info), _groups(refused, info)


def _groups(groups: dict[Any, list[int]], info: ProgramInfo) -> tuple[Held, ...]:
    return tuple(_held(place, size, count, info) for place, (size, count) in groups.items() if size > 0)


def _add(groups: dict[Any, list[int]], path: tuple, arg: Any, sharding: Any, info: ProgramInfo) -> None:
    """Count one argument leaf (its per-device bytes) in its top-level argument's group."""
    entry = groups.setdefault(_user_place(path, info) or _top_level(path), [0, 0])
    entry[0] += _device_bytes(arg, sharding)
    entry[1] += 1


def refused_note(refused: tuple[Held, ...], peak_bytes: int) -> str | None:
    """One sentence on donations that save nothing, where they weigh (a hundredth of the call's peak or more).

    Example:
        >>> refused_note((Held("params", 0, 16 * 2**20, 2),), 32 * 2**20)[:60]
        'donated params (16.0 MiB in 2 array(s)) but no output has th'
    """
    size = sum(h.bytes for h in refused)
    if not refused or size < 0.01 * peak_bytes:
        return None
    names = ", ".join(h.argument for h in refused)
    return (f"donated {names} ({format_bytes(size)} in {sum(h.leaves for h in refused)} array(s)) but no output has "
            "their shape and dtype, so XLA cannot write an output over them and the donation saves nothing (jax: "
            "'Some donated buffers were not usable'): return the updated values in the arguments' shapes and dtypes "
            "(cast after the call), or leave them out of donate_argnums")


def _user_place(path: tuple, info: ProgramInfo) -> tuple[str, str] | None:
    """``("user", argument)`` for a leaf of a wrapper's argument that the user passed as ``argument`` (filter_jit
    packs every array into its ``dynamic_nodonate``: ``dynamic_nodonate['rest'][0]`` is the user's ``x``), else
    None."""
    import jax

    kind, which = _top_level(path)
    if kind != "pos" or not info.argument_names:
        return None
    argnum = _argnum(int(which), info.static_argnums, info.positional)
    if argnum >= len(info.parameter_names):
        return None
    parameter = info.parameter_names[argnum]
    user = dict(info.argument_names).get(parameter + jax.tree_util.keystr(path[2:]))
    top = re.split(r"[.\[]", user, maxsplit=1)[0] if user else parameter
    return ("user", top) if top != parameter else None  # nnx.jit's own parameters are the user's: by position


def _top_level(path: tuple) -> Any:
    """(positional index) or (keyword name) of a leaf of ``(args, kwargs)``."""
    first, second = path[0], path[1] if len(path) > 1 else None
    kwargs = getattr(first, "idx", 0) == 1
    return ("kw", getattr(second, "key", "?")) if kwargs else ("pos", getattr(second, "idx", 0))


def _held(place: Any, size: int, count: int, info: ProgramInfo) -> Held:
    kind, which = place
    if kind in ("kw", "user"):
        return Held(str(which), None, size, count, False)
    argnum = _argnum(int(which), info.static_argnums, info.positional)
    names = info.parameter_names
    name = names[argnum] if argnum < len(names) else f"argument {argnum}"
    return Held(name, argnum, size, count, argnum in info.threaded)


def _argnum(dynamic_index: int, static: tuple[int, ...], positional: int) -> int:
    """The call's position of the ``dynamic_index``-th non-static positional argument.

        >>> _argnum(1, (1,), 3)
        2
    """
    static_set = {s % positional if positional else s for s in static}
    seen = -1
    for position in range(max(positional, dynamic_index + len(static_set) + 1)):
        if position in static_set:
            continue
        seen += 1
        if seen == dynamic_index:
            return position
    return dynamic_index


def _device_bytes(arg: Any, sharding: Any) -> int:
    import numpy as np

    shape = tuple(arg.shape)
    if sharding is not None:
        with contextlib.suppress(Exception):  # a sharding that cannot say: count the whole array
            shape = tuple(sharding.shard_shape(shape))
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(arg.dtype).itemsize


def _device_count(compiled: Any) -> int:
    try:
        shardings = compiled.input_shardings[0] or compiled.output_shardings
        import jax

        for sharding in jax.tree_util.tree_leaves(shardings):
            return len(sharding.device_set)
    except Exception:  # noqa: BLE001 - the count is informative only
        pass
    return 1
