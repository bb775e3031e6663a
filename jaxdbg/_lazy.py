"""Names a package exports but imports only on first use (a module ``__getattr__``, PEP 562): what a command's
parent process or a job's child does not need stays unimported there (jax, the other commands' modules).

Example:
    >>> attribute("jaxdbg.memory", {"parse_bytes": "jaxdbg.memory.units"}, "parse_bytes")("1KiB")
    1024
"""

from __future__ import annotations

import importlib
from typing import Any


def attribute(package: str, lazy: dict[str, str], name: str) -> Any:
    """``name`` from the module ``lazy[name]`` (imported now), as ``package.__getattr__(name)`` answers."""
    if name in lazy:
        return getattr(importlib.import_module(lazy[name]), name)
    raise AttributeError(f"module '{package}' has no attribute '{name}'")
