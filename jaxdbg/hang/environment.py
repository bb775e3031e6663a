"""The report's ``environment`` where the program never started jax's backend (stuck before any JAX work,
or a process looked at with ``--pid``): versions and this process's place, no devices.

Example:
    >>> env = fallback_environment()
    >>> env["devices"], env["process_count"] >= 1
    ([], True)
"""

from __future__ import annotations

import os
import platform
from importlib import metadata

from jaxdbg.launch import launched_place


def fallback_environment() -> dict:
    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    index, count = launched_place(os.environ) or (0, 1)
    return {"jax": version("jax"), "jaxlib": version("jaxlib"), "backend": "unknown", "devices": [],
            "python": platform.python_version(), "process_index": index, "process_count": count}
