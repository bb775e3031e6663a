"""jaxdbg's import graph: no cycles, the core imports no command package, repro keeps its imports plain.

Read from the package's source with ``ast`` (nothing is imported), so the checks take milliseconds. An edge is
any import of one jaxdbg module by another, at the top of a module or inside a function (a function-level
import is how a cycle hides); imports under ``if TYPE_CHECKING:`` name types only and do not count.
"""

from __future__ import annotations

import ast
import itertools
import os
from dataclasses import dataclass

import jaxdbg

PACKAGE = os.path.dirname(os.path.abspath(jaxdbg.__file__))

# Cycles known and left for later, each with who owns it; the test fails when one grows, a new one appears,
# or one is gone (then its entry goes too).
KNOWN_CYCLES: dict[frozenset[str], str] = {}
# Packages held to plain imports: every import of a jaxdbg module at module level, no private name of another
# module imported, and a function-level import (of a heavy dependency) says why in a comment.
PLAIN_IMPORTS = ("jaxdbg.repro",)
# The core: what every command builds on. It imports no command (the command packages, cli, doctor).
CORE_PACKAGES = ("jaxdbg.jaxpr", "jaxdbg.schema")
# jaxdbg.results maps each command to its result type (the typed report reader's table): it knows every command.
NOT_CORE = ("jaxdbg", "jaxdbg.__main__", "jaxdbg.doctor", "jaxdbg.pytest_plugin", "jaxdbg.results")


@dataclass(frozen=True)
class Import:
    importer: str
    target: str  # the jaxdbg module imported (a submodule where ``from package import submodule``)
    name: str | None  # the name taken from it (``from target import name``), else None
    line: int
    in_function: bool
    comment: bool  # a comment on the import's line or the line above


def _modules() -> dict[str, str]:
    """Module name -> file, for every module of the package."""
    found = {}
    for folder, _, files in os.walk(PACKAGE):
        for file in files:
            if file.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, file), os.path.dirname(PACKAGE))[:-3].split(os.sep)
                found[".".join(rel[:-1] if rel[-1] == "__init__" else rel)] = os.path.join(folder, file)
    return found


MODULES = _modules()


def _resolve(importer: str, node: ast.Import | ast.ImportFrom) -> list[tuple[str, str | None]]:
    """(jaxdbg module, name taken) for each name the import statement binds."""
    pairs: list[tuple[str, str | None]] = []
    if isinstance(node, ast.Import):
        pairs = [(alias.name, None) for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = importer.split(".")[: len(importer.split(".")) - node.level + MODULES[importer].endswith(
                "__init__.py")]
            base = ".".join(parts + ([node.module] if node.module else []))
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            pairs.append((submodule, None) if submodule in MODULES else (base, alias.name))
    resolved = []
    for module, name in pairs:
        while module and module not in MODULES:  # `import jaxdbg.x.y` binds jaxdbg: the module is the longest known
            module = module.rpartition(".")[0]
        if module.startswith("jaxdbg"):
            resolved.append((module, name))
    return resolved


def _imports(module: str) -> list[Import]:
    with open(MODULES[module]) as handle:
        source = handle.read()
    lines = source.splitlines()
    found: list[Import] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for other in child.orelse:
                    visit(other, in_function)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                here = lines[child.lineno - 1]
                above = lines[child.lineno - 2].strip() if child.lineno > 1 else ""
                comment = "#" in here[here.find("import"):] or above.startswith("#")
                targets = _resolve(module, child) or [("", None)]  # "": not of jaxdbg (a lazy import still counts)
                found.extend(Import(module, target, name, child.lineno, in_function, comment)
                             for target, name in targets)
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(ast.parse(source), False)
    return found


IMPORTS = {module: _imports(module) for module in MODULES}
GRAPH = {module: {i.target for i in imports if i.target and i.target != module} for module, imports in IMPORTS.items()}


def _cycles() -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(GRAPH[node]):
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for node in sorted(GRAPH):
        if node not in index:
            connect(node)
    return found


def _a_loop(component: frozenset[str]) -> str:
    """One loop through ``component``, each step with the line of its import: what to cut."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        node = frontier.pop(0)
        for other in sorted(GRAPH[node] & component):
            if other == start:
                loop = [*paths[node], start]
                steps = [f"{a} (line {next(i.line for i in IMPORTS[a] if i.target == b)})"
                         for a, b in itertools.pairwise(loop)]
                return " -> ".join(steps) + f" -> {start}"
            if other not in paths:
                paths[other] = [*paths[node], other]
                frontier.append(other)
    return ", ".join(sorted(component))


def test_the_package_has_no_import_cycle():
    cycles = _cycles()
    new = [c for c in cycles if c not in KNOWN_CYCLES]
    assert not new, "import cycles (move what both sides need into a module of its own):\n" + "\n".join(
        _a_loop(c) for c in new)
    gone = [", ".join(sorted(c)) for c in KNOWN_CYCLES if c not in cycles]
    assert not gone, f"no longer a cycle, remove it from KNOWN_CYCLES: {gone}"


def test_the_core_imports_no_command():
    def core(module: str) -> bool:
        top_level = os.path.dirname(MODULES[module]) == PACKAGE and module not in NOT_CORE  # jaxdbg/x.py
        return top_level or module.startswith(tuple(p + "." for p in CORE_PACKAGES)) or module in CORE_PACKAGES

    wrong = [f"{i.importer} (line {i.line}) imports {i.target}" for module in MODULES if core(module)
             for i in IMPORTS[module] if i.target and not core(i.target) and i.target != "jaxdbg"]
    assert not wrong, "the core reaches up into a command (move what it needs down into the core):\n" + "\n".join(
        dict.fromkeys(wrong))


def test_repro_imports_at_module_level_and_takes_no_private_name():
    held = [m for m in MODULES if m.startswith(PLAIN_IMPORTS)]
    assert len(held) > 20  # the rule reads repro's modules, not an empty list
    wrong = []
    for module in held:
        for i in IMPORTS[module]:
            where = f"{module} line {i.line}"
            if i.in_function and i.target:
                wrong.append(f"{where}: imports {i.target} inside a function (import it at module level)")
            elif i.in_function and not i.comment:
                wrong.append(f"{where}: a lazy import says why in a comment (a heavy dependency, ...)")
            if i.name and i.name.startswith("_") and not i.name.startswith("__") and i.target != module:
                wrong.append(f"{where}: takes the private name {i.name} of {i.target} (make it public, or move it)")
    assert not wrong, "\n".join(dict.fromkeys(wrong))
