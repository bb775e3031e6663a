"""Which sharding put a collective into a compiled program: the argument split over the devices it joins.

XLA's SPMD partitioner inserts a collective where an operation needs data that its sharding spread over
several devices: a ``dot_general`` contracting over a dimension split across a mesh axis makes partial sums,
summed by an all-reduce over that axis. From the optimised HLO text alone: the collective's device groups
(``replica_groups``, ``source_target_pairs``), the entry parameters its operands come from (followed back
through fusions, loops and calls), and each parameter's tile assignment (``sharding={devices=...}``). The
arguments held in different pieces by the devices of one group are the ones that put it there. The
collective's own metadata names the op of the user's program (``op_name``) and its line.

At compile time :func:`argument_specs` keeps each argument's ``PartitionSpec`` and the mesh
(``shardings.json`` next to the HLO), so the report names them as the user wrote them; without it (a capture)
the HLO's own sharding text stands in.

Example:
    >>> import jax, jax.numpy as jnp, numpy as np
    >>> from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    >>> from jaxdbg.profile.hlo import parse_hlo
    >>> mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
    >>> x = jax.device_put(jnp.ones((4, 8)), NamedSharding(mesh, P("data")))
    >>> compiled = jax.jit(lambda x: x.T @ x).lower(x).compile()
    >>> module = parse_hlo(compiled.as_text())
    >>> [sharding_cause(module, name) for name in module.ops if name.startswith("all-reduce")]  # one device
    []
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np

from jaxdbg.profile.hlo import HloModule, Instruction, entry_parameters, op_primitives, parameter_number
from jaxdbg.profile.model import ShardedArgument, ShardingCause

COLLECTIVES = {"all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
               "all-reduce-start", "all-gather-start", "collective-permute-start", "ragged-all-to-all"}
_DONE = {"all-reduce-done", "all-gather-done", "collective-permute-done"}
_IOTA = re.compile(r"\[([\d,]*)\]<=\[([\d,]*)\](?:T\(([\d,]*)\))?")
# XLA's mesh form of replica groups: the devices of a mesh (in iota order, or as given after it, e.g.
# "<=[2,2]T(1,0)" or ", device_ids=([2,2]T(1,0))" or ", device_ids=(0,2,1,3)"), grouped along some of its axes.
_MESH_GROUPS = re.compile(r"mesh\[([^\]]*)\](.*?)\{([^}]*)\}")
_MESH_IOTA = re.compile(r"\[([\d,]*)\](?:T\(([\d,]*)\))?")
_MESH_LIST = re.compile(r"device_ids=\(([\d,\s]*)\)")
# ... and of a sharding: the mesh, then for each dimension the axes split over it.
_MESH_SHARDING = re.compile(r"\{mesh\[([^\]]*)\](.*?),?\s*\[((?:\{[^}]*\},?\s*)*)\](.*)\}$")
_VISIT_LIMIT = 20_000


def argument_specs(compiled: Any) -> dict | None:
    """What ``shardings.json`` keeps of a compiled function's inputs: the mesh and, per flattened argument
    that the executable takes, its pytree path and ``PartitionSpec``; None where no argument is sharded over
    a mesh of several devices (nothing to explain)."""
    import jax
    from jax.sharding import NamedSharding

    try:
        leaves = jax.tree_util.tree_flatten_with_path(compiled.input_shardings)[0]
    except Exception:  # noqa: BLE001 - an executable without input shardings: nothing to keep
        return None
    mesh, arguments = None, []
    for path, sharding in leaves:
        spec = None
        if isinstance(sharding, NamedSharding):
            spec, mesh = spec_text(tuple(sharding.spec)), mesh or sharding.mesh
        # (args or kwargs, position or keyword, the rest): the rest is what the HLO name ends with.
        arguments.append({"path": jax.tree_util.keystr(tuple(path[2:])), "spec": spec})
    if mesh is None or math.prod(mesh.shape.values()) < 2:
        return None
    return {"mesh": [[str(name), int(size)] for name, size in mesh.shape.items()], "arguments": arguments}


def spec_text(spec: tuple) -> str:
    """A PartitionSpec as the user writes it.

        >>> spec_text(("data", None, ("x", "y")))
        "P('data', None, ('x', 'y'))"
    """
    return f"P({', '.join(repr(tuple(entry)) if isinstance(entry, (tuple, list)) else repr(entry) for entry in spec)})"


def write_specs(path: str, specs: dict) -> None:
    with open(path, "w") as handle:
        json.dump(specs, handle)


def read_specs(module: HloModule, path: str) -> None:
    """Give ``module``'s entry parameters the PartitionSpecs and mesh kept in ``shardings.json``. The
    executable takes the kept arguments in order (jax drops unused ones, which have no sharding there
    either); a parameter whose name does not end with the kept path keeps the HLO's own text."""
    try:
        with open(path) as handle:
            specs = json.load(handle)
    except (OSError, ValueError):
        return
    arguments = specs.get("arguments") or []
    for inst in entry_parameters(module):
        number = parameter_number(inst)
        if number is None or number >= len(arguments):
            continue
        kept = arguments[number]
        if kept.get("spec") and module.arguments.get(inst.name, "").endswith(kept.get("path", "")):
            module.specs[inst.name] = kept["spec"]
    module.mesh = tuple((str(name), int(size)) for name, size in specs.get("mesh") or ())


def sharding_cause(module: HloModule, name: str) -> ShardingCause | None:
    """Why the collective ``name`` is in ``module``: the entry arguments it depends on that are split
    between the devices of one of its groups, the mesh axes its groups span, and the op it belongs to."""
    inst = module.instructions.get(name.lstrip("%"))
    if inst is not None and inst.opcode in _DONE and inst.operands:
        inst = module.instructions.get(inst.operands[0])
    if inst is None or inst.opcode not in COLLECTIVES:
        return None
    parameters = sorted(_entry_ancestors(module, inst), key=lambda p: parameter_number(p) or 0)
    groups = device_groups(inst.groups) or [sorted({d for p in parameters for d in tile_map(p.sharding) or {}})]
    split = [p for p in parameters if _split_within(tile_map(p.sharding), groups)]
    described = module.op(inst.name)
    ops = op_primitives(inst.op_name)  # a combined collective: "(dot_general:reduce_sum)"
    return ShardingCause(
        arguments=tuple(ShardedArgument(module.arguments.get(p.name, p.name), module.specs.get(p.name) or p.sharding)
                        for p in split),
        axes=mesh_axes(module.mesh, groups), devices=inst.groups,
        op=", ".join(ops), op_name=inst.op_name, source=described.source if described else None)


def _entry_ancestors(module: HloModule, start: Instruction) -> list[Instruction]:
    """The entry parameters ``start`` depends on; a parameter of a loop body or called computation leads on
    to the operands of the instructions that call it (the loop's whole state: an over-approximation)."""
    callers: dict[str, list[Instruction]] | None = None  # built when a called computation's parameter is met
    found, seen, frontier = [], {start.name}, [start]
    while frontier and len(seen) < _VISIT_LIMIT:
        inst = frontier.pop()
        if inst.opcode == "parameter":
            if inst.computation == module.entry:
                found.append(inst)
                continue
            if callers is None:
                callers = {}
                for other in module.instructions.values():
                    for called in other.calls:
                        callers.setdefault(called, []).append(other)
            following = [o for caller in callers.get(inst.computation, ()) for o in caller.operands]
        else:
            following = list(inst.operands)
        for name in following:
            if name not in seen and name in module.instructions:
                seen.add(name)
                frontier.append(module.instructions[name])
    return found


def _iota(dims: list[int], reshape: list[int], perm: list[int] | None) -> np.ndarray:
    ids = np.arange(math.prod(reshape)).reshape(reshape)
    return (ids.transpose(perm) if perm else ids).reshape(dims)


def _ints(text: str | None) -> list[int]:
    return [int(v) for v in (text or "").split(",") if v.strip()]


def tile_map(sharding: str) -> dict[int, tuple[int, ...]] | None:
    """``{device: the index of the tile it holds}`` of an HLO sharding (data dimensions only: replication
    dimensions left out); None where the array is whole on each device (replicated, maximal) or unknown.

        >>> tile_map("{devices=[2,1,2]<=[2,2]T(1,0) last_tile_dim_replicate}")
        {0: (0, 0), 2: (0, 0), 1: (1, 0), 3: (1, 0)}
        >>> tile_map("{devices=[2,1]1,0}"), tile_map("{replicated}")
        ({1: (0, 0), 0: (1, 0)}, None)
        >>> tile_map("{mesh['data'=2,'model'=2], [{'model'}, {}]}")
        {0: (0, 0), 1: (1, 0), 2: (0, 0), 3: (1, 0)}
    """
    if sharding.strip().startswith("{mesh["):
        return _mesh_tiles(sharding)
    match = re.match(r"\{devices=\[([\d,]+)\]([^ }]*)(.*)\}$", sharding.strip())
    if not match:
        return None
    dims, assignment, rest = _ints(match.group(1)), match.group(2), match.group(3)
    iota = _IOTA.match(f"[{match.group(1)}]{assignment}")
    try:
        if iota:
            tiles = _iota(dims, _ints(iota.group(2)), _ints(iota.group(3)) or None)
        else:
            tiles = np.array(_ints(assignment)).reshape(dims)
    except ValueError:
        return None
    extra = 1 if "last_tile_dim_replicate" in rest else 0
    subgroups = re.search(r"last_tile_dims=\{([^}]*)\}", rest)
    extra += len(subgroups.group(1).split(",")) if subgroups else 0
    data_dims = len(dims) - extra
    return {int(tiles[index]): tuple(index[:data_dims]) for index in np.ndindex(*dims)}


def device_groups(text: str) -> list[list[int]]:
    """The device groups of a collective's ``replica_groups`` / ``source_target_pairs`` ([] for ``{}``:
    every device in one group).

        >>> device_groups("{{0,1},{2,3}}"), device_groups("[2,2]<=[2,2]T(1,0)")
        ([[0, 1], [2, 3]], [[0, 2], [1, 3]])
        >>> device_groups("mesh['a'=2,'b'=2] {'a'}")
        [[0, 2], [1, 3]]
    """
    mesh = _MESH_GROUPS.fullmatch(text.strip())
    if mesh:
        return _mesh_groups(mesh)
    iota = _IOTA.fullmatch(text.strip())
    if iota:
        return [list(map(int, row)) for row in _iota(_ints(iota.group(1)), _ints(iota.group(2)),
                                                      _ints(iota.group(3)) or None)]
    return [_ints(group) for group in re.findall(r"\{([\d,\s]*)\}", text[1:-1] if text.startswith("{{") else "")
            if _ints(group)]


def _mesh_ids(sizes: list[int], written: str) -> np.ndarray | None:
    """The device numbers of a mesh of ``sizes``, as written after ``mesh[...]`` (iota order by default)."""
    listed, iota = _MESH_LIST.search(written), _MESH_IOTA.search(written)
    try:
        if listed and not iota:
            return np.array(_ints(listed.group(1))).reshape(sizes)
        return _iota(sizes, _ints(iota.group(1)) if iota else [math.prod(sizes)],
                     _ints(iota.group(2)) if iota else None)
    except ValueError:
        return None


def _mesh_tiles(sharding: str) -> dict[int, tuple[int, ...]] | None:
    """``tile_map`` of XLA's named form ``{mesh['data'=2,'model'=2], [{}, {'model'}]}``: for each dimension,
    the mesh axes split over it (major first)."""
    match = _MESH_SHARDING.match(sharding.strip())
    if not match or ":" in match.group(3):
        return None
    axes = re.findall(r"'([^']*)'=(\d+)", match.group(1))
    names, sizes = [name for name, _ in axes], [int(size) for _, size in axes]
    per_dim = [re.findall(r"'([^']*)'", dim) for dim in re.findall(r"\{([^}]*)\}", match.group(3))]
    ids = _mesh_ids(sizes, match.group(2))
    if ids is None or not any(per_dim) or any(name not in names for dim in per_dim for name in dim):
        return None
    tiles = {}
    for coords in np.ndindex(*sizes):
        tile = []
        for dim in per_dim:
            index = 0
            for name in dim:
                axis = names.index(name)
                index = index * sizes[axis] + coords[axis]
            tile.append(index)
        tiles[int(ids[coords])] = tuple(tile)
    return tiles


def _mesh_groups(match: re.Match) -> list[list[int]]:
    """Groups of ``mesh['x'=2,'y'=4] {'y'}``: the devices that differ only along the named axes; [] (unknown)
    for forms not read here (sub-axes).

        >>> _mesh_groups(_MESH_GROUPS.fullmatch("mesh['a'=1,'b'=2,'c'=2], device_ids=([2,2]T(1,0)) {'b'}"))
        [[0, 1], [2, 3]]
    """
    axes = re.findall(r"'([^']*)'=(\d+)", match.group(1))
    grouped = re.findall(r"'([^']*)'", match.group(3))
    names, sizes = [name for name, _ in axes], [int(size) for _, size in axes]
    if not axes or any(name not in names for name in grouped) or ":" in match.group(3):
        return []
    ids = _mesh_ids(sizes, match.group(2))
    if ids is None:
        return []
    inner = [names.index(name) for name in grouped]
    order = [axis for axis in range(len(sizes)) if axis not in inner] + inner
    size = math.prod(sizes[axis] for axis in inner)
    return [list(map(int, row)) for row in ids.transpose(order).reshape(-1, size)]


def _split_within(tiles: dict[int, tuple[int, ...]] | None, groups: list[list[int]]) -> bool:
    """True when the devices of some group hold different pieces of the array."""
    return tiles is not None and any(len({tiles[d] for d in group if d in tiles}) > 1 for group in groups)


def mesh_axes(mesh: tuple[tuple[str, int], ...], groups: list[list[int]]) -> tuple[str, ...]:
    """The mesh axes along which the devices of a group differ (a device's number is its place in the mesh,
    as in the executable's device assignment of a NamedSharding).

        >>> mesh_axes((("data", 2), ("model", 2)), [[0, 1], [2, 3]])
        ('model',)
    """
    if not mesh:
        return ()
    shape = [size for _, size in mesh]
    total = math.prod(shape)
    varying: set[int] = set()
    for group in groups:
        coords = [np.unravel_index(d, shape) for d in group if d < total]
        varying.update(axis for axis in range(len(shape)) if len({c[axis] for c in coords}) > 1)
    return tuple(mesh[axis][0] for axis in sorted(varying))
