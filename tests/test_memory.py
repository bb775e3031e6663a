"""``jaxdbg memory`` on programs whose answers are known: a leak through a Python list, a missing donation,
activations kept for the backward pass of a deep model, a step that does not fit a given --device-memory, a
function target that is not run because it would not fit, a real RESOURCE_EXHAUSTED on CPU, an Equinox
step over arrays sharded on 4 devices followed by a pmap'd evaluation, and a Flax NNX loop that keeps its logits.

Every run is made once (module fixture, in this process through ``jaxdbg.cli.main``; each target runs in its
own child) and checked by several tests.
"""

from __future__ import annotations

import csv
import json
import re
import runpy
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from jaxdbg.cli import main
from jaxdbg.schema import schema

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "recipes"
CORPUS = Path(__file__).resolve().parent / "corpus"
KIB, MIB = 1 << 10, 1 << 20

RUNS = {
    "leak": ["recipes/memory_leak/train.py", "--plot"],
    "remat": ["recipes/memory_remat/train.py", "--device-memory", "8MiB", "--budget",
              "train_step.temp_bytes<=4MiB,live_bytes<=1GiB", "--no-plot"],
    "oom": ["recipes/memory_oom/train.py", "--no-plot"],
    "misfit": ["recipes/memory_fit/model.py::top_scores", "--args", "f32[2048,64] f32[2048,64]", "--device-memory",
               "8MiB", "--no-plot"],
    "sharded": [str(CORPUS / "eqx_sharded_donation" / "train.py"), "--no-plot"],
    "nnx": [str(CORPUS / "nnx_memory_history" / "train.py")],  # the default: memory.html, no memory.png
    "leak_in_function": [str(CORPUS / "memory_leak_in_function" / "train.py"), "--no-plot"],
    "checkpointed": [str(CORPUS / "memory_checkpointed_scan" / "model.py") + "::stack_grad", "--args",
                     "f32[128,256] f32[8,256,256]", "--no-plot"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[int, dict, Path]]:
    """name -> (exit code, report, --out folder); run from the repository's root, as the recipes' READMEs do."""
    folder = tmp_path_factory.mktemp("memory")
    found = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)
        for name, argv in RUNS.items():
            out = folder / name
            code = main(["memory", *argv, "--out", str(out), "--json", str(folder / f"{name}.json"), "-q"])
            found[name] = (code, json.loads((folder / f"{name}.json").read_text()), out)
    return found


def _marker(path: Path, text: str) -> int:
    """The line of ``path`` that carries the marker comment ``# <- text``."""
    return _line(path, f"# <- {text}")


def _line(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_every_report_is_valid_and_exits_as_it_found(runs) -> None:
    validator = jsonschema.Draft202012Validator(schema())
    for name, (code, report, _) in runs.items():
        errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(report)]
        assert not errors, (name, errors)
        assert report["command"] == "memory" and code == report["exit_code"]
    assert {name: runs[name][0] for name in runs} == {"leak": 1, "remat": 1, "oom": 1, "misfit": 1, "sharded": 0,
                                                          "nnx": 1, "checkpointed": 0,
                                                          "leak_in_function": 1}


def test_a_leak_through_a_list_names_the_list_and_the_line_that_fills_it(runs) -> None:
    code, report, _ = runs["leak"]
    script = RECIPES / "memory_leak" / "train.py"
    (leak,) = report["result"]["leaks"]
    activation = 512 * 256 * 4  # one step's f32[512,256] activations
    assert leak["producer"] == "train_step" and leak["source"]["line"] == _marker(script, "call")
    assert leak["kept_by"] == "list 'activations'" and leak["kept_at"]["line"] == _marker(script, "keeps")
    # 24 steps: every step's activations but the latest call's (its outputs are the loop's state) are the leak
    assert (leak["arrays"], leak["bytes"], leak["per_call_bytes"]) == (23, 23 * activation, activation)
    hint = next(h for h in report["result"]["hints"] if h["kind"] == "leak")
    assert hint["saves_bytes"] == 23 * activation and "list 'activations'" in hint["text"]
    assert code == 1 and report["result"]["found"] and not report["result"]["budget"]["misfits"]


def test_a_leak_freed_only_when_the_function_that_held_it_returned_is_still_a_leak(runs) -> None:
    _, report, _ = runs["leak_in_function"]
    path = CORPUS / "memory_leak_in_function" / "train.py"
    (leak,) = report["result"]["leaks"]
    assert leak["kept_by"] == "dict 'self.cache'" and leak["kept_at"]["line"] == _marker(path, "kept")
    assert leak["per_call_bytes"] == 512 * 128 * 4 and leak["arrays"] >= 8


def test_process_0_speaks_for_a_job_whose_other_process_leaked() -> None:
    """Process 0 found nothing itself, process 1 a leak: process 0's report (the job's) is found, exits 1 and
    its line names process 1, not 'everything fits'."""
    from jaxdbg.memory.messages import JobMemory
    from jaxdbg.memory.result import ProcessMemory
    from jaxdbg.memory.run import MemoryOptions, assemble, exit_code
    from jaxdbg.runner import Outcome

    rows = (ProcessMemory(0, 2 * MIB, "cpu:0", 0, False, 0), ProcessMemory(1, 8 * MIB, "cpu:1", 1, False, 0))
    outcome = Outcome("ok", 0, None, None, "", "", 1.0, (JobMemory(rows),))
    result = assemble(outcome, MemoryOptions(), ())
    assert result.found and exit_code(result) == 1
    assert result.essential_line() == "process 1: 1 leak(s) (its own report says where)"
    # a process whose program raised: named with its error (process 0 then only fails in its collective)
    rows = (ProcessMemory(0, 2 * MIB, "cpu:0", 0, False, 0, failed="ValueError: Gloo all-reduce failed"),
            ProcessMemory(1, 8 * MIB, "cpu:1", 0, False, 0, failed="ValueError: corrupt record at train.py:20"))
    result = assemble(Outcome("ok", 0, None, None, "", "", 1.0, (JobMemory(rows),)), MemoryOptions(), ())
    assert result.essential_line() == "process 1 raised ValueError: corrupt record at train.py:20"


def test_a_missing_donation_is_held_and_hinted_with_its_bytes(runs) -> None:
    _, report, _ = runs["leak"]
    (program,) = report["result"]["functions"]
    params = 2 * 256 * 256 * 4
    assert [(h["argument"], h["argnum"], h["bytes"], h["threaded"]) for h in program["held"]] == [
        ("params", 0, params, True)]  # x is passed again unchanged: not a candidate
    assert program["passed_again"] == ["x"]
    (hint,) = [h for h in report["result"]["hints"] if h["kind"] == "donate"]
    assert hint["saves_bytes"] == params and "jax.jit(..., donate_argnums=(0,))" in hint["text"]


def test_the_peak_and_what_was_live_at_it(runs) -> None:
    _, report, _ = runs["leak"]
    result = report["result"]
    peak, (program,) = result["peak"], result["functions"]
    # The leak grows to the end: the peak is in the last call, on top of every kept activation.
    assert (peak["function"], peak["call_index"], peak["device"]) == ("train_step", 23, "cpu:0")
    assert peak["program_bytes"] == program["peak_bytes"] - program["argument_bytes"]
    assert peak["bytes"] == peak["live_bytes"] + peak["program_bytes"]
    top = result["live_at_peak"][0]
    assert (top["producer"], top["calls"]) == ("train_step", 23) and top["bytes"] >= 22 * 512 * 256 * 4


def test_the_leak_run_writes_csv_and_pictures_and_png_only_when_asked(runs) -> None:
    _, report, _ = runs["leak"]
    artifacts = report["artifacts"]
    with open(artifacts["samples_csv"]) as handle:
        rows = list(csv.DictReader(line for line in handle if not line.startswith("#")))
    assert len(rows) == report["result"]["samples"] * 4  # one row per sample and device (4 CPU devices)
    assert max(int(r["estimate_bytes"]) for r in rows) == report["result"]["peak"]["bytes"]
    assert Path(artifacts["plot"]).read_bytes()[:4] == b"\x89PNG"
    page = Path(artifacts["html"]).read_text()
    assert "<svg" in page and "peak" in page and "train_step" in page
    assert Path(artifacts["buffers_csv"]).read_text().count("train_step") >= 5
    with open(artifacts["buffers_csv"]) as handle:
        returned = {row["output"] for row in csv.DictReader(handle) if row["output"]}
    assert returned and returned == {b["output"] for f in report["result"]["functions"] for b in f["largest"]
                                     if b["output"]}
    default = runs["nnx"][1]["artifacts"]  # run without --plot: the page, not the PNG (matplotlib's second)
    assert "<svg" in Path(default["html"]).read_text() and "plot" not in default
    assert not (Path(default["html"]).parent / "memory.png").exists()


def test_activations_kept_for_the_backward_pass_get_a_remat_hint(runs) -> None:
    _, report, _ = runs["remat"]
    (program,) = report["result"]["functions"]
    line = _marker(RECIPES / "memory_remat" / "train.py", "activation")
    activation = 1024 * 256 * 4
    forward = [b for b in program["largest"] if b["pass"] == "forward"]
    assert forward and all(b["op"] == "tanh" and b["source"]["line"] == line for b in forward)
    # 8 layers: at the start of the backward pass the forward activations are all held (at least 6 of them)
    assert program["forward_kept_bytes"] >= 6 * activation
    (hint,) = [h for h in report["result"]["hints"] if h["kind"] == "remat"]
    assert 0 < hint["saves_bytes"] < program["forward_kept_bytes"] and f"train.py:{line}" in hint["text"]
    assert not program["checkpointed"] and "jax.checkpoint around groups of layers" in hint["text"]


def test_a_program_already_under_jax_checkpoint_is_not_told_to_use_it(runs) -> None:
    _, report, _ = runs["checkpointed"]
    (program,) = report["result"]["functions"]
    assert program["checkpointed"] and program["forward_kept_bytes"] > 0
    (hint,) = [h for h in report["result"]["hints"] if h["kind"] == "remat"]
    assert "although it already uses jax.checkpoint" in hint["text"]
    assert "jax.checkpoint around groups of layers" not in hint["text"]


def test_a_step_that_does_not_fit_the_given_device_memory(runs) -> None:
    _, report, _ = runs["remat"]
    result = report["result"]
    (program,) = result["functions"]
    budget = 8 * MIB
    assert (result["budget"]["device_memory_bytes"], result["budget"]["origin"]) == (budget, "--device-memory")
    assert program["fits"] is False and program["over_bytes"] == program["needs_bytes"] - budget > 0
    assert program["needs_bytes"] == program["live_before_bytes"] + program["peak_bytes"] - program["argument_bytes"]
    assert result["budget"]["misfits"] == ["train_step"]
    # --budget: the temporaries rule broke, the run's live bytes rule held
    (violation,) = result["budget"]["violations"]
    assert violation.startswith("train_step.temp_bytes ") and not result["budget"]["ok"]
    assert {h["kind"] for h in result["hints"]} >= {"fit", "dtype", "remat", "donate", "shard"}
    shard = next(h for h in result["hints"] if h["kind"] == "shard")  # x, 1 MiB, over the 4 CPU devices
    assert shard["saves_bytes"] == 1024 * 256 * 4 * 3 // 4


def test_a_function_target_that_would_not_fit_is_not_run(runs) -> None:
    _, report, _ = runs["misfit"]
    result = report["result"]
    (program,) = result["functions"]
    line = _marker(RECIPES / "memory_fit" / "model.py", "[n, n] scores")
    sort = program["largest"][0]
    assert (sort["kind"], sort["shape"], sort["bytes"]) == ("temp", "f32[2048,2048]", 2048 * 2048 * 4)
    assert sort["source"]["line"] in (line, line + 1)  # the matmul fused into the sort that follows it
    assert program["fits"] is False and any("not run" in note for note in result["notes"])
    dtype = next(h for h in result["hints"] if h["kind"] == "dtype")
    assert dtype["saves_bytes"] == 2048 * 2048 * 2


def test_a_real_out_of_memory_error_on_cpu_is_explained(runs) -> None:
    _, report, _ = runs["oom"]
    oom = report["result"]["out_of_memory"]
    script = RECIPES / "memory_oom" / "train.py"
    assert (oom["function"], oom["call_index"], oom["source"]["line"]) == ("expand", 0, _marker(script, "the call"))
    assert oom["requested_bytes"] == 1 << 57 and "Out of memory" in oom["message"]
    largest = oom["program"]["largest"][0]
    assert (largest["bytes"], largest["kind"], largest["source"]["line"]) == (1 << 57, "output",
                                                                             _marker(script, "128 PiB"))
    (outside,) = [g for g in oom["live"] if g["producer"] == "outside jitted calls"]
    assert outside["bytes"] >= 4 * 256 * 256 * 4  # the four weight matrices live when it failed
    assert report["result"]["error"] is None and report["result"]["found"]
    # XLA:CPU dispatches asynchronously too: float(...) of the result raised it, after the call had returned
    assert oom["asynchronous"] and oom["surfaced_at"]["line"] == _marker(script, "the call")
    assert oom["explanation"].startswith("call 0 of expand could not allocate 128.0 PiB on the device")


# What XLA:GPU raised on an H200 under a 7 GiB limit (XLA_PYTHON_CLIENT_MEM_FRACTION=0.05, jax 0.11.2) when
# top_scores' [65536, 65536] temporaries did not fit: top_scores had returned, the eager [0, 0] (jit_squeeze)
# consumed its poisoned output, and float(...) raised the error.
GPU_ASYNC_OOM = ("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 96.00GiB with allocator GPU_0_bfc on "
                 "device 0. [tf-allocator-allocation-error=''] [executable_name='jit_squeeze']")
# The same limit, jnp.sort(q @ k.T) at compile: the GEMM autotuner could run no config. The first line as raised;
# the failures XLA appends below it ("Failures (n):", one status each) are in the allocator's words.
GPU_AUTOTUNER_OOM = ("NOT_FOUND: All configs failed during profiling or were excluded from selection.\nFailures (1):\n"
                     "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 16.00GiB.")


def test_an_out_of_memory_error_raised_later_by_an_eager_op_is_the_earlier_calls_whose_size_it_asked() -> None:
    """The GPU's 96.00GiB is top_scores' temporaries (its function table: 96.0 GiB, to the byte a little more):
    the error is that call's, raised later by jit_squeeze. Not a later call's that took a 96 GiB array as its
    argument (its peak counts it), nor an eager operation's asking for the size of top_scores' outputs, nor a
    size 6% away."""
    from rich.console import Console

    from jaxdbg._source import SourceLocation
    from jaxdbg.cli.memory import _render_oom
    from jaxdbg.memory.oom import asked_by, executable_name, explanation, is_out_of_memory, requested_bytes
    from jaxdbg.memory.result import MemoryResult, OutOfMemory, ProgramMemory

    gib = 1 << 30
    temp = 96 * gib + 3 * MIB
    top_scores = ProgramMemory("top_scores", None, 0, 0, "f32[65536] f32[65536]", 512 * KIB, 2 * MIB, 0, temp, 0,
                               512 * KIB + 2 * MIB + temp, needs_bytes=256 * MIB + 2 * MIB + temp, fits=False)
    consumer = ProgramMemory("first", None, 0, 0, "f32[65536,65536]", 96 * gib, 4, 0, 0, 0, 96 * gib + 4)
    asked = requested_bytes(GPU_ASYNC_OOM)
    assert is_out_of_memory(RuntimeError(GPU_ASYNC_OOM)) and asked == 96 * gib
    assert asked_by(asked, [consumer, top_scores]) is top_scores  # the most recently called first
    assert asked_by(asked, [consumer]) is None
    assert asked_by(2 * MIB, [top_scores]) is None and asked_by(90 * gib, [top_scores]) is None
    assert executable_name(GPU_ASYNC_OOM) == "jit_squeeze"
    line = SourceLocation("oom2.py", 10, "<module>")
    said = explanation(GPU_ASYNC_OOM, asked, "top_scores", call_index=0, asynchronous=True, surfaced_at=line,
                       surfaced_in="jit_squeeze")
    assert said == ("call 0 of top_scores could not allocate 96.0 GiB on the device; jax dispatches asynchronously, "
                    "so the call had returned and the error was raised later at oom2.py:10 by jit_squeeze, when its "
                    "result was used")
    assert explanation(GPU_ASYNC_OOM, asked, "top_scores", call_index=0) is None  # raised by the call itself
    oom = OutOfMemory(GPU_ASYNC_OOM, "top_scores", 0, line, asked, 256 * MIB, program=top_scores, asynchronous=True,
                      surfaced_at=line, explanation=said)
    assert MemoryResult(out_of_memory=oom).essential_line() == ("out of memory in top_scores asking for 96.0 GiB, "
                                                                "raised later where its result was used")
    console = Console(record=True, width=400)
    _render_oom(MemoryResult(out_of_memory=oom), console)
    shown = console.export_text()
    assert "out of memory in call 0 of top_scores oom2.py:10, asking for 96.0 GiB" in shown and said in shown
    assert "the allocation that failed is the temporaries of top_scores (96.0 GiB, allocated as one block)" in shown


def test_the_gpu_autotuners_not_found_is_said_in_plain_words() -> None:
    from jaxdbg.memory.oom import explanation, first_line, is_out_of_memory, requested_bytes

    asked = requested_bytes(GPU_AUTOTUNER_OOM)
    assert is_out_of_memory(RuntimeError(GPU_AUTOTUNER_OOM)) and asked == 16 << 30
    assert first_line(GPU_AUTOTUNER_OOM).startswith("NOT_FOUND: All configs failed during profiling")
    said = explanation(GPU_AUTOTUNER_OOM, asked, "top_scores")
    assert said is not None and said.startswith("XLA's GPU autotuner, which runs each candidate kernel")
    assert "matmul or convolution of top_scores" in said and "could run none of them in the memory left" in said
    assert "(16.0 GiB) did not fit" in said


def test_an_equinox_step_on_sharded_arrays_is_measured_per_device(runs) -> None:
    code, report, _ = runs["sharded"]
    result = report["result"]
    # The first call's model is on one device, its outputs replicated over the mesh: one recompile, same program.
    first, program = [f for f in result["functions"] if f["name"] == "train_step"]
    assert program["jit"] == "eqx.filter_jit" and program["devices"] == 4
    # the recompiled row says which argument changed, and how, in profile's words
    assert first["recompiled_because"] is None
    assert program["recompiled_because"].startswith("argument 'model.") and "sharding changed" in (
        program["recompiled_because"])
    batch = 1024 * 64 * 4 // 4  # the f32[1024,64] batch, a quarter on each device
    arguments = {b["argument"]: b for b in program["largest"] if b["kind"] == "argument"}
    assert arguments["x"]["bytes"] == batch and arguments["x"]["op_name"] == "x"
    # filter_jit's inner function takes dynamic_nodonate['rest'][13]: its buffers are named as the user's leaves
    assert "model.layers[1].weight" in arguments and all(
        name.split(".")[0].split("[")[0] in ("x", "y", "model", "opt_state") for name in arguments), arguments
    devices = {d["device"]: d for d in result["devices"]}
    assert set(devices) == {"cpu:0", "cpu:1", "cpu:2", "cpu:3"}
    peaks = [d["peak_live_bytes"] for d in devices.values()]
    assert max(peaks) - min(peaks) <= 16 and min(peaks) >= batch * 2  # each its part (a scalar loss on one only)
    (held,) = program["held"]
    assert held["argument"] == "model, opt_state" and held["threaded"]
    donate = next(h for h in result["hints"] if h["kind"] == "donate")
    assert 'eqx.filter_jit(..., donate="all")' in donate["text"] and "x, y" in donate["text"]
    assert code == 0 and not result["found"]


def test_a_flax_nnx_loop_that_keeps_its_logits_is_named_in_nnx_terms(runs) -> None:
    """nnx.jit threads the model and optimizer through every call (updated in place): the step is followed as
    nnx.jit, the list of per-step logits is the leak, and the donation hint is spelled as nnx.jit takes it."""
    code, report, _ = runs["nnx"]
    script = CORPUS / "nnx_memory_history" / "train.py"
    result = report["result"]
    (program,) = result["functions"]
    assert (program["name"], program["jit"]) == ("train_step", "nnx.jit")
    assert [(h["argument"], h["argnum"], h["threaded"]) for h in program["held"]] == [
        ("model", 0, True), ("optimizer", 1, True)]
    # nnx.jit passes the model as states lists (model.states[0][3]): its buffers are named by the module's fields
    arguments = {b["argument"] for b in program["largest"] if b["kind"] == "argument"}
    assert "model.out.kernel" in arguments and "optimizer.opt_state[0].mu.out.kernel" in arguments, arguments
    (leak,) = result["leaks"]
    logits = 256 * 512 * 4  # one step's f32[BATCH, CLASSES] logits
    assert leak["kept_by"] == "list 'history'" and leak["kept_at"]["line"] == _marker(script, "keeps")
    assert leak["producer"] == "train_step" and leak["source"]["line"] == _marker(script, "call")
    assert (leak["arrays"], leak["per_call_bytes"]) == (11, logits)  # 12 steps: all but the latest call's
    donate = next(h for h in result["hints"] if h["kind"] == "donate")
    assert "nnx.jit(..., donate_argnums=(0, 1))" in donate["text"]
    assert donate["saves_bytes"] == sum(h["bytes"] for h in program["held"])
    assert code == 1 and result["found"]


def test_a_pmapped_function_is_followed_as_a_function_with_its_compiled_peak(runs) -> None:
    """The same run's pmap'd evaluation (pmap is a jit jax builds itself, which takes no compiler options): its own
    entry, per device, with the buffers of its own buffer-assignment dump, its arguments named as the user's."""
    _, report, _ = runs["sharded"]
    (program,) = [f for f in report["result"]["functions"] if f["name"] == "evaluate"]
    block = 1024 * 64 * 4 // 4  # xs and ys: f32[4,256,64], one [256,64] block on each device
    assert program["jit"] == "jax.pmap" and program["devices"] == 4
    assert program["argument_bytes"] == 2 * block and program["peak_bytes"] >= 2 * block
    assert [b["bytes"] for b in program["largest"] if b["kind"] == "argument"] == [block, block]
    # pmap's own jit calls its parameters flat_args[i]: they are named by the user's parameters, as a jit's are
    arguments = [b for b in program["largest"] if b["kind"] == "argument"]
    assert sorted((b["argument"], b["op_name"]) for b in arguments) == [("xs", "xs"), ("ys", "ys")]
    assert program["dump"] and program["source"]["line"] == _line(CORPUS / "eqx_sharded_donation" / "train.py",
                                                                  "@functools.partial(jax.pmap")


def test_the_commands_parent_imports_neither_jax_nor_numpy(tmp_path) -> None:
    """Only the child runs jax: the parent that assembles the report imports neither (1.1 s and 0.1 s of the
    command's start otherwise), nor matplotlib (and numpy with it) unless --plot asks for memory.png."""
    (tmp_path / "hello.py").write_text("print('hello')\n")
    code = ("import sys\nfrom jaxdbg.cli import main\ncode = main(['memory', 'hello.py', '-q'])\n"
            "print(code, sorted({m.split('.')[0] for m in sys.modules} & {'jax', 'numpy', 'matplotlib'}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip().splitlines()[-1] == "0 []", done.stdout + done.stderr


@pytest.mark.parametrize(("argv", "says"), [
    (["recipes/memory_leak/train.py", "--device-memory", "12XB"], "is not a byte count"),
    (["recipes/memory_leak/train.py", "--device-memory", "0"], "positive amount"),
    (["recipes/memory_leak/train.py", "--budget", "peak<=1GiB"], "unknown metric 'peak'"),
    (["recipes/memory_leak/train.py", "--budget", "f.live_bytes<=1GiB"], "whole run only"),
    (["recipes/memory_leak/train.py", "--args", "f32[3]"], "function target"),
])
def test_bad_input_is_one_line_and_exit_2(argv, says, capsys, tmp_path) -> None:
    assert main(["memory", *argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


def test_check_reads_a_memory_report_back(runs) -> None:
    from jaxdbg.check.findings import finding

    _, report, _ = runs["remat"]
    line, where = finding(report)
    assert line is not None and line.startswith("train_step needs ") and "budget broken" in line
    decorated = _line(RECIPES / "memory_remat" / "train.py", "@jax.jit")  # a function's first line: its decorator
    assert where is not None and (where.function, where.line) == ("train_step", decorated)
    _, leak, _ = runs["leak"]
    line, where = finding(leak)
    assert re.match(r"leak: train_step outputs kept \(list 'activations'\)", line or "")
    assert where is not None and where.line == _marker(RECIPES / "memory_leak" / "train.py", "keeps")


def test_metrics_of_a_memory_report(runs) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from jaxdbg.metrics.export import text_of

    _, report, _ = runs["leak"]
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text_of(report)) for s in family.samples}
    assert samples[("jaxdbg_memory_leaks", (("process", "0"),))] == 1
    assert samples[("jaxdbg_memory_leaked_bytes", (("process", "0"),))] == 23 * 512 * 256 * 4
    assert samples[("jaxdbg_memory_run_peak_bytes", (("process", "0"),))] == report["result"]["peak"]["bytes"]
    key = ("jaxdbg_device_memory_peak_bytes", (("device", "cpu:0"), ("process", "0")))
    assert samples[key] == next(d["peak_live_bytes"] for d in report["result"]["devices"] if d["device"] == "cpu:0")


def test_a_memory_budget_gates_a_check_suite(tmp_path, capsys) -> None:
    """`jaxdbg check` runs a memory check with a peak_bytes budget: its verdict, finding and user line."""
    model = RECIPES / "memory_fit" / "model.py"
    config = tmp_path / "pyproject.toml"
    config.write_text(f'[tool.jaxdbg.check.fits]\ncommand = "memory"\ntarget = "{model}::top_scores"\n'
                      'budget = "top_scores.peak_bytes<=64KiB"\n'
                      'options = ["--args", "f32[256,64] f32[256,64]", "--no-plot"]\n')
    code = main(["check", "--config", str(config), "--out", str(tmp_path / "out"), "--json", str(tmp_path / "c.json")])
    (check,) = json.loads((tmp_path / "c.json").read_text())["result"]["checks"]
    assert code == 1 and (check["command"], check["passed"]) == ("memory", False)
    finding = check["finding"]
    assert finding.startswith("budget broken: top_scores.peak_bytes ") and "> 65536 (64.0 KiB)" in finding
    assert (check["location"]["function"], check["location"]["line"]) == ("top_scores", _line(model, "def top_scores"))


def test_a_failure_of_the_recorder_is_a_note_and_the_run_goes_on(tmp_path, monkeypatch) -> None:
    import jax
    import jax.numpy as jnp

    from jaxdbg import jit_layer
    from jaxdbg.memory import recorder
    from jaxdbg.memory.messages import MemoryNote, ProgramAnalysed

    def broken(*args, **kwargs):
        raise RuntimeError("snapshot broke")

    monkeypatch.setattr(recorder, "take_snapshot", broken)
    sent: list = []
    hook = recorder.MemoryRecorder(sent.append, str(tmp_path))
    with recorder.compile_spans(hook), jit_layer.installed(hook):
        double = jax.jit(lambda x: x * 2.0)
        assert [float(double(jnp.float32(v))) for v in (1.0, 2.0)] == [2.0, 4.0]  # the program's answers stand
    (note,) = [m.text for m in sent if isinstance(m, MemoryNote)]
    assert "stopped following live memory (sampling live memory failed: RuntimeError: snapshot broke)" in note
    assert [m.program.name for m in sent if isinstance(m, ProgramAnalysed)] == ["<lambda>"]  # analysed all the same


def test_donation_is_hinted_only_where_it_saves_a_share_of_the_peak_worth_saying() -> None:
    """A training step's params (48 MiB of a 208 MiB peak) are hinted; a metrics tuple threaded through the same
    loop (8 B) is not. The peak is weighed without what leaked: a leak's bytes do not drown the donation."""
    from jaxdbg.memory.hints import hints_for
    from jaxdbg.memory.result import Held, Leak, ProgramMemory

    def program(name: str, held: int, peak: int) -> ProgramMemory:
        return ProgramMemory(name, None, 0, 0, "", held, held, 0, 0, 0, peak,
                             held=(Held("state", 0, held, 2, threaded=True),))

    step, metrics = program("train_step", 48 * MIB, 160 * MIB), program("update_metrics", 8, 36)
    hints = hints_for([step, metrics], (), None, 1, "cpu", peak_bytes=208 * MIB)
    assert [(h.kind, h.function) for h in hints if h.kind == "donate"] == [("donate", "train_step")]
    small = program("train_step", 512 * KIB, 3 * MIB)
    leak = Leak("train_step", None, 23, 11 * MIB + 512 * KIB, 512 * KIB, 1, 23)
    assert [h.kind for h in hints_for([small], (leak,), None, 1, "cpu", peak_bytes=15 * MIB)] == ["leak", "donate"]
    assert not [h for h in hints_for([small], (), None, 1, "cpu", peak_bytes=15 * MIB) if h.kind == "donate"]


def test_float32_copies_of_bfloat16_weights_are_hinted_with_the_cast_line() -> None:
    """A step that casts its bf16 weights to float32 holds f32 arrays of their very shapes (the copy, the float32
    gradient): a dtype hint names the arguments and the cast's line. A float32 activation of another shape, or
    copies too small to matter, are not."""
    from jaxdbg._source import SourceLocation
    from jaxdbg.memory.hints import hints_for
    from jaxdbg.memory.result import Buffer, ProgramMemory

    cast = SourceLocation("train.py", 16, "loss_fn")
    weights = (Buffer("w", "argument", 8 * MIB, "bf16[512,8192]", argument="params['unembed']"),
               Buffer("d", "argument", 2 * MIB, "bf16[2048,512]", argument="params['down']"))
    gradient = SourceLocation("train.py", 17, "loss_fn")
    copies = (Buffer("dot.1", "temp", 16 * MIB, "f32[512,8192]", op="transpose", source=gradient),
              Buffer("wrapped_convert.2", "temp", 4 * MIB, "f32[2048,512]", source=cast))

    def hints(*largest: Buffer, peak: int = 60 * MIB):
        step = ProgramMemory("train_step", None, 0, 0, "", 12 * MIB, 0, 0, 36 * MIB, 0, peak, largest=largest)
        return [h for h in hints_for([step], (), None, 1, "cpu") if h.kind == "dtype"]

    (hint,) = hints(*weights, *copies)
    assert "bfloat16 arguments params['unembed'], params['down'] (f32[512,8192], f32[2048,512], 20.0 MiB" in hint.text
    assert hint.saves_bytes == 10 * MIB and hint.source == cast and "preferred_element_type" in hint.text
    assert not hints(*weights, Buffer("h", "temp", 16 * MIB, "f32[16,2048]", op="tanh"))
    assert not hints(*weights, *copies, peak=1024 * MIB)


def test_the_held_line_lists_what_weighs_and_sums_up_the_scalars() -> None:
    """params (48 MiB of a 160 MiB peak) get their line; a step counter and a learning rate held across the same
    call are summed up in one dim line, not listed one by one."""
    from rich.console import Console

    from jaxdbg.cli.memory import _render_buffers
    from jaxdbg.memory.result import Held, ProgramMemory

    held = (Held("params", 0, 48 * MIB, 6, threaded=True), Held("step", 1, 4, 1, threaded=True),
            Held("lr", 2, 4, 1, threaded=False))
    console = Console(record=True, width=200)
    _render_buffers(ProgramMemory("train_step", None, 0, 0, "", 48 * MIB, 48 * MIB, 0, 0, 0, 160 * MIB, held=held),
                    console)
    text = console.export_text()
    assert "held across the call: params, 48.0 MiB in 6 array(s)" in text
    assert "held across the call: step" not in text and "and 2 smaller argument(s) held across the call, 8 B" in text


def test_recompiled_rows_say_what_changed_and_the_buffers_which_compile_they_are() -> None:
    """A step with a static learning rate recompiles each epoch: each row's cause is said once per cause under the
    table (rows with the same cause share a line), and the buffers shown are named as the compile they come from."""
    import dataclasses

    from rich.console import Console

    from jaxdbg.cli.memory import _render_buffers, _render_functions
    from jaxdbg.memory.result import Buffer, ProgramMemory

    first = ProgramMemory("train_step", None, 0, 0, "", KIB, KIB, 0, 0, 0, 3 * KIB)
    rows = (first, *(dataclasses.replace(first, compile_index=i, call_index=4 * i, recompiled_because=why)
                     for i, why in ((1, "static argument 'lr' changed 0.1 -> 0.05"),
                                    (2, "static argument 'lr' changed 0.05 -> 0.025"),
                                    (3, "a new Python callable"), (4, "a new Python callable"))))
    console = Console(record=True, width=200)
    _render_functions(rows, console)
    largest = (Buffer("p0", "argument", KIB, "f32[256]", None, "", None),)
    _render_buffers(dataclasses.replace(rows[-1], largest=largest), console)
    text = console.export_text()
    assert "train_step #1 (call 4): static argument 'lr' changed 0.1 -> 0.05" in text
    assert "train_step #2 (call 8): static argument 'lr' changed 0.05 -> 0.025" in text
    assert "train_step #3, #4 (calls 12, 16): a new Python callable" in text
    assert "train_step #4: largest buffers at its peak" in text


def test_an_earlier_runs_dump_in_the_same_out_folder_is_cleared(tmp_path) -> None:
    """XLA numbers a run's modules afresh: a stale module_0026.jit_forward from an earlier run into the same --out,
    newer-numbered than this run's first compile, was read as its buffer assignment."""
    from jaxdbg.memory.jobs import dump_folder

    stale = tmp_path / "xla_dump" / "module_0026.jit_forward.cpu_after_optimizations-buffer-assignment.txt"
    stale.parent.mkdir()
    stale.write_text("allocation 0: size 4")
    (tmp_path / "xla_dump" / "notes.txt").write_text("the user's")
    assert dump_folder(str(tmp_path / "xla_dump")) == str(tmp_path / "xla_dump")
    assert sorted(p.name for p in (tmp_path / "xla_dump").iterdir()) == ["notes.txt"]


def test_arrays_that_appeared_once_and_stayed_are_no_leak() -> None:
    """tests/corpus/gnn_segment_sum: a GNN step closing over its edge lists; the first call leaves 1.2-1.6 MB more
    outside jitted calls, then nothing changes (before: 'leak ... kept by an unnamed list', exit 1). The points
    are shaped like that run's samples; the full run is left out of the suite (7 s)."""
    from jaxdbg.memory.leaks import GroupPoint, is_leak

    jump = [GroupPoint(i, arrays=7 if i else 3, bytes=(3300 if i else 1800) * KIB, calls=0) for i in range(7)]
    assert not is_leak(jump, min_bytes=MIB)
    piling = [GroupPoint(i, arrays=3 + i, bytes=(1800 + 500 * i) * KIB, calls=0) for i in range(7)]
    assert is_leak(piling, min_bytes=MIB)


def test_a_growing_state_is_no_leak_and_does_not_make_a_list_of_scalars_one() -> None:
    """A KV cache grown by concatenation: the latest call's outputs (the cache) grow 16 KiB a call while a list
    keeps each call's 4-byte token. Only older calls' outputs can leak: 4 B a call is far under the threshold
    (before, the cache's growth was charged to the list: 'leak ... 316 B', exit 1)."""
    from jaxdbg.memory.leaks import GroupPoint, growing_state, is_leak

    def point(i: int, latest: int) -> GroupPoint:
        cache = (i + 1) * 16 * KIB
        return GroupPoint(i, arrays=i + 2, bytes=cache + 4 * i, calls=i + 1, first_call=0, last_call=i,
                          latest_arrays=2, latest_bytes=latest)

    kv = [point(i, (i + 1) * 16 * KIB) for i in range(80)]
    assert not is_leak(kv, min_bytes=MIB)
    assert is_leak([point(i, 0) for i in range(80)], min_bytes=MIB)  # the same bytes, all from older calls: a leak
    # the growth itself is said (a note: memory that grows without bound, a recompile per shape), with its rate
    assert growing_state(kv, min_bytes=MIB) == (16 * KIB, 80 * 16 * KIB, 16 * KIB)
    assert growing_state([point(i, 64 * KIB) for i in range(80)], min_bytes=MIB) is None  # a steady state


def test_buffers_name_a_donated_argument_written_in_place_and_list_no_tuple_or_token(tmp_path) -> None:
    """An output XLA writes into a donated argument's buffer is that argument's memory (named as the user passed
    it); the outputs' tuple (a table of pointers) and the ordered callback's token hold no data."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import io_callback

    from jaxdbg.memory.program import ProgramInfo, analyse

    def step(params, x):
        io_callback(lambda v: None, None, x.sum(), ordered=True)
        return {"w": params["w"] - x}, x.sum(), x.max()

    options = {"xla_dump_to": str(tmp_path), "xla_dump_hlo_as_text": True}
    jitted = jax.jit(step, donate_argnums=0, compiler_options=options)
    compiled = jitted.lower({"w": jnp.ones((64, 64))}, jnp.ones((64, 64))).compile()
    largest = analyse(compiled, ProgramInfo("step", None, 0, 0, ""), str(tmp_path)).largest
    assert all(b.bytes > 0 and not b.shape.startswith(("(", "token")) for b in largest), largest
    assert {b.argument for b in largest if b.kind == "argument"} == {"params['w']", "x"}, largest


def test_a_checkpointed_scan_whose_stacked_outputs_fill_the_peak_is_told_to_accumulate_in_the_carry() -> None:
    """A long RNN scan under jax.checkpoint that returns every hidden state as ys: the stacked buffers (one slice
    per iteration) are named, with the carry accumulation that drops the ys."""
    from jaxdbg._source import SourceLocation
    from jaxdbg.memory.hints import remat_hints
    from jaxdbg.memory.result import Buffer, ProgramMemory

    scan = SourceLocation("rnn.py", 17, "loss")
    stacked = tuple(Buffer(f"dus.{i}", "temp", 125 * MIB, "f32[2000,32,512]", "dynamic_update_slice", source=scan,
                           pass_="forward") for i in range(2))
    program = ProgramMemory("loss_and_grad", None, 0, 0, "", 127 * MIB, 2 * MIB, 375 * MIB, 0, 0, 504 * MIB,
                            largest=stacked, forward_kept_bytes=250 * MIB, checkpointed=True)
    (hint,) = remat_hints([program])
    assert "although it already uses jax.checkpoint" in hint.text
    assert "2 of them (made at rnn.py:17) are stacked one slice per loop iteration" in hint.text
    assert "accumulate it in the carry" in hint.text



def _seen(see):
    """A jit-layer hook that keeps ``see(call)`` for every call, taken before it runs (the layer lets go of the
    call's arguments once it returned)."""
    from jaxdbg.jit_layer import JitHook

    class Keep(JitHook):
        def __init__(self) -> None:
            self.seen: list = []

        def before(self, call) -> None:
            self.seen.append(see(call))

    return Keep()


def test_a_checkified_functions_buffers_and_held_arguments_are_named_by_its_own_parameters(tmp_path) -> None:
    """jax.jit(checkify.checkify(f)) compiles checkify's ``checked_fun(*args, **kwargs)``: jax names the arguments
    ``args[0]``, ``args[1]``; the buffers and the held list name them as f does (``weights``, ``batch``)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import checkify

    from jaxdbg import jit_layer
    from jaxdbg.memory.program import ProgramInfo, analyse
    from jaxdbg.memory.recorder import FunctionState, _argument_names

    program = tmp_path / "checked.py"  # a user file: jaxdbg looks inside checkify's wrapper only for user code
    program.write_text("import jax.numpy as jnp\nfrom jax.experimental import checkify\n\n\n"
                       "def f(weights, batch):\n"
                       "    checkify.check(jnp.all(batch > -1e9), 'batch is finite')\n"
                       "    return jnp.tanh(batch @ weights).sum()\n")
    f = runpy.run_path(str(program))["f"]
    keep = _seen(lambda call: (_argument_names(call), FunctionState(call.function).parameters))
    args = jnp.ones((64, 64)), jnp.ones((32, 64))
    with jit_layer.installed(keep):
        jax.jit(checkify.checkify(f))(*args)[0].throw()
    ((names, parameters),) = keep.seen
    assert dict(names) == {"args[0]": "weights", "args[1]": "batch"}
    assert parameters == ("weights", "batch")  # what the held list says
    dump = tmp_path / "dump"
    options = {"xla_dump_to": str(dump), "xla_dump_hlo_as_text": True}
    compiled = jax.jit(checkify.checkify(f), compiler_options=options).lower(*args).compile()
    largest = analyse(compiled, ProgramInfo("checkify(f)", None, 0, 0, "", argument_names=names), str(dump)).largest
    assert {b.argument for b in largest if b.kind == "argument"} == {"weights", "batch"}, largest


def test_an_equinox_module_called_as_the_function_is_named_by_its_class() -> None:
    """eqx.filter_jit(model)(x): the module is an argument of filter_jit's compiled function; the held list, the
    signature and the hints name it ``MLP`` (its leaves ``MLP.w1``), never ``<function>``."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    from jaxdbg import frameworks, jit_layer
    from jaxdbg.memory.recorder import _argument_names

    class MLP(eqx.Module):
        w1: jax.Array

        def __call__(self, x):
            return MLP(self.w1 + x)

    keep = _seen(lambda call: (frameworks.user_arguments(call.function.fun, call.args, call.kwargs),
                               _argument_names(call)))
    with jit_layer.installed(keep):
        eqx.filter_jit(MLP(jnp.ones((8, 8))))(jnp.ones((8, 8)))
    ((arguments, names),) = keep.seen
    assert [a.name for a in arguments] == ["MLP", "x"]
    assert "MLP.w1" in dict(names).values()


def test_an_argument_filter_jit_holds_across_the_call_is_named_as_the_user_passed_it() -> None:
    """filter_jit packs every array argument into its inner function's ``dynamic_nodonate``: the held list names
    the user's argument whose array an output could have reused (``x``), not ``dynamic_nodonate``."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    from jaxdbg import jit_layer
    from jaxdbg.memory.program import ProgramInfo, donations
    from jaxdbg.memory.recorder import FunctionState, _argument_names

    class MLP(eqx.Module):
        w1: jax.Array

        def __call__(self, x):
            return x @ self.w1

    def step(model, x):
        return model(x)

    keep = _seen(lambda call: (call.function, tuple(call.args), _argument_names(call),
                               FunctionState(call.function).parameters))
    with jit_layer.installed(keep):
        eqx.filter_jit(step)(MLP(jnp.ones((8, 4))), jnp.ones((16, 8)))  # the output, f32[16,4], fits no argument
        eqx.filter_jit(step)(MLP(jnp.ones((8, 8))), jnp.ones((16, 8)))  # f32[16,8]: x's shape
    function, args, names, parameters = keep.seen[-1]
    statics = tuple(function.static_argnums)
    compiled = jax.jit(function.fun, static_argnums=statics).lower(*args).compile()
    info = ProgramInfo("step", None, 1, 1, "", parameters, statics, len(args), argument_names=names)
    assert [(h.argument, h.leaves) for h in donations(compiled, info)[0]] == [("x", 1)]


def test_a_donation_no_output_can_take_is_told_to_save_nothing() -> None:
    """Params donated but returned cast to bf16 (no output has their f32 shapes): XLA aliases nothing, and the
    program's note says so; the f32 `x` that an f32 output could reuse is still a held argument."""
    import jax
    import jax.numpy as jnp

    from jaxdbg.memory.program import ProgramInfo, donations, refused_note

    def step(params, x):
        return jax.tree_util.tree_map(lambda p: p.astype(jnp.bfloat16), params), x * 2

    params = {"w1": jnp.ones((64, 32)), "w2": jnp.ones((32,))}
    compiled = jax.jit(step, donate_argnums=(0,)).lower(params, jnp.ones((8,))).compile()
    info = ProgramInfo("step", None, 0, 0, "", ("params", "x"), (), 2)
    held, refused = donations(compiled, info)
    assert [(h.argument, h.argnum, h.bytes, h.leaves) for h in refused] == [("params", 0, 4 * (64 * 32 + 32), 2)]
    assert [h.argument for h in held] == ["x"]
    assert "donated params" in (refused_note(refused, 16_000) or "") and refused_note(refused, 10**9) is None


def test_a_scans_stacked_outputs_and_the_residuals_saved_for_its_gradient_are_told_apart(tmp_path) -> None:
    """An RNN scan that returns every hidden state: run forward, its stacked ys are the scan's outputs; under
    jax.grad the stacks its forward pass keeps (ys included: only the gradient reads them) are saved for the
    gradient, listed at the peak (a loop's state, once missing from the list) and counted as kept activations;
    under value_and_grad the hidden states reach the loss too: ys again."""
    import jax
    import jax.numpy as jnp

    from jaxdbg.memory.program import ProgramInfo, analyse

    def scan(w, xs):
        return jax.lax.scan(lambda h, x: (jnp.tanh(h @ w + x),) * 2, jnp.zeros((16, 64)), xs)[1]

    scan_line = scan.__code__.co_firstlineno + 1

    def loss(w, xs):
        return jnp.sum(scan(w, xs) ** 2)

    def stacked(function, name, labels: list | None = None) -> tuple[dict, int]:
        dump = tmp_path / name
        options = {"xla_dump_to": str(dump), "xla_dump_hlo_as_text": True}
        compiled = jax.jit(function, compiler_options=options).lower(jnp.ones((64, 64)), jnp.ones((32, 16, 64)))
        program = analyse(compiled.compile(), ProgramInfo(name, None, 0, 0, ""), str(dump))
        if labels is not None:
            labels += [(b.label(), b.source.line if b.source else None) for b in program.largest if b.stacked]
        return {b.name: b.stacked for b in program.largest if b.stacked}, program.forward_kept_bytes

    labels: list = []
    ys, _ = stacked(scan, "forward", labels)
    assert set(ys.values()) == {"ys"}, ys
    # named as what it is, at the user's line, not as the dynamic_update_slice that writes it
    assert labels == [("output: tanh, a loop's outputs (scan ys) stacked over 32 steps", scan_line)], labels
    labels.clear()
    residuals, kept = stacked(jax.grad(loss), "grad", labels)
    assert len(residuals) >= 2 and set(residuals.values()) == {"residuals"}, residuals
    # the hidden state carried in and saved as it was (no operation of its own): the scan's line
    assert all("dynamic_update_slice" not in label and line == scan_line for label, line in labels), labels
    assert kept >= len(residuals) * 32 * 16 * 64 * 4
    both, _ = stacked(jax.value_and_grad(loss), "value_and_grad")
    assert set(both.values()) == {"ys", "residuals"}, both


def test_a_loops_carry_written_in_place_is_counted_once_at_the_peak(tmp_path) -> None:
    """SGD steps in a scan whose carry (the weights) the body updates in place: XLA lists both the loop's state
    and the body's write at the peak, one buffer; the schedule's peak stays within what the call holds."""
    import jax
    import jax.numpy as jnp

    from jaxdbg.memory.program import ProgramInfo, analyse

    def train(w, xs):
        def step(w, x):
            return w - 0.1 * jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2))(w), None
        return jax.lax.scan(step, w, xs)[0]

    options = {"xla_dump_to": str(tmp_path), "xla_dump_hlo_as_text": True}
    compiled = jax.jit(train, compiler_options=options).lower(jnp.ones((256, 256)), jnp.ones((4, 8, 256))).compile()
    program = analyse(compiled, ProgramInfo("train", None, 0, 0, ""), str(tmp_path))
    assert program.schedule_peak_bytes is not None
    assert program.schedule_peak_bytes <= program.peak_bytes - program.code_bytes, program
    # the carry returned: named as the output, not as the gradient its block holds at the peak
    (returned,) = [b for b in program.largest if b.kind == "output" and b.shape == "f32[256,256]"]
    assert (returned.output, returned.pass_, returned.label()) == ("output", None, f"output: {returned.op}"), returned
    assert returned.op in ("sub", "mul") and returned.source is not None, returned  # the update, w - 0.1 * g
