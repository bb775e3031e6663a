"""Every nan-hunt recipe, run in this process through the library, against the recipe's expected.json.

expected.json holds the ground truth a person wrote for the recipe (primitive, pass, path, call); source
lines are marked in the recipe with ``# <- origin`` / ``# <- chain`` so they are not hard-coded numbers.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from jaxdbg.nan import HuntOptions
from jaxdbg.nan.session import hunt_here
from jaxdbg.report import to_jsonable
from jaxdbg.target import parse_target

from conftest import RECIPES

NAMES = sorted(d for d in os.listdir(RECIPES) if d.startswith("nan_") and os.path.isdir(os.path.join(RECIPES, d)))


def _marked_line(folder: str, file: str, marker: str) -> int:
    with open(os.path.join(folder, file)) as handle:
        lines = [i for i, text in enumerate(handle, start=1) if text.rstrip().endswith(marker)]
    assert len(lines) == 1, f"{file} must mark exactly one line with '{marker}'"
    return lines[0]


def _cases() -> list:
    cases = []
    for name in NAMES:
        with open(os.path.join(RECIPES, name, "expected.json")) as handle:
            expected = json.load(handle)
        cases.append(pytest.param(name, [], expected, id=name))
        for variant in expected.pop("variants", []):
            merged = {**expected, **{k: v for k, v in variant.items() if k != "args"}}
            cases.append(pytest.param(name, variant["args"], merged, id=f"{name}[{' '.join(variant['args'])}]"))
    return cases


def _check_source(found: dict, expected: dict, folder: str, marker: str) -> None:
    source = found["source"]
    assert source is not None
    assert os.path.basename(source["file"]) == expected["file"]
    assert source["line"] == _marked_line(folder, expected["file"], marker)
    if "function" in expected:
        assert source["function"] == expected["function"]


@pytest.mark.parametrize("name,args,expected", _cases())
def test_recipe(name: str, args: list, expected: dict, tmp_path, capsys) -> None:
    folder = os.path.join(RECIPES, name)
    options = HuntOptions(out_dir=str(tmp_path), **expected.get("options", {}))
    try:
        result, artifacts = hunt_here(parse_target(os.path.join(folder, "train.py"), args), options)
    finally:
        sys.modules.pop("layers", None)  # nan_nested_jit imports its sibling module by this name
    got = to_jsonable(result)
    assert got["found"] is expected["found"], got["explanation"]
    if not expected["found"]:
        assert got["first"] is None and got["calls_watched"] > 0 and artifacts == {}
        return
    first = got["first"]
    for key in ("kind", "primitive", "pass", "function", "call_index", "path", "argument"):
        if key in expected:
            assert first[key] == expected[key], (key, first)
    if "source" in expected:
        _check_source(first, expected["source"], folder, "# <- origin")
    for want, link in zip(expected.get("chain", []), got["chain"]):
        assert link["kind"] == want["kind"]
        if "primitive" in want:
            assert link["primitive"] == want["primitive"]
        _check_source(link, want["source"], folder, "# <- chain")
    assert len(got["chain"]) >= len(expected.get("chain", []))
    if "strategy" in expected:
        assert got["strategy"] == expected["strategy"]
    if "growth" in expected:
        names = [g["name"] for g in got["growth"]]
        assert set(expected["growth"]) <= set(names)
        assert all(g["first_call"] < first["call_index"] and g["ratio"] >= 100 for g in got["growth"])
    if "precision" in expected:
        for key, value in expected["precision"].items():
            assert got["precision"][key] == value
    if "hint_contains" in expected:
        assert any(expected["hint_contains"] in hint for hint in got["hints"]), got["hints"]
    assert got["explanation"].startswith(("A NaN", "An Inf", "A non-finite"))
    assert {"inputs", "jaxpr", "bundle"} <= set(artifacts)  # an input NaN too: the call is kept for a replay
    assert all(os.path.exists(path) for path in artifacts.values())
