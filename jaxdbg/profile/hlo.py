"""Read optimised HLO text (``Compiled.as_text()``): its instructions, what each costs, and its source line.

XLA writes the Python stack of each operation into the module as tables (``FileNames``, ``FunctionNames``,
``FileLocations``, ``StackFrames``) and tags instructions with ``metadata={op_name=... stack_frame_id=N}``
(older versions write ``source_file=... source_line=...`` instead); both forms are read. An op's source is
the innermost frame of its stack that lies in a user file: an op made inside Flax or optax gets the user's
line that called into the library. A fusion takes its category from the heaviest instruction inside it (a
dot over a reduce over elementwise work) and its source from the heaviest fused instruction that has one:
XLA often leaves the fusion itself without stack metadata.

Example:
    >>> import jax, jax.numpy as jnp
    >>> def step(a, b):
    ...     return jnp.tanh(a @ b)
    >>> module = parse_hlo(jax.jit(step).lower(jnp.ones((8, 8)), jnp.ones((8, 8))).compile().as_text())
    >>> module.name, "matmul" in {op.category for op in module.ops.values()}
    ('jit_step', True)
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from jaxdbg._source import SourceLocation, is_user_path

_MODULE = re.compile(r"^HloModule\s+([^\s,]+)")
_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_OPCODE = re.compile(r"^\S.*?\s([a-z][\w\-]*)\(")
_CALLS = re.compile(r"\b(?:calls|to_apply|body|condition|branch_computations)=\{?%?([\w.\-]+)")
_KIND = re.compile(r"\bkind=(k\w+)")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_FRAME_ID = re.compile(r"stack_frame_id=(\d+)")
_SOURCE_FILE = re.compile(r'source_file="([^"]*)"')
_SOURCE_LINE = re.compile(r"source_line=(\d+)")
_TABLE_ROW = re.compile(r"^(\d+)\s+(.*)$")
_FIELDS = re.compile(r"(\w+)=(-?\d+)")

# The heavier an opcode, the more it explains a fusion's time (and names its category).
_CATEGORY_RANK = [
    ("convolution", {"convolution"}),
    ("matmul", {"dot", "ragged-dot"}),
    ("custom-call", {"custom-call"}),
    ("collective", {"all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
                    "all-reduce-start", "all-gather-start", "collective-permute-start", "send", "recv"}),
    ("sort", {"sort"}),
    ("gather/scatter", {"gather", "scatter"}),
    ("reduction", {"reduce", "reduce-window", "select-and-scatter"}),
    ("control flow", {"while", "conditional", "call"}),
    ("rng", {"rng", "rng-bit-generator", "rng-get-and-update-state"}),
    ("transcendental", {"exponential", "log", "tanh", "logistic", "sine", "cosine", "power", "sqrt", "rsqrt",
                        "erf", "exponential-minus-one", "log-plus-one", "atan2", "cbrt", "tan"}),
    ("data movement", {"copy", "transpose", "broadcast", "reshape", "slice", "concatenate", "pad",
                       "dynamic-slice", "dynamic-update-slice", "bitcast", "reverse", "iota", "copy-start",
                       "copy-done", "bitcast-convert", "tuple", "get-tuple-element"}),
]
_NOT_WORK = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast"}


@dataclass(frozen=True)
class Instruction:
    name: str
    opcode: str
    computation: str
    calls: tuple[str, ...] = ()
    fusion_kind: str = ""
    op_name: str = ""
    frame_id: int | None = None
    source_file: str | None = None
    source_line: int | None = None
    text: str = ""
    operands: tuple[str, ...] = ()
    sharding: str = ""  # an entry parameter's HLO sharding, e.g. "{devices=[2,2]<=[4]}"
    groups: str = ""  # a collective's device groups: replica_groups or source_target_pairs, as written


@dataclass(frozen=True)
class HloOp:
    """What the profile shows for one executed instruction."""

    name: str
    opcode: str
    category: str
    source: SourceLocation | None
    op_name: str
    expression: str


@dataclass
class HloModule:
    name: str
    instructions: dict[str, Instruction] = field(default_factory=dict)
    computations: dict[str, list[str]] = field(default_factory=dict)
    frames: dict[int, tuple[int, int]] = field(default_factory=dict)  # frame id -> (location id, parent id)
    locations: dict[int, SourceLocation] = field(default_factory=dict)
    ops: dict[str, HloOp] = field(default_factory=dict)
    arguments: dict[str, str] = field(default_factory=dict)  # entry parameter -> the user's path (params['w'])
    entry: str = ""
    # Set from the compile's shardings.json (jaxdbg.profile.collectives): entry parameter -> its PartitionSpec
    # as the user wrote it, and the mesh's (axis name, size) pairs in order.
    specs: dict[str, str] = field(default_factory=dict)
    mesh: tuple[tuple[str, int], ...] = ()

    def readable(self, expression: str) -> str:
        """``expression`` with the entry parameters jax named after mangled paths (``%params__w1__.1``) written
        as the user's arguments (``params['w1']``), which their metadata keeps."""
        return re.sub(r"%([\w.\-]+)", lambda m: self.arguments.get(m.group(1), m.group(0)), expression)

    def op(self, name: str) -> HloOp | None:
        """The op behind a profiled name (thunk names may drop a '%' or carry a suffix)."""
        return self.ops.get(name) or self.ops.get(name.lstrip("%"))


def parse_hlo(text: str) -> HloModule:
    """Parse optimised HLO text into instructions, stack frames and per-op category and source."""
    lines = text.splitlines()
    match = _MODULE.match(lines[0]) if lines else None
    module = HloModule(match.group(1) if match else "")
    _parse_tables(lines, module)
    current, entry = "", ""
    for line in lines:
        header = _COMPUTATION.match(line)
        if header:
            current = header.group(2)
            entry = current if header.group(1) else entry
            module.entry = entry
            module.computations[current] = []
            continue
        if not current or line.strip() == "}":
            continue
        inst = _parse_instruction(line, current)
        if inst is not None:
            module.instructions[inst.name] = inst
            module.computations[current].append(inst.name)
            if current == entry and inst.opcode == "parameter" and inst.op_name:
                module.arguments[inst.name] = inst.op_name
    users: dict[str, list[str]] = {}
    for inst in module.instructions.values():
        for operand in inst.operands:
            users.setdefault(operand, []).append(inst.name)
    for inst in module.instructions.values():
        if inst.opcode not in _NOT_WORK:
            op = _describe(module, inst)
            if op.source is None:
                op = dataclasses.replace(op, source=_neighbour_source(module, inst, users))
            module.ops[inst.name] = dataclasses.replace(op, expression=module.readable(op.expression))
    return module


def _neighbour_source(module: HloModule, inst: Instruction, users: dict[str, list[str]]) -> SourceLocation | None:
    """For an instruction XLA left without metadata (e.g. a dot split out of a fusion on CPU): the source of
    the nearest instruction consuming its result, else of the nearest one producing its operands."""
    for follow in (lambda i: users.get(i.name, ()), lambda i: i.operands):
        frontier, seen = [inst], {inst.name}
        for _ in range(3):
            following = []
            for current in frontier:
                for name in follow(current):
                    nxt = module.instructions.get(name)
                    if nxt is None or name in seen:
                        continue
                    seen.add(name)
                    source = _describe(module, nxt).source if nxt.opcode not in _NOT_WORK else None
                    if source is not None:
                        return source
                    following.append(nxt)
            frontier = following
    return None


def _parse_instruction(line: str, computation: str) -> Instruction | None:
    match = _INSTRUCTION.match(line)
    if not match:
        return None
    name, rest = match.group(2), match.group(3)
    opcode = _OPCODE.match(rest)
    if not opcode:
        return None
    frame = _FRAME_ID.search(rest)
    op_name = _OP_NAME.search(rest)  # HLO text escapes quotes: dynamic_nodonate[\'rest\'] is jax's ['rest']
    kind = _KIND.search(rest)
    src_file, src_line = _SOURCE_FILE.search(rest), _SOURCE_LINE.search(rest)
    return Instruction(
        name=name, opcode=opcode.group(1), computation=computation, operands=_operands(rest, opcode.end()),
        calls=tuple(_CALLS.findall(rest)), fusion_kind=kind.group(1) if kind else "",
        op_name=op_name.group(1).replace("\\'", "'") if op_name else "",
        frame_id=int(frame.group(1)) if frame else None,
        source_file=src_file.group(1) if src_file else None,
        source_line=int(src_line.group(1)) if src_line else None,
        text=rest.split(", metadata=")[0][:200], sharding=_braced(rest, "sharding="),
        groups=_braced(rest, "replica_groups=") or _braced(rest, "source_target_pairs="),
    )


def _braced(rest: str, key: str) -> str:
    """The value after ``key`` in an instruction's attributes: a ``{...}`` group (nested braces kept whole) or,
    for replica groups in iota form, ``[2,2]<=[4]``.

        >>> _braced("all-reduce(%a), replica_groups={{0,1},{2,3}}, to_apply=%add", "replica_groups=")
        '{{0,1},{2,3}}'
    """
    start = rest.find(key)
    if start < 0:
        return ""
    start += len(key)
    if not rest.startswith("{", start):
        return _iota_value(rest[start:])
    depth = 0
    for end in range(start, len(rest)):
        depth += {"{": 1, "}": -1}.get(rest[end], 0)
        if depth == 0:
            return rest[start:end + 1]
    return ""


def _iota_value(text: str) -> str:
    """``[2,2]<=[4]`` (or with ``T(1,0)``), or XLA's mesh form ``mesh['a'=2,'b'=2] {'b'}``, at the start of
    ``text``, up to the attribute that follows."""
    match = re.match(r"\[[\d,]*\]<=\[[\d,]*\](?:T\([\d,]*\))?|mesh\[[^\]]*\][^{]*\{[^}]*\}", text)
    return match.group(0) if match else ""


def _operands(rest: str, start: int) -> tuple[str, ...]:
    """Names inside the opcode's parentheses (``dot(%a, %b)`` -> a, b), attributes after it left out."""
    depth, end = 1, start
    while end < len(rest) and depth:
        depth += {"(": 1, ")": -1}.get(rest[end], 0)
        end += 1
    return tuple(re.findall(r"%([\w.\-]+)", rest[start:end]))


def _parse_tables(lines: list[str], module: HloModule) -> None:
    """The stack-frame tables XLA prints between the module header and the first computation."""
    files: dict[int, str] = {}
    functions: dict[int, str] = {}
    raw_locations: dict[int, dict[str, int]] = {}
    table = None
    for line in lines[1:]:
        if _COMPUTATION.match(line):
            break
        stripped = line.strip()
        if stripped in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            table = stripped
            continue
        row = _TABLE_ROW.match(stripped)
        if not row or table is None:
            continue
        key, value = int(row.group(1)), row.group(2)
        if table == "FileNames":
            files[key] = value.strip('"')
        elif table == "FunctionNames":
            functions[key] = value.strip('"')
        elif table == "FileLocations":
            raw_locations[key] = {k: int(v) for k, v in _FIELDS.findall(value)}
        else:
            fields = {k: int(v) for k, v in _FIELDS.findall(value)}
            module.frames[key] = (fields.get("file_location_id", 0), fields.get("parent_frame_id", 0))
    # Frame ids are 1-based with 0 for "no parent", but the text XLA prints (jax 0.10 and 0.11 alike) gives
    # each parent one above the id it means: the root frame 1 reads "parent_frame_id=1", a frame whose
    # parent is frame 4 reads 5. A frame cannot be its own parent, so a row naming itself tells this
    # printing apart from one that writes the ids as they are.
    if any(parent == key for key, (_, parent) in module.frames.items()):
        module.frames = {key: (loc, parent - 1) for key, (loc, parent) in module.frames.items()}
    for key, loc in raw_locations.items():
        module.locations[key] = SourceLocation(
            files.get(loc.get("file_name_id", 0), "?"), loc.get("line", 0),
            functions.get(loc.get("function_name_id", 0), "?"),
        )


def frame_stack(module: HloModule, frame_id: int | None) -> list[SourceLocation]:
    """The Python stack recorded for a ``stack_frame_id``, innermost call first."""
    stack: list[SourceLocation] = []
    seen = set()
    while frame_id and frame_id not in seen and frame_id in module.frames:
        seen.add(frame_id)
        location_id, frame_id = module.frames[frame_id]
        location = module.locations.get(location_id)
        if location is not None:
            stack.append(location)
    return stack


def frame_source(module: HloModule, frame_id: int | None) -> SourceLocation | None:
    """The innermost user location of a stack frame: past the frames of jax, Flax, optax or jaxdbg's own
    wrappers, the user's line that called into them."""
    return next((location for location in frame_stack(module, frame_id) if is_user_path(location.file)), None)


def instruction_source(module: HloModule, inst: Instruction) -> SourceLocation | None:
    if inst.frame_id is not None:
        found = frame_source(module, inst.frame_id)
        if found is not None:
            return found
    if inst.source_file and inst.source_line and is_user_path(inst.source_file):
        return SourceLocation(inst.source_file, inst.source_line, inst.op_name.rsplit("/", 1)[-1] or "?")
    return None


def opcode_category(opcode: str) -> str:
    for category, opcodes in _CATEGORY_RANK:
        if opcode in opcodes:
            return category
    return "elementwise"


_CALL_TARGET = re.compile(r'custom_call_target="([^"]*)"')


def custom_call_category(text: str) -> str:
    """A library call named by its target: cuBLAS/hipBLAS gemms are matmuls, cuDNN convolutions convolutions.

        >>> custom_call_category('%c = f32[8] custom-call(%a, %b), custom_call_target="__cublas$lt$matmul"')
        'matmul'
    """
    match = _CALL_TARGET.search(text)
    target = match.group(1).lower() if match else ""
    if "gemm" in target or "matmul" in target:
        return "matmul"
    if "conv" in target:
        return "convolution"
    return "custom-call"


def _rank(opcode: str) -> int:
    for rank, (_, opcodes) in enumerate(_CATEGORY_RANK):
        if opcode in opcodes:
            return rank
    return len(_CATEGORY_RANK)


def _inner(module: HloModule, inst: Instruction, depth: int = 0) -> list[Instruction]:
    """Instructions of the computations a fusion (or call) runs, recursively (bounded)."""
    found = []
    for comp in inst.calls:
        for name in module.computations.get(comp, ()):
            child = module.instructions[name]
            found.append(child)
            if child.opcode == "fusion" and depth < 4:
                found.extend(_inner(module, child, depth + 1))
    return found


def _describe(module: HloModule, inst: Instruction) -> HloOp:
    """Category and source of one instruction; a fusion takes both from its heaviest inner ops."""
    lead, inner = inst, []
    if inst.opcode == "fusion":
        inner = sorted((i for i in _inner(module, inst) if i.opcode not in _NOT_WORK and i.opcode != "fusion"),
                       key=lambda i: _rank(i.opcode))  # stable: ties keep the computation's order
        if inner:
            lead = min(inner, key=lambda i: (_rank(i.opcode), i.frame_id is None))
    category = custom_call_category(lead.text) if lead.opcode == "custom-call" else opcode_category(lead.opcode)
    if inst.opcode == "fusion" and category in ("elementwise", "data movement"):
        category = {"kLoop": "loop fusion", "kInput": "input fusion", "kOutput": "output fusion"}.get(
            inst.fusion_kind, category)
    # The lead first (a fusion's time is mostly its dot), then the other fused ops, heaviest first, then the
    # fusion's own metadata, which XLA often drops.
    candidates = [lead] + [i for i in inner if i is not lead] + ([inst] if inst is not lead else [])
    source = next((found for found in (instruction_source(module, i) for i in candidates) if found), None)
    return HloOp(inst.name, inst.opcode, category, source, lead.op_name or inst.op_name, inst.text)


_TRIP_COUNT = re.compile(r'known_trip_count":\{"n":"(\d+)"')


def loop_note(text: str, flops: tuple[float, float] | None = None) -> str | None:
    """A caveat for cost analysis of a module with while loops (XLA counts a loop body once); ``flops``:
    (reported, executed) where the loops' matmuls were counted per iteration instead."""
    loops = len(re.findall(r"\swhile\(", text))
    if not loops:
        return None
    trips = [int(n) for n in _TRIP_COUNT.findall(text)]
    counted = f" (trip counts {', '.join(map(str, trips))})" if trips else ""
    head = f"the function runs {loops} while loop(s){counted}: XLA's cost analysis counts a loop body once"
    if flops:
        return (f"{head}; matmul FLOPs are counted here per iteration ({flops[0]:.3g} reported, {flops[1]:.3g} "
                "executed), elementwise FLOPs and bytes in loops once, so those stay lower bounds")
    return f"{head}, so flops, bytes and the rates derived from them are lower bounds"


_MODULE_LINE = re.compile(r"^HloModule\s+([^\s,]+)")


_PARAMETER_NUMBER = re.compile(r"parameter\((\d+)\)")


def entry_parameters(module: HloModule) -> Iterator[Instruction]:
    """The entry computation's parameters, in the order the module lists them."""
    return (module.instructions[n] for n in module.computations.get(module.entry, ())
            if module.instructions[n].opcode == "parameter")


def parameter_number(inst: Instruction) -> int | None:
    """An entry parameter's position (``parameter(3)``: 3)."""
    match = _PARAMETER_NUMBER.search(inst.text)
    return int(match.group(1)) if match else None


def op_primitives(op_name: str) -> tuple[str, ...]:
    """The primitives an HLO instruction's ``op_name`` names: the last part of jax's name stack, or, for an
    instruction XLA made of several (a combined collective, a CSE'd pair), each of the combined names' last parts.

    Example:
        >>> op_primitives("jit(step)/jvp()/tanh"), op_primitives("jit(f)/(dot_general:reduce_sum)")
        (('tanh',), ('dot_general', 'reduce_sum'))
        >>> op_primitives("jit(f)/(transpose(jvp())/shard_map/psum:jvp()/shard_map/psum)")
        ('psum',)
    """
    parts = _top_level_split(op_name, "/")
    last = parts[-1] if parts else ""
    if not (last.startswith("(") and last.endswith(")")):
        return (last,) if last else ()
    found: list[str] = []
    for alternative in _top_level_split(last[1:-1], ":"):
        found += [p for p in op_primitives(alternative) if p not in found]
    return tuple(found)


# Parts of jax's name stack that are its own (loops, calls, remat, cond branches), not a scope the user named
_JAX_STACK_WORDS = frozenset({"while", "body", "cond", "closed_call", "core_call", "checkpoint", "remat", "remat2",
                              "rematted_computation", "shard_map", "scan", "custom_jvp_call", "custom_vjp_call",
                              "custom_vjp_call_jaxpr", "pallas_call"})
_BRANCH = re.compile(r"branch_\d+_fun$")


def named_scope(op_name: str) -> str:
    """The scopes the user named around an instruction (``jax.named_scope``, ``jax.named_call``, a Flax module's
    name), outermost first, joined by ``/``: jax's transformations around them (``jvp(...)``, ``transpose(...)``,
    ``vmap(...)``), its loops and calls, every ``jit(...)`` (the function itself, jnp's helpers) and the primitive
    go; '' where there is none.

    Example:
        >>> named_scope("jit(step)/transpose(jvp(attention))/jit(_where)/select_n")
        'attention'
        >>> named_scope("jit(step)/jvp()/while/body/cond/branch_1_fun/checkpoint/outer/inner/sin"), named_scope("add")
        ('outer/inner', '')
    """
    parts = _top_level_split(op_name, "/")[:-1]  # the last part is the primitive
    scopes = []
    for part in parts:
        while (opened := part.find("(")) > 0 and part.endswith(")") and part[:opened] not in ("jit", "pjit"):
            part = part[opened + 1:-1]  # a transformation around the scope: jvp(attention) -> attention
        if part and "(" not in part and part not in _JAX_STACK_WORDS and not _BRANCH.match(part):
            scopes.append(part)
    return "/".join(scopes)


def _top_level_split(text: str, separator: str) -> list[str]:
    """``text`` split at ``separator`` outside parentheses."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += (char == "(") - (char == ")")
        if char == separator and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def module_name(hlo_text: str) -> str:
    match = _MODULE_LINE.match(hlo_text)
    return match.group(1) if match else ""
