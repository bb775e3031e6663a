"""The real-program corpus (tests/corpus/): jaxdbg's answers on Flax NNX, Equinox and Optax programs."""

from __future__ import annotations

import json
import os

import pytest

from jaxdbg.cli import main

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def _line_of(path: str, marker: str) -> int:
    with open(path) as handle:
        return next(i for i, text in enumerate(handle, start=1) if marker in text)


def _hunt(program: str, tmp_path, capsys) -> tuple[int, dict]:
    pytest.importorskip("flax")
    pytest.importorskip("equinox")
    path = os.path.join(CORPUS, program)
    code = main(["nan-hunt", path, "--json", "-", "--out", str(tmp_path / "out")])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("program, primitive, pass_, marker, call_index, chain", [
    # nnx.jit around nnx.value_and_grad and nnx.Optimizer: replayed from the traced computation (the NNX
    # wrapper cannot be called again outside its update context).
    ("nnx_mnist_nan/train.py", "mul", "forward", "# the bug", 2, [("inf", "log", "forward")]),
    # eqx.filter_jit + filter_value_and_grad: sqrt's derivative at 0 is a backward-pass origin at the sqrt line.
    ("eqx_pairwise_nan/train.py", "mul", "backward", "# includes each point", 0, [("inf", "div", "backward")]),
])
def test_nan_hunt_on_framework_programs(program, primitive, pass_, marker, call_index, chain, tmp_path, capsys):
    code, report = _hunt(program, tmp_path, capsys)
    first = report["result"]["first"]
    assert code == 1 and report["result"]["found"]
    line = _line_of(os.path.join(CORPUS, program), marker)
    assert (first["primitive"], first["pass"], first["source"]["line"], first["call_index"]) == (
        primitive, pass_, line, call_index)
    assert [(c["kind"], c["primitive"], c["pass"]) for c in report["result"]["chain"]] == chain
    assert all(c["source"]["line"] == line for c in report["result"]["chain"])
