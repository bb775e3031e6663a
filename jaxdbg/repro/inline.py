"""Paste the user's own modules into the script that imports them, so a reduced script stands alone.

A project's ``train.py`` usually does ``from models import CNN``, with ``models.py`` beside it. A reduction of
``train.py`` alone keeps that import, and the reproducer then only runs inside the user's folder. Here each
top-level ``import m`` / ``from m import a`` of a module ``m.py`` in the same folder is replaced by the text of
``m.py`` (its ``if __name__ == "__main__":`` blocks blanked, its own sibling imports pasted the same way), and
``m.attr`` becomes ``attr``. Every line of the result remembers the file and line it came from, so a failure
located in ``models.py`` is found again in the combined script.

A module is left imported (the result is then not standalone, which verification will say) when pasting it
could change what a name means: a top-level name bound by two of the files to different things (they would
share one namespace), ``m`` used other than as ``m.attr``, a package, or an import cycle.

Example:
    >>> import os, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> _ = open(os.path.join(folder, "models.py"), "w").write("def width():\\n    return 3\\n")
    >>> _ = open(os.path.join(folder, "train.py"), "w").write("import models\\nprint(models.width())\\n")
    >>> combined = inline_local_modules(os.path.join(folder, "train.py"))
    >>> print(combined.text, end="")
    def width():
        return 3
    print(width())
    >>> combined.modules, combined.line_of(os.path.join(folder, "models.py"), 2)
    (('models',), 2)
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass

from jaxdbg._errors import UsageError

MAX_DEPTH = 8


@dataclass(frozen=True)
class Combined:
    """A script with its sibling modules pasted in; ``origins[i]`` is the (real path, line) of line ``i + 1``."""

    text: str
    origins: tuple[tuple[str, int], ...]
    modules: tuple[str, ...]

    def line_of(self, path: str, line: int) -> int | None:
        """The line of the combined text that was line ``line`` of ``path``, or None."""
        wanted = (os.path.realpath(path), line)
        return next((i + 1 for i, origin in enumerate(self.origins) if origin == wanted), None)


def blank_main_blocks(source: str) -> str:
    """Replace top-level ``if __name__ == "__main__":`` blocks by blank lines (line numbers stay put)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        raise UsageError(f"the target module has a syntax error at line {err.lineno}: {err.msg}") from None
    lines = source.splitlines()
    for node in tree.body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) and "__name__" in ast.unparse(node.test):
            for i in range(node.lineno - 1, node.end_lineno or node.lineno):
                lines[i] = ""
    return "\n".join(lines) + "\n"


class _Refused(Exception):
    """This module cannot be pasted safely; it stays imported."""


def inline_local_modules(path: str, source: str | None = None, folder: str | None = None) -> Combined | None:
    """The file at ``path`` (or ``source``, read as if it were that file) with the modules it imports from
    ``folder`` (default: its own) pasted in; None when it imports none that could be pasted."""
    if source is None:
        with open(path) as handle:
            source = handle.read()
    refused: set[str] = set()
    while True:  # each round keeps one more module imported, until no name means two things
        modules: list[str] = []
        lines = _inline(os.path.realpath(path), source, modules, (os.path.realpath(path),), folder, set(), refused)
        if not modules:
            return None
        future = [pair for pair in lines if pair[0].strip() == "from __future__ import annotations"]
        rest = [pair for pair in lines if pair not in future]
        lines = future[:1] + rest  # a pasted module's __future__ import must come first in the combined file
        combined = Combined("\n".join(text for text, _ in lines) + "\n", tuple(origin for _, origin in lines),
                            tuple(modules))
        clash = _clash(combined, os.path.realpath(path))
        if clash is None:
            return combined
        refused.add(clash)


def _clash(combined: Combined, main: str) -> str | None:
    """A pasted module (its path) that binds a top-level name another file binds to something else: pasted,
    one would overwrite the other in the one namespace left. None when there is none."""
    try:
        tree = ast.parse(combined.text)
    except SyntaxError:
        return None
    seen: dict[str, tuple[str, str]] = {}  # name -> (file, what binds it)
    for node in tree.body:
        file = combined.origins[node.lineno - 1][0]
        for name, what in _bindings(ast.Module(body=[node], type_ignores=[])).items():
            first = seen.setdefault(name, (file, what))
            if first[0] != file and not (what.startswith(("import", "from")) and what == first[1]):
                return file if file != main else first[0]
    return None


def _inline(path: str, source: str, modules: list[str], stack: tuple[str, ...], folder: str | None,
            pasted: set[str], refused: set[str]) -> list[tuple[str, tuple[str, int]]]:
    """Lines of ``source`` (with origins) with its pastable sibling imports replaced by the modules' lines."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return [(text, (path, i + 1)) for i, text in enumerate(source.splitlines())]
    raw = source.splitlines()
    out = [(text, (path, i + 1)) for i, text in enumerate(raw)]
    folder = folder or os.path.dirname(path)
    edits: list[tuple[int, int, list[tuple[str, tuple[str, int]]]]] = []  # (first line, last line, replacement)
    renames: dict[str, str] = {}  # module alias -> module name, for `m.attr` -> `attr`
    for node in tree.body:
        name = _sibling(node, folder)
        if name is None:
            continue
        module_path = os.path.realpath(os.path.join(folder, name + ".py"))
        if module_path in stack or module_path in refused or len(stack) > MAX_DEPTH:
            continue
        try:
            replacement = _paste(node, name, module_path, tree, modules, stack, renames, pasted, refused)
        except (_Refused, UsageError, SyntaxError, OSError, UnicodeDecodeError):
            continue
        edits.append((node.lineno, node.end_lineno or node.lineno, replacement))
    if not edits:
        return out
    out = _drop_prefixes(out, tree, renames, path)
    for first, last, replacement in sorted(edits, reverse=True):
        out[first - 1:last] = replacement
    return out


def _sibling(node: ast.stmt, folder: str) -> str | None:
    """The module name of a top-level import of a plain ``.py`` module in ``folder`` (not a package)."""
    if isinstance(node, ast.Import) and len(node.names) == 1:
        name = node.names[0].name
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        name = node.module
    else:
        return None
    if "." in name or not os.path.isfile(os.path.join(folder, name + ".py")):
        return None
    return name


def _paste(node: ast.stmt, name: str, module_path: str, importer: ast.Module, modules: list[str],
           stack: tuple[str, ...], renames: dict[str, str], pasted: set[str],
           refused: set[str]) -> list[tuple[str, tuple[str, int]]]:
    """The lines replacing one import: the module's (once per program: a later import of it only binds the
    names it imports), then ``alias = name`` for each ``from m import name as alias``."""
    with open(module_path) as handle:
        module_source = blank_main_blocks(handle.read())
    ast.parse(module_source)  # a module that does not parse stays imported (SyntaxError)
    if isinstance(node, ast.Import):
        alias = node.names[0].asname or name
        if not _only_attribute_reads(importer, alias):
            raise _Refused(f"{alias} is used other than as {alias}.attr")
        renames[alias] = name
    lines = [] if module_path in pasted else _inline(module_path, module_source, modules, (*stack, module_path),
                                                     None, pasted, refused)
    pasted.add(module_path)
    origin = (stack[-1], node.lineno)
    if isinstance(node, ast.ImportFrom):
        lines += [(f"{a.asname} = {a.name}", origin) for a in node.names if a.asname and a.asname != a.name]
    if name not in modules:
        modules.append(name)
    return lines


def _only_attribute_reads(tree: ast.Module, alias: str) -> bool:
    """Every use of ``alias`` is ``alias.attr`` read (not stored, not the bare name)."""
    parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == alias:
            parent = parents.get(id(node))
            if not (isinstance(parent, ast.Attribute) and isinstance(parent.ctx, ast.Load)):
                return False
    return True


def _bindings(tree: ast.Module) -> dict[str, str]:
    """Top-level names and what binds them (an import's target, else the statement kind)."""
    bound: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for a in node.names:
                bound[a.asname or a.name.split(".")[0]] = f"import {a.name if a.asname else a.name.split('.')[0]}"
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                bound[a.asname or a.name] = f"from {'.' * node.level}{node.module} import {a.name}"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound[node.name] = "definition"
        else:
            for target in ast.walk(node):
                if isinstance(target, ast.Name) and isinstance(target.ctx, ast.Store):
                    bound[target.id] = "assignment"
    return bound


def _drop_prefixes(lines: list[tuple[str, tuple[str, int]]], tree: ast.Module, renames: dict[str, str],
                   path: str) -> list[tuple[str, tuple[str, int]]]:
    """``m.attr`` -> ``attr`` for each pasted ``import m`` (edited in place: lines keep their numbers)."""
    if not renames:
        return lines
    spots = sorted(((n.lineno, n.col_offset, n.value.end_col_offset or 0) for n in ast.walk(tree)
                    if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in renames),
                   reverse=True)
    out = list(lines)
    for line, start, end in spots:
        text = out[line - 1][0].encode()
        if text[end:end + 1] != b".":
            continue  # `m . attr` spelled with spaces: left as is (the run then says m is undefined)
        edited = text[:start] + text[end + 1:]  # the name and its dot (offsets are in UTF-8 bytes)
        out[line - 1] = (edited.decode(), out[line - 1][1])
    return out
