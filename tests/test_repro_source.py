"""Source reduction and failure signatures; no degenerate reproducer is ever accepted."""

import ast
import os
import runpy
import sys
import tempfile

import pytest

from jaxdbg._source import SourceLocation
from jaxdbg.repro.failures import Checker, choose, constant_checks, observe, raises_constants
from jaxdbg.repro.jobs import CHILD_ENV, RunRequest
from jaxdbg.repro.signature import Criterion, FailureSignature, normalise_message
from jaxdbg.repro.source import SourceReducer, is_constant_raise, undefined_names
from jaxdbg.repro.source_check import with_checks
from jaxdbg.repro.standard import beyond_jax, framework_references, standard_edits
from jaxdbg.repro.watch import WatchConfig
from jaxdbg.runner import run_contained

RECIPES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "recipes")
MISMATCH = os.path.join(RECIPES, "repro_jit_mismatch", "features.py")


def test_messages_are_normalised_for_shapes_addresses_and_paths():
    a = normalise_message("dot_general requires contracting dimensions to have the same shape, got (128,) and (64,).")
    b = normalise_message("dot_general requires contracting dimensions to have the same shape, got (1,) and (4,).")
    assert a == b and "<n>" in a
    assert normalise_message("<object at 0x7f3a2c1b90d0> from /tmp/x/y/model.py") == "<object at <addr>> from <path>"
    assert normalise_message("jit and op-by-op disagree") == "jit and op-by-op disagree"
    # A dtype is a name, not a number: float32 and bfloat16 stay apart.
    assert normalise_message("type float32[8] and bfloat16[8]") == "type float32[<n>] and bfloat16[<n>]"


def test_stack_frames_quoted_in_a_message_are_no_part_of_it():
    """Equinox's EquinoxRuntimeError quotes the stack inside jit: jaxdbg's own frames under its watch, other
    user frames as the program shrinks. Once part of the criterion, no reproducer ever matched (NOT verified)."""
    def equinox(frames):
        return ("Above is the stack outside of JIT. Below is the stack inside of JIT:\n" + frames
                + "\nequinox.EquinoxRuntimeError: integrator diverged\n\n----\n\nAn error occurred.")

    watched = equinox('  File "/x/jaxdbg/jit.py", line 40, in __call__\n    out = hooks[0].around(call, call.run)\n'
                      '          ^^^^^^^^^^^^^^^^^^^^^^^\n  File "run.py", line 19, in body\n    y = error_if(y, c)\n')
    alone = equinox('  File "repro.py", line 7, in body\n    y = error_if(y, y > 1.0)\n        ^^^^^^^^\n')
    assert normalise_message(watched) == normalise_message(alone)
    assert "integrator diverged" in normalise_message(alone) and "File" not in normalise_message(alone)


def test_one_criterion_decides_and_travels_as_json():
    criteria = [Criterion.exception("TypeError", "got (128,) at 0x7f3a in /tmp/a/m.py"),
                Criterion("crash", signal="SIGSEGV"), Criterion("crash", message="exit status 3"), Criterion("timeout"),
                Criterion.nonfinite("Inf"), Criterion.mismatch("float64")]
    assert [Criterion.from_json(c.to_json()) for c in criteria] == criteria
    assert [c.what for c in criteria] == [None, None, None, None, "Inf", None]
    # A signature is its criterion plus where: the place is no part of "the same way".
    here = FailureSignature.of(criteria[0], location=SourceLocation("/tmp/a/m.py", 3, "f"))
    assert here.same_as(criteria[0]) and Criterion.from_json(here.to_json()) == criteria[0]
    assert not criteria[1].same_as(criteria[2]) and not criteria[4].same_as(Criterion.nonfinite("NaN"))
    # An exception by type name and normalised message; a written NaN/mismatch reproducer by its assertion.
    assert criteria[0].same_exception("TypeError", "got (8,) at 0x1 in /home/me/m.py")
    assert not criteria[0].same_exception("ValueError", "got (8,) at 0x1 in /home/me/m.py")
    assert criteria[4].reproduced_by("AssertionError", "jax.jit(f) produced Inf: [inf]")
    assert not criteria[4].reproduced_by("AssertionError", "jax.jit(f) produced NaN: [nan]")
    assert Criterion.mismatch().reproduced_by("AssertionError", "\nNot equal to tolerance\njit and op-by-op "
                                                                "(jax.disable_jit) disagree")
    assert criteria[5].reproduced_by("AssertionError", "jit and float64 (jax.enable_x64) disagree: [0.] jitted")
    assert not criteria[5].reproduced_by("AssertionError", "jit and op-by-op (jax.disable_jit) disagree")
    # A source-level reproducer names the user's jitted function, not f.
    assert Criterion.nonfinite("NaN").reproduced_by("AssertionError", "jax.jit(train_step) produced NaN: [nan]")
    with pytest.raises(ValueError, match="kind"):
        Criterion.from_json({"kind": "segfault"})
    # A process that exited on its own (os._exit(3) in a callback) has no signal: the headline says its status.
    assert FailureSignature.of(criteria[2]).describe() == "crash: exit status 3"
    assert FailureSignature.of(criteria[1]).describe() == "crash with SIGSEGV"


@pytest.mark.parametrize("code, degenerate", [
    ("assert 0, 'jit and op-by-op disagree'", True),
    ("assert False, f'jit and op-by-op disagree {1}'", True),
    ("raise AssertionError('jit and op-by-op disagree')", True),
    ("assert np.allclose(jit_out, eager_out), 'jit and op-by-op disagree'", False),
    ("raise ValueError(f'bad shape {x.shape}')", False),
])
def test_raise_or_assert_of_constants_is_degenerate(code, degenerate):
    assert is_constant_raise(ast.parse(code).body[0]) is degenerate


def test_a_guarded_constant_raise_is_not_degenerate(tmp_path):
    guarded = "import numpy as np\nif not np.allclose(1, 2):\n    raise AssertionError('jit and op-by-op disagree')\n"
    bare = "raise AssertionError('jit and op-by-op disagree')\n"
    path = str(tmp_path / "c.py")
    assert not raises_constants(guarded, SourceLocation(path, 3, "<module>"), path)
    assert raises_constants(bare, SourceLocation(path, 1, "<module>"), path)


@pytest.mark.parametrize("code, constant", [
    ("t = eqx.error_if(t, jnp.abs(t.sum(-1) - 1) > 1e-3, 'targets must sum to 1')", 0),
    ("t = eqx.error_if(t, jnp.abs(1) > 0.001, 'targets must sum to 1')", 1),  # the computation was cut away
    ("checkify.check(x > 0, 'x must be positive')", 0),
    ("checkify.check(True, 'x must be positive')", 1),
    ("t = eqx.branched_error_if(t, jnp.asarray(True), 0, ['bad'])", 1),
])
def test_a_runtime_check_whose_condition_became_a_constant_is_degenerate(code, constant):
    """An Equinox/checkify check that raises inside jit keeps its message whatever its condition: a candidate that
    tests a constant condition no longer runs the computation that failed, so repro never accepts it."""
    text = "import equinox as eqx\nimport jax.numpy as jnp\nfrom jax.experimental import checkify\n" + code
    assert constant_checks(text) == constant


LABEL_SMOOTHING = """\
import equinox as eqx
import jax
import jax.numpy as jnp


@eqx.filter_jit
def loss(labels, n):
    targets = jax.nn.one_hot(labels, n) * 0.9 + 0.1 / (n - 1)   # the bug: 0.1 / n sums to 1
    targets = eqx.error_if(targets, jnp.abs(targets.sum(-1) - 1) > 1e-3, "targets must sum to 1")
    return targets.sum()
"""


def test_a_runtime_check_reports_the_values_its_condition_read_and_a_cut_cause_shows(tmp_path):
    """eqx.error_if raises one fixed message whatever made it fire: the values its condition read (recorded
    before it raises) tell the user's bug (mis-smoothed rows) from a candidate that fires on other rows."""
    equinox = pytest.importorskip("equinox")
    import jax.numpy as jnp

    from jaxdbg.repro.checks import recorded_checks
    from jaxdbg.repro.failures import other_check_values

    path = tmp_path / "smooth.py"
    path.write_text(LABEL_SMOOTHING)
    sent: list = []
    channel = type("Channel", (), {"send": staticmethod(sent.append)})()
    for labels, n in (([1, 2, 3], 10), ([4], 10), ([0], 2)):
        with recorded_checks(channel, LABEL_SMOOTHING):  # (each run of a program reports its check once)
            namespace: dict = {}
            exec(compile(LABEL_SMOOTHING, str(path), "exec"), namespace)
            with pytest.raises(equinox.EquinoxRuntimeError, match="targets must sum to 1"):
                namespace["loss"](jnp.asarray(labels), n)
    assert equinox.error_if.__name__ == "error_if"  # restored
    bug, fewer_rows, other = sent
    assert (bug.location.line, bug.names, bug.values, bug.shares, bug.shapes) == (
        9, ("targets",), ((0.01111, 0.9111),), ((0.9, 0.1),), ((3, 10),))
    assert other_check_values(bug, fewer_rows) is None  # the same rows, a smaller batch: the same bug
    assert "fired on other values (targets: 0.1, 1.0, not 0.01111, 0.9111)" in other_check_values(bug, other)


def test_a_one_hot_narrowed_by_a_candidate_is_not_the_same_failure():
    """The same distinct values are not enough: a one-hot of width 10 cut to width 2 holds 0 and 1 too. Fewer rows
    of the same width keep what the check tested; rows of another width, or values in other shares, do not."""
    import numpy as np

    from jaxdbg._source import SourceLocation
    from jaxdbg.repro.checks import value_profile
    from jaxdbg.repro.failures import other_check_values
    from jaxdbg.repro.messages import CheckFired

    def fired(labels) -> CheckFired:
        values, shares = value_profile(labels)
        return CheckFired(SourceLocation("train.py", 9, "loss"), ("labels",), (values,), (shares,),
                          (np.shape(labels),))

    width_10 = fired(np.eye(10, dtype=np.float32)[[1, 2, 3, 7]])
    assert other_check_values(width_10, fired(np.eye(10)[[4]])) is None  # fewer rows
    assert other_check_values(width_10, fired(np.eye(10)[4])) is None  # one row, its batch axis gone
    # width 2 of labels 1..4 (repro made it): one row [0, 1], three of zeros, about the original's shares
    narrowed = other_check_values(width_10, fired(np.eye(2)[[1, 1]] * np.array([[1], [0]])))
    assert "read labels of shape (2, 2), not rows of shape (10,)" in narrowed
    # a 1-D array may shrink; its values keep their shares
    assert other_check_values(fired(np.arange(6) % 2), fired(np.array([0, 1]))) is None
    assert "in other shares" in other_check_values(fired(np.arange(6) % 2), fired(np.array([0, 0, 0, 0, 1])))


def test_a_checkify_check_reports_what_made_it_fail(tmp_path):
    """checkify.check raises where its condition is false (eqx.error_if where true); one that holds sends nothing."""
    from jaxdbg.repro.checks import recorded_checks

    code = ("import jax\nimport jax.numpy as jnp\nfrom jax.experimental import checkify\n\n"
            "def g(x):\n    z = x - 1\n    checkify.check(jnp.all(z > 0), 'z must be positive')\n    return z\n")
    path = tmp_path / "g.py"
    path.write_text(code)
    sent: list = []
    with recorded_checks(type("Channel", (), {"send": staticmethod(sent.append)})(), code):
        namespace: dict = {}
        exec(compile(code, str(path), "exec"), namespace)
        checked = namespace["jax"].jit(namespace["checkify"].checkify(namespace["g"]))
        assert checked(namespace["jnp"].arange(2.0, 4.0))[0].get() is None and not sent
        assert "z must be positive" in checked(namespace["jnp"].arange(3.0))[0].get()
    assert [(m.location.line, m.names, m.values) for m in sent] == [(7, ("z",), ((-1.0, 0.0, 1.0),))]


def test_the_reducer_keeps_a_kept_statement_as_written():
    """The runtime check's statement is kept like the raising one: its condition is the user's test."""
    source = "a = 1\nb = 2\nc = check(b + a, a * 3 > 1)\nprint(c)\n"
    reducer = SourceReducer(source, protected_line=4, kept_lines=[3],
                            test=lambda states: ["print(c)" in s.text for s in states])
    assert "c = check(b + a, a * 3 > 1)" in reducer.run()


def test_the_reducer_shrinks_a_batch_written_in_one_digit_and_keeps_the_axes_the_failure_needs():
    """Making a batch of 4 one row shortens no text, yet is smaller; the axes the (simulated) check needs stay."""
    source = "import jax\nx = jax.random.normal(jax.random.PRNGKey(0), (4, 6, 12))\nprint(check(x))\n"

    def fails(states):  # the check fires on a [batch, 6, 12] array, any batch
        return ["(0), (" in s.text and s.text.split("(0), (")[1].split(")")[0].split(", ")[1:] == ["6", "12"]
                for s in states]

    assert "(1, 6, 12)" in SourceReducer(source, protected_line=3, test=fails).run()


@pytest.mark.parametrize("code, once", [
    ("import jax\nimport equinox as eqx\nm = eqx.nn.Linear(2, 2, key=jax.random.key(0))", True),
    ("import numpy as np\nnp.random.seed(0)\nx = np.random.rand(3)", False),  # deleting the seed: luck
    ("import numpy as np\nx = np.random.default_rng().normal(size=3)", False),
    ("import numpy as np\nx = np.random.default_rng(0).normal(size=3)", True),
    ("import jax.numpy as jnp\nx = jnp.load('x.npy')", False),  # an earlier run may have written it
    ("import os\nx = os.environ.get('SCALE')", False),  # any other library: not known to be deterministic
    ("names = set(['a', 'b'])", False),  # a str set's order changes with PYTHONHASHSEED
])
def test_a_candidate_runs_a_second_time_only_where_two_runs_can_differ(code, once):
    """The second run of an accepted candidate (that it does not fail by luck) is skipped where luck has no part."""
    from jaxdbg.repro.determinism import deterministic
    assert deterministic(code) is once


def test_a_slow_test_asked_now_and_then_still_holds_for_the_result():
    """The op-by-op run (does the candidate still need jit?) is asked of a few accepted states only; where one
    fails it, the search goes back to the newest that passes, and the result passes it."""
    source = "".join(f"v{k} = {k}\n" for k in range(12)) + "assert v0 == 0\n"
    slow: list[str] = []

    def needs_v7(state):
        slow.append(state.text)
        return "v7 = 7" in state.text

    reducer = SourceReducer(source, protected_line=13, test=lambda states: ["v0 = 0" in s.text for s in states],
                            slow_test=needs_v7, remember_failed=False)
    assert reducer.run() == "v0 = 0\nv7 = 7\nassert v0 == 0"
    assert len(slow) < reducer.checks  # (far fewer than the candidates accepted and rejected)


def _value_error_test(states):
    verdicts = []
    for state in states:
        try:
            exec(compile(state.text, "<candidate>", "exec"), {})
            verdicts.append(False)
        except ValueError as err:
            verdicts.append(str(err).startswith("bad"))
        except Exception:  # noqa: BLE001 - any other failure is not the one looked for
            verdicts.append(False)
    return verdicts


SCRIPT = '''
import os, sys
import numpy as np
N = 128

def helper(a, b):
    c = a + b
    for i in range(3):
        c = c * 2
    return c

def model(x):
    y = helper(x, 1)
    with open(os.devnull) as fh:
        z = np.zeros((N, 64))
    if y > 0:
        raise ValueError("bad " + str(z.shape))
    return y

print("start")
model(3)
'''


def test_reducer_keeps_the_raising_statement_and_its_guard():
    reducer = SourceReducer(SCRIPT, protected_line=17, test=_value_error_test, jobs=2)
    text = reducer.run()
    assert "raise ValueError('bad ' + str(z.shape))" in text  # kept as written (its operands shrank)
    assert "if y > 0:" in text  # the condition deciding the raise is never simplified away
    assert "helper" not in text and "print" not in text and "import os" not in text
    assert len(text.splitlines()) <= 8
    assert not undefined_names(ast.parse(text))


def test_candidates_python_warns_about_are_never_run_nor_printed():
    """Inlining a tuple into ``np.array(lens)[:, None]`` gives ``(5, 7, 9)[:, None]``: Python's SyntaxWarning
    ("tuple indices must be integers...") was printed on the user's terminal once per such candidate; such a
    candidate fails another way, so it is not tried."""
    import warnings

    script = ("import numpy as np\nlens = (5, 7, 9)\n\ndef run(n):\n"
              "    mask = np.arange(4)[None, :] < np.array(lens)[:, None]\n"
              "    if mask.sum() > n:\n        raise ValueError('bad')\nrun(3)\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        text = SourceReducer(script, protected_line=7, test=_value_error_test).run()
    assert not [w for w in caught if issubclass(w.category, SyntaxWarning)]
    assert "raise ValueError('bad')" in text and len(text.splitlines()) < 8


@pytest.mark.parametrize("script, line", [("SCRIPT", 17), ("CHAIN", 7)])
def test_changes_that_failed_wait_for_the_last_round_and_the_result_is_the_same(script, line):
    """A deletion that failed is not retried after each unrelated simplification, only in a last full round:
    fewer checks, the same reduced program."""
    source = globals()[script]
    remembering = SourceReducer(source, protected_line=line, test=_value_error_test)
    retrying = SourceReducer(source, protected_line=line, test=_value_error_test, remember_failed=False)
    assert remembering.run() == retrying.run()
    assert remembering.checks < retrying.checks, (remembering.checks, retrying.checks)


@pytest.fixture(scope="module")
def mismatch_checker():
    """A Checker for the jit-mismatch recipe's own assertion (the case a generic reducer gets wrong)."""
    request = RunRequest(sys_path=(os.path.dirname(MISMATCH),), watch=WatchConfig(nonfinite=False))
    original = run_contained(RunRequest(script=MISMATCH, watch=WatchConfig(nonfinite=False)), timeout=60,
                             env=CHILD_ENV)
    target = choose(observe(original), "exception", None)
    assert target is not None and target.signature.message == "jit and op-by-op disagree"
    with tempfile.TemporaryDirectory() as work:
        checker = Checker(target, request, script_name="features.py", work_dir=work, original_path=MISMATCH,
                          timeout=30, jobs=2, env=CHILD_ENV, jit_sensitive=True)
        yield checker
        checker.close()


def test_assert_of_constants_matching_the_message_is_rejected(mismatch_checker):
    # Same exception type and message as the original, and nothing else: the degenerate "reproducer".
    assert not mismatch_checker.check_text("assert 0, f'jit and op-by-op disagree'\n", (1, 1))
    assert mismatch_checker.last_rejections


def test_kept_assert_over_unrelated_values_is_rejected(mismatch_checker):
    # The assert is kept as written and jax.jit still runs, but the failure no longer needs jit.
    text = ("import jax\nimport numpy as np\n\ndef features(x):\n    return x + 1.0\n"
            "jit_out = jax.jit(features)(np.float32(1.0))\neager_out = 5.0\n"
            "assert np.allclose(jit_out, eager_out, atol=1e-3), 'jit and op-by-op disagree'\n")
    assert not mismatch_checker.check_text(text, (8, 8))
    assert "jit disabled" in " ".join(mismatch_checker.last_rejections)


def test_the_real_jit_failure_is_accepted(mismatch_checker):
    text = ("import jax\nimport numpy as np\n\ndef features(x):\n    return (x + 100000000.0) - 100000000.0\n"
            "x = np.ones(3, np.float32)\njit_out = jax.jit(features)(x)\neager_out = features(x)\n"
            "assert np.allclose(jit_out, eager_out, atol=1e-3), 'jit and op-by-op disagree'\n")
    assert mismatch_checker.check_text(text, (9, 9)), mismatch_checker.last_rejections


# A NaN and a mismatch raise nothing: a source-level reproducer of either ends in jaxdbg's check of the call.
CHECKED = """import jax
import jax.numpy as jnp
import numpy as np

calls = [0]


@jax.jit
def step(x):
    return jnp.log(x - 1.0), {"n": jnp.int32(0)}


def scaled(x):
    calls[0] += 1  # read while tracing: jit keeps the first value, op by op it grows
    return x * calls[0]


fwd = jax.jit(scaled)
wide = jax.jit(lambda x: (x * 1e8 + 1.0) - x * 1e8)
x = jnp.arange(3.0)
for i in range(2):
    y = print(np.asarray(step(x + i)[0]))
z = fwd(x)
w = wide(x)
"""


@pytest.mark.parametrize("criterion, function, line, call, message", [
    (Criterion.nonfinite("NaN"), "step", 22, "step(x + i)", "jax.jit(step) produced NaN: "),
    (Criterion.mismatch(), "scaled", 23, "fwd(x)", "jit and op-by-op (jax.disable_jit) disagree: [1. 2.] jitted, "
                                                   "[2. 4.] op by op"),
    (Criterion.mismatch("float64"), "<lambda>", 24, "wide(x)", "jit and float64 (jax.enable_x64) disagree"),
])
def test_a_nan_or_mismatch_ends_in_a_check_on_the_computed_values(tmp_path, criterion, function, line, call, message):
    """The call of the jitted function is wrapped (not print's, not np.asarray's); run, the program raises the
    AssertionError the verification looks for, at the first failing call."""
    checked = with_checks(CHECKED, (line, line), criterion, function)
    assert checked and checked[0].call == call
    path = tmp_path / "repro.py"
    path.write_text(checked[0].text)
    assert checked[0].text.splitlines()[checked[0].lines[0] - 1].lstrip().startswith(("y = print(", "z = ", "w = "))
    with pytest.raises(AssertionError) as raised:
        runpy.run_path(str(path), run_name="__main__")
    assert criterion.reproduced_by("AssertionError", str(raised.value)) and message in str(raised.value)
    assert imports_only_jax_and_numpy(checked[0].text)


def test_no_check_without_a_call_and_an_alias_before_any_other_call():
    assert with_checks("import jax\nx = 1\n", (2, 2), Criterion.nonfinite("NaN"), "step") == []
    text = "import jax\nimport numpy as np\nf = jax.jit(step)\ny = helper(np.exp(f(2.0)))\n"
    assert [c.call for c in with_checks(text, (4, 4), Criterion.nonfinite("NaN"), "step")] == ["f(2.0)",
                                                                                              "helper(np.exp(f(2.0)))"]


def imports_only_jax_and_numpy(text):
    tree = ast.parse(text)
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return names | {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} <= {"jax",
                                                                                                          "numpy"}


CHAIN = '''
import numpy as np
CFG = dict(width=8, depth=3, scale=2.0)

def check(v, limit=1.0):
    if v.sum() > limit:
        raise ValueError("bad total " + str(v.shape))
    return v

def layer(x, cfg, unused=None):
    y = x * cfg["scale"]
    z = y + 1
    return check(z)

def model(x, cfg):
    for _ in range(cfg["depth"]):
        x = layer(x, cfg)
    return x

model(np.ones(CFG["width"]), CFG)
'''


def _apply_all(reducer, make_edits):
    """Every candidate an edit pass makes from the reducer's current state (None where an edit does not apply)."""
    return [state for state in (reducer._apply(edit) for edit in make_edits(reducer.state)) if state is not None]


def test_inlining_a_call_keeps_behaviour_and_drops_the_definition():
    reducer = SourceReducer(CHAIN, protected_line=7, test=_value_error_test)
    candidates = _apply_all(reducer, reducer.inline_calls)
    whole = [s.text for s in candidates if "def layer" not in s.text]
    assert whole, "inlining every call of layer() (and dropping it) must be a candidate"
    assert "def check" in whole[0] and "raise ValueError('bad total ' + str(v.shape))" in whole[0]
    assert _value_error_test([s for s in candidates if "def layer" not in s.text]) == [True]
    assert not any("def check" not in s.text for s in candidates)  # the function holding the failure stays


def test_reducer_collapses_a_call_chain_around_the_kept_statement():
    text = SourceReducer(CHAIN, protected_line=7, test=_value_error_test, jobs=2).run()
    assert "raise ValueError('bad total ' + str(v.shape))" in text and "if v.sum() > limit:" in text
    assert "def layer" not in text and "def model" not in text and "CFG" not in text
    assert len(text.splitlines()) <= 7, text
    assert not undefined_names(ast.parse(text)) and _value_error_test([type("S", (), {"text": text})]) == [True]


def test_inlining_renames_callee_locals_that_would_collide():
    source = ("def f(a):\n    x = a + 1\n    return x * 2\nx = 10\ny = f(3)\nassert (x, y) == (10, 8)\n"
              "raise ValueError('bad')\n")
    reducer = SourceReducer(source, protected_line=7, test=_value_error_test)
    [inlined] = [s for s in _apply_all(reducer, reducer.inline_calls) if "def f" not in s.text]
    assert "x1 = 3 + 1" in inlined.text and _value_error_test([inlined]) == [True]


MODULE = '''
import equinox as eqx

class Block(eqx.Module):
    scale: float
    norm: int
    width: int

    def __init__(self, width):
        self.scale = 2.0
        self.norm = width + 1
        if width > 1:
            self.width = width

    def __call__(self, x):
        raise ValueError("bad " + str(x * self.scale))

Block(4)(3)
'''


def test_a_declared_field_goes_with_its_assignments():
    """An eqx.Module (a dataclass, a flax struct) must set every declared field: deleting `norm: int` or
    `self.norm = ...` alone breaks it, so only the pair goes; a field the failing statement reads stays."""
    pytest.importorskip("equinox")
    reducer = SourceReducer(MODULE, protected_line=16, test=_value_error_test)
    candidates = _apply_all(reducer, reducer.drop_fields)
    assert len(candidates) == 3 and _value_error_test(candidates) == [False, True, True]  # scale is read
    assert "norm" not in candidates[1].text and "width > 1" in candidates[1].text
    assert "self.width" not in candidates[2].text and "if width > 1:" in candidates[2].text
    text = SourceReducer(MODULE, protected_line=16, test=_value_error_test, standardise=False).run()
    assert "norm" not in text and "width" not in text and "scale: float" in text, text
    text = SourceReducer(MODULE, protected_line=16, test=_value_error_test).run()  # a plain class in the end
    assert "norm" not in text and "eqx" not in text and "self.scale" in text, text


# Framework spellings swapped for JAX's: what the reproducer then imports (jax/numpy), and that it fails the same.

EQX_STEP = '''import equinox as eqx
import jax
import jax.numpy as jnp


class Affine(eqx.Module):
    weight: jax.Array
    bias: jax.Array
    activation: str = eqx.field(static=True)

    def __call__(self, x):
        y = x @ self.weight + self.bias
        return jax.nn.relu(y) if self.activation == "relu" else y


@eqx.filter_jit
def step(model: Affine, x, classes):
    logits = jax.vmap(model)(x)
    if logits.shape[-1] != classes:
        raise ValueError(f"{logits.shape[-1]} outputs for {classes} classes")
    return eqx.filter_grad(lambda m: jnp.sum(jax.vmap(m)(x)))(model)


step(Affine(jnp.ones((4, 3)), jnp.zeros(3), "relu"), jnp.ones((2, 4)), 4)
'''

NNX_STEP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "nnx_label_check", "train.py")


def _raised(text: str) -> tuple[str, str]:
    """(type, message) of what executing ``text`` raises."""
    try:
        exec(compile(text, "<candidate>", "exec"), {})
    except Exception as err:  # noqa: BLE001 - whatever it raises is the answer
        return type(err).__name__, str(err).splitlines()[0]
    return "", "ran"


def _edited(source: str, edit) -> tuple[str, int]:
    tree = ast.parse(source)
    assert edit(list(ast.walk(tree)))
    return ast.unparse(tree), framework_references(tree)


def test_an_equinox_step_becomes_plain_jax_in_one_edit(monkeypatch):
    """eqx.Module -> a registered dataclass (the static field marked so), filter_jit -> jax.jit with the Python
    constant it filtered out as static, filter_grad -> jax.grad: the same ValueError with Equinox unimportable."""
    pytest.importorskip("equinox")
    assert _raised(EQX_STEP) == ("ValueError", "3 outputs for 4 classes")
    edits = standard_edits(ast.parse(EQX_STEP), set())
    text, references = _edited(EQX_STEP, edits[0])
    assert references == 0 and "@jax.tree_util.register_dataclass" in text
    assert "functools.partial(jax.jit, static_argnames=('classes',))" in text and "jax.grad(" in text
    plain, _ = _edited(EQX_STEP, edits[1])  # the classes' bases dropped instead: no dataclass, no pytree
    assert _raised(plain)[0] == "TypeError"
    monkeypatch.setitem(sys.modules, "equinox", None)
    assert _raised(text.replace("import equinox as eqx\n", "")) == ("ValueError", "3 outputs for 4 classes")


def test_an_nnx_step_keeps_its_module_while_jax_jit_takes_it():
    """nnx.jit -> jax.jit, nnx.value_and_grad/relu/one_hot -> JAX's: an nnx.Module is a pytree, so the step
    fails the same with the model still an NNX one; dropping its base (no pytree, no nnx.Optimizer) does not."""
    pytest.importorskip("flax")
    with open(NNX_STEP) as handle:
        source = handle.read()
    expected = _raised(source)
    assert expected == ("ValueError", "labels must be class indices, got shape (2, 3)")
    edits = standard_edits(ast.parse(source), set())
    dropped, _ = _edited(source, edits[0])
    assert "class MLP:" in dropped and _raised(dropped) != expected
    kept, references = _edited(source, edits[1])
    assert "@jax.jit" in kept and "jax.value_and_grad(loss_fn)" in kept and "jax.nn.one_hot(" in kept
    assert "rngs: nnx.Rngs" not in kept and references == 6  # the model's own: Module, Rngs, Linear, Optimizer
    assert _raised(kept) == expected


def test_a_reproducer_names_what_it_needs_beyond_jax_and_numpy():
    assert beyond_jax("import jax\nimport functools\nimport numpy as np\n", "needed") == ""
    with open(NNX_STEP) as handle:
        line = beyond_jax(handle.read(), "time")
    assert line.startswith("# needs flax, optax beyond jax/numpy: nnx.Module, nnx.jit, nnx.Optimizer, nnx.Rngs and ")
    assert line.endswith(" more not reduced away within --max-time\n")


def test_calls_evaluated_lazily_or_recursive_functions_are_not_inlined():
    source = ("def f(a):\n    b = a\n    return b\ndef r(n):\n    return r(n - 1) if n else 0\n"
              "z = [f(i) for i in range(2)]\nw = r(2) or f(1)\nraise ValueError('bad')\n")
    reducer = SourceReducer(source, protected_line=8, test=_value_error_test)
    assert _apply_all(reducer, reducer.inline_calls) == []


def test_constant_lookups_fold_and_unneeded_defaults_go():
    source = ("CFG = dict(n=4, name='a')\ndef f(x, k=2):\n    return x * k\ny = f(CFG['n'], 3)\n"
              "raise ValueError('bad' * y)\n")
    reducer = SourceReducer(source, protected_line=5, test=_value_error_test)
    [folded] = _apply_all(reducer, reducer.fold_constant_lookups)
    assert "f(4, 3)" in folded.text
    [no_default] = _apply_all(reducer, reducer.drop_defaults)
    assert "def f(x, k):" in no_default.text


def test_dead_code_goes_in_one_step_but_never_a_call_that_may_fail():
    source = ("import os\nimport numpy as np\ndef unused():\n    return 1\ndef run(v):\n    raise ValueError('bad')\n"
              "a = np.ones(3)\nb = a * 2\nc = b + 1\nt = {'keep': a, 'drop': b}\nout = run(t['keep'])\n")
    reducer = SourceReducer(source, protected_line=6, test=_value_error_test)
    both = reducer._apply(reducer.delete_dead_code(reducer.state)[0])
    assert both is not None and _value_error_test([both]) == [True]
    assert "import os" not in both.text and "def unused" not in both.text and "b = " not in both.text
    assert "'drop'" not in both.text and "out = run(t['keep'])" in both.text  # unread, but it calls run()


@pytest.mark.parametrize("source, expected", [
    ("z = [f(i) for i in range(3)]", "z = [f(0)]"),
    ("z = [f(k, c) for k in keys[1:-1]]", "z = [f(keys[1:-1][0], c)]"),
    ("z = sum((g(a) for a in [x, y]))", "z = sum((g(x),))"),
    ("z = {n: i for i, n in enumerate(names)}", "z = {names[0]: 0}"),
    ("z = [a + b for a, b in zip(p, q)]", "z = [p[0] + q[0]]"),
    ("z = [h(v) for v in make(3)]", "z = [h(list(make(3))[0])]"),
])
def test_a_comprehension_becomes_its_first_item(source, expected):
    reducer = SourceReducer(source + "\nraise ValueError('bad')\n", protected_line=2, test=_value_error_test)
    [single] = _apply_all(reducer, reducer.single_iterations)
    assert single.text.splitlines()[0] == expected


def test_comprehensions_with_a_filter_or_a_shadowed_variable_stay():
    source = "z = [f(i) for i in range(3) if i]\nw = [(lambda i: i)(i) for i in range(2)]\nraise ValueError('bad')\n"
    reducer = SourceReducer(source, protected_line=3, test=_value_error_test)
    assert _apply_all(reducer, reducer.single_iterations) == []


def test_a_loop_runs_once_with_its_first_value_and_the_call_can_then_be_inlined():
    source = ("def init(k):\n    w = k * 2\n    return {'w': w}\n"
              "blocks = [init(k) for k in range(1, 4)]\nfor i, b in enumerate(blocks):\n    total = b['w'] + i\n"
              "    if total > 1:\n        raise ValueError('bad')\n")
    reducer = SourceReducer(source, protected_line=8, test=_value_error_test)
    [single] = _apply_all(reducer, reducer.single_iterations)
    assert "blocks = [init(1)]" in single.text
    reducer.state = single
    assert any("def init" not in s.text for s in _apply_all(reducer, reducer.inline_calls))
    unwrapped = [s.text for s in _apply_all(reducer, reducer.unwrap_blocks)]
    assert any("i = 0\nb = blocks[0]\ntotal = b['w'] + i\nif total > 1:" in t for t in unwrapped), unwrapped
    assert _value_error_test([type("S", (), {"text": t}) for t in unwrapped]) == [True] * len(unwrapped)


def test_a_value_read_once_later_in_its_block_is_written_there():
    source = ("def g(k):\n    w = k * 2\n    x = w + 1\n    return x\n"
              "def h(k):\n    v = k * 2\n    k = 0\n    return v\n"
              "def r(k):\n    u = k * 2\n    for _ in range(2):\n        k = u\n    return k\n"
              "if g(1) + h(1) + r(1) > 1:\n    raise ValueError('bad')\n")
    reducer = SourceReducer(source, protected_line=15, test=_value_error_test)
    texts = [s.text for s in _apply_all(reducer, reducer.inline_constants)]
    assert any("x = k * 2 + 1" in t for t in texts) and any("return w + 1" in t for t in texts)
    assert not any("return k * 2\n" in t for t in texts) and any("v = k * 2" in t for t in texts)  # k changed
    assert not any("k = k * 2" in t for t in texts)  # read inside a loop
    assert _value_error_test([type("S", (), {"text": t}) for t in texts]) == [True] * len(texts)


def test_a_cause_announced_on_the_next_line_is_quoted(tmp_path):
    """JAX says a non-hashable static argument's cause on the line after 'The error was:'; repro's texts (the
    detection, a source reproducer's verification) once stopped at the colon."""
    script = tmp_path / "static.py"
    script.write_text("from functools import partial\nimport jax\nimport jax.numpy as jnp\n\n"
                      "@partial(jax.jit, static_argnums=(1,))\ndef f(x, rate):\n    return x * rate\n\n"
                      "f(jnp.ones(3), jnp.float32(0.5))\n")
    failure = choose(observe(run_contained(RunRequest(script=str(script)), timeout=60, env=CHILD_ENV)),
                     "exception", None)
    assert failure is not None and "unhashable type" in failure.describe()
