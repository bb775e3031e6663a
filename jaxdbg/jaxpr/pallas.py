"""A gridded Pallas kernel's state between programs, as interpret mode keeps it, for a replay program by program.

Interpret mode runs the programs in grid order (the last grid axis fastest) on whole arrays: each program's
blocks are sliced where its index maps say, the kernel runs on them (scalar-prefetch values first, scratch
buffers last, carried from program to program), and every block is written back before the next program.
An output aliased to an input starts as that input; a block that runs past an array's edge reads padding.

Interpret mode fills padding, unwritten outputs and fresh scratch with NaN (to catch reads of memory a real
accelerator leaves holding garbage). A replay that looks for the first operation making a NaN cannot start
from NaN: it pads with the array's edge values instead and starts outputs and scratch at 0, so an operation on
padding makes a NaN only where it would on the array's own values. A kernel whose outputs differ for that (it
reads the padding or an unwritten buffer into what it returns) is found by comparing with interpret mode's own
run (:func:`reads_uninitialised`) and said so.

For a grid too large to replay every program op by op, :class:`Compiled` runs the programs compiled
(one loop, no replay) up to the first whose written blocks or scratch hold a NaN or Inf: the program to
replay.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxdbg import _compat


@dataclass
class State:
    """The scalar-prefetch values, the operands' arrays (inputs, then outputs; padded to whole blocks) and the
    scratch buffers between two programs."""

    scalars: list
    arrays: list
    scratch: list


def initial(grid: _compat.PallasGrid, invals: Sequence[Any], outvars: Sequence[Any],
            uninitialised: bool = False) -> State:
    """The state before the first program: inputs and aliased outputs padded with their edge values, other
    outputs and scratch at 0 (see the module docstring); with ``uninitialised``, as interpret mode starts:
    padding, outputs and scratch filled with NaN (the smallest integer, False)."""
    scalars, inputs = list(invals[:grid.scalars]), list(invals[grid.scalars:])
    aliased = dict(grid.aliases)
    outputs = [inputs[aliased[k] - grid.scalars] if k in aliased else _fresh(v.aval, uninitialised)
               for k, v in enumerate(outvars)]
    arrays = [_padded(x, block, uninitialised) for x, block in zip([*inputs, *outputs], grid.blocks)]
    jaxpr, _ = _compat.open_jaxpr(grid.kernel)
    scratch = [_fresh(v.aval, uninitialised) for v in jaxpr.invars[len(jaxpr.invars) - grid.scratch:]]
    return State(scalars, arrays, scratch)


def _fresh(aval: Any, uninitialised: bool) -> Any:
    return jnp.full(aval.shape, _garbage(aval.dtype)) if uninitialised else jnp.zeros(aval.shape, aval.dtype)


def _garbage(dtype: Any) -> Any:
    """What interpret mode fills memory not yet written with, as a value of ``dtype``."""
    if jnp.issubdtype(dtype, jnp.inexact):
        return jnp.array(jnp.nan, dtype)
    if jnp.issubdtype(dtype, jnp.integer):
        return jnp.array(jnp.iinfo(dtype).min, dtype)
    return jnp.zeros((), dtype)


def _padded(x: Any, block: Sequence[int], uninitialised: bool = False) -> Any:
    widths = [(0, -n % b) for n, b in zip(np.shape(x), block)]
    if not any(w for _, w in widths):
        return x
    if uninitialised:
        return jnp.pad(x, widths, constant_values=_garbage(x.dtype))
    return jnp.pad(x, widths, mode="edge")


def blocks(grid: _compat.PallasGrid, state: State, ids: Sequence[Any]) -> tuple[list, list]:
    """``(starts, refs)``: each operand's block offsets for program ``ids`` and the kernel's arguments (scalars,
    blocks with squeezed dimensions dropped, scratch)."""
    starts = grid.starts(ids, state.scalars)
    sliced = [jax.lax.dynamic_slice(a, start, shape).reshape(_kernel_shape(shape, squeezed))
              for a, start, shape, squeezed in zip(state.arrays, starts, grid.blocks, grid.squeezed)]
    return starts, [*state.scalars, *sliced, *state.scratch]


def _kernel_shape(shape: Sequence[int], squeezed: Sequence[bool]) -> tuple[int, ...]:
    return tuple(n for n, gone in zip(shape, squeezed) if not gone)


def write_back(grid: _compat.PallasGrid, state: State, starts: list, values: Sequence[Any]) -> State:
    """The state after a program that returned ``values`` (the kernel's refs after it ran): its blocks written
    into the arrays, its scratch carried on; scalar-prefetch values are read only."""
    n = len(state.arrays)
    written = values[grid.scalars:grid.scalars + n]
    arrays = [jax.lax.dynamic_update_slice(a, v.reshape(shape), start)
              for a, v, shape, start in zip(state.arrays, written, grid.blocks, starts)]
    return State(state.scalars, arrays, list(values[grid.scalars + n:]))


def outputs(grid: _compat.PallasGrid, state: State, outvars: Sequence[Any]) -> list:
    """The outputs, their padding cut off."""
    first = len(state.arrays) - len(outvars)
    return [a[tuple(slice(0, n) for n in v.aval.shape)] for a, v in zip(state.arrays[first:], outvars)]


def program_ids(index: int, grid: Sequence[int]) -> tuple[int, ...]:
    """The grid position of the ``index``-th program in grid order (the last axis fastest).

        >>> program_ids(5, (2, 3))
        (1, 2)
    """
    return tuple(int(i) for i in np.unravel_index(index, grid)) if grid else ()


class Compiled:
    """Programs of one kernel run compiled, in one loop (one compilation per kernel, whatever the range)."""

    def __init__(self, grid: _compat.PallasGrid):
        self.grid = grid
        self._run = jax.jit(self._loop)

    def run(self, state: State, start: int, stop: int, watch: bool = True) -> tuple[State, int]:
        """Run programs ``start .. stop-1`` from ``state``; with ``watch``, stop after the first whose blocks or
        scratch hold a NaN or Inf once it ran. Returns the state after and the index after the last one run."""
        ran, arrays, scratch = self._run(state.scalars, state.arrays, state.scratch, jnp.int32(start),
                                         jnp.int32(stop), jnp.bool_(watch))
        return State(state.scalars, list(arrays), list(scratch)), int(ran)

    def _loop(self, scalars: list, arrays: list, scratch: list, start: Any, stop: Any, watch: Any) -> tuple:
        from jax.extend.core import jaxpr_as_fun

        grid, kernel = self.grid, jaxpr_as_fun(self.grid.kernel)

        def body(carry: tuple) -> tuple:
            index, arrays, scratch, _ = carry
            rest, ids = index, list[Any]()
            for n in reversed(grid.grid):  # grid order: the last axis fastest
                ids.insert(0, rest % n)
                rest = rest // n
            now = State(scalars, list(arrays), list(scratch))
            with _compat.pallas_program(ids, grid.grid):
                starts, refs = blocks(grid, now, ids)
                values = kernel(*refs)
            after = write_back(grid, now, starts, values)
            bad = jnp.bool_(False)
            for v in values[grid.scalars:]:
                if jnp.issubdtype(v.dtype, jnp.inexact):
                    bad = bad | ~jnp.all(jnp.isfinite(v))
            return index + 1, tuple(after.arrays), tuple(after.scratch), bad & watch

        def cond(carry: tuple) -> Any:
            return (carry[0] < stop) & ~carry[3]

        ran, after, scratch_after, _ = jax.lax.while_loop(cond, body, (start, tuple(arrays), tuple(scratch),
                                                                       jnp.bool_(False)))
        return ran, after, scratch_after


_COMPILED: dict[int, tuple[_compat.PallasGrid, Compiled]] = {}


def compiled(grid: _compat.PallasGrid) -> Compiled:
    """The kernel's programs compiled, once per grid (the interpreter keeps one grid per kernel jaxpr)."""
    if id(grid) not in _COMPILED or _COMPILED[id(grid)][0] is not grid:
        if len(_COMPILED) > 64:  # (a long run's kernels come and go)
            _COMPILED.clear()
        _COMPILED[id(grid)] = (grid, Compiled(grid))
    return _COMPILED[id(grid)][1]


def programs(grid: _compat.PallasGrid) -> int:
    return math.prod(grid.grid)


def reads_uninitialised(grid: _compat.PallasGrid, invals: Sequence[Any], outvars: Sequence[Any]) -> bool:
    """Whether the kernel's outputs hold a NaN or Inf when run from interpret mode's NaN-filled padding, outputs
    and scratch, and none when run from the replay's (finite) ones: it reads memory not yet written."""
    runner = compiled(grid)

    def nonfinite(uninitialised: bool) -> bool:
        state, _ = runner.run(initial(grid, invals, outvars, uninitialised), 0, programs(grid), False)
        return any(not bool(jnp.all(jnp.isfinite(o))) for o in outputs(grid, state, outvars)
                   if jnp.issubdtype(o.dtype, jnp.inexact))

    return nonfinite(True) and not nonfinite(False)
