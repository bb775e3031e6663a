"""Every command's real report validates against jaxdbg/schema/report.schema.json, and the schema rejects a
report with a field missing, renamed, of the wrong type, or an exit code that contradicts its result; the typed
reader (jaxdbg.results.read_report) gives back the very result each command wrote.

Each command runs once, in process through typer's CliRunner, on the smallest recipe and options that
exercise its result (about 20 s on two cores).
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import jsonschema
import pytest
import typer
from typer.testing import CliRunner

import jaxdbg.cli._common
import jaxdbg.schema
from jaxdbg.cli import app
from jaxdbg.pipeline.bench import BenchResult
from jaxdbg.report import Report, ReportReadError, to_jsonable
from jaxdbg.results import read_report
from jaxdbg.schema import schema

RECIPES = Path(__file__).resolve().parent.parent / "recipes"

# Raised by the program itself: a JAX operation's own shape error would be cut to that operation ("computation").
SHAPE_BUG = ("import jax.numpy as jnp\n\nx = jnp.ones(3)\nif x.shape != (4,):\n"
             "    raise ValueError(f'expected 4 features, got {x.shape}')\n")
NAN_BUG = ("import jax\nimport jax.numpy as jnp\n\n\n@jax.jit\ndef f(x):\n    return jnp.log(x - 2.0) * 3.0\n\n\n"
           "print(f(jnp.ones(3)))\n")

# case -> (argv after the command's own --json/--out, the exit code it must give)
CASES = {
    "doctor": (["doctor"], 0),
    "nan-hunt-found": (["nan-hunt", str(RECIPES / "nan_forward" / "train.py")], 1),
    "nan-hunt-clean": (["nan-hunt", str(RECIPES / "nan_clean" / "train.py")], 0),
    "profile-script": (["profile", str(RECIPES / "recompile_storm" / "train.py"), "--budget", "recompiles<=0",
                        "--monitor"], 1),
    "profile-function": (["profile", f"{RECIPES / 'run_heavy' / 'train.py'}::power_iterations", "--args",
                          "f32[32,32]", "--runs", "2", "--warmup", "1", "--compare", "{profile-script}"], 0),
    "repro-source": (["repro", "{shape_bug.py}", "--max-time", "60"], 0),
    "repro-computation": (["repro", "{nan_bug.py}", "--kind", "nonfinite", "--max-time", "60"], 0),
    "pipeline-sim": (["pipeline-bench", "--stages", "2", "--microbatches", "4", "--hint", "1f1b,bf",
                      "--memory-cap", "1,2"], 0),
    "pipeline-real": (["pipeline-bench", "--mode", "real", "--stages", "2", "--microbatches", "2"], 0),
    "check": (["check", "--config", "{check.toml}"], 1),
    "memory-fits": (["memory", f"{RECIPES / 'memory_fit' / 'model.py'}::top_scores", "--args",
                     "f32[256,64] f32[256,64]", "--device-memory", "64MiB", "--budget", "peak_bytes<=64MiB",
                     "--no-plot"], 0),
    "hang-hunt": (["hang-hunt", str(RECIPES / "nan_clean" / "train.py"), "--no-native"], 0),
    "usage-error": (["profile", str(RECIPES / "nan_forward" / "train.py"), "--args", "f32[3]"], 2),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[dict[str, dict], dict[str, object]]:
    """Each case's JSON report, and the result object the command wrote it from."""
    folder = tmp_path_factory.mktemp("reports")
    (folder / "shape_bug.py").write_text(SHAPE_BUG)
    (folder / "nan_bug.py").write_text(NAN_BUG)
    (folder / "check.toml").write_text('[tool.jaxdbg.check.no-nan]\ncommand = "nan-hunt"\ntarget = "nan_bug.py"\n')
    found: dict[str, dict] = {}
    results: dict[str, object] = {}
    written: list[Report] = []
    write_json = jaxdbg.cli._common.write_json

    def keep(report: Report, destination: str) -> None:
        written.append(report)
        write_json(report, destination)

    runner = CliRunner()
    for case, (argv, code) in CASES.items():
        paths = {"{shape_bug.py}": str(folder / "shape_bug.py"), "{nan_bug.py}": str(folder / "nan_bug.py"),
                 "{profile-script}": str(folder / "profile-script.json"), "{check.toml}": str(folder / "check.toml")}
        argv = [paths.get(arg, arg) for arg in argv]
        destination = folder / f"{case}.json"
        out = folder / f"{case}-out"
        written.clear()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(jaxdbg.cli._common, "write_json", keep)
            result = runner.invoke(app, [*argv, "--json", str(destination), "--out", str(out), "-q"])
        assert result.exit_code == code, (case, result.output)
        report = json.loads(destination.read_text())
        assert json.loads((out / "report.json").read_text()) == report, case  # --out's copy is the same report
        found[case] = report
        results[case] = written[-1].result
    return found, results


@pytest.fixture(scope="module")
def reports(runs) -> dict[str, dict]:
    return runs[0]


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema())


def test_the_schema_is_valid_draft_2020_12_and_ships_in_the_package() -> None:
    loaded = schema()
    jsonschema.Draft202012Validator.check_schema(loaded)
    assert loaded["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert (Path(jaxdbg.schema.__file__).parent / jaxdbg.schema.SCHEMA_FILE).is_file()
    loaded["title"] = "changed"
    assert schema()["title"] != "changed"  # each call returns a fresh copy


def test_the_schema_knows_every_command() -> None:
    commands = set(typer.main.get_command(app).commands)
    # plus "watch": jaxdbg.watch's report (a library call, checked in tests/test_live_watch.py)
    assert set(schema()["properties"]["command"]["enum"]) == commands | {"watch"}
    assert {argv[0] for argv, _ in CASES.values()} == commands  # every command's report is checked below


@pytest.mark.parametrize("case", sorted(CASES))
def test_real_report_is_valid(case: str, reports: dict, validator) -> None:
    report = reports[case]
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(report)]
    assert not errors, errors


def test_the_runs_reached_the_interesting_shapes(reports: dict) -> None:
    """The valid reports cover what the schema describes: found and clean, errors, nested lists filled."""
    assert reports["nan-hunt-found"]["result"]["first"]["primitive"] == "log"
    assert reports["nan-hunt-clean"]["result"]["first"] is None
    script = reports["profile-script"]["result"]
    assert script["functions"][0]["recompiles"][0]["changes"] and script["monitor"] and not script["budget"]["ok"]
    assert reports["profile-function"]["result"]["comparison"]
    assert reports["repro-source"]["result"]["strategy"] == "source"
    assert reports["repro-computation"]["result"]["strategy"] == "computation"
    assert reports["pipeline-real"]["result"]["correctness"]["ok"] is True
    assert "model" in reports["pipeline-real"]["result"]["config"]
    assert set(reports["usage-error"]["result"]) == {"error"}
    fits = reports["memory-fits"]["result"]
    assert fits["functions"][0]["fits"] is True and fits["budget"]["ok"] and fits["samples"] >= 1
    hang = reports["hang-hunt"]["result"]
    assert hang["kind"] == "finished" and hang["processes"][0]["last_calls"][0]["function"] == "train_step"


def _parent(report: dict, path: list):
    """The object holding the last key of ``path``, and that key."""
    *parents, last = path
    for key in parents:
        report = report[key]
    return report, last


def _drop(path):
    def change(report):
        holder, key = _parent(report, path)
        del holder[key]
    return change


def _rename(path, new):
    def change(report):
        holder, key = _parent(report, path)
        holder[new] = holder.pop(key)
    return change


def _set(path, value):
    def change(report):
        holder, key = _parent(report, path)
        holder[key] = value
    return change


MUTATIONS = {
    "envelope without exit_code": ("doctor", _drop(["exit_code"]), "exit_code"),
    "doctor without checks": ("doctor", _drop(["result", "checks"]), "checks"),
    "nan origin without pass": ("nan-hunt-found", _drop(["result", "first", "pass"]), "pass"),
    "nan origin call_index renamed": ("nan-hunt-found", _rename(["result", "first", "call_index"], "callIndex"),
                                      "callIndex"),
    "nan found but exit 0": ("nan-hunt-found", _set(["exit_code"], 0), "1 was expected"),
    "nan clean with an origin": ("nan-hunt-clean", _set(["result", "first"], {"kind": "nan"}), "primitive"),
    "profile median renamed": ("profile-script", _rename(["result", "functions", 0, "execute", "median_s"],
                                                         "median"), "median"),
    "profile compiles as text": ("profile-function", _set(["result", "functions", 0, "compiles"], "1"), "'1'"),
    "repro signature kind renamed": ("repro-source", _rename(["result", "signature", "kind"], "failure"),
                                     "failure"),
    "pipeline run without speedup": ("pipeline-sim", _drop(["result", "runs", 0, "speedup_vs_fixed"]),
                                     "speedup_vs_fixed"),
    "pipeline correctness without ok": ("pipeline-real", _drop(["result", "correctness", "ok"]), "'ok'"),
    "error result with extra key": ("usage-error", _set(["result", "detail"], "more"), "detail"),
    "unknown command": ("doctor", _set(["command"], "lint"), "'lint'"),
    "check entry with extra key": ("check", _set(["result", "checks", 0, "extra"], 1), "extra"),
    "check passed with exit 1": ("check", _set(["result", "passed"], True), "0 was expected"),
    "hang process without state": ("hang-hunt", _drop(["result", "processes", 0, "state"]), "state"),
    "hang finished but exit 1": ("hang-hunt", _set(["exit_code"], 1), "0 was expected"),
}


def _messages(errors) -> str:
    """Every message of the errors and of their nested causes (anyOf/oneOf alternatives)."""
    found = []
    for error in errors:
        found.append(error.message)
        found.append(_messages(error.context))
    return "\n".join(found)


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_schema_rejects_a_broken_report(name: str, reports: dict, validator) -> None:
    case, change, named = MUTATIONS[name]
    report = copy.deepcopy(reports[case])
    change(report)
    errors = list(validator.iter_errors(report))
    assert errors, f"{name}: the schema accepted it"
    assert named in _messages(errors), _messages(errors)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_reader_gives_back_the_result_the_command_wrote(case: str, runs) -> None:
    """read(to_jsonable(result)) == result for every command's real result: typed, nested, tuples, None."""
    reports, results = runs
    read = read_report(reports[case])
    wrote = results[case]
    if isinstance(wrote, BenchResult):  # its config is a bare dict: a Costs in it comes back as its JSON
        assert to_jsonable(read.result.config) == to_jsonable(wrote.config)
        wrote = dataclasses.replace(wrote, config=read.result.config)
    # repr, not ==: a NaN's stats hold NaN (unequal to itself); repr also tells a tuple from a list, 3 from 3.0
    assert repr(read.result) == repr(wrote)
    assert to_jsonable(read.result) == reports[case]["result"]
    assert (read.command, read.exit_code) == (reports[case]["command"], reports[case]["exit_code"])


@pytest.mark.parametrize("name", sorted(n for n, (case, _, named) in MUTATIONS.items()
                                        if case != "usage-error" and "was expected" not in named))
def test_the_reader_names_a_broken_field(name: str, reports: dict) -> None:
    """What the schema refuses in a result, the reader refuses too, naming the field (never a silent None)."""
    case, change, named = MUTATIONS[name]
    report = copy.deepcopy(reports[case])
    change(report)
    with pytest.raises(ReportReadError, match=named.strip("'")):
        read_report(report)
