"""Source locations that point at user code, never into jax, jaxlib, jaxdbg or the standard library.

Example:
    >>> loc = SourceLocation(file="train.py", line=12, function="loss_fn")
    >>> loc.as_dict()
    {'file': 'train.py', 'line': 12, 'function': 'loss_fn'}
"""

from __future__ import annotations

import os
import sys
import sysconfig
import traceback
import types
from dataclasses import asdict, dataclass
from functools import lru_cache


@dataclass(frozen=True)
class SourceLocation:
    """A line of user code: the contract's ``{"file", "line", "function"}``."""

    file: str
    line: int
    function: str

    def as_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return f"{self.file}:{self.line} ({self.function})"


@lru_cache(maxsize=1)
def _library_roots() -> tuple[str, ...]:
    """Folders whose files are never 'user code'."""
    roots = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.add(os.path.realpath(path))
    for name in ("jax", "jaxlib", "jaxdbg", "numpy", "typer", "rich", "click"):
        file = getattr(sys.modules.get(name), "__file__", None)
        if file:
            roots.add(os.path.realpath(os.path.dirname(file)))
    roots.add(os.path.realpath(os.path.dirname(os.path.dirname(__file__))) + os.sep + "jaxdbg")
    return tuple(sorted(roots))


def is_user_file(path: str | None) -> bool:
    """True for a real file that belongs to the user (not jax, jaxdbg, site-packages or stdlib)."""
    if not path or path.startswith("<"):
        return False
    real = os.path.realpath(path)
    if any(real == root or real.startswith(root + os.sep) for root in _library_roots()):
        return False
    return not _inside_a_jaxdbg_copy(os.path.dirname(real))


@lru_cache(maxsize=4096)
def _is_user_path(path: str) -> bool:
    """:func:`is_user_file`, remembered per path: asked for each frame of every watched call."""
    return is_user_file(path)


def is_user_path(path: str) -> bool:
    """:func:`is_user_file` remembered per path, for code that asks about the same few files many times (the
    stack frames of every op of an HLO module: a 400-op training step asked 1,600 times, 0.7 s uncached)."""
    return _is_user_path(path)


def is_jaxdbg_file(path: str) -> bool:
    """True for a file of jaxdbg itself (this installation or any other copy of the package)."""
    return _inside_a_jaxdbg_copy(os.path.dirname(os.path.realpath(path)))


@lru_cache(maxsize=4096)
def _inside_a_jaxdbg_copy(folder: str) -> bool:
    """True inside any copy of the jaxdbg package (an installed one and a source checkout side by side)."""
    while True:
        if os.path.basename(folder) == "jaxdbg" and os.path.exists(os.path.join(folder, "_child.py")):
            return True
        parent = os.path.dirname(folder)
        if parent == folder:
            return False
        folder = parent


def innermost_user_frame(tb: types.TracebackType | None) -> SourceLocation | None:
    """The deepest traceback frame that lies in user code, or None."""
    found = None
    for frame, lineno in traceback.walk_tb(tb):
        if is_user_file(frame.f_code.co_filename):
            found = SourceLocation(frame.f_code.co_filename, lineno, frame.f_code.co_name)
    return found


def caller_user_frame(skip: int = 1) -> SourceLocation | None:
    """The innermost user frame on the current Python stack (for hooks that run inside jax calls), walked up from
    ``sys._getframe(skip)`` (1: the caller of this function). Each frame walked is built as an object on the way
    (``sys._getframe(skip)`` builds only the one it lands on): a hook called on every call starts as close below
    the user frame as it can."""
    frame: types.FrameType | None = sys._getframe(skip)
    known = _KNOWN_CODE
    while frame is not None:
        code = frame.f_code
        entry = known.get(id(code))
        if entry is None or entry[0] is not code:
            if len(known) > 4096:
                known.clear()
            entry = known[id(code)] = (code, _is_user_path(code.co_filename), {})
        if entry[1]:
            sites = entry[2]
            site = sites.get(frame.f_lasti)  # the call's instruction: its line costs a scan of the line table
            if site is None:  # a watched loop asks for the same line on every call: one object per call site
                site = sites[frame.f_lasti] = SourceLocation(code.co_filename, frame.f_lineno, code.co_name)
            return site
        frame = frame.f_back
    return None


# Asked on every watched call, so remembered per code object, by id (hashing a code object hashes its whole
# bytecode): (the code object itself, to tell a reused id, whether it is user code, its call sites' locations
# by instruction offset).
_KNOWN_CODE: dict[int, tuple[types.CodeType, bool, dict[int, SourceLocation]]] = {}
