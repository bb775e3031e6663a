"""``jaxdbg profile`` on the real-program corpus (tests/corpus/): what a user reads, piped at 80 columns, and
what the JSON report holds. The NNX language model builds its parameters eagerly (NNX initialises outside
jit), runs its matmuls inside Flax layers, and has a jitted function with a long name; the Linen script
parses absl flags and needs --workdir."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from jaxdbg.cli import main
from jaxdbg.cli.profile import _s
from jaxdbg.profile.hlo import frame_stack, parse_hlo

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
LM = os.path.join(CORPUS, "nnx_lm_profile", "train.py")
ABSL = os.path.join(CORPUS, "linen_absl_flags", "train.py")


def _line_of(path: str, marker: str) -> int:
    with open(path) as handle:
        return next(i for i, text in enumerate(handle, start=1) if marker in text)


@pytest.fixture(scope="module")
def lm(tmp_path_factory) -> tuple[str, dict]:
    """One profile of the LM, as a user piping it would read it: a child process, stdout not a terminal,
    COLUMNS=80. Returns (stdout, report)."""
    pytest.importorskip("flax")
    pytest.importorskip("optax")
    out = tmp_path_factory.mktemp("lm")
    env = dict(os.environ, COLUMNS="80")
    proc = subprocess.run([sys.executable, "-m", "jaxdbg", "profile", LM, "--out", str(out / "o"), "--top", "20",
                           "--json", str(out / "report.json")], capture_output=True, text=True, env=env, timeout=900,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    with open(out / "report.json") as handle:
        return proc.stdout, json.load(handle)


def _executed_ops(hlo_path: str) -> list:
    """The ops of a compiled module's entry computation: what the profiler times (fusions, unfused ops)."""
    with open(hlo_path) as handle:
        text = handle.read()
    module = parse_hlo(text)
    entry = re.search(r"^ENTRY %?([\w.\-]+)", text, re.MULTILINE).group(1)
    return [module.ops[name] for name in module.computations[entry] if name in module.ops]


def test_eager_compiles_are_shown_and_counted(lm):
    text, report = lm
    result = report["result"]
    eager = result["eager_compile"]
    # NNX builds every parameter outside jit: each initialiser compiles on its own
    assert eager["count"] >= 10 and re.fullmatch(r"jit\(_(truncated_)?normal\)", eager["top"][0]["name"])
    jitted = sum(f["compile"]["total_s"] for f in result["functions"])
    assert result["totals"]["compile_s"] == pytest.approx(jitted + eager["total_s"], rel=1e-9)
    said = " ".join(text.split("\neager compiles", 1)[1].split("\ntransfers")[0].split())  # rich wraps it
    assert said.startswith(f"(operations run outside jit): {eager['count']} in {_s(eager['total_s'])}, ")
    assert eager["top"][0]["name"] in said
    assert f"{_s(eager['total_s'])} of it eager" in text.split("jitted functions")[0]
    hints = result["hints"]
    assert any("operations run outside jit compiled one by one" in h and "random initialisers" in h
               and "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0" in h for h in hints), hints
    assert all(f"{eager['count']} eager operations" in h for h in hints if h.startswith("compilation takes"))


def test_matmuls_inside_flax_layers_point_at_the_users_lines(lm):
    text, report = lm
    lines = {_line_of(LM, "# matmul: attention"), _line_of(LM, "# matmul: MLP"),
             _line_of(LM, "# matmul: the output projection")}
    functions = {f["name"]: f for f in report["result"]["functions"]}
    assert set(functions) == {"train_step", "compute_eval_metrics"}
    for function in functions.values():
        # every matmul the step runs, forward and backward, fused or not, at the line that made it
        matmuls = [op for op in _executed_ops(function["hlo"]["optimized_hlo"]) if op.category == "matmul"]
        assert {op.source.line if op.source else None for op in matmuls} == lines, function["name"]
        assert {op.source.file for op in matmuls} == {LM}
        # the op table: the hottest matmul names the user's line, in the JSON and in the text
        matmuls = [op for op in function["ops"] if op["category"] == "matmul"]
        assert matmuls and all(op["source"]["file"] == LM and op["source"]["line"] in lines for op in matmuls)
        hottest = matmuls[0]
        # in this function's own table: the two functions' fusions may share a name
        table = text.split(f"top ops of {function['name']}", 1)[1]
        row = next(line for line in table.splitlines() if line.startswith(f"│ {hottest['name']} "))
        assert f"train.py:{hottest['source']['line']}" in row


def test_piped_output_at_80_columns_keeps_numbers_whole(lm):
    text, report = lm
    assert "…" not in text and "..." not in text
    tables = [line for line in text.splitlines() if line[:1] in "┏┃┡│└"]
    assert tables and max(len(line) for line in tables) <= 80

    def row_of(name: str, table: str) -> list[str]:  # a long name may fold: its first line starts the row
        block = text.split(table, 1)[1].split("\n└", 1)[0]
        rows = [[cell.strip() for cell in line.strip("│").split("│")] for line in block.splitlines()
                if line.startswith("│")]
        exact = [row for row in rows if row[0] == name]
        return (exact or [row for row in rows if len(row[0]) >= 12 and name.startswith(row[0])])[0]

    for function in report["result"]["functions"]:
        cells = row_of(function["name"], "jitted functions")
        assert _s(function["compile"]["total_s"]) in cells and _s(function["execute"]["total_s"]) in cells
        for op in function["ops"]:
            cells = row_of(op["name"], f"top ops of {function['name']} (")
            assert _s(op["total_s"]) in cells and f"{100 * op['fraction']:.1f}%" in cells
    header = next(line for line in tables if "function" in line)
    assert {"compile", "execute"} <= {cell.strip() for cell in header.strip("┃").split("┃")}


def test_a_missing_absl_flag_is_reported_by_its_error_line(tmp_path, capsys):
    pytest.importorskip("flax")
    pytest.importorskip("absl")
    code = main(["profile", ABSL, "--out", str(tmp_path / "o"), "--json", str(tmp_path / "r.json")])
    out, err = capsys.readouterr()
    assert code == 3
    assert "Flag --workdir must have a value other than None" in err and "--helpshort" not in err
    result = json.loads((tmp_path / "r.json").read_text())["result"]
    assert "Flag --workdir must have a value other than None" in result["error"]
    # it stopped in absl's flag parsing: optax's jitted helpers were defined on import, none was called
    assert any("failed before it called any jitted function" in n for n in result["notes"]), result["notes"]
    assert not any("jax.jit" in n or "first call" in n for n in result["notes"]) and "jax.jit" not in out


def test_the_absl_script_profiles_once_given_its_flag_and_ties_linen_layers_to_their_lines(tmp_path):
    pytest.importorskip("flax")
    pytest.importorskip("absl")
    code = main(["profile", ABSL, "--out", str(tmp_path / "o"), "--json", str(tmp_path / "r.json"),
                 "--trace-calls", "0", "--", "--workdir", str(tmp_path / "work"), "--steps", "3"])
    result = json.loads((tmp_path / "r.json").read_text())["result"]
    assert code == 0, result["error"]
    step = next(f for f in result["functions"] if f["name"] == "train_step")
    assert step["execute"]["calls"] == 3 and (tmp_path / "work" / "loss.txt").exists()
    # the ops that run (fusions, unfused dots): forward and backward convolutions and matmuls, made inside
    # nn.Conv and nn.Dense; XLA leaves the kernel gradient's fusion without metadata (its neighbours say)
    layers = [op for op in _executed_ops(step["hlo"]["optimized_hlo"]) if op.category in ("convolution", "matmul")]
    assert {op.source.line if op.source else None for op in layers} == {
        _line_of(ABSL, f"# layer: {name}") for name in ("conv", "hidden", "logits")}


def _inner(x):
    return jnp.sin(x) * 2.0  # marker: inner


def _middle(x):
    return _inner(x) + 1.0  # marker: middle


def _outer(x):
    return _middle(x)  # marker: outer


def test_stack_frames_read_with_their_parents():
    """XLA's StackFrames table as jax 0.10 and 0.11 print it: each frame's parent, up to the caller."""
    text = jax.jit(_outer).lower(jnp.ones(8)).compile().as_text()  # marker: caller
    module = parse_hlo(text)
    sine = next(i for i in module.instructions.values() if i.opcode == "sine")
    stack = frame_stack(module, sine.frame_id)
    assert [(s.function, s.line) for s in stack[:4]] == [
        (name, _line_of(__file__, f"# marker: {marker}")) for name, marker in
        (("_inner", "inner"), ("_middle", "middle"), ("_outer", "outer"),
         ("test_stack_frames_read_with_their_parents", "caller"))]
