"""Which lock (or event, queue, thread) a stuck thread waits for, and which thread holds that lock.

Python's locks do not record their owner (an ``RLock`` does), so the owner is read from the code: a frame
whose current line lies inside a ``with lock:`` block (or after a ``lock.acquire()`` in the same function
with no ``release()`` between) holds that lock. The object a line names (``lock``, ``self.lock``,
``locks["io"]``) is looked up in the frame's own variables without running any of the program's code
(no properties, no ``__getattr__``), and compared by identity, so two names for one lock are one lock.

Example:
    >>> import sys, threading
    >>> lock = threading.Lock()
    >>> def held():
    ...     with lock:
    ...         return holds(sys._getframe())
    >>> [(name, obj is lock, line > 0) for name, obj, line in held()]
    [('lock', True, True)]
"""

from __future__ import annotations

import ast
import functools
import inspect
import linecache
from typing import Any

from jaxdbg._source import is_user_file

_WAIT_METHODS = {"acquire": "lock", "wait": "wait", "get": "queue", "join": "thread", "result": "future",
                 "put": "queue", "wait_for": "wait"}


@functools.lru_cache(maxsize=256)
def _tree(filename: str) -> ast.Module | None:
    text = "".join(linecache.getlines(filename))
    if not text:
        return None
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError):
        return None


def _statements_at(tree: ast.Module, line: int) -> list[ast.AST]:
    """The nodes whose span holds ``line``, outermost first."""
    found: list[ast.AST] = []
    nodes: list[ast.AST] = [tree]
    while nodes:
        node = nodes.pop()
        for child in ast.iter_child_nodes(node):
            start, end = getattr(child, "lineno", None), getattr(child, "end_lineno", None)
            if start is not None and end is not None and start <= line <= end:
                found.append(child)
                nodes.append(child)
    return found


def value_of(expression: ast.AST, frame: Any) -> Any:
    """The object an expression names in ``frame`` (names, attributes, constant subscripts), found without
    running the program's code; None where it cannot be."""
    if isinstance(expression, ast.Name):
        for scope in (frame.f_locals, frame.f_globals, frame.f_builtins):
            if expression.id in scope:
                return scope[expression.id]
        return None
    if isinstance(expression, ast.Attribute):
        owner = value_of(expression.value, frame)
        if owner is None:
            return None
        try:
            found = inspect.getattr_static(owner, expression.attr)
        except AttributeError:
            return None
        return None if isinstance(found, (property, staticmethod, classmethod)) else found
    if isinstance(expression, ast.Subscript) and isinstance(expression.slice, ast.Constant):
        owner = value_of(expression.value, frame)
        if isinstance(owner, (dict, list, tuple)):
            try:
                return owner[expression.slice.value]  # type: ignore[index]  # a wrong key type is caught below
            except (KeyError, IndexError, TypeError):
                return None
    return None


def wait_expressions(filename: str, line: int) -> list[tuple[str, ast.expr]]:
    """``(kind, expression)`` candidates of what ``line`` waits on, innermost first: ``with X:`` (kind
    ``lock``), ``X.acquire()`` (``lock``), ``X.wait()``, ``X.get()``, ``X.join()``, ``X.result()``."""
    tree = _tree(filename)
    if tree is None:
        return []
    found: list[tuple[str, ast.expr]] = []
    for node in reversed(_statements_at(tree, line)):
        if isinstance(node, (ast.With, ast.AsyncWith)) and node.lineno == line:
            found.extend(("lock", item.context_expr) for item in node.items)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.lineno <= line:
            kind = _WAIT_METHODS.get(node.func.attr)
            if kind is not None:
                found.append((kind, node.func.value))
    return found


def held_expressions(filename: str, line: int) -> list[tuple[ast.expr, int]]:
    """``(expression, line it was taken at)`` of what a frame at ``line`` holds: the items of the ``with``
    blocks whose body holds the line, and ``X.acquire()``-d names of the function not released since."""
    tree = _tree(filename)
    if tree is None:
        return []
    enclosing = _statements_at(tree, line)
    held: list[tuple[ast.expr, int]] = []
    for node in enclosing:
        if isinstance(node, (ast.With, ast.AsyncWith)) and node.body and node.body[0].lineno <= line:
            held.extend((item.context_expr, node.lineno) for item in node.items)
    function = next((n for n in reversed(enclosing) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))),
                    None)
    held.extend(_acquired(function or tree, line))
    return held


def waited_object(frame: Any) -> tuple[str, str, Any] | None:
    """``(kind, name as written, object)`` of what the frame's current line waits on (see
    :func:`wait_expressions`); None if the line waits on nothing it names."""
    for kind, expression in wait_expressions(frame.f_code.co_filename, frame.f_lineno):
        obj = value_of(expression, frame)
        if kind == "lock" and not is_lock(obj):
            continue
        if obj is not None:
            named = "lock" if is_lock(obj) else _waitable(obj) if kind == "wait" else kind
            return named, ast.unparse(expression), obj
    return None


def _waitable(obj: Any) -> str:
    """What ``obj.wait()`` waits on, in words: ``event``, ``condition``, ``barrier`` (else ``wait``).

        >>> import threading
        >>> _waitable(threading.Event()), _waitable(threading.Condition()), _waitable(object())
        ('event', 'condition', 'wait')
    """
    import threading

    for kind, cls in (("event", threading.Event), ("condition", threading.Condition), ("barrier", threading.Barrier)):
        if isinstance(obj, cls):
            return kind
    return "wait"


def set_sites(filename: str, name: str) -> list[tuple[int, str]]:
    r"""``(line, function)`` of each ``name.set()`` written in the file: where an event waited for on ``name`` can
    be set (``<module>`` at the top level).

        >>> import tempfile
        >>> with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        ...     _ = f.write("import threading\nready = threading.Event()\ndef watcher():\n    ready.set()\n")
        >>> set_sites(f.name, "ready")
        [(4, 'watcher')]
    """
    tree = _tree(filename)
    if tree is None:
        return []
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inside = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and child.func.attr == "set"
                    and ast.unparse(child.func.value) == name):
                found.append((child.lineno, function))
            visit(child, inside)

    visit(tree, "<module>")
    return sorted(found)


def queue_uses(frame: Any) -> list[tuple[str, Any, int]]:
    """``(op, queue, line)`` for each ``q.get(...)``/``q.put(...)`` (``_nowait`` too) written in the function the
    frame runs (anywhere in it: a loop takes again at a line it is not at now), ``op`` being ``get`` or ``put``: the
    queues the thread drains or fills, which a thread blocked on the other side of one waits for.

        >>> import queue, sys
        >>> q = queue.Queue(maxsize=1)
        >>> def consumer():
        ...     uses = queue_uses(sys._getframe())
        ...     q.get_nowait()
        ...     return uses
        >>> _ = q.put(1); [(op, obj is q) for op, obj, _ in consumer()]
        [('get', True)]
    """
    tree = _tree(frame.f_code.co_filename)
    if tree is None:
        return []
    scope: ast.AST = next((n for n in reversed(_statements_at(tree, frame.f_lineno))
                           if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), tree)
    found = []
    for node in _own_nodes(scope):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("get", "get_nowait", "put", "put_nowait"):
            obj = value_of(node.func.value, frame)
            if is_queue(obj):
                found.append((node.func.attr.split("_")[0], obj, node.lineno))
    return found


def _own_nodes(scope: ast.AST) -> list[ast.AST]:
    """The nodes of a function (or module) body, without those of the functions, lambdas and classes it defines:
    they run in frames of their own."""
    found: list[ast.AST] = []
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return found


def is_queue(obj: Any) -> bool:
    """A ``queue.Queue`` (or one of its subclasses): bounded by ``maxsize``, its items in ``queue``."""
    return isinstance(getattr(obj, "maxsize", None), int) and hasattr(obj, "queue") and hasattr(obj, "put")


def holds(frame: Any) -> list[tuple[str, Any, int]]:
    """``(name, lock, line)`` for every lock the frame holds at its current line: inside a ``with`` block on
    it, or after an ``acquire()`` in the same function that no ``release()`` followed."""
    held = []
    for expression, line in held_expressions(frame.f_code.co_filename, frame.f_lineno):
        obj = value_of(expression, frame)
        if is_lock(obj):
            held.append((ast.unparse(expression), obj, line))
    return held


def _acquired(scope: ast.AST, line: int) -> list[tuple[ast.expr, int]]:
    """Names ``X.acquire()``-d on an earlier line of ``scope`` with no ``X.release()`` since."""
    calls = sorted((n for n in ast.walk(scope) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                    and n.func.attr in ("acquire", "release") and n.lineno < line), key=lambda n: n.lineno)
    open_: dict[str, tuple[ast.expr, int]] = {}
    for call in calls:
        assert isinstance(call.func, ast.Attribute)
        name = ast.unparse(call.func.value)
        if call.func.attr == "release":
            open_.pop(name, None)
        else:
            open_[name] = (call.func.value, call.lineno)
    return list(open_.values())


def called_name(filename: str, line: int) -> str | None:
    """The name of the function a line calls (``step`` of ``w, loss = step(w, x)``), or None.

        >>> called_name(__file__, 0) is None
        True
    """
    tree = _tree(filename)
    if tree is None:
        return None
    for node in reversed(_statements_at(tree, line)):
        if isinstance(node, ast.Call) and node.lineno == line:
            func = node.func
            return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    return None


def is_lock(obj: Any) -> bool:
    """A ``threading.Lock`` or ``RLock`` (what ``with`` and ``acquire`` block on, and a thread holds)."""
    kind = type(obj).__name__
    return kind in ("lock", "RLock", "_RLock") and hasattr(obj, "acquire") and hasattr(obj, "release")


def rlock_owner(obj: Any) -> int | None:
    """The thread ident that holds an ``RLock`` (its repr says), else None."""
    text = repr(obj)
    if "owner=" not in text:
        return None
    number = text.split("owner=", 1)[1].split()[0].rstrip(">")
    return int(number) if number.isdigit() and number != "0" else None


def user_frames(frame: Any) -> list[Any]:
    """The frames of a thread's stack that lie in user files, innermost first."""
    found = []
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            found.append(frame)
        frame = frame.f_back
    return found
