"""The assertion a source-level reproducer of a NaN/Inf or a jit mismatch ends with.

A NaN or a mismatch raises nothing by itself: reduced at the source level (no per-operation cut was
possible), the program would only show it under jaxdbg's detector, and ``python repro.py`` would exit 0.
So the call of the failing jitted function in the failing statement is wrapped in a check that computes on
the real values: ``y = step(x)`` becomes ``y = check_no_nan(step(x))`` (every floating output leaf is
asserted free of NaN/Inf), or ``y = check_jit_vs_op_by_op(step, x)`` (the call again under
``jax.disable_jit()``, or in float64 under ``jax.enable_x64``, compared within the tolerance the detector
used). The check is a small function written into the reproducer (it imports only jax and numpy); its
AssertionError names the failure in the words :meth:`Criterion.assertion` gives, which is what the
verification looks for. The text is edited in place (comments and layout of the rest stay as they were).

Which call: the statement may hold several. They are tried best first (:func:`with_checks`): a call of the
function by its name (or ``jax.jit(name)(...)``), then of a name bound to an expression that mentions it,
then any other call that is not a builtin's or an imported module's; inner calls before outer ones. The
caller verifies each and keeps the first that fails as the original did.

Example:
    >>> text = "import jax\\n\\n@jax.jit\\ndef step(x):\\n    return x\\n\\nprint(step(1.0))\\n"
    >>> checked = with_checks(text, (7, 7), Criterion.nonfinite("NaN"), "step")[0]
    >>> checked.call, checked.lines
    ('step(1.0)', (17, 17))
    >>> print(checked.text.splitlines()[16])
    print(check_no_nan(step(1.0)))
"""

from __future__ import annotations

import ast
import builtins
import re
from dataclasses import dataclass

from jaxdbg.repro.signature import Criterion
from jaxdbg.repro.source import find_statement, parse

_LIBRARIES = ("jax", "jaxlib", "numpy", "scipy", "math", "functools")  # whose calls are never the user's jit
MAX_CALLS = 3  # calls of one statement tried (each costs a verification); the first is nearly always the one

_NONFINITE = '''def {name}(out):
    """jaxdbg's check: `{function}` must return no {what} (it does while the bug is present)."""
    import jax, numpy as np
    for v in jax.tree_util.tree_leaves(out):
        if {inexact}:
            assert not np.{test}(np.asarray(v)).any(), f"{message}: {{v}}"
    return out
'''

_MISMATCH = '''def {name}(fun, /, *args, **kwargs):
    """jaxdbg's check: `{function}` jitted and {reference} must agree (they do not while the bug is present)."""
    import jax, numpy as np
    inputs = jax.tree_util.tree_map({prepare}, (args, kwargs))
    out = fun(*args, **kwargs)
    with {context}:
        ref = fun(*inputs[0], **inputs[1])
    for a, b in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(ref)):
        if {inexact_a} and np.shape(a) == np.shape(b):
            a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
            close = np.isclose(a, b, rtol={rtol!r}, atol={atol!r}, equal_nan=True)
            assert close.all(), f"{message}: {{a[~close]}} jitted, {{b[~close]}} {reference}"
    return out
'''
_INEXACT = 'jax.numpy.issubdtype(getattr({v}, "dtype", int), jax.numpy.{kind})'
# The inputs of the reference call, taken before the jitted call runs (it may donate them), or widened.
_OP_BY_OP_INPUTS = "lambda v: v.copy() if isinstance(v, jax.Array) else v"
_FLOAT64_INPUTS = f"lambda v: np.asarray(v, np.float64) if {_INEXACT.format(v='v', kind='floating')} else v"


@dataclass(frozen=True)
class Checked:
    """The program with the check added: its text, the failing statement's lines in it, the call checked."""

    text: str
    lines: tuple[int, int]
    call: str


def check_source(criterion: Criterion, function: str, name: str, rtol: float = 1e-3, atol: float = 1e-5) -> str:
    """The check function ``name`` for ``criterion`` (a NaN/Inf or a mismatch) of the jitted ``function``."""
    message = criterion.assertion(function)
    if criterion.kind == "nonfinite":
        test = "isnan" if criterion.what == "NaN" else "isinf"
        return _NONFINITE.format(name=name, function=function, what=criterion.what, test=test, message=message,
                                 inexact=_INEXACT.format(v="v", kind="inexact"))
    wide = criterion.reference == "float64"
    return _MISMATCH.format(name=name, function=function, reference="in float64" if wide else "op by op",
                            prepare=_FLOAT64_INPUTS if wide else _OP_BY_OP_INPUTS,
                            context="jax.enable_x64(True)" if wide else "jax.disable_jit()",
                            inexact_a=_INEXACT.format(v="a", kind="inexact"), rtol=rtol, atol=atol, message=message)


def with_checks(text: str, lines: tuple[int, int], criterion: Criterion, function: str, rtol: float = 1e-3,
                atol: float = 1e-5) -> list[Checked]:
    """``text`` with the failing statement (at ``lines``)'s call of ``function`` checked, one version per call
    that may be it, best first (at most MAX_CALLS); empty when the statement holds no call to check."""
    tree = parse(text)
    statement = next((node for node in ast.walk(tree) if isinstance(node, ast.stmt)
                      and (node.lineno, node.end_lineno) == lines), None) or find_statement(tree, lines[0])
    if statement is None:
        return []
    name = _free_name(text, "check_no_nan" if criterion.kind == "nonfinite" else
                      f"check_jit_vs_{'float64' if criterion.reference == 'float64' else 'op_by_op'}")
    helper = check_source(criterion, function, name, rtol, atol)
    rows = text.splitlines(keepends=True)
    found = []
    for call in _ranked_calls(tree, statement, function)[:MAX_CALLS]:
        start, end = _offset(rows, call.lineno, call.col_offset), _offset(rows, call.end_lineno, call.end_col_offset)
        wrapped = _wrapped(text, rows, call, name, criterion.kind == "nonfinite")
        if wrapped is None:
            continue
        edited = text[:start] + wrapped + text[end:]
        head, tail = _split_after_line(edited, _after_imports(tree))
        prefix = (head.rstrip("\n") + "\n\n\n" if head.strip() else "") + helper + "\n\n"
        body = tail.lstrip("\n")
        program = prefix + body
        try:
            parse(program)
        except SyntaxError:
            continue
        shift = prefix.count("\n") - (edited.count("\n") - body.count("\n"))  # lines before the body: now, then
        found.append(Checked(program, (lines[0] + shift, lines[1] + shift), text[start:end]))
    return found


def _ranked_calls(tree: ast.Module, statement: ast.stmt, function: str) -> list[ast.Call]:
    """The calls in ``statement`` (its own expressions, not the blocks it holds) that may be of ``function``."""
    wanted = set(re.findall(r"[A-Za-z_]\w*", function))  # "checkify(step)" is step's
    aliases = {_terminal(target) for node in ast.walk(tree) if isinstance(node, ast.Assign)
               and wanted & _identifiers(node.value) for target in node.targets}  # step = jax.jit(loss)
    libraries = _libraries(tree)
    ranked: list[tuple[int, int, ast.Call]] = []
    for depth, call in _calls(statement):
        func = call.func
        names = _identifiers(func) if isinstance(func, ast.Call) else {_terminal(func)} - {None}
        if names & wanted:
            rank = 0
        elif names & aliases:
            rank = 1
        elif _root(func) in libraries or (isinstance(func, ast.Name) and hasattr(builtins, func.id)):
            continue  # print(...), np.asarray(...): not the user's jitted function
        else:
            rank = 2
        ranked.append((rank, -depth, call))
    ranked.sort(key=lambda item: item[:2])
    return [call for _, _, call in ranked]


def _libraries(tree: ast.Module) -> set[str]:
    """Names the program imports that are modules or libraries' functions (``jnp``, ``np``, ``jit``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) or (isinstance(node, ast.ImportFrom) and node.level == 0
                                            and (node.module or "").split(".")[0] in _LIBRARIES):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return names


def _calls(statement: ast.stmt) -> list[tuple[int, ast.Call]]:
    """Every call in the statement's own expressions, with its nesting depth."""
    blocks = ("body", "orelse", "finalbody", "handlers", "cases")
    roots = [value for field, value in ast.iter_fields(statement) if field not in blocks]
    found: list[tuple[int, ast.Call]] = []

    def visit(node: object, depth: int) -> None:
        if isinstance(node, list):
            for item in node:
                visit(item, depth)
            return
        if not isinstance(node, ast.AST):
            return
        if isinstance(node, ast.Call):
            found.append((depth, node))
            depth += 1
        for child in ast.iter_child_nodes(node):
            visit(child, depth)

    visit(roots, 0)
    return found


def _wrapped(text: str, rows: list[str], call: ast.Call, name: str, value: bool) -> str | None:
    """The call wrapped in the check: ``name(call)`` (a value to check) or ``name(func, args...)``; None when
    its source does not split so (a parenthesised callee)."""
    start, end = _offset(rows, call.lineno, call.col_offset), _offset(rows, call.end_lineno, call.end_col_offset)
    if value:
        return f"{name}({text[start:end]})"
    middle = _offset(rows, call.func.end_lineno, call.func.end_col_offset)
    func, rest = text[start:middle], text[middle:end].lstrip()
    if not (rest.startswith("(") and rest.endswith(")")):
        return None
    inner = rest[1:-1]  # what the parentheses of the call hold
    if len(call.args) == 1 and not call.keywords and isinstance(call.args[0], ast.GeneratorExp):
        inner = f"({inner})"  # f(x for x in y) passes one generator; check(f, x for x in y) is no syntax
    return f"{name}({func}, {inner})" if inner.strip() else f"{name}({func})"


def _identifiers(node: ast.AST) -> set[str]:
    return {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node) if isinstance(n, (ast.Name,
                                                                                                  ast.Attribute))}


def _terminal(node: ast.AST) -> str | None:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def _root(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _after_imports(tree: ast.Module) -> int:
    """The last line of the module's leading docstring and imports (0: none): the check goes after them."""
    last = 0
    for index, stmt in enumerate(tree.body):
        docstring = (index == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
                     and isinstance(stmt.value.value, str))
        if not (docstring or isinstance(stmt, (ast.Import, ast.ImportFrom))):
            break
        last = stmt.end_lineno or stmt.lineno
    return last


def _split_after_line(text: str, line: int) -> tuple[str, str]:
    rows = text.splitlines(keepends=True)
    return "".join(rows[:line]), "".join(rows[line:])


def _offset(rows: list[str], line: int | None, column: int | None) -> int:
    """The text offset of an AST position (``col_offset`` counts UTF-8 bytes)."""
    line, column = line or 1, column or 0
    return sum(len(row) for row in rows[:line - 1]) + len(rows[line - 1].encode()[:column].decode())


def _free_name(text: str, name: str) -> str:
    while re.search(rf"\b{name}\b", text):
        name += "_"
    return name
