"""The compatibility matrix (tests/compat/compat_matrix.py): each JAX feature's program against nan-hunt,
profile, repro, jaxdbg.watch, check, memory and hang-hunt, one test per cell; and docs/compat.md, generated from
the same definition, up to date.

Cost is shared: the first cell asked for starts every process of the matrix at once, with 8 CPU devices:
- one `jaxdbg check --jobs 2` of a generated pyproject: a nan-hunt check per row (the check column; each
  check's own report is also the nan-hunt cell) and one profile check running every row in one process
  (`tests/compat/profile_all.py`: the profile column);
- `jaxdbg repro` of the rows marked for it, one after another, with a bounded --max-time and no source pass;
- then one process running every row inside `jaxdbg.watch` (`tests/compat/watch_all.py`: the watch column);
- then one `jaxdbg memory` and one `jaxdbg hang-hunt` of every row in one process (`profile_all.py` again).
Each test then reads its cell. A cell the definition marks as a known bug is xfail(strict=True): it fails
loudly once the fix lands, and its entry in the definition must go (the page changes with it).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parent.parent
COMPAT = ROOT / "tests" / "compat"
sys.path.insert(0, str(COMPAT))

import compat_matrix as M  # noqa: E402 - the definition lives beside its programs

from jaxdbg.schema import schema  # noqa: E402

JAX = importlib.metadata.version("jax")
WAIT_S = 1200  # the longest any process of the matrix may take on a loaded 2-core machine
REPRO_OPTIONS = ["--max-time", "120", "--source-time", "0", "--runs", "1", "--jobs", "1"]
PROFILE_CHECK = "profile-all"
# The processes run one after another beside the check: the repro rows first (their reduction is bounded by
# wall time, so they go while only the check runs beside them), the watch, then memory and hang-hunt of every row.
CHAIN = (*(f"repro-{row.name}" for row in M.ROWS if row.repro), "watch", "memory", "hang-hunt")


def _environment() -> dict[str, str]:
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", os.environ.get("XLA_FLAGS", ""))
    return {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": f"{flags} --xla_force_host_platform_device_count={M.DEVICES}".strip()}


def _recompiles() -> int:
    return sum(f.compiles - 1 for row in M.ROWS for f in row.functions if not row.known_in("profile", JAX))


def _pyproject(folder: Path, errors: Path) -> Path:
    """Every row as a nan-hunt check, and one profile check of every row in one process."""
    rows = " ".join(row.name for row in M.ROWS)
    tables = [f'[tool.jaxdbg.check.{PROFILE_CHECK}]\ncommand = "profile"\n'  # the longest: first, beside the others
              f'target = "{COMPAT / "profile_all.py"} -- {errors} {rows}"\n'
              f'budget = "recompiles<={_recompiles()}"\noptions = ["--trace-calls", "0"]\n']
    tables += [f'[tool.jaxdbg.check.{row.name}]\ncommand = "nan-hunt"\ntarget = "{COMPAT / row.name}.py"\n'
               for row in M.ROWS]
    path = folder / "pyproject.toml"
    path.write_text("[project]\nname = 'compat-matrix'\n\n" + "\n".join(tables))
    return path


class MatrixRun:
    """The matrix's processes, started together; each accessor waits for the one it reads."""

    def __init__(self, folder: Path):
        self.folder, self.env = folder, _environment()
        self.errors = folder / "profile-errors.json"
        config = _pyproject(folder, self.errors)
        self.check = self._start("check", [sys.executable, "-m", "jaxdbg", "check", "--jobs", "2", "--config",
                                           str(config), "--json", str(folder / "check.json"), "--out",
                                           str(folder / "check"), "--timeout", str(WAIT_S)])
        self.repros: dict[str, tuple[int, dict | None]] = {}
        self.chained: subprocess.Popen | None = None  # the process of the chain below running now
        self.ended = {name: threading.Event() for name in CHAIN}
        threading.Thread(target=self._chain, daemon=True).start()

    def _start(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.folder / f"{name}.log", "w")  # noqa: SIM115 - closed with the process in stop()
        return subprocess.Popen(argv, cwd=self.folder, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)

    def _chain(self) -> None:
        """The processes of :data:`CHAIN`, one after another (three processes at a time on two cores at most,
        with the check's two)."""
        try:
            self._run_chain()
        finally:
            for ended in self.ended.values():  # a failure of the chain itself: the cells say what is missing
                ended.set()

    def _run_chain(self) -> None:
        for row in (r for r in M.ROWS if r.repro):
            out, report = self.folder / f"repro-{row.name}", self.folder / f"repro-{row.name}.json"
            code = self._run(f"repro-{row.name}", [sys.executable, "-m", "jaxdbg", "repro", f"{COMPAT / row.name}.py",
                                                   *REPRO_OPTIONS, "--out", str(out), "--json", str(report), "-q"])
            self.repros[row.name] = (code, json.loads(report.read_text()) if report.exists() else None)
        (self.folder / "watch").mkdir()
        self._run("watch", [sys.executable, str(COMPAT / "watch_all.py"), str(self.folder / "watch"),
                            *(row.name for row in M.ROWS)])
        for command in ("memory", "hang-hunt"):
            self._run(command, [sys.executable, "-m", "jaxdbg", command, str(COMPAT / "profile_all.py"), "--out",
                                str(self.folder / command), "--json", str(self.folder / f"{command}.json"), "-q",
                                "--timeout", str(WAIT_S), "--", str(self.folder / f"{command}-errors.json"),
                                *(row.name for row in M.ROWS)])

    def _run(self, name: str, argv: list[str]) -> int:
        self.chained = self._start(name, argv)
        try:
            return self._wait(self.chained)
        finally:
            self.ended[name].set()

    def _wait(self, process: subprocess.Popen) -> int:
        try:
            return process.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            return process.wait()

    def log(self, name: str) -> str:
        return (self.folder / f"{name}.log").read_text()[-3000:]

    def checks(self) -> dict[str, dict]:
        self._wait(self.check)
        path = self.folder / "check.json"
        assert path.exists(), f"jaxdbg check wrote no report:\n{self.log('check')}"
        return {c["name"]: c for c in json.loads(path.read_text())["result"]["checks"]}

    def report(self, check: str) -> dict:
        return json.loads(Path(self.checks()[check]["report"]).read_text())

    def profile_errors(self) -> dict[str, str]:
        self.checks()
        return json.loads(self.errors.read_text()) if self.errors.exists() else {}

    def watch(self, row: str) -> dict:
        self._wait_for("watch")
        path = self.folder / "watch" / "watch.json"
        assert path.exists(), f"the watch process wrote nothing:\n{self.log('watch')}"
        return json.loads(path.read_text())[row]

    def repro(self, row: str) -> tuple[int, dict | None]:
        self._wait_for(f"repro-{row}")
        return self.repros[row]

    def run_of_every_row(self, command: str) -> tuple[dict, dict[str, str]]:
        """The report of ``command`` (memory, hang-hunt) run on every row in one process, and the rows that raised."""
        self._wait_for(command)
        path, errors = self.folder / f"{command}.json", self.folder / f"{command}-errors.json"
        assert path.exists(), f"jaxdbg {command} wrote no report:\n{self.log(command)}"
        return json.loads(path.read_text()), json.loads(errors.read_text()) if errors.exists() else {}

    def _wait_for(self, name: str) -> None:
        self.ended[name].wait(timeout=WAIT_S * len(CHAIN))

    def stop(self) -> None:
        for process in (self.check, self.chained):
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    run = MatrixRun(tmp_path_factory.mktemp("compat"))
    yield run
    run.stop()


def _cells(column: str, aspect: str | None = None, where=lambda row: True) -> list:
    """One param per row, xfail(strict) where the definition knows the cell (or this aspect of it) fails."""
    params = []
    for row in M.ROWS:
        if not where(row):
            continue
        known = row.known_in(column, JAX) or (row.known_in(column, JAX, aspect) if aspect else None)
        marks = [pytest.mark.xfail(strict=True, reason=f"issue 19: {known.reason}")] if known else []
        params.append(pytest.param(row, id=row.name, marks=marks))
    return params


def _line(row: M.Row, marker: str) -> int:
    lines = [i for i, text in enumerate((COMPAT / f"{row.name}.py").read_text().splitlines(), start=1)
             if marker in text]
    assert len(lines) == 1, f"{row.name}.py: the marker {marker!r} must be on exactly one line"
    return lines[0]


def _by_name(row: M.Row) -> dict[str, list[M.Function]]:
    """The row's jitted functions by name, those of one name by their figures (compiles, calls)."""
    named: dict[str, list[M.Function]] = {}
    for function in row.functions:
        named.setdefault(function.name, []).append(function)
    return {name: sorted(functions, key=lambda f: (f.compiles, f.calls)) for name, functions in named.items()}


def _op(found: dict, row: M.Row) -> tuple:
    source = found["source"] or {}
    return (found["kind"], found["primitive"], found["pass"], os.path.basename(source.get("file", "")),
            source.get("line"))


def _expected(op: M.Op, row: M.Row) -> tuple:
    return op.kind, op.primitive, op.pass_, f"{row.name}.py", _line(row, op.marker)


def assert_origin(result: dict, row: M.Row, column: str = "nan-hunt") -> None:
    """The answer of nan-hunt and of the watch: origin (one of those the row allows), call, path, dtype, chain,
    explanation."""
    first = result["first"]
    assert first is not None and result["found"], result.get("notes")
    allowed = [(*_expected(op, row), call) for op, call in row.origins(column)]
    assert (*_op(first, row), first["call_index"]) in allowed, (first, result.get("notes"))
    if row.path:
        assert row.path in first["path"]
    if row.dtype:
        assert first["inputs"][0]["dtype"] == row.dtype
    for op in row.chain:
        assert _expected(op, row) in [_op(link, row) for link in result["chain"]]
    for words in row.explanation:
        assert words in result["explanation"]


# -- nan-hunt (each row's report from its check) -------------------------------------------------------------


@pytest.mark.parametrize("row", _cells("nan-hunt"))
def test_nan_hunt(matrix, row) -> None:
    report = matrix.report(row.name)
    assert report["exit_code"] == 1, report["result"]
    assert_origin(report["result"], row)


@pytest.mark.parametrize("row", _cells("nan-hunt", "device", lambda row: row.device))
def test_nan_hunt_names_the_device(matrix, row) -> None:
    assert matrix.report(row.name)["result"]["first"]["device"] == row.device


@pytest.mark.parametrize("row", _cells("nan-hunt", "hint", lambda row: row.hint))
def test_nan_hunt_first_hint_fits(matrix, row) -> None:
    first_hint = matrix.report(row.name)["result"]["hints"][0]
    assert row.hint in first_hint, first_hint


@pytest.mark.parametrize("row", _cells("nan-hunt", "leaves", lambda row: row.leaves))
def test_nan_hunt_names_the_inputs_in_its_bundle(matrix, row) -> None:
    bundle = json.loads(Path(matrix.report(row.name)["artifacts"]["bundle"]).read_text())
    names = [entry["name"] for entry in bundle["inputs"]]
    assert set(row.leaves) <= set(names), names


# -- profile (every row in one profiled process) -------------------------------------------------------------


def _figures(function: dict) -> tuple[int, int]:
    return function["compiles"], function["execute"]["calls"]


@pytest.mark.parametrize("row", _cells("profile"))
def test_profile(matrix, row) -> None:
    assert row.name not in matrix.profile_errors(), matrix.profile_errors()[row.name]
    functions = [f for f in matrix.report(PROFILE_CHECK)["result"]["functions"]
                 if os.path.basename((f["source"] or {}).get("file", "")) == f"{row.name}.py"]
    for name, expected_of_name in _by_name(row).items():
        found = sorted((f for f in functions if f["name"] == name), key=_figures)
        figures = [_figures(f) for f in found]
        assert figures == [(e.compiles, e.calls) for e in expected_of_name], ([f["name"] for f in functions], figures)
        for got, expected in zip(found, expected_of_name):
            reasons = " ".join(r["reason"] for r in got["recompiles"])
            assert (expected.recompile or "") in reasons and bool(reasons) == bool(expected.recompile), reasons


# -- jaxdbg.watch (every row in one process) -----------------------------------------------------------------


@pytest.mark.parametrize("row", _cells("watch"))
def test_watch(matrix, row) -> None:
    got = matrix.watch(row.name)
    assert got["raised"] == "NonFiniteError", got
    assert_origin(got["report"], row, "watch")
    assert json.loads(Path(got["path"]).read_text())["command"] == "watch"


@pytest.mark.parametrize("row", _cells("watch", "device", lambda row: row.device))
def test_watch_names_the_device(matrix, row) -> None:
    assert matrix.watch(row.name)["report"]["first"]["device"] == row.device


# -- check (one jaxdbg check run) ----------------------------------------------------------------------------


@pytest.mark.parametrize("row", _cells("check"))
def test_check(matrix, row) -> None:
    check = matrix.checks()[row.name]
    assert (check["passed"], check["exit_code"]) == (False, 1), check
    location = check["location"]
    at = (os.path.basename(location["file"]), location["line"])
    assert any(at == (f"{row.name}.py", _line(row, op.marker)) and f"made by {op.primitive}" in check["finding"]
               for op, _ in row.origins()), (at, check["finding"])


def test_check_of_every_row_in_one_profile_run_holds_its_budget(matrix) -> None:
    check = matrix.checks()[PROFILE_CHECK]
    assert (check["passed"], check["exit_code"]) == (True, 0), (check, matrix.log("check"))


# -- repro (the rows marked for it) --------------------------------------------------------------------------


@pytest.mark.parametrize("row", _cells("repro", where=lambda row: row.repro))
def test_repro(matrix, row) -> None:
    code, report = matrix.repro(row.name)
    assert report is not None and code == 0, matrix.log(f"repro-{row.name}")
    result = report["result"]
    assert (result["verified"], result["strategy"], result["signature"]["kind"]) == (True, "computation", "nonfinite")
    assert result["minimized"]["equations"] < result["original"]["equations"]
    assert "assert not np.isnan(out).any()" in Path(report["artifacts"]["repro"]).read_text()


# -- memory (every row in one `jaxdbg memory` run) -----------------------------------------------------------


def _in_row(source: dict | None, row: M.Row) -> bool:
    return os.path.basename((source or {}).get("file", "")) == f"{row.name}.py"


@pytest.mark.parametrize("command", ["memory", "hang-hunt"])
def test_one_run_of_every_row_is_a_clean_report(matrix, command) -> None:
    """Nothing found (no leak, no budget, no stall), nothing of jaxdbg's own failing, a report the schema takes."""
    report, _ = matrix.run_of_every_row(command)
    jsonschema.Draft202012Validator(schema()).validate(report)
    result = report["result"]
    assert (report["exit_code"], result["error"]) == (0, None), (result, matrix.log(command))
    assert not [note for note in result["notes"] if re.search(r"fail|could not|stopped", note)], result["notes"]
    if command == "hang-hunt":
        assert (result["kind"], result["stalled"], result["divergence"]) == ("finished", False, None), result
        calls = json.loads(Path(report["artifacts"]["flight_record"]).read_text())["calls"]
        assert calls[0]["seq"] == 0, "the flight recorder's ring no longer holds the whole matrix: split the run"


@pytest.mark.parametrize("row", _cells("memory"))
def test_memory(matrix, row) -> None:
    report, errors = matrix.run_of_every_row("memory")
    assert row.name not in errors, errors[row.name]
    programs = [p for p in report["result"]["functions"] if _in_row(p["source"], row)]
    for name, expected_of_name in _by_name(row).items():
        compiles = [p for p in programs if p["name"] == name]
        listed = [(p["name"], p["call_index"]) for p in programs]
        assert len(compiles) == sum(e.compiles for e in expected_of_name), listed
        for program in compiles:
            assert min(program["peak_bytes"], program["argument_bytes"]) > 0 and program["note"] is None, program
            buffers = program["largest"]
            assert buffers and all(b["bytes"] > 0 for b in buffers), buffers
            # every argument listed named as the user passed it (params['w'], model.layers[0].weight), and the
            # user lines of the others in the row's program
            arguments = [b["argument"] for b in buffers if b["kind"] == "argument"]
            assert arguments and all(name and "<" not in name for name in arguments), buffers
            assert all(_in_row(b["source"], row) for b in buffers if b["source"]), buffers


# -- hang-hunt (every row in one `jaxdbg hang-hunt` run) -------------------------------------------------------


@pytest.mark.parametrize("row", _cells("hang-hunt"))
def test_hang_hunt(matrix, row) -> None:
    report, errors = matrix.run_of_every_row("hang-hunt")
    assert row.name not in errors, errors[row.name]
    record = json.loads(Path(report["artifacts"]["flight_record"]).read_text())
    calls = [c for c in record["calls"] if c["kind"] == "call" and _in_row(c["site"], row)]
    for name, expected_of_name in _by_name(row).items():
        mine = [c for c in calls if c["function"] == name]
        indices = sorted(i for e in expected_of_name for i in range(e.calls))  # each function's calls 0, 1, ...
        assert sorted(c["index"] for c in mine) == indices, [(c["function"], c["index"]) for c in calls]
        assert all(c["program"] is not None and c["ready"] and c["error"] is None for c in mine), mine
    collectives = [c for p in {c["program"] for c in calls} for c in record["programs"][str(p)]["collectives"]]
    assert {c["op"] for c in collectives} == set(row.collectives), collectives
    assert all(_in_row(c["source"], row) for c in collectives), collectives


# -- the definition and its page -----------------------------------------------------------------------------


def test_every_program_is_a_row_and_every_marker_is_on_one_line() -> None:
    programs = {p.stem for p in COMPAT.glob("*.py")} - {"compat_matrix", "profile_all", "watch_all"}
    assert programs == {row.name for row in M.ROWS}
    for row in M.ROWS:
        for op in (*(op for op, _ in (*row.origins(), *row.watch_origins)), *row.chain):
            _line(row, op.marker)


def test_page_is_up_to_date() -> None:
    spec = importlib.util.spec_from_file_location("compat_page", ROOT / "scripts" / "compat_page.py")
    assert spec is not None and spec.loader is not None
    page = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(page)
    assert (ROOT / "docs" / "compat.md").read_text() == page.render(M), "run: python scripts/compat_page.py"
