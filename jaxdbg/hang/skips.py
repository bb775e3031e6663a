"""Where a loop can go past a call: the ``continue``, ``break`` and ``return`` before it in the loop's body, and the
``if`` it runs under, read from the user's source.

A process that ran fewer collective calls than the others skipped one; in a training loop that is almost always
a condition that differs between processes (``jax.process_index()``, the local data, an early exit). hang-hunt
knows the line where the others wait; this module names the lines of that loop that can skip it, so the hint
points at them instead of "find the call it skipped".

Example:
    >>> import tempfile, textwrap
    >>> source = textwrap.dedent('''
    ...     for step in range(10):
    ...         x = next(batches)
    ...         if x is None and jax.process_index() == 1:
    ...             continue
    ...         loss = train_step(x)
    ... ''')
    >>> with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as handle:
    ...     _ = handle.write(source)
    >>> [(p.line, p.kind, p.condition) for p in skip_points(handle.name, 6)]
    [(5, 'continue', 'x is None and jax.process_index() == 1')]
"""

from __future__ import annotations

import ast
import dataclasses
import os
from dataclasses import dataclass

MAX_POINTS = 3  # the hint names at most this many (the nearest the call first)


@dataclass(frozen=True)
class SkipPoint:
    """A line that can take the loop past the call: ``continue``/``break``/``return`` (with the ``if`` condition
    it stands under, if any), or ``if``: the call runs only under ``condition``."""

    line: int
    kind: str
    condition: str | None = None
    in_loop: bool = True  # False: the call stands in no loop, only under ifs (``if jax.process_index() == 0:``)

    def words(self, path: str) -> str:
        """```continue` at train.py:35 (under `if step % 4 == 3`)``."""
        at = f"{os.path.basename(path)}:{self.line}"
        if self.kind == "if":
            return f"the `if {self.condition}` at {at} around the call"
        under = f" (under `if {self.condition}`)" if self.condition else ""
        return f"the `{self.kind}` at {at}{under}"


def skip_points(path: str, line: int) -> list[SkipPoint]:
    r"""The lines of the innermost loop around ``line`` of ``path`` that can skip it, nearest first; outside any
    loop, the ``if`` statements around it; [] where the file cannot be read.

        >>> import tempfile
        >>> with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as handle:
        ...     _ = handle.write("score = evaluate(w)\nif jax.process_index() == 0:\n    sync('metrics')\n")
        >>> [(p.line, p.kind, p.condition, p.in_loop) for p in skip_points(handle.name, 3)]
        [(2, 'if', 'jax.process_index() == 0', False)]
    """
    try:
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return []
    chain = _chain(tree, line)
    loops = [i for i, node in enumerate(chain) if isinstance(node, (ast.For, ast.While, ast.AsyncFor))]
    if not loops:
        return [dataclasses.replace(point, in_loop=False) for point in _ifs_around(chain, line)][:MAX_POINTS]
    loop_at = loops[-1]
    loop = chain[loop_at]
    assert isinstance(loop, (ast.For, ast.While, ast.AsyncFor))
    found = _ifs_around(chain[loop_at + 1:], line)  # the ifs between the loop and the call: it runs under them
    for stmt in loop.body:
        for exit_, under in _exits(stmt, None):
            if exit_.lineno < line:
                found.append(SkipPoint(exit_.lineno, _KINDS[type(exit_)], under))
    found.sort(key=lambda point: -point.line)
    return found[:MAX_POINTS]


_KINDS = {ast.Continue: "continue", ast.Break: "break", ast.Return: "return"}


def _ifs_around(chain: list[ast.AST], line: int) -> list[SkipPoint]:
    """The ``if`` statements of ``chain`` whose body (or else branch) holds ``line``: the call runs only under them."""
    found = []
    for node in chain:
        if isinstance(node, ast.If) and not _spans(node.test, line):
            in_else = any(_spans(stmt, line) for stmt in node.orelse)
            condition = ast.unparse(node.test)
            found.append(SkipPoint(node.lineno, "if", f"not ({condition})" if in_else else condition))
    return found


def _chain(tree: ast.AST, line: int) -> list[ast.AST]:
    """The statements that contain ``line``, outermost first."""
    chain: list[ast.AST] = []
    node: ast.AST | None = tree
    while node is not None:
        inner = next((child for child in ast.iter_child_nodes(node)
                      if isinstance(child, ast.stmt) and _spans(child, line)), None)
        if inner is not None:
            chain.append(inner)
        node = inner
    return chain


def _spans(node: ast.AST, line: int) -> bool:
    start, end = getattr(node, "lineno", None), getattr(node, "end_lineno", None)
    return start is not None and end is not None and start <= line <= end


def _exits(node: ast.AST, condition: str | None) -> list[tuple[ast.stmt, str | None]]:
    """The ``continue``/``break``/``return`` statements of ``node`` that leave the enclosing loop's iteration (not
    those of a nested loop or function), each with the innermost ``if`` condition it stands under."""
    if isinstance(node, (ast.Continue, ast.Break, ast.Return)):
        return [(node, condition)]
    if isinstance(node, (ast.For, ast.While, ast.AsyncFor, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                         ast.Lambda)):
        return []  # their continue/break/return are their own
    found = []
    if isinstance(node, ast.If):
        test = ast.unparse(node.test)
        for stmt in node.body:
            found += _exits(stmt, test)
        for stmt in node.orelse:
            found += _exits(stmt, f"not ({test})")
        return found
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.stmt | ast.excepthandler):
            found += _exits(child, condition)
    return found
