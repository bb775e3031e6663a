"""Buffers a loop stacks one slice per iteration: a ``lax.scan``'s outputs (its ``ys``) or, in a gradient program,
the residuals its forward pass saves for the backward pass.

XLA compiles a scan to a ``while`` whose state tuple holds each stacked buffer; the loop body writes one slice
of it per iteration (a ``dynamic-update-slice``, often fused). Which one it is is told by data flow, not by
jax's name stack (the user's own ys sit among the ``jvp()`` operations as much as the residuals do): an element
of the loop's result that reaches the program's outputs other than through the backward pass
(``transpose(...)`` operations) is the scan's ys; one that only the backward pass reads was saved for it.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from jaxdbg.profile.hlo import parse_hlo
    >>> def loss(w, xs):
    ...     _, hs = jax.lax.scan(lambda h, x: (jnp.tanh(h * w + x),) * 2, jnp.zeros(4), xs)
    ...     return (hs ** 2).sum()
    >>> module = parse_hlo(jax.jit(jax.grad(loss)).lower(jnp.ones(4), jnp.ones((8, 4))).compile().as_text())
    >>> loops = Loops(module)
    >>> sorted({loops.element_role(w, i) for w in loops.whiles for i in range(8)} - {None})
    ['residuals']
"""

from __future__ import annotations

import re
from typing import Literal

from jaxdbg.profile.hlo import HloModule, Instruction

StackedRole = Literal["ys", "residuals"]
_INDEX = re.compile(r"\bindex=(\d+)")
_SCALAR = re.compile(r"^[a-z]+\d*\[\]")  # an instruction's text starts with its shape: s32[] is a loop index
_CARRIED = {"get-tuple-element", "parameter", "copy", "bitcast", "constant"}


class Loops:
    """The while loops of one compiled module, and which of their state elements are stacked, and for what."""

    def __init__(self, module: HloModule):
        self.module = module
        self.whiles = [i for i in module.instructions.values() if i.opcode == "while"]
        self.users: dict[str, list[str]] = {}
        for inst in module.instructions.values():
            for operand in inst.operands:
                self.users.setdefault(operand, []).append(inst.name)
        self._body = {w.name: body for w in self.whiles if (body := self._body_of(w)) is not None}
        self._loop_of_computation = {c: w for w in self.whiles for c in w.calls}
        # XLA:CPU may outline a loop into a computation of its own, called where the loop was
        self._callers: dict[str, list[Instruction]] = {}
        for inst in module.instructions.values():
            if inst.opcode == "call":
                for called in inst.calls:
                    self._callers.setdefault(called, []).append(inst)

    def locate(self, name: str, index: str) -> tuple[Instruction, int] | None:
        """``(while, element)`` for an HLO value of a loop's state: the while's own result element, its body's
        or condition's parameter element (``arg_tuple.3{2}``), or what the body writes into an element."""
        inst = self.module.instructions.get(name)
        if inst is None:
            return None
        first = int(index.split(",")[0]) if index else None
        if inst.opcode == "while" and first is not None:
            return inst, first
        if inst.opcode == "parameter" and first is not None:
            loop = self._loop_of_computation.get(inst.computation)
            return (loop, first) if loop is not None else None
        loop = self._loop_of_computation.get(inst.computation)
        root = self._body.get(loop.name) if loop is not None else None
        if loop is not None and root is not None and not index and name in root.operands:
            return loop, root.operands.index(name)
        return None

    def producer(self, loop: Instruction, element: int) -> Instruction | None:
        """What the loop's body writes into ``element`` each iteration, when that is one slice of a stacked buffer
        (a dynamic-update-slice, fused or not); None for a carry or a value passed through."""
        root = self._body.get(loop.name)
        if root is None or element >= len(root.operands):
            return None
        made = self.module.instructions.get(root.operands[element])
        if made is None:
            return None
        inner = [self.module.instructions.get(n) for c in made.calls for n in self.module.computations.get(c, ())]
        if made.opcode == "dynamic-update-slice" or any(i is not None and i.opcode == "dynamic-update-slice"
                                                        for i in inner):
            return made
        return None

    def carried(self, loop: Instruction, element: int) -> Instruction | None:
        """What the loop's body writes into ``element`` each iteration (the new carry), whatever it is."""
        root = self._body.get(loop.name)
        return self.module.instructions.get(root.operands[element]) if root and element < len(root.operands) else None

    def written(self, made: Instruction) -> Instruction:
        """What a loop's write into its stacked buffer writes: the update a fused dynamic-update-slice takes, whose
        operation and line say what is stacked (the write itself carries only the scan's own line); ``made`` where
        that is a value carried in (a copy of the loop's state) rather than computed."""
        op = self.module.ops.get(made.name)
        if op is None or "dynamic_update_slice" not in op.op_name:
            return made  # the write computes the value too (a fusion): its own operation says what it is
        for operand in made.operands:
            inst = self.module.instructions.get(operand)
            if (inst is not None and inst.opcode not in _CARRIED and inst.name in self.module.ops
                    and not _SCALAR.match(inst.text)):
                return inst
        return made

    def element_role(self, loop: Instruction, element: int) -> StackedRole | None:
        """``ys`` for a stacked element that reaches the program's outputs outside the backward pass, ``residuals``
        for one only the backward pass reads; None for an element the loop does not stack."""
        if self.producer(loop, element) is None:
            return None
        return "ys" if self._reaches_output(self._element_users(loop, element)) else "residuals"

    def _element_users(self, inst: Instruction, element: int) -> list[str]:
        """The instructions that read ``element`` of ``inst``'s tuple (or the whole tuple), also through the calls
        of an outlined computation whose result ``inst`` is."""
        found = [u for u in self.users.get(inst.name, ()) if self._element_of(u) in (element, None)]
        if self._is_root(inst):
            for caller in self._callers.get(inst.computation, ()):
                found += self._element_users(caller, element)
        return found

    def _is_root(self, inst: Instruction) -> bool:
        return self.module.computations[inst.computation][-1] == inst.name

    def _reaches_output(self, start: list[str]) -> bool:
        """Whether a path from ``start`` reaches its computation's root without a backward-pass operation, or a
        program without a backward pass at all."""
        frontier, seen = list(start), set(start)
        backward = False
        while frontier:
            name = frontier.pop()
            inst = self.module.instructions[name]
            if "transpose(" in inst.op_name:
                backward = True
                continue
            following = list(self.users.get(name, []))
            if self._is_root(inst):
                callers = self._callers.get(inst.computation, [])
                if not callers:
                    return True  # an output of the program (or of the loop body that holds this loop)
                following += [u for c in callers for u in self.users.get(c.name, ())]
            elif not following:
                return True
            for nxt in following:
                if nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)
        return not backward

    def _element_of(self, user: str) -> int | None:
        """The element a get-tuple-element takes; None for another user (it takes the whole tuple)."""
        inst = self.module.instructions[user]
        if inst.opcode != "get-tuple-element":
            return None
        match = _INDEX.search(inst.text)
        return int(match.group(1)) if match else None

    def _body_of(self, loop: Instruction) -> Instruction | None:
        """The root tuple of the loop's body (the condition's root is a predicate)."""
        for called in loop.calls:
            names = self.module.computations.get(called) or []
            root = self.module.instructions.get(names[-1]) if names else None
            if root is not None and root.opcode == "tuple":
                return root
        return None
