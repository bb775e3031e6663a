"""What one compiled program is, as hang-hunt compares it between processes: its fingerprint, the collectives
in it with the devices (and so the processes) each one joins, and whether it spans several processes.

The fingerprint is the function's name, the abstract signature jit compiled it for (shapes, dtypes,
shardings, static values: :mod:`jaxdbg.profile.signature`) and the kinds of its collectives. It is the same
text in every process that runs the same SPMD program (no paths, no addresses), so two processes that reach
different fingerprints at the same step ran different programs. A program is *global* when its devices
belong to several processes: every process must run it, in the same order; the others (a process's own
logging or metrics step) may differ between processes without harm.

Example:
    >>> import jax, jax.numpy as jnp
    >>> compiled = jax.jit(lambda x: x * 2).lower(jnp.ones(3)).compile()
    >>> program = describe_program(7, "double", "x: f32[3]", compiled)
    >>> program.key, program.collectives, program.processes, program.is_global
    ('double(x: f32[3])', (), (0,), False)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from jaxdbg._source import SourceLocation

_REDUCTIONS = {"add": "sum", "maximum": "max", "minimum": "min", "multiply": "product", "and": "and",
               "or": "or"}


@dataclass(frozen=True)
class Collective:
    """One collective of a program: its HLO opcode, what it reduces with (all-reduce, reduce-scatter), the
    groups of global device ids it joins, the processes those devices belong to, and the user's line."""

    op: str
    reduce: str | None
    groups: tuple[tuple[int, ...], ...]
    processes: tuple[int, ...]
    source: SourceLocation | None = None

    def describe(self) -> str:
        """``all-reduce (sum) over processes 0, 1 at train.py:26``."""
        kind = f"{self.op} ({self.reduce})" if self.reduce else self.op
        over = f" over processes {', '.join(map(str, self.processes))}" if len(self.processes) > 1 else ""
        at = f" at {_short(self.source)}" if self.source else ""
        return f"{kind}{over}{at}"


@dataclass(frozen=True)
class Program:
    """One program a jitted function compiled to, numbered in this process (``id``)."""

    id: int
    function: str
    signature: str
    collectives: tuple[Collective, ...] = ()
    processes: tuple[int, ...] = ()
    note: str = ""  # why the collectives are unknown, where they are

    @property
    def key(self) -> str:
        """The fingerprint compared between processes."""
        kinds = ",".join(c.op + (f":{c.reduce}" if c.reduce else "") for c in self.collectives)
        return f"{self.function}({self.signature})" + (f" [{kinds}]" if kinds else "")

    @property
    def is_global(self) -> bool:
        return len(self.processes) > 1


def describe_program(ident: int, function: str, signature: str, compiled: Any | None, note: str = "") -> Program:
    """The :class:`Program` of a compiled executable (None: collectives unknown, say why in ``note``)."""
    if compiled is None:
        return Program(ident, function, signature, note=note)
    from jaxdbg import _compat
    from jaxdbg.profile.hlo import parse_hlo

    devices = _compat.program_devices(compiled)
    processes = tuple(sorted({int(getattr(d, "process_index", 0)) for d in devices})) or (0,)
    try:
        module = parse_hlo(compiled.as_text())
    except Exception as err:  # noqa: BLE001 - the program stands without its collectives
        return Program(ident, function, signature, (), processes, f"HLO unreadable: {type(err).__name__}")
    return Program(ident, function, signature, collectives_of(module, devices), processes, note)


def collectives_of(module: Any, devices: tuple) -> tuple[Collective, ...]:
    """The collectives of a parsed HLO module, in program order, with their groups as global device ids."""
    from jaxdbg.profile.collectives import COLLECTIVES, device_groups

    found = []
    for inst in module.instructions.values():
        if inst.opcode not in COLLECTIVES:
            continue
        groups = device_groups(inst.groups) if inst.groups else []
        if not groups:
            groups = [list(range(len(devices)))] if devices else []
        global_groups = tuple(tuple(int(devices[i].id) if i < len(devices) else i for i in group) for group in groups)
        owners = {d.id: int(getattr(d, "process_index", 0)) for d in devices}
        processes = tuple(sorted({owners.get(i, 0) for group in global_groups for i in group}))
        described = module.op(inst.name)
        found.append(Collective(inst.opcode.removesuffix("-start"), _reduction(module, inst), global_groups,
                                processes, described.source if described else None))
    return tuple(found)


def _reduction(module: Any, inst: Any) -> str | None:
    """What an all-reduce or reduce-scatter combines with: the root of its ``to_apply`` computation."""
    if not inst.calls or "to_apply" not in inst.text:
        return None
    names = module.computations.get(inst.calls[0], [])
    for name in reversed(names):
        opcode = module.instructions[name].opcode if name in module.instructions else ""
        if opcode in _REDUCTIONS:
            return _REDUCTIONS[opcode]
    return None


_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def signature_text(signature: Any) -> str:
    """A call signature as text that is the same in every process (object addresses dropped).

    Example:
        >>> import numpy as np
        >>> from jaxdbg.profile.signature import call_signature
        >>> signature_text(call_signature(lambda w, n: w, (np.zeros((2, 3), np.float32), 4), {}, (1,)))
        'w: f32[2, 3], n: static 4'
    """
    parts = [f"{path}: {leaf.describe()}" for path, leaf in signature.leaves]
    return _ADDRESS.sub("", ", ".join(parts))


def _short(source: SourceLocation) -> str:
    import os

    return f"{os.path.basename(source.file)}:{source.line}"
