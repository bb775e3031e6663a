"""Source reduction and failure signatures; no degenerate reproducer is ever accepted."""

import ast
import os
import tempfile

import pytest

from jaxdbg.repro.failures import Checker, choose, observe, raises_constants
from jaxdbg.repro.jobs import CHILD_ENV, JOB, RunRequest
from jaxdbg.repro.signature import normalise_message
from jaxdbg.repro.source import SourceReducer, is_constant_raise, undefined_names
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
    from jaxdbg._source import SourceLocation

    guarded = "import numpy as np\nif not np.allclose(1, 2):\n    raise AssertionError('jit and op-by-op disagree')\n"
    bare = "raise AssertionError('jit and op-by-op disagree')\n"
    path = str(tmp_path / "c.py")
    assert not raises_constants(guarded, SourceLocation(path, 3, "<module>"), path)
    assert raises_constants(bare, SourceLocation(path, 1, "<module>"), path)


def _value_error_test(states):
    verdicts = []
    for state in states:
        try:
            exec(compile(state.text, "<candidate>", "exec"), {})
            verdicts.append(False)
        except ValueError as err:
            verdicts.append(str(err).startswith("bad"))
        except Exception:
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


@pytest.fixture(scope="module")
def mismatch_checker():
    """A Checker for the jit-mismatch recipe's own assertion (the case a generic reducer gets wrong)."""
    request = RunRequest(sys_path=(os.path.dirname(MISMATCH),), watch=WatchConfig(nonfinite=False))
    original = run_contained(JOB, RunRequest(script=MISMATCH, watch=WatchConfig(nonfinite=False)), timeout=60, env=CHILD_ENV)
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
