"""The ``[tool.jaxdbg.check]`` table of a pyproject.toml: one sub-table per check.

Each check names a jaxdbg ``command`` (``profile``, ``nan-hunt``, ``memory`` or ``hang-hunt``), a ``target``
(as on the command line, ``train.py -- --steps 50``), and optionally ``options`` (a list of extra command-line
words) and a ``budget`` (profile and memory: ``--budget``'s rules, e.g. ``peak_bytes<=2GiB`` for memory). Anything
else is refused with one line naming the key and the file, so a typo never turns a CI gate off; an unknown budget
rule or option is refused by the command that reads it, and ``jaxdbg check`` then exits 2 naming the check
(:mod:`jaxdbg.check.runner`).

Example:
    >>> import pathlib, tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "pyproject.toml").write_text(
    ...     '[tool.jaxdbg.check.step-budget]\\ncommand = "profile"\\ntarget = "train.py"\\n'
    ...     'budget = "recompiles<=0"\\noptions = ["--runs", "5"]\\n')
    >>> [(c.name, c.command, c.argv()) for c in load_checks(folder / "pyproject.toml")]
    [('step-budget', 'profile', ['--budget', 'recompiles<=0', '--runs', '5', 'train.py'])]
"""

from __future__ import annotations

import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from jaxdbg._choices import choice
from jaxdbg._errors import UsageError

Command = Literal["profile", "nan-hunt", "memory", "hang-hunt"]
COMMANDS: tuple[Command, ...] = get_args(Command)
BUDGETED = ("profile", "memory")  # commands that take --budget
_KEYS = {"command": str, "target": str, "options": list, "budget": str}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # the check's name is also its folder in --out


@dataclass(frozen=True)
class CheckSpec:
    """One check of the table; ``config`` is the file it came from, whose folder is where the check runs."""

    name: str
    command: Command
    target: str
    config: Path
    options: tuple[str, ...] = ()
    budget: str | None = None

    @property
    def folder(self) -> Path:
        return self.config.parent

    def argv(self, *extra: str) -> list[str]:
        """The command's words after ``jaxdbg <command>``: options (then ``extra``, jaxdbg check's own) before
        the target, so a script's ``-- ARGS`` stay last and reach the script alone."""
        budget = ["--budget", self.budget] if self.budget is not None else []
        return [*budget, *self.options, *extra, *shlex.split(self.target)]


def find_config(start: Path) -> Path:
    """The nearest pyproject.toml from ``start`` upwards (as pytest finds its rootdir)."""
    for folder in (start, *start.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    raise UsageError(f"no pyproject.toml in {start} or above; run jaxdbg check in your project or name the "
                     "file with --config PATH")


def load_checks(path: Path) -> tuple[CheckSpec, ...]:
    """Read and validate every check; raise :class:`UsageError` (exit 2) naming the file and key at fault."""
    where = str(path)
    if not path.is_file():
        raise UsageError(f"--config '{where}': no such file; give the path of your pyproject.toml")
    try:
        document = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise UsageError(f"{where}: not valid TOML ({err}); fix the file") from None
    table = document.get("tool", {}).get("jaxdbg", {}).get("check")
    if table is None:
        raise UsageError(f"{where}: no [tool.jaxdbg.check] table; add one sub-table per check, e.g. "
                         "[tool.jaxdbg.check.no-nan] with command = \"nan-hunt\" and target = \"train.py\"")
    if not isinstance(table, dict) or not table:
        raise UsageError(f"{where}: [tool.jaxdbg.check] must hold one sub-table per check, e.g. "
                         "[tool.jaxdbg.check.no-nan]")
    return tuple(_check(name, entry, path) for name, entry in table.items())


def _check(name: str, entry: Any, path: Path) -> CheckSpec:
    key = f"tool.jaxdbg.check.{name}"
    if not isinstance(entry, dict):
        raise UsageError(f"{path}: '{key}' must be a table with command and target, not a "
                         f"{type(entry).__name__}; write it as [{key}]")
    if not _NAME.match(name):
        raise UsageError(f"{path}: check name '{name}' must be letters, digits, '-', '_' or '.'; rename [{key}]")
    for field, value in entry.items():
        if field not in _KEYS:
            raise UsageError(f"{path}: unknown key '{field}' in [{key}]; use {', '.join(_KEYS)}")
        if not isinstance(value, _KEYS[field]):
            raise UsageError(f"{path}: '{field}' in [{key}] must be a {_KEYS[field].__name__}, not "
                             f"{type(value).__name__}")
    for field in ("command", "target"):
        if not entry.get(field, "").strip():
            raise UsageError(f"{path}: [{key}] has no '{field}'; add e.g. command = \"profile\", target = \"train.py\"")
    command = choice(entry["command"], COMMANDS)
    if command is None:
        raise UsageError(f"{path}: command '{entry['command']}' in [{key}] is not one jaxdbg check runs; use "
                         f"{' or '.join(COMMANDS)}")
    options = entry.get("options", [])
    if not all(isinstance(o, str) for o in options):
        raise UsageError(f"{path}: 'options' in [{key}] must be a list of strings, e.g. [\"--timeout\", \"300\"]")
    named = {option.split("=", 1)[0] for option in options}  # --out DIR and --out=DIR alike
    for reserved in ("--out", "--json", "--budget"):
        if reserved in named:
            raise UsageError(f"{path}: 'options' in [{key}] sets {reserved}, which jaxdbg check sets itself"
                             + ("; use the budget key" if reserved == "--budget" else "; leave it out"))
    budget = entry.get("budget")
    if budget is not None and command not in BUDGETED:
        raise UsageError(f"{path}: 'budget' in [{key}] needs command = \"profile\" or \"memory\" ({command} has no "
                         "budget)")
    # The budget's rules and the options are read by the command itself (importing the profiler here would
    # cost every run a second); a check whose command refuses them makes jaxdbg check exit 2 naming the check.
    try:
        shlex.split(entry["target"])
    except ValueError as err:
        raise UsageError(f"{path}: target in [{key}] cannot be split into words ({err}); check its quotes") from None
    return CheckSpec(name, command, entry["target"], path.resolve(), tuple(options), budget)
