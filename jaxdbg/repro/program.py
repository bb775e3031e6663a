"""The reproducer script of a cut computation: emitted jax/lax code, its inputs, and the failing check.

The script imports only jax and numpy. Its inputs are written inline when small (``np.float32(-1.0)``,
``np.full(...)``, short literal arrays) and otherwise loaded from ``inputs.npz`` next to it. Its last
statement fails the same way as the original: ``jax.jit(f)(...)`` raises the original exception, or an
assertion on the jitted result names the NaN/Inf or the jit vs op-by-op disagreement. :func:`write_program`
writes any reproducer (a cut's, one operation's) into a folder; :func:`program_fails` checks it here.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from jaxdbg.repro.cut import Cutter
    >>> from jaxdbg.repro.graph import flatten, record
    >>> from jaxdbg.repro.signature import Criterion
    >>> x = jnp.array([0.5, 2.0])
    >>> graph, consts = flatten(jax.make_jaxpr(lambda x: jnp.log(x - 1.0) * 2.0)(x))
    >>> check = CutCheck(Criterion.nonfinite("NaN"))
    >>> best = Cutter(graph, record(graph, [x], consts), check).run()
    >>> program = build_program(graph, best, check, origin="jit(f)", original_equations=len(graph.nodes))
    >>> print(program.source[program.source.index("def f"):], end="")
    def f(a):
        b = lax.log(a)
        return b
    <BLANKLINE>
    a = np.float32(-1.0)
    out = np.asarray(jax.jit(f)(a))
    assert not np.isnan(out).any(), f"jax.jit(f) produced NaN: {out}"
"""

from __future__ import annotations

import ast
import io
import os
import re
import runpy
import tokenize
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from jaxdbg.jaxpr.emit import HEADER, PRIMS_IMPORT, EmitError, EmittedFunction, array_expr, emit_function
from jaxdbg.repro.cut import Candidate, CutCheck
from jaxdbg.repro.graph import Graph, equation_count
from jaxdbg.repro.signature import Criterion
from jaxdbg.repro.source import parse
from jaxdbg.storable import is_key, restore_source, storable

INPUTS_FILE = "inputs.npz"
REPRO_FILE = "repro.py"
STABLEHLO_FILE = "repro.stablehlo.mlir"


@dataclass(frozen=True)
class ReproProgram:
    """A standalone reproducer: its source, the arrays for ``inputs.npz`` (maybe none), its equation count."""

    source: str
    arrays: dict = field(default_factory=dict)
    equations: int = 0
    function: EmittedFunction | None = None

    @property
    def lines(self) -> int:
        return count_lines(self.source)


def count_lines(source: str) -> int:
    """Lines that hold code: blank lines, comments and docstring-only lines do not count."""
    code_lines: set[int] = set()
    try:
        docstrings = {n.body[0].lineno for n in ast.walk(parse(source))
                      if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                      and n.body and isinstance(n.body[0], ast.Expr)
                      and isinstance(n.body[0].value, ast.Constant)
                      and isinstance(n.body[0].value.value, str)}
        skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type in skip:
                continue
            if tok.type == tokenize.STRING and tok.start[0] in docstrings:
                continue
            code_lines.update(range(tok.start[0], tok.end[0] + 1))
    except (SyntaxError, tokenize.TokenError):
        return sum(1 for line in source.splitlines() if line.strip() and not line.strip().startswith("#"))
    return len(code_lines)


def emit_candidate(graph: Graph, cand: Candidate) -> EmittedFunction:
    """The candidate's nodes as ``def f(<inputs>)`` returning its (single) output."""
    inputs = cand.inputs(graph)
    return emit_function("f", inputs, [graph.nodes[i] for i in cand.nodes], list(cand.outvars[:1]))


def can_emit(graph: Graph, cand: Candidate) -> bool:
    try:
        emit_candidate(graph, cand)
    except EmitError:
        return False
    return True


def build_program(graph: Graph, cand: Candidate, check: CutCheck, origin: str,
                  original_equations: int, context: str = "") -> ReproProgram:
    """Write the reproducer of ``cand``, ending with ``check`` (raises EmitError if some equation has no Python
    spelling); ``context`` is a sentence for its docstring (e.g. which loop iteration it is)."""
    emitted = emit_candidate(graph, cand)
    inputs = cand.inputs(graph)
    assign, arrays = [], {}
    for name, var in zip(emitted.arg_names, inputs):
        value = cand.values[var]
        try:
            if is_key(value):
                raise EmitError("a PRNG key has no literal: its key data goes into the npz")
            assign.append(f"{name} = {array_expr(np.asarray(value))}")
        except EmitError:  # bfloat16 travels as its bits, a PRNG key as its key data (npz keeps neither)
            arrays[name], special = storable(value)
            assign.append(f"{name} = " + restore_source(f"_inputs[{name!r}]", special))
    if arrays:
        assign.insert(0, f'_inputs = np.load((__file__.rpartition("/")[0] or ".") + "/{INPUTS_FILE}")')
    args = ", ".join(emitted.arg_names)
    what = _failure_words(check.criterion)
    sources = list(dict.fromkeys(f"{os.path.basename(n.source.file)}:{n.source.line} ({n.source.function})"
                                 for n in (graph.nodes[i] for i in cand.nodes) if n.source is not None))
    where = (f"\nThe equations come from {', '.join(sources[:4])}{' ...' if len(sources) > 4 else ''}.\n"
             if sources else "")
    if context:
        where = (where or "\n") + context + "\n"
    kept = equation_count(graph.nodes[i] for i in cand.nodes)
    doc = (f'"""jaxdbg repro: {what} (cut from {original_equations} equations of {origin} to {kept}).\n'
           f'{where}\n`python {REPRO_FILE}` fails with {_expected(check.criterion)} while the bug is present.\n"""\n')
    wide = (any(storable(cand.values[v])[0].dtype.itemsize == 8 for v in inputs)
            or re.search(r"\b(float|int|uint|complex)(64|128)\b", emitted.source) is not None)  # not a 64 in a shape
    lines = [doc + HEADER + (PRIMS_IMPORT if emitted.uses_prims else "")]
    if wide:
        lines.append('jax.config.update("jax_enable_x64", True)\n')
    lines += ["", emitted.source, *assign]
    lines += check_lines(check, args)
    return ReproProgram("\n".join(lines) + "\n", arrays, kept, emitted)


def _failure_words(criterion: Criterion) -> str:
    if criterion.kind == "nonfinite":
        return f"jax.jit(f) produces {criterion.what}"
    if criterion.kind == "mismatch":
        return "jax.jit(f) and op-by-op execution disagree"
    return f"jax.jit(f) raises {criterion.type}"


def _expected(criterion: Criterion) -> str:
    return f"{criterion.type}" if criterion.kind == "exception" else "AssertionError"


def check_lines(check: CutCheck, args: str) -> list[str]:
    """The last statements of a reproducer of ``f``: they fail as ``check`` says while the bug is present."""
    criterion = check.criterion
    if criterion.kind == "nonfinite":
        test = "np.isnan(out)" if criterion.what == "NaN" else "np.isinf(out)"
        return [f"out = np.asarray(jax.jit(f)({args}))",
                f'assert not {test}.any(), f"{criterion.assertion()}: {{out}}"']
    if criterion.kind == "mismatch":
        return [f"out = np.asarray(jax.jit(f)({args}))",
                "with jax.disable_jit():",
                f"    ref = np.asarray(f({args}))",
                f"np.testing.assert_allclose(out, ref, rtol={check.rtol!r}, atol={check.atol!r}, "
                f'err_msg="{criterion.assertion()}")']
    return [f"jax.jit(f)({args})"]


class Written(Protocol):
    """A reproducer ready to be written: its source and the arrays of its ``inputs.npz`` (maybe none)."""

    @property
    def source(self) -> str: ...

    @property
    def arrays(self) -> dict: ...


def write_program(program: Written, folder: str) -> dict[str, str]:
    """Write ``repro.py`` (and ``inputs.npz`` if it has arrays) into ``folder``; returns their paths by key."""
    files = {"repro": os.path.join(folder, REPRO_FILE)}
    with open(files["repro"], "w") as handle:
        handle.write(program.source)
    if program.arrays:
        files["inputs"] = os.path.join(folder, INPUTS_FILE)
        np.savez(files["inputs"], **program.arrays)
    return files


def program_fails(path: str, criterion: Criterion) -> bool:
    """Run a written reproducer in this process and check it fails as ``criterion`` says (a quick self-check)."""
    try:
        runpy.run_path(path, run_name="__main__")
    except Exception as err:  # noqa: BLE001 - the exception is what we compare
        return criterion.reproduced_by(type(err).__name__, str(err))
    return False
