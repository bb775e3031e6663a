"""`jaxdbg repro` on the real-program corpus (tests/corpus/) and on what such programs bring: framework shape
errors cut to the one JAX operation, reproducers that stand alone in an empty folder, a host callback's
exception as the signature, pytree and bfloat16 inputs of a function target."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdbg.cli import main
from jaxdbg.repro.program import count_lines
from jaxdbg.repro.signature import Criterion, normalise_message
from jaxdbg.target import flatten_inputs, load_npz_inputs, save_npz_inputs

from conftest import line_of

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def repro(tmp_path, *argv):
    """`jaxdbg repro ...` in-process; returns (exit code, report, out folder). One run of the original: these
    programs fail every time (telling a flaky failure takes two: test_repro_cli's test_flaky_failure_...)."""
    out = tmp_path / "out"
    code = main(["repro", "--out", str(out), "--json", str(tmp_path / "r.json"), "-q", "--runs", "1", *argv])
    return code, json.loads((tmp_path / "r.json").read_text()), out


def imports_of(path) -> set[str]:
    tree = ast.parse(Path(path).read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return names | {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}


def run_alone(path, tmp_path, *companions, blocked=()):
    """`python repro.py` copied alone into an empty folder (nothing of the user's around it), as a user would;
    the packages named in ``blocked`` cannot be imported (as where they are not installed)."""
    folder = tmp_path / f"alone-{os.path.basename(path)}"
    folder.mkdir()
    for name in (path, *companions):
        shutil.copy(name, folder)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # jax from the environment, not the repo
    command = [os.path.basename(path)]
    if blocked:
        command = ["-c", f"import runpy, sys; sys.modules.update(dict.fromkeys({list(blocked)!r})); "
                         f"runpy.run_path({command[0]!r}, run_name='__main__')"]
    return subprocess.run([sys.executable, *command], cwd=folder, capture_output=True, text=True, timeout=120,
                          env=env)


def raised(run) -> tuple[str, str]:
    """(exception type, normalised message) of a failed run: its traceback's last `SomeError: message` line
    (JAX prints a note about filtered frames after it)."""
    for line in reversed(run.stderr.strip().splitlines()):
        found = re.match(r"^([A-Za-z_][\w.]*(?:Error|Exception)): (.*)$", line)
        if found:
            return found.group(1).rsplit(".", 1)[-1], normalise_message(found.group(2))
    return "", run.stderr[-300:]


# ----------------------------------------------------------------------------------------------------------
# The corpus: framework programs whose shape error is cut to the one JAX operation
# ----------------------------------------------------------------------------------------------------------

# program, file and marker of the user's line that calls the failing operation, shapes of its inputs
SHAPE_ERRORS = [
    # Flax NNX Transformer LM, bf16 compute: the attention output projection is emb_dim wide, its input qkv_dim.
    ("nnx_lm_shape", "train.py", "# attention output projection", "bfloat16[8,32,48], bfloat16[64,64]"),
    # Equinox GRU under lax.scan, vmap, filter_value_and_grad and filter_jit: 3 features into a 2-input cell.
    ("eqx_gru_shape", "train.py", "# one GRU step per time step", "float32[48,2], float32[3]"),
    # Flax NNX CNN in a sibling module (models.py): 32x32 images into a layer sized for 28x28.
    ("nnx_cnn_sibling", "models.py", "x = nnx.relu(self.dropout2(self.linear1(x)",
     "float32[32,4096], float32[3136,256]"),
]


@pytest.fixture(scope="module", params=SHAPE_ERRORS, ids=[case[0] for case in SHAPE_ERRORS])
def shape_error(request, tmp_path_factory):
    pytest.importorskip("flax")
    pytest.importorskip("equinox")
    program = request.param[0]
    tmp_path = tmp_path_factory.mktemp(program)
    # --max-time bounds the second file (repro_source.py) only (the cut is found before): it leaves that file's
    # reduction some time after a slow detection on a loaded machine. --source-time 8: what is checked of
    # repro_source.py (the user's line, siblings pasted, failing alone) holds however far it was reduced (the
    # default budget is test_repro_cli's test_time_limit_keeps_the_smallest_verified_reproducer).
    code, report, out = repro(tmp_path, os.path.join(CORPUS, program, "train.py"), "--max-time", "90",
                              "--source-time", "8")
    return request.param, code, report, out, tmp_path


def test_a_framework_shape_error_becomes_its_one_operation_which_fails_alone(shape_error):
    (program, culprit, marker, avals), code, report, out, tmp_path = shape_error
    result = report["result"]
    assert code == 0 and result["verified"] and result["strategy"] == "computation"
    assert result["failing_primitives"] == ["dot_general"] and result["minimized"]["equations"] == 1
    assert result["signature"]["type"] == "TypeError" and "dot_general requires" in result["signature"]["message"]
    user_file = os.path.join(CORPUS, program, culprit)
    assert result["signature"]["location"]["file"] == user_file
    assert result["signature"]["location"]["line"] == line_of(user_file, marker)
    text = (out / "repro.py").read_text()
    assert count_lines(text) <= 15 and result["minimized"]["lines"] == count_lines(text)
    assert imports_of(out / "repro.py") <= {"jax", "numpy"}
    assert f"dot_general({avals})" in text and f"Called at {culprit}:{line_of(user_file, marker)}" in text
    assert result["original"]["lines"] >= 60
    run = run_alone(out / "repro.py", tmp_path)  # copied alone into an empty folder, it fails the same way
    assert run.returncode != 0 and raised(run) == (result["signature"]["type"], result["signature"]["message"])


def test_the_program_reduced_at_the_users_level_points_at_the_users_line(shape_error):
    """repro_source.py: the user's program (sibling modules pasted in), failing at the user's line, alone."""
    (program, culprit, marker, _), _, report, out, tmp_path = shape_error
    source = (out / "repro_source.py").read_text()
    assert report["artifacts"]["source"] == str(out / "repro_source.py")
    assert "import models" not in source and "from models" not in source
    line = line_of(os.path.join(CORPUS, program, culprit), marker)
    failing = next(text for text in source.splitlines() if "# <- jaxdbg: fails here" in text)
    assert f"({culprit}:{line} " in failing
    signature = report["result"]["signature"]
    run = run_alone(out / "repro_source.py", tmp_path)
    assert run.returncode != 0 and raised(run) == (signature["type"], signature["message"])


# ----------------------------------------------------------------------------------------------------------
# A NaN in a framework program: cut to the operation that made it
# ----------------------------------------------------------------------------------------------------------


def cut_first_step(tmp_path, program: str, make_args):
    """The program's first ``train_step`` captured and cut as repro's cut child does (``cut_captured``, which
    writes repro.py and checks it), here in this process: (summary, repro.py's path, the program's path)."""
    import importlib.util
    import time

    from jaxdbg.repro.cutting import cut_captured
    from jaxdbg.repro.jobs import CutRequest, RunRequest
    from jaxdbg.repro.messages import FailureSeen
    from jaxdbg.repro.watch import Captured, trace_flat

    path = os.path.join(CORPUS, program, "train.py")
    spec = importlib.util.spec_from_file_location(program, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    closed, flat = trace_flat(module.train_step, {}, make_args(module), {})
    seen = FailureSeen("nonfinite", "train_step", 0, "jitted function produced NaN", what="NaN")
    request = CutRequest(RunRequest(script=path), str(tmp_path), str(tmp_path / "progress"), budget_s=120)
    summary = cut_captured(Captured("train_step", closed, flat, seen), request, time.perf_counter() + 120)
    return summary, tmp_path / "repro.py", path


def vae_args(vae):
    data = vae.binarised_digits(np.random.default_rng(0), 64)
    params = vae.init_params(jax.random.PRNGKey(0), jnp.asarray(data.mean(axis=0)))
    return params, vae.optimizer.init(params), jnp.asarray(data[:32]), jax.random.PRNGKey(1)


def l2sp_args(l2sp):
    pretrained = l2sp.init_mlp(jax.random.PRNGKey(0), [l2sp.FEATURES, l2sp.HIDDEN, l2sp.CLASSES])
    params = jax.tree.map(jnp.copy, pretrained)
    x, labels = l2sp.clusters(np.random.default_rng(0), 32)
    return params, l2sp.optimizer.init(params), pretrained, jnp.asarray(x), jnp.asarray(labels)


NAN_PROGRAMS = [
    # Plain JAX + Optax VAE: a -inf bias (log-odds of a pixel never on) makes p = 0, and x * log(p) with x = 0
    # is NaN after the fori_loop. The inputs hold -inf (the bias), the jaxpr PRNG keys: the cut still starts
    # from no NaN and ends at the one multiplication.
    ("vae_fori_nan", vae_args, "# the NaN: 0 * log(0)", ["mul"]),
    # Optax warmup-cosine + clip_by_global_norm + MultiSteps, an L2-SP penalty ||params - pretrained|| at
    # distance 0: 0.5 / sqrt(0) = inf, then 0 * inf = NaN in the gradient; neither alone fails from finite
    # inputs, the chain does (optax's whole update cut away).
    ("optax_multisteps_l2sp_nan", l2sp_args, "# the NaN: d sqrt at 0", ["div", "mul", "broadcast_in_dim", "mul"]),
]


@pytest.mark.parametrize("program, make_args, marker, primitives", NAN_PROGRAMS, ids=[p[0] for p in NAN_PROGRAMS])
def test_a_nan_in_a_framework_program_is_cut_to_the_operations_that_made_it(program, make_args, marker, primitives,
                                                                           tmp_path):
    summary, written, path = cut_first_step(tmp_path, program, make_args)
    assert summary.ok and summary.self_check and summary.primitives == primitives, summary.reason
    assert summary.equations_original > 150  # the whole step: forward, backward and the optimiser update
    text = written.read_text()
    assert count_lines(text) <= 15 and imports_of(written) <= {"jax", "numpy"}
    assert f"train.py:{line_of(path, marker)}" in text
    run = run_alone(written, tmp_path)
    assert run.returncode != 0 and "produced NaN" in run.stderr


# ----------------------------------------------------------------------------------------------------------
# A shape error raised by jax.numpy itself (before any primitive): cut to that one call
# ----------------------------------------------------------------------------------------------------------


def test_a_jnp_level_shape_error_becomes_that_one_call_in_bf16(tmp_path):
    """Flax Linen LM, bf16 compute: 100 features split into 8 heads of 12 fails in jnp's reshape check."""
    pytest.importorskip("flax")
    program = os.path.join(CORPUS, "linen_lm_heads", "train.py")
    code, report, out = repro(tmp_path, program, "--max-time", "20", "--source-time", "0")
    result = report["result"]
    assert code == 0 and result["verified"] and result["strategy"] == "computation"
    assert result["failing_primitives"] == ["Array.reshape"] and result["minimized"]["equations"] == 1
    assert result["signature"]["type"] == "TypeError" and "cannot reshape array" in result["signature"]["message"]
    line = line_of(program, "# split into heads")
    assert (result["signature"]["location"]["file"], result["signature"]["location"]["line"]) == (program, line)
    text = (out / "repro.py").read_text()
    assert count_lines(text) <= 15 and imports_of(out / "repro.py") <= {"jax", "numpy"}
    assert "a.reshape(1, 16, 8, 12)" in text and "dtype=jnp.bfloat16" in text and f"train.py:{line}" in text
    run = run_alone(out / "repro.py", tmp_path)
    assert run.returncode != 0 and raised(run) == ("TypeError", result["signature"]["message"])


JNP_RAISES = {  # jax.numpy / jax.nn functions that check their arguments themselves
    "jnp.einsum": lambda x: jnp.einsum("bqd,bkd->bqk", x, jnp.ones((2, 5, 3))),
    "jnp.split": lambda x: jnp.split(x, 3, axis=-1),
    "jnp.take_along_axis": lambda x: jnp.take_along_axis(x, jnp.zeros((2, 4), jnp.int32), axis=-1),
    "jax.nn.dot_product_attention": lambda x: jax.nn.dot_product_attention(
        x[..., None], jnp.ones((2, 5, 3, 1)), jnp.ones((2, 5, 3, 1))),
}


@pytest.mark.parametrize("spelling", sorted(JNP_RAISES))
def test_a_jnp_call_that_raises_by_itself_is_written_as_that_call(spelling, tmp_path):
    from jaxdbg.repro.operation import cut_operation

    filtering = jax.config.jax_traceback_filtering
    jax.config.update("jax_traceback_filtering", "off")  # as in the contained runs: the frames must be there
    try:
        with pytest.raises((TypeError, ValueError)) as caught:
            jax.jit(JNP_RAISES[spelling])(jnp.ones((2, 4, 4)))
    finally:
        jax.config.update("jax_traceback_filtering", filtering)
    err = caught.value
    summary = cut_operation(err, str(tmp_path), Criterion.exception(type(err).__name__, str(err)), "jit(step)")
    assert summary.ok and summary.primitives == [spelling], summary.reason
    text = (tmp_path / "repro.py").read_text()
    assert f"return {spelling}(" in text and count_lines(text) <= 15 and "test_corpus_repro.py:" in text


# ----------------------------------------------------------------------------------------------------------
# Standalone means standalone: verified alone in an empty folder, the user's modules pasted in or no verdict
# ----------------------------------------------------------------------------------------------------------

MODELS = """import jax.numpy as jnp


def scale():
    return 3.0


def forward(x):
    h = jnp.tanh(x * scale())
    if float(jnp.abs(h).max()) > 0.9:
        raise ValueError("activations saturated")
    return h
"""

TRAIN = """import jax.numpy as jnp
import models

{own}x = jnp.ones(4) * 0.5
for step in range(3):
    models.forward(x * step)
"""


def _project(tmp_path, own: str):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "models.py").write_text(MODELS)
    (folder / "train.py").write_text(TRAIN.format(own=own))
    return folder / "train.py"


def test_sibling_modules_are_pasted_once_with_the_lines_they_came_from(tmp_path):
    from jaxdbg.repro.inline import inline_local_modules

    (tmp_path / "helpers.py").write_text("import jax.numpy as jnp\n\ndef act(x):\n    return jnp.tanh(x)\n")
    (tmp_path / "layers.py").write_text("import helpers as h\n\n\ndef dense(w, x):\n    return h.act(x @ w)\n")
    (tmp_path / "model.py").write_text("from layers import dense as layer\nimport layers\n\n\ndef loss(w, x):\n"
                                       "    return layers.dense(w, x).sum() + layer(w, x).sum()\n")
    combined = inline_local_modules(str(tmp_path / "model.py"))
    assert combined.modules == ("helpers", "layers") and "import" not in combined.text.replace("import jax", "")
    assert combined.text.count("def dense") == 1 and "layer = dense" in combined.text
    row = combined.line_of(str(tmp_path / "layers.py"), 5)
    assert combined.text.splitlines()[row - 1] == "    return act(x @ w)"
    namespace: dict = {}
    exec(combined.text, namespace)
    loss = namespace["loss"](np.ones((3, 3), np.float32), np.ones((2, 3), np.float32))
    assert float(loss) == pytest.approx(11.9407, 1e-4)
    (tmp_path / "model.py").write_text("import layers\n\n\ndef act(x):\n    return x\n\n\nlayers.dense(1.0, 2.0)\n")
    clashing = inline_local_modules(str(tmp_path / "model.py"))  # helpers.act and model's act: helpers stays imported
    assert clashing.modules == ("layers",) and "import helpers as h" in clashing.text
    assert clashing.text.count("def act") == 1


def test_a_sibling_module_is_pasted_into_the_reproducer(tmp_path):
    code, report, out = repro(tmp_path, str(_project(tmp_path, "")), "--max-time", "40")
    result = report["result"]
    assert code == 0 and result["verified"] and result["strategy"] == "source"
    assert "models" not in imports_of(out / "repro.py") and "alone in an empty folder" in result["verification"]
    run = run_alone(out / "repro.py", tmp_path)
    assert run.returncode != 0 and raised(run) == ("ValueError", "activations saturated")


def test_a_reproducer_that_needs_the_users_folder_is_never_verified(tmp_path):
    """models.py cannot be pasted (train.py binds `scale` too): the reduced script still imports it, runs only
    beside it, and so is no reproducer (it was reported 'verified: fresh run' when runs could see the folder)."""
    code, report, _ = repro(tmp_path, str(_project(tmp_path, "def scale():\n    return 0.5\n\n\n")),
                            "--max-time", "40")
    result = report["result"]
    assert code == 3 and not result["verified"] and report["exit_code"] == 3
    assert "No module named 'models'" in result["verification"]
    assert "alone in an empty folder" in result["verification"]


# ----------------------------------------------------------------------------------------------------------
# A framework step that raises in the user's own code: reduced at the source level, to jax and numpy only
# ----------------------------------------------------------------------------------------------------------

FRAMEWORK_STEPS = {"flax": "nnx_label_check", "equinox": "eqx_label_check"}


@pytest.mark.parametrize("framework", sorted(FRAMEWORK_STEPS))
def test_a_framework_step_raising_in_user_code_becomes_a_jax_numpy_reproducer(framework, tmp_path):
    """A Python check of the user's inside nnx.jit / eqx.filter_jit (no JAX operation raised: the source is
    reduced): nnx.jit and eqx.filter_jit become jax.jit, the models go, and repro.py imports neither Flax nor
    Equinox (nor Optax); it fails the same way where they are not installed."""
    pytest.importorskip(framework)
    script = os.path.join(CORPUS, FRAMEWORK_STEPS[framework], "train.py")
    # --kind exception: no NaN/mismatch watch in the detection runs (nothing to find there)
    code, report, out = repro(tmp_path, script, "--kind", "exception", "--max-time", "90")
    result = report["result"]
    assert code == 0 and result["verified"] and result["strategy"] == "source"
    text = (out / "repro.py").read_text()
    assert imports_of(out / "repro.py") <= {"jax", "numpy"} and "# needs" not in text, text
    assert "@jax.jit" in text and "raise ValueError(f'labels must be class indices" in text
    run = run_alone(out / "repro.py", tmp_path, blocked=("flax", "equinox", "optax"))
    assert run.returncode != 0 and raised(run) == ("ValueError", result["signature"]["message"])


# ----------------------------------------------------------------------------------------------------------
# A host callback's exception, not the frames that happened to call the computation
# ----------------------------------------------------------------------------------------------------------

CALLBACK = """import jax
import jax.numpy as jnp
import numpy as np


def log_stats(x):
    x = np.asarray(x)
    if x.max() > 1.0:
        raise ValueError(f"activation too large: {x.max():.3f}")
    return np.float32(x.mean())


@jax.jit
def step(x):
    y = jnp.tanh(x) * 3
    m = jax.pure_callback(log_stats, jax.ShapeDtypeStruct((), jnp.float32), y)
    return y.sum() + m


print(step(jnp.ones(4)))
"""


def test_a_callback_error_is_signed_by_the_exception_raised_inside_it(tmp_path):
    script = tmp_path / "stats.py"
    script.write_text(CALLBACK)
    code, report, out = repro(tmp_path, str(script), "--max-time", "40")
    result = report["result"]
    message = result["signature"]["message"]
    assert code == 0 and result["verified"]
    assert message.endswith("ValueError: activation too large: <n>")
    assert not any(frame in message for frame in ("Traceback", "target_job", "run_script", "runpy"))
    assert result["minimized"]["lines"] < result["original"]["lines"]  # candidates can match it now
    assert "raise ValueError" in (out / "repro.py").read_text()


@pytest.fixture(scope="module")
def logger_crash(tmp_path_factory):
    """repro on the corpus' Equinox step whose jax.debug.callback logger raises KeyError at step 5 (run once)."""
    pytest.importorskip("equinox")
    tmp_path = tmp_path_factory.mktemp("eqx_callback_logger")
    # --timeout 240: each run replays its jitted steps op by op (the mismatch check: a compile per operation), which
    # at load 7-11 on 2 cores outlasted the 60 s default, so the failure kept was a timeout (3 runs of 3).
    code, report, out = repro(tmp_path, os.path.join(CORPUS, "eqx_callback_logger", "train.py"), "--max-time", "15",
                              "--source-time", "0", "--timeout", "240")
    return code, report["result"], out, tmp_path


def test_a_framework_callback_crash_is_signed_by_the_loggers_own_exception(logger_crash):
    code, result, _, _ = logger_crash
    signature = result["signature"]
    assert code == 0 and result["verified"] and signature["kind"] == "exception"
    assert signature["message"].endswith("KeyError: 'accuracy'")  # raised in the user's logger, not jax's words
    assert not any(frame in signature["message"] for frame in ("Traceback", "target_job", "run_script", "runpy"))
    program = os.path.join(CORPUS, "eqx_callback_logger", "train.py")
    # where the logger raised, not the line that called the jitted step (nor jaxdbg's or runpy's frames)
    assert signature["location"] == {"file": program, "line": line_of(program, "# the bug"), "function": "__call__"}
    assert "alone in an empty folder" in result["verification"]


def test_a_framework_callback_crash_becomes_a_jax_numpy_reproducer(logger_crash):
    """Cut to the callback: the user's logger written alone (reduced), called through jax.debug.callback from a
    tiny jitted function with step 5's values; no Equinox, no Optax, no training loop."""
    _, result, out, tmp_path = logger_crash
    text = (out / "repro.py").read_text()
    assert result["strategy"] == "computation" and result["failing_primitives"] == ["jax.debug.callback"]
    assert count_lines(text) <= 15 and imports_of(out / "repro.py") <= {"jax", "numpy"}
    assert "class MetricLogger" in text and "recent['accuracy']" in text and "jax.debug.callback(logger, " in text
    assert "np.int32(5)" in text  # the failing call's step (step 0 to 4 do not raise)
    assert any(note.startswith("repro.py: the host function MetricLogger.__call__ (raised at train.py:")
               for note in result["notes"])
    run = run_alone(out / "repro.py", tmp_path)
    assert run.returncode != 0 and "JaxRuntimeError: INTERNAL: CpuCallback error" in run.stderr
    assert raised(run) == ("KeyError", "'accuracy'")  # the traceback XLA passes on ends with the logger's


class Saver:
    """A host function with state: a bound method called through io_callback that fails on its third save."""

    def __init__(self):
        self.saved = 0

    def save(self, x):
        self.saved += 1
        if self.saved > 2:
            raise RuntimeError(f"disk full after {self.saved} saves of {x.shape}")
        return np.float32(0)


def _saving_step(x):
    from jax.experimental import io_callback

    saver = Saver()
    for _ in range(3):
        io_callback(saver.save, jax.ShapeDtypeStruct((), jnp.float32), x, ordered=True)


def _lambda_step(x):
    config = {"log": print}
    jax.debug.callback(lambda v: config["history"].append(v), x)  # a lambda: no source of its own


def test_a_host_callback_is_cut_to_its_function_never_to_a_raise_of_constants(tmp_path):
    from jaxdbg.repro.callback import cut_callback, recorded_callbacks

    def recorded(step):
        with recorded_callbacks() as recorder, pytest.raises(Exception) as caught:
            jax.jit(step)(jnp.ones(3))
        assert recorder.failure is not None and recorder.failure.explains(caught.value)
        assert recorder.failure.raised_at.file == __file__
        return recorder.failure, type(caught.value).__name__, normalise_message(str(caught.value))

    # A bound method with state, through io_callback: the method alone, its instance from its attributes.
    failed, exc_type, message = recorded(_saving_step)
    summary = cut_callback(failed, str(tmp_path), Criterion("exception", exc_type, message), "jit(step)")
    assert failed.kind == "io_callback" and summary.ok and summary.primitives == ["io_callback"], summary.reason
    text = (tmp_path / "repro.py").read_text()
    assert "if self.saved > 2:" in text and count_lines(text) <= 15
    assert imports_of(tmp_path / "repro.py") <= {"jax", "numpy"}
    run = run_alone(tmp_path / "repro.py", tmp_path)
    assert run.returncode != 0 and "JaxRuntimeError: INTERNAL: CpuCallback error" in run.stderr
    assert message.endswith(": ".join(raised(run)))  # ... and the traceback XLA passes on ends as it did
    # A lambda reading a dict it closes over cannot be written alone: no cut (the source reduction answers),
    # and no stand-in that merely raises KeyError('history').
    failed, exc_type, message = recorded(_lambda_step)
    summary = cut_callback(failed, str(tmp_path / "lambda"), Criterion("exception", exc_type, message), "jit(step)")
    assert failed.kind == "jax.debug.callback" and not summary.ok and summary.checks == 0


def test_a_mismatch_from_a_value_frozen_at_trace_time_is_named_and_shown_standalone(tmp_path):
    """Optax MLP whose dropout mask is drawn with np.random inside the jitted step: jit keeps the mask of its
    trace, op by op draws a new one. The watch sees the mismatch on the first call; replaying the captured
    jaxpr cannot show it (the mask is a constant there), so the cut says why, naming the line, and writes the
    user's `dropout` alone, jitted vs op by op on the traced shape: a jax/numpy program failing alone."""
    import importlib.util
    import time

    from jaxdbg.repro.cutting import cut_captured
    from jaxdbg.repro.jobs import CutRequest, RunRequest
    from jaxdbg.repro.watch import JitWatch, StopRun, WatchConfig

    class Channel(list):
        send = list.append

    path = os.path.join(CORPUS, "optax_frozen_dropout", "train.py")
    watch = JitWatch(WatchConfig(nonfinite=False, mismatch_calls=1, capture="mismatch"), Channel())
    with watch.installed():  # as in repro's runs: the program's module-level jax.jit is made while watched
        spec = importlib.util.spec_from_file_location("optax_frozen_dropout", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        params = module.init_mlp(jax.random.PRNGKey(0), [module.FEATURES, module.HIDDEN, module.HIDDEN, module.CLASSES])
        x, labels = module.clusters(np.random.default_rng(0), 64)
        with pytest.raises(StopRun):
            module.train_step(params, module.optimizer.init(params), x, labels)
    seen = [m for m in watch.channel if getattr(m, "kind", None) == "mismatch"]
    assert [(m.function, m.call, m.reference) for m in seen] == [("train_step", 0, "op-by-op")]
    assert seen[0].detail["mismatched"] > seen[0].detail["size"] // 2  # the loss and most parameters
    line = line_of(path, "return jnp.where(keep")
    assert watch.captured.frozen == f"a constant used by `select_n` at train.py:{line}"
    request = CutRequest(RunRequest(script=path), str(tmp_path), str(tmp_path / "progress"), budget_s=60)
    summary = cut_captured(watch.captured, request, time.perf_counter() + 60)
    assert summary.ok and summary.checks == 1 and summary.primitives == ["select_n"]
    assert summary.reason.startswith(f"jit froze a value Python computed while tracing: a constant used by "
                                     f"`select_n` at train.py:{line} differs")
    assert summary.reason.endswith("repro.py: `dropout` alone, jitted and op by op")
    text = (tmp_path / "repro.py").read_text()
    assert count_lines(text) <= 15 and imports_of(tmp_path / "repro.py") <= {"jax", "numpy"}
    assert "np.random.rand(*x.shape) >= rate" in text and "return dropout(x, 0.5)" in text
    assert "x = np.ones((64, 128)).astype(np.float32)" in text and "with jax.disable_jit():" in text
    assert "assert np.array_equal(jax.jit(f)(x), jax.jit(f)(x), equal_nan=True)" in text  # jit: the same mask
    run = run_alone(tmp_path / "repro.py", tmp_path)
    assert run.returncode != 0 and raised(run)[0] == "AssertionError"
    assert "jit and op-by-op (jax.disable_jit) disagree" in run.stderr


# ----------------------------------------------------------------------------------------------------------
# Function targets: pytree and bfloat16 inputs, as nan-hunt takes them
# ----------------------------------------------------------------------------------------------------------

MODEL = """import jax.numpy as jnp
import numpy as np


def log_margin(x):
    return jnp.log(x - 5.0).sum()


def mlp(params, x):
    for w, b in params:
        x = jnp.tanh(x @ w + b)
    return jnp.log(x - 2.0).sum()


def check_widths(params, x):
    for w, b in params:
        if w.shape[0] != x.shape[-1]:
            raise ValueError(f"layer expects {w.shape[0]} features, got {x.shape[-1]}")
        x = jnp.tanh(x @ w + b)
    return x.sum()


def make_inputs():
    rng = np.random.default_rng(0)
    bf16 = jnp.bfloat16
    params = [(rng.standard_normal((8, 8)).astype(bf16), np.zeros(8, bf16)) for _ in range(2)]
    return params, rng.standard_normal((4, 8)).astype(bf16)


def make_mismatched():
    params, x = make_inputs()
    return params + [(np.ones((6, 2), jnp.bfloat16), np.zeros(2, jnp.bfloat16))], x
"""


@pytest.fixture()
def model(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(MODEL)
    return path


def test_bf16_args_of_a_function_target(model, tmp_path):
    code, report, out = repro(tmp_path, f"{model}::log_margin", "--args", "bf16[64]", "--max-time", "40",
                              "--source-time", "0")
    result = report["result"]
    assert code == 0 and result["verified"] and result["signature"]["kind"] == "nonfinite"
    assert result["failing_primitives"] == ["log"] and "jnp.bfloat16" in (out / "repro.py").read_text()
    run = run_alone(out / "repro.py", tmp_path)
    assert run.returncode != 0 and "produced NaN" in run.stderr


def test_pytree_bf16_inputs_from_make_inputs(model, tmp_path):
    code, report, _ = repro(tmp_path, f"{model}::mlp", "--inputs", f"{model}::make_inputs", "--max-time", "40",
                            "--source-time", "0")
    result = report["result"]
    assert code == 0 and result["verified"] and result["failing_primitives"] == ["log"]


def test_pytree_bf16_inputs_reach_a_source_reduction_intact(model, tmp_path):
    """The program raises by itself (no JAX operation to cut to): the reduced script rebuilds the list of
    (w, b) bf16 tuples from inputs.npz with numpy alone, and fails the same way in an empty folder."""
    code, report, out = repro(tmp_path, f"{model}::check_widths", "--inputs", f"{model}::make_mismatched",
                              "--max-time", "40")
    result = report["result"]
    assert code == 0 and result["verified"] and result["strategy"] == "source"
    assert result["signature"]["message"] == "layer expects <n> features, got <n>"
    assert imports_of(out / "repro.py") <= {"jax", "numpy"}
    companions = [out / "inputs.npz"] if (out / "inputs.npz").exists() else []
    run = run_alone(out / "repro.py", tmp_path, *companions)
    assert run.returncode != 0 and raised(run) == ("ValueError", "layer expects <n> features, got <n>")


def test_inputs_npz_keeps_nesting_and_bfloat16(tmp_path):
    import jax.numpy as jnp

    params = [(np.arange(4, dtype=np.float32).astype(jnp.bfloat16), np.ones(2, np.int32))]
    inputs = (params, {"scale": np.float32(2.0), "steps": 3}, None)
    save_npz_inputs(str(tmp_path / "in.npz"), inputs)
    loaded = load_npz_inputs(str(tmp_path / "in.npz"))
    assert isinstance(loaded[0], list) and isinstance(loaded[0][0], tuple) and loaded[2] is None
    assert loaded[0][0][0].dtype == jnp.bfloat16 and loaded[0][0][0].tolist() == [0, 1, 2, 3]
    assert loaded[1]["steps"] == 3 and isinstance(loaded[1]["steps"], int) and loaded[1]["scale"] == 2.0
    assert flatten_inputs(loaded).args == flatten_inputs(inputs).args
    plain = tmp_path / "plain.npz"
    save_npz_inputs(str(plain), (np.ones(3), np.zeros(2)))
    assert sorted(np.load(plain).files) == ["arg0", "arg1"]  # plain arrays stay a plain npz


def test_inputs_of_other_containers_are_refused_with_what_repro_takes():
    from typing import NamedTuple

    from jaxdbg._errors import UsageError

    class Params(NamedTuple):
        w: np.ndarray

    with pytest.raises(UsageError, match=r"input arg1\[0\] is a Params; repro takes arrays"):
        flatten_inputs((np.ones(2), [Params(np.ones(2))]))
