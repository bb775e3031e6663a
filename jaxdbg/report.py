"""Reports: the contract's JSON envelope around a command's result, and the output folder.

Results are frozen dataclasses (a failed command's is ``{"error": ...}``); :func:`to_jsonable` derives their
JSON, so nobody hand-builds dictionaries for the wire. A field whose JSON name is a Python keyword says so
in its metadata (``field(metadata={"json": "pass"})``); ``{"json": None}`` keeps a field out of the JSON (a
traceback for ``-v``). Non-finite floats become the strings ``"nan"``, ``"inf"``, ``"-inf"`` (JSON has no
literal for them). :func:`from_jsonable` undoes it: a report's JSON back into the result types, field by field
against their annotations, so a missing, renamed or mistyped field is an error naming it (never a silent None).
Each command's result also says, in one line, what it found (:class:`Result`), for ``-q`` and CI.

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
import types
import typing
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar, Union, runtime_checkable

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
    np = sys.modules.get("numpy")  # a numpy value exists only where numpy is imported: not imported for it here
    if isinstance(value, bool) or (np is not None and isinstance(value, np.bool_)):
        return bool(value)
    if isinstance(value, int) or (np is not None and isinstance(value, np.integer)):
        return int(value)
    if isinstance(value, float) or (np is not None and isinstance(value, np.floating)):
        number = float(value)
        if math.isnan(number):
            return "nan"
        if math.isinf(number):
            return "inf" if number > 0 else "-inf"
        return number
    if np is not None and isinstance(value, np.ndarray):
        return to_jsonable(value.tolist())
    if isinstance(value, Path):
        return str(value)
    return value


T = TypeVar("T")
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}  # to_jsonable's spelling of non-finite floats


class ReportReadError(UsageError):
    """A report's JSON does not match the result type; the message names the field (``result.first.pass``)."""


def from_jsonable(kind: type[T], value: Any, where: str = "result") -> T:
    """Undo :func:`to_jsonable`: ``value`` (JSON data) as an instance of ``kind``, checked against its annotations.

    Dataclasses (nested, by their JSON names), ``X | None``, unions, ``Literal``, enums, tuples, lists, dicts,
    paths and non-finite floats come back as they were; ``Any`` and bare ``dict``/``list`` fields as the JSON
    holds them. A field missing, unknown, or of the wrong type raises :class:`ReportReadError` naming its path.

    Example:
        >>> from jaxdbg._source import SourceLocation
        >>> where = SourceLocation("train.py", 7, "loss")
        >>> from_jsonable(SourceLocation, to_jsonable(where)) == where
        True
        >>> from_jsonable(SourceLocation, {"file": "train.py", "lineno": 7, "function": "loss"})
        Traceback (most recent call last):
        ...
        jaxdbg.report.ReportReadError: result: missing field 'line' (found 'lineno' instead)
    """
    return typing.cast(T, _read(kind, value, where))


def _read(kind: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(kind)
    if kind is Any or kind is object:
        return value
    if origin in (Union, types.UnionType):
        return _read_union(typing.get_args(kind), value, where)
    if origin is Literal:
        if value not in typing.get_args(kind):
            raise ReportReadError(f"{where}: {value!r} is not one of {', '.join(map(repr, typing.get_args(kind)))}")
        return value
    if origin in (tuple, list, set, frozenset):
        return _read_sequence(origin, typing.get_args(kind), value, where)
    if origin is dict:
        key_kind, value_kind = typing.get_args(kind)
        items = _expect(dict, value, where).items()
        return {_read_key(key_kind, k, where): _read(value_kind, v, f"{where}[{k!r}]") for k, v in items}
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return _read_dataclass(kind, value, where)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        try:
            return kind(value)
        except ValueError:
            raise ReportReadError(f"{where}: {value!r} is not a {kind.__name__}") from None
    return _read_plain(kind, value, where)


def _read_plain(kind: Any, value: Any, where: str) -> Any:
    """Scalars, paths, and bare containers (``dict``, ``list``: kept as the JSON holds them)."""
    if kind is type(None):
        if value is not None:
            raise ReportReadError(f"{where}: expected null, found {value!r}")
        return None
    if kind is float:
        if isinstance(value, str) and value in _NON_FINITE:
            return _NON_FINITE[value]
        return float(_expect((int, float), value, where))
    if kind is int:
        return _expect(int, value, where)
    if kind is Path:
        return Path(_expect(str, value, where))
    if kind in (tuple, set, frozenset):
        return kind(_expect(list, value, where))
    if isinstance(kind, type):
        return _expect(kind, value, where)
    raise ReportReadError(f"{where}: cannot read the type {kind!r}")


def _expect(kind: type | tuple[type, ...], value: Any, where: str) -> Any:
    """``value`` when it is a ``kind`` (a bool is not a number here), else ReportReadError."""
    if isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool):
        return value
    names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
    raise ReportReadError(f"{where}: expected {names}, found {type(value).__name__} {value!r}"[:300])


def _read_union(kinds: tuple, value: Any, where: str) -> Any:
    if value is None and type(None) in kinds:
        return None
    options = [k for k in kinds if k is not type(None)]
    errors = []
    for option in options:  # the first that reads: members of result unions differ in their fields
        try:
            return _read(option, value, where)
        except ReportReadError as err:
            errors.append(str(err))
    raise ReportReadError(errors[0] if len(errors) == 1 else f"{where}: matches none of {kinds}: "
                          + "; ".join(errors))


def _read_sequence(origin: type, args: tuple, value: Any, where: str) -> Any:
    items = _expect(list, value, where)
    if origin is tuple and args and args[-1] is not Ellipsis:  # tuple[float, float]: a fixed length
        if len(items) != len(args):
            raise ReportReadError(f"{where}: expected {len(args)} items, found {len(items)}")
        return tuple(_read(k, v, f"{where}[{i}]") for i, (k, v) in enumerate(zip(args, items)))
    item = args[0] if args else Any
    return origin(_read(item, v, f"{where}[{i}]") for i, v in enumerate(items))


def _read_key(kind: Any, key: str, where: str) -> Any:
    """A dict key: to_jsonable wrote ``str(key)``."""
    if kind in (str, Any):
        return key
    if kind is int:
        try:
            return int(key)
        except ValueError:
            raise ReportReadError(f"{where}: key {key!r} is not an integer") from None
    return _read(kind, key, f"{where} key")


@cache
def _fields_of(kind: type) -> tuple[tuple[str | None, str, Any, bool], ...]:
    """(JSON name or None when kept out of the JSON, field name, annotation, an __init__ argument) per field."""
    hints = typing.get_type_hints(kind)
    return tuple((f.metadata.get("json", f.name), f.name, hints[f.name], f.init) for f in dataclasses.fields(kind))


def _read_dataclass(kind: type, value: Any, where: str) -> Any:
    data = _expect(dict, value, where)
    fields = _fields_of(kind)
    written = {json_name for json_name, _, _, _ in fields if json_name is not None}
    unknown = [key for key in data if key not in written]
    values = {}
    for json_name, name, annotation, init in fields:
        if json_name is None:
            continue  # kept out of the JSON (a traceback for -v): its default
        if json_name not in data:
            instead = f" (found {', '.join(map(repr, unknown))} instead)" if unknown else ""
            raise ReportReadError(f"{where}: missing field {json_name!r}{instead}")
        read = _read(annotation, data[json_name], f"{where}.{json_name}")  # a field set in __post_init__: checked
        if init:
            values[name] = read
    if unknown:
        raise ReportReadError(f"{where}: unknown field {unknown[0]!r} (not in {kind.__name__})")
    return kind(**values)


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
    """The artifacts folder, absolute: ``--out`` (its parent must exist) or ``jaxdbg-out/<command>-<timestamp>/``
    (a relative one is taken from the folder jaxdbg was started in: the target's child process may change its own
    working folder, ``os.chdir`` into a run directory, before it writes the artifacts)."""
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
    try:
        path.mkdir(parents=out is None, exist_ok=True)
    except OSError as err:  # a parent that is a file, a read-only or virtual file system: the user's to change
        raise UsageError(f"--out '{path}': cannot create the folder ({err.strerror or err}); choose another "
                         "--out") from err
    return path.absolute()


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
