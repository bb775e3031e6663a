"""Matmul FLOPs a compiled function really executes, loops included, read from its optimised HLO.

XLA's cost analysis counts a while loop's body once, whatever its trip count, and on GPU leaves out the
cuBLAS calls that carry the matmuls. A scan over 40 layers then reports a fortieth of its FLOPs, and the
achieved rate comes out 40 times too low. Here each dot (and cuBLAS/hipBLAS gemm call) is counted as
``2 x output elements x contracted size``, times the trip counts of the loops around it; the elementwise
work inside loops stays counted once, so the total is still a lower bound, a much closer one.

Example:
    >>> import jax, jax.numpy as jnp
    >>> def power(a):                                     # five 4x4 matmuls in a loop: 5 * 2 * 4**3 FLOPs
    ...     return jax.lax.fori_loop(0, 5, lambda i, v: a @ v, a)
    >>> flops = loop_matmul_flops(jax.jit(power).lower(jnp.ones((4, 4))).compile().as_text())
    >>> flops.executed
    640.0
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

from jaxdbg.profile.hlo import _COMPUTATION, _INSTRUCTION, _OPCODE, _TRIP_COUNT, _operands, custom_call_category

_SHAPE = re.compile(r"^\(?\s*[a-z]\w*\[([\d,]*)\]")
_CONTRACTING = re.compile(r"lhs_contracting_dims=\{([\d,]*)\}")
_BODY = re.compile(r"\bbody=%?([\w.\-]+)")
_CALLED = re.compile(r"\b(?:calls|to_apply)=%?([\w.\-]+)")


@dataclass(frozen=True)
class LoopFlops:
    executed: float  # matmul FLOPs of one call, each loop body times its trip count
    counted_once: float  # the same matmuls, each loop body once (how cost analysis counts)
    library_once: float  # the part of counted_once in library calls (cuBLAS), which cost analysis may skip
    unknown_loops: int  # loops whose trip count XLA did not record (counted once)

    def corrected(self, reported: float) -> float:
        """``reported`` (cost analysis FLOPs) with every loop's matmuls counted as often as they run."""
        counted = self.counted_once if reported >= self.counted_once else self.counted_once - self.library_once
        return max(reported, reported - counted + self.executed)


@dataclass(frozen=True)
class _Inst:
    name: str
    opcode: str
    dims: tuple[int, ...]
    rest: str
    operands: tuple[str, ...]


def loop_matmul_flops(text: str) -> LoopFlops | None:
    """Matmul FLOPs per call from optimised HLO text; None when the module runs no loop (nothing to fix)."""
    computations, entry = _parse(text)
    if entry is None or not any(i.opcode == "while" for insts in computations.values() for i in insts):
        return None
    dims = {i.name: i.dims for insts in computations.values() for i in insts}
    totals = {"executed": 0.0, "once": 0.0, "library": 0.0, "unknown": 0}

    def visit(computation: str, times: float, seen: frozenset) -> None:
        if computation in seen:  # HLO has no recursion; guard anyway
            return
        for inst in computations.get(computation, ()):
            flops, library = _matmul_flops(inst, dims)
            totals["executed"] += times * flops
            totals["once"] += flops
            totals["library"] += flops if library else 0.0
            if inst.opcode == "while":
                body = _BODY.search(inst.rest)
                trips = _TRIP_COUNT.search(inst.rest)
                totals["unknown"] += trips is None
                if body:
                    visit(body.group(1), times * (int(trips.group(1)) if trips else 1), seen | {computation})
            elif inst.opcode in ("fusion", "call", "async-start"):
                for callee in _CALLED.findall(inst.rest):
                    visit(callee, times, seen | {computation})

    visit(entry, 1.0, frozenset())
    return LoopFlops(totals["executed"], totals["once"], totals["library"], int(totals["unknown"]))


def _parse(text: str) -> tuple[dict[str, list[_Inst]], str | None]:
    computations: dict[str, list[_Inst]] = {}
    current, entry = None, None
    for line in text.splitlines():
        header = _COMPUTATION.match(line)
        if header:
            current = header.group(2)
            computations[current] = []
            entry = current if header.group(1) else entry
            continue
        match = _INSTRUCTION.match(line) if current else None
        opcode = _OPCODE.match(match.group(3)) if match else None
        if current is None or match is None or opcode is None:
            continue
        rest = match.group(3)
        shape = _SHAPE.match(rest)
        dims = tuple(int(d) for d in shape.group(1).split(",") if d) if shape else ()
        computations[current].append(_Inst(match.group(2), opcode.group(1), dims, rest, _operands(rest, opcode.end())))
    return computations, entry


def _matmul_flops(inst: _Inst, dims: dict[str, tuple[int, ...]]) -> tuple[float, bool]:
    """``(FLOPs, whether a library call)`` of one dot or gemm custom call; (0, False) for anything else."""
    if inst.opcode == "dot":
        contracting = _CONTRACTING.search(inst.rest)
        axes = [int(a) for a in contracting.group(1).split(",") if a] if contracting else []
        library = False
    elif inst.opcode == "custom-call" and custom_call_category(inst.rest) == "matmul":
        axes = _config_axes(inst.rest)
        library = True
    else:
        return 0.0, False
    lhs = dims.get(inst.operands[0], ()) if inst.operands else ()
    if not lhs or any(a >= len(lhs) for a in axes):
        return 0.0, library
    return 2.0 * math.prod(inst.dims) * math.prod(lhs[a] for a in axes), library


def _config_axes(rest: str) -> list[int]:
    """The lhs contracting dimensions in a gemm call's backend_config JSON."""
    start = rest.find("backend_config=")
    if start < 0:
        return []
    try:
        config, _ = json.JSONDecoder().raw_decode(rest[start + len("backend_config="):])
    except ValueError:
        return []
    numbers = (config.get("gemm_backend_config") or {}).get("dot_dimension_numbers") or {}
    return [int(a) for a in numbers.get("lhs_contracting_dimensions", [])]
