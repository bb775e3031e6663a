"""docs/cli.md stays in step with the command line: the options of every command (read from the click
command objects typer builds) are the ones its section documents, each with the right default.

docs/cli.md has a section ``## Common options`` (options every command takes) and one section
``## jaxdbg <command>`` per command; in each, a table whose first column holds the option names in
backticks (`` `--runs N` ``, `` `-q`, `--quiet` ``) and whose second column holds the default:
``off``/``on`` for a flag, ``none...`` when there is no default value, otherwise the value in backticks.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer

from jaxdbg.cli import COMMANDS, app

CLI_MD = Path(__file__).resolve().parent.parent / "docs" / "cli.md"
_OPTION = re.compile(r"`(-{1,2}[A-Za-z][\w-]*)")


def _sections() -> dict[str, str]:
    text = CLI_MD.read_text()
    parts = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    return {title.strip(): body for title, body in zip(parts[1::2], parts[2::2])}


def _table(body: str) -> dict[str, str]:
    """Option name -> the default cell, from the rows of the section's option table(s)."""
    rows = {}
    for line in body.splitlines():
        if not line.startswith("| `-"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        for name in _OPTION.findall(cells[0]):
            rows[name] = cells[1]
    return rows


def _group():
    return typer.main.get_command(app)


def _options(command) -> dict[str, object]:
    """Every option string of a click command -> its parameter (help options included, as None)."""
    found: dict[str, object] = {}
    for param in command.params:
        if param.param_type_name == "option":
            for name in (*param.opts, *param.secondary_opts):
                found[name] = param
    for name in command.context_settings.get("help_option_names", []) or _group().context_settings["help_option_names"]:
        found[name] = None
    return found


SECTIONS = _sections()
COMMON = _table(SECTIONS["Common options"])
NAMES = sorted(_group().commands)


def test_every_command_has_a_section() -> None:
    assert set(NAMES) == {name.replace("_", "-") for name in COMMANDS}
    documented = {title.split(" ", 1)[1] for title in SECTIONS if title.startswith("jaxdbg ")}
    assert documented == set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_documented_options_are_the_commands_options(name: str) -> None:
    command = _group().commands[name]
    own = _table(SECTIONS[f"jaxdbg {name}"])
    documented = set(own) | set(COMMON)
    actual = set(_options(command))
    missing, extra = sorted(actual - documented), sorted(documented - actual)
    assert not missing, f"options of 'jaxdbg {name}' missing from docs/cli.md: {missing}"
    assert not extra, f"docs/cli.md documents options 'jaxdbg {name}' does not take: {extra}"
    assert not set(own) & set(COMMON), "an option is documented both as common and as the command's own"


def test_root_options() -> None:
    root = _table(SECTIONS["jaxdbg"])
    actual = {name for name, param in _options(_group()).items() if param is not None}
    assert set(root) == actual == {"--version", "--processes"}


def _default_matches(param, cell: str) -> bool:
    if param.is_flag and param.default is not None:  # a tri-state --x/--no-x flag defaults to None: "none (...)"
        return cell == ("on" if param.default else "off")
    if param.default is None:
        return cell.startswith("none")
    match = re.match(r"`([^`]+)`", cell)
    if not match:
        return False
    written = match.group(1)
    if isinstance(param.default, (int, float)) and not isinstance(param.default, bool):
        try:
            return float(written) == float(param.default)
        except ValueError:
            return False
    return written == str(param.default)


@pytest.mark.parametrize("name", NAMES)
def test_documented_defaults_are_the_real_ones(name: str) -> None:
    own = _table(SECTIONS[f"jaxdbg {name}"])
    wrong = []
    for option, param in _options(_group().commands[name]).items():
        if param is None:
            continue
        cell = own.get(option, COMMON.get(option))
        if not _default_matches(param, cell):
            wrong.append(f"{option}: documented {cell!r}, real default {param.default!r}")
    assert not wrong, wrong


def test_the_parser_reads_the_tables() -> None:
    """The checks above compare sets; they mean something only if the tables were read."""
    assert {"--json", "--out", "--timeout", "-q", "--quiet", "-v", "--verbose", "-h", "--help"} == set(COMMON)
    profile = _table(SECTIONS["jaxdbg profile"])
    assert profile["--runs"] == "`20`" and profile["--budget"] == "none"
    assert {"--lookahead", "--no-lookahead"} <= set(_table(SECTIONS["jaxdbg pipeline-bench"]))


def test_target_commands_document_their_target() -> None:
    for name in NAMES:
        command = _group().commands[name]
        takes_target = any(p.param_type_name == "argument" and p.name == "target" for p in command.params)
        usage = f"`jaxdbg {name} TARGET" if takes_target else f"`jaxdbg {name} [OPTIONS]`"
        assert usage in SECTIONS[f"jaxdbg {name}"], (name, usage)


def test_help_shows_the_default_out_folder() -> None:
    """Rich reads '[default: ...]' in a help text as markup and drops it; the --out default must show."""
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["doctor", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "jaxdbg-out/<command>-<timestamp>/" in result.output
