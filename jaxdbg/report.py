"""Reports: the contract's JSON envelope around a command's result, and the output folder.

Results are frozen dataclasses (a failed command's is ``{"error": ...}``); :func:`to_jsonable` derives their
JSON, so nobody hand-builds dictionaries for the wire. A field whose JSON name is a Python keyword says so
in its metadata (``field(metadata={"json": "pass"})``); ``{"json": None}`` keeps a field out of the JSON (a
traceback for ``-v``). Non-finite floats become the strings ``"nan"``, ``"inf"``, ``"-inf"`` (JSON has no
literal for them). Each command's result also says, in one line, what it
found (:class:`Result`), for ``-q`` and CI.

Example:
    >>> report = Report(command="doctor", target=None, result={"ok": True}, exit_code=0)
    >>> report.to_dict(environment={"backend": "cpu"})["result"]
    {'ok': True}
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import math
import os
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from jaxdbg._errors import UsageError
from jaxdbg._version import __version__


@runtime_checkable
class Result(Protocol):
    """What every command's result offers besides its fields."""

    def essential_line(self) -> str | None:
        """One line that says what the command found (a NaN origin, a broken budget, a failed check), or None."""


def to_jsonable(value: Any) -> Any:
    """Dataclasses, numpy values, paths, enums, tuples -> plain JSON-ready Python."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.metadata.get("json", f.name): to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)
                if f.metadata.get("json", f.name) is not None}  # metadata {"json": None}: kept out of the JSON
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, enum.Enum):
        return to_jsonable(value.value)
    if isinstance(value, (np.bool_, bool)):
        return bool(value)
    if isinstance(value, (np.integer, int)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        number = float(value)
        if math.isnan(number):
            return "nan"
        if math.isinf(number):
            return "inf" if number > 0 else "-inf"
        return number
    if isinstance(value, np.ndarray):
        return to_jsonable(value.tolist())
    if isinstance(value, Path):
        return str(value)
    return value


def environment_info() -> dict:
    """The envelope's ``environment``: jax/jaxlib versions, backend, devices, python, and this process's place
    in a multi-process job (imports jax and starts its backend: call it after the program's own
    ``jax.distributed.initialize()``)."""
    import jax
    import jaxlib

    return {
        "jax": jax.__version__,
        "jaxlib": getattr(jaxlib, "__version__", "unknown"),
        "backend": jax.default_backend(),
        "devices": [
            {"id": d.id, "platform": d.platform, "kind": getattr(d, "device_kind", ""),
             "process_index": d.process_index}
            for d in jax.devices()
        ],
        "python": platform.python_version(),
        "process_index": jax.process_index(),  # a multi-process job (jax.distributed): which process wrote this
        "process_count": jax.process_count(),
    }


@dataclass
class Report:
    """One command's report: the contract's envelope minus what is filled at write time."""

    command: str
    target: str | None
    result: Any
    exit_code: int
    artifacts: dict[str, str] = field(default_factory=dict)
    environment: dict | None = None  # None: filled from this process when written

    def to_dict(self, environment: dict | None = None) -> dict:
        return {
            "tool": "jaxdbg",
            "version": __version__,
            "command": self.command,
            "target": self.target,
            "environment": environment or self.environment or environment_info(),
            "result": to_jsonable(self.result),
            "artifacts": {k: str(v) for k, v in self.artifacts.items()},
            "exit_code": self.exit_code,
        }


def write_json(report: Report, destination: str) -> None:
    """Write the report as JSON to a path, or to stdout for ``-`` (then nothing else goes to stdout)."""
    text = json.dumps(report.to_dict(), indent=2, allow_nan=False)
    if destination == "-":
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
        return
    path = Path(destination)
    if not path.parent.exists():
        raise UsageError(
            f"--json '{destination}': folder '{path.parent}' does not exist; create it or pick another path")
    path.write_text(text + "\n")


def resolve_out_dir(out: str | None, command: str) -> Path:
    """The artifacts folder: ``--out`` (its parent must exist) or ``jaxdbg-out/<command>-<timestamp>/``."""
    if out:
        path = Path(out)
        if not path.parent.exists():
            raise UsageError(
                f"--out '{out}': parent folder '{path.parent}' does not exist; create it first or choose another --out"
            )
        if path.exists() and not path.is_dir():
            raise UsageError(f"--out '{out}' is a file, not a folder; choose a folder for the artifacts")
    else:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        path = Path("jaxdbg-out") / f"{command}-{stamp}"
    path.mkdir(parents=out is None, exist_ok=True)
    return path


def process_folder(out_dir: Path, environment: dict | None) -> Path:
    """The output folder of this process: ``out_dir`` itself, or its ``process-<index>/`` in a multi-process
    job (every process runs the same command line, maybe on one machine).

    Example:
        >>> str(process_folder(Path("out"), {"process_index": 1, "process_count": 4}))
        'out/process-1'
    """
    env = environment or {}
    if env.get("process_count", 1) <= 1:
        return out_dir
    return out_dir / f"process-{env['process_index']}"


def relative_or_absolute(path: str | os.PathLike) -> str:
    """A path as short as it can be said: relative to the current folder when inside it."""
    text = os.fspath(path)
    try:
        rel = os.path.relpath(text)
    except ValueError:
        return text
    return text if rel.startswith("..") else rel
