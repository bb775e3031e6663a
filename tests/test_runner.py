"""Contained runs: jaxdbg survives and describes whatever the target does."""

import json
import sys

import pytest

from jaxdbg.protocol import Echo, EchoRequest
from jaxdbg.runner import faulthandler_user_frame, run_contained
from jaxdbg.target import ScriptRun, parse_target


def _script(tmp_path, body: str) -> str:
    path = tmp_path / "target.py"
    path.write_text(body)
    return str(path)


def _run(tmp_path, body, timeout=60, **kwargs):
    return run_contained(ScriptRun(parse_target(_script(tmp_path, body))), timeout=timeout, **kwargs)


def test_ok_run_returns_messages_and_output():
    outcome = run_contained(EchoRequest({"x": [1, 2]}), timeout=60)
    assert outcome.ok and outcome.last(Echo).value == {"x": [1, 2]} and outcome.returncode == 0


def test_exception_in_jitted_code_names_type_message_and_user_line(tmp_path):
    outcome = _run(tmp_path, (
        "import jax, jax.numpy as jnp\n"
        "@jax.jit\n"
        "def f(x):\n"
        "    return x.reshape(7, 3)\n"
        "print('before')\n"
        "f(jnp.ones((4, 4)))\n"
    ))
    assert outcome.status == "exception"
    assert outcome.exception.type == "TypeError" and "reshape" in outcome.exception.message
    assert outcome.exception.user_frame.line == 4 and outcome.exception.user_frame.function == "f"
    assert "before" in outcome.stdout
    assert "raised TypeError" in outcome.describe()


def test_an_assertion_that_prints_a_2d_array_is_quoted_whole(tmp_path):
    """numpy prints a matrix a row per line: the one-line description keeps every row, not '[[nan 1.]'."""
    outcome = _run(tmp_path, (
        "import numpy as np\n"
        "out = np.array([[np.nan, 1.0], [2.0, 3.0]], np.float32)\n"
        "assert not np.isnan(out).any(), f'jax.jit(f) produced NaN: {out}'\n"
    ))
    assert outcome.describe().startswith("raised AssertionError: jax.jit(f) produced NaN: [[nan  1.] [ 2.  3.]] at ")


def test_segfault_is_a_crash_with_its_line(tmp_path):
    outcome = _run(tmp_path, "import ctypes\nprint('start')\nctypes.string_at(0)\n")
    assert outcome.status == "crash" and outcome.signal == "SIGSEGV"
    assert outcome.crash_frame is not None and outcome.crash_frame.line == 3
    assert "crashed with SIGSEGV" in outcome.describe()


def test_abort_is_a_crash_described_with_the_runtimes_last_words(tmp_path):
    outcome = _run(tmp_path, "import os\nos.abort()\n")
    assert outcome.status == "crash" and outcome.signal == "SIGABRT"
    assert outcome.describe().startswith("crashed with SIGABRT at ")
    # a native runtime that aborts says why first (gloo on mismatched collectives): the description quotes it
    outcome = _run(tmp_path, (
        "import os, sys\n"
        "sys.stderr.write(\"terminate called after throwing an instance of 'gloo::EnforceNotMet'\\n  what():  \"\n"
        "                 \"[enforce fail at pair.cc:459] Is there a distributed collective mismatch?\\n\")\n"
        "os.abort()\n"))
    assert outcome.describe().endswith("(gloo::EnforceNotMet: Is there a distributed collective mismatch?)"), \
        outcome.describe()


def test_hang_is_stopped_and_located(tmp_path):
    # The limit leaves a loaded machine time to start the child and reach the sleep it should be found in.
    outcome = _run(tmp_path, "import time\n\ndef wait():\n    time.sleep(600)\n\nwait()\n", timeout=8)
    assert outcome.status == "timeout" and outcome.elapsed_s >= 8  # stopped at the limit, not before
    assert outcome.crash_frame is not None and outcome.crash_frame.line == 4


def test_exit_code_and_messages_before_a_crash(tmp_path):
    outcome = _run(tmp_path, "import sys\nsys.exit(5)\n")
    assert outcome.status == "exit" and outcome.returncode == 5 and outcome.exception is None
    crashed = _run(tmp_path, (
        "from jaxdbg._child import current_channel\nfrom jaxdbg.protocol import Echo\nimport os\n"
        "current_channel().send(Echo(41))\nos.abort()\n"
    ))
    assert crashed.status == "crash" and [m.value for m in crashed.all(Echo)] == [41]


def test_device_count_reaches_the_child(tmp_path):
    outcome = _run(tmp_path, (
        "import jax\nfrom jaxdbg._child import current_channel\nfrom jaxdbg.protocol import Echo\n"
        "current_channel().send(Echo(jax.device_count()))\n"
    ), device_count=3)
    assert outcome.ok and outcome.last(Echo).value == 3


@pytest.mark.parametrize("text, expected", [
    ('Fatal Python error: Segmentation fault\n\nCurrent thread 0x1 (most recent call first):\n'
     '  File "/home/u/train.py", line 9 in step\n  File "/home/u/train.py", line 20 in <module>\n', 9),
    ("no dump here\n", None),
])
def test_faulthandler_frame_parsing(text, expected):
    frame = faulthandler_user_frame(text)
    assert (frame.line if frame else None) == expected


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as handle:
            return "\nState:\tZ" not in handle.read()
    except FileNotFoundError:
        return False


# profile waits for its target on the main thread; repro waits for its cut on a thread of its own (its progress
# display), which jaxdbg's exit does not unwind: the target's third run (the cut's) sleeps before its NaN.
# profile reports as at its --timeout (exit 3); repro, whose runs' timeouts are its answers, exits at once (143).
SLEEPERS = {
    "profile": ("import os, time\nopen({pid!r}, 'a').write(f'{{os.getpid()}}\\n')\ntime.sleep(120)\n", 1),
    "repro": ("import os, time\nimport jax, jax.numpy as jnp\nopen({pid!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
              "if len(open({pid!r}).read().split()) >= 3:\n    time.sleep(120)\n"
              "print(jax.jit(jnp.log)(-1.0))\n", 3),
}


@pytest.mark.parametrize("command", sorted(SLEEPERS))
def test_sigterm_to_jaxdbg_stops_the_contained_target(tmp_path, command):
    """A CI timeout kills jaxdbg with SIGTERM: the target, in its own session, must not outlive it. profile ends
    its run as at its --timeout: its report, its one line and exit 3, the target last seen where it slept."""
    import signal
    import subprocess
    import sys
    import time

    pid_file = tmp_path / "pid"
    text, runs = SLEEPERS[command]
    script = tmp_path / "sleeper.py"
    script.write_text(text.format(pid=str(pid_file)))
    extra = ["--kind", "nonfinite"] if command == "repro" else []
    jaxdbg = subprocess.Popen([sys.executable, "-m", "jaxdbg", command, str(script), "-q", *extra, "--out",
                               str(tmp_path / "o")], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (
                pid_file.exists() and len(pid_file.read_text().split()) >= runs):
            time.sleep(0.1)
        target = int(pid_file.read_text().split()[-1])
        time.sleep(0.5)
        jaxdbg.send_signal(signal.SIGTERM)
        assert jaxdbg.wait(timeout=30) == (3 if command == "profile" else 128 + signal.SIGTERM)
        deadline = time.monotonic() + 10
        while _alive(target) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(target)
        said = jaxdbg.stderr.read().decode()
        assert "Traceback" not in said
        if command == "profile":
            report = json.loads((tmp_path / "o" / "report.json").read_text())
            error = report["result"]["error"]
            assert report["exit_code"] == 3 and error.startswith("the target was stopped after "), report
            assert error.endswith(f"s (jaxdbg received SIGTERM) (last seen at {script}:3 (<module>))"), error
            assert said == f"jaxdbg profile: {error}\n"
    finally:
        jaxdbg.kill()


def test_a_background_process_left_by_the_target_neither_holds_jaxdbg_nor_outlives_it(tmp_path):
    """It inherits the target's stdout: with pipes, jaxdbg waited for it until the timeout."""
    import time

    pid_file = tmp_path / "bg.pid"
    body = ("import subprocess, sys\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
            f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
            "print('left it running')\n")
    outcome = _run(tmp_path, body, timeout=120)
    # "ok", not "timeout": jaxdbg did not wait for the background process (it sleeps past the limit)
    assert outcome.status == "ok" and "left it running" in outcome.stdout
    background = int(pid_file.read_text())
    deadline = time.monotonic() + 30
    while _alive(background) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(background)


def test_an_exit_with_a_message_says_it(tmp_path):
    outcome = _run(tmp_path, "import sys\nsys.exit('config invalid: missing data dir')\n")
    assert outcome.status == "exit" and outcome.returncode == 1
    assert outcome.describe() == "exited with status 1 (last on stderr: config invalid: missing data dir)"


def test_an_exception_reported_before_a_fatal_signal_is_the_outcome():
    """A job's runtime aborts a process whose peer was lost while it waits to leave the job together: the
    exception it reported first (the failed collective) is what ended the run."""
    from jaxdbg.protocol import ChildFailed, describe_exception
    from jaxdbg.runner import outcome_of

    try:
        raise RuntimeError("Gloo all-reduce failed: Connection reset by peer")
    except RuntimeError as err:
        info = describe_exception(err)
    outcome = outcome_of(-6, False, [ChildFailed(info)], "", "", 1.0)
    assert (outcome.status, outcome.exception.type) == ("exception", "RuntimeError")
    assert outcome_of(-6, False, [], "", "", 1.0).status == "crash"


def _request_types():
    """Every Request type jaxdbg defines (its modules found in the source, so nothing is missed by an import)."""
    import importlib
    import inspect
    import pathlib

    import jaxdbg
    from jaxdbg.protocol import Request

    root = pathlib.Path(jaxdbg.__file__).parent
    for path in root.rglob("*.py"):
        if "(Request" in path.read_text():
            importlib.import_module(".".join(("jaxdbg", *path.relative_to(root).with_suffix("").parts)))
    found, todo = [], list(Request.__subclasses__())
    while todo:
        kind = todo.pop()
        todo.extend(kind.__subclasses__())
        module = sys.modules.get(kind.__module__)
        # a module's own class: not one a docstring example defines (its __module__ is the module's name too)
        if kind.__module__.startswith("jaxdbg.") and getattr(module, kind.__qualname__, None) is kind \
                and not inspect.isabstract(kind):
            found.append(kind)
    return found


def test_every_request_type_has_one_handler_that_takes_it():
    import inspect
    import typing

    from jaxdbg.protocol import handler_for

    kinds = _request_types()
    assert len(kinds) >= 10  # echo, script, profiler capture, nan, profile, memory, hang, pipeline, repro x3
    for kind in kinds:
        handler = handler_for(kind)
        first = next(iter(inspect.signature(handler).parameters))
        assert typing.get_type_hints(handler)[first] is kind, f"{handler.__qualname__} does not take {kind.__name__}"


def test_a_request_without_a_handler_or_with_two_is_refused(tmp_path):
    from dataclasses import dataclass

    from jaxdbg.protocol import Request, handler_for, handles

    @dataclass(frozen=True)
    class Orphan(Request):
        value: int = 0

    with pytest.raises(TypeError, match=r"registers no handler for .*Orphan"):
        handler_for(Orphan)
    handles(Orphan)(lambda request, channel: None)
    with pytest.raises(TypeError, match="already has a handler"):
        handles(Orphan)(print)
    with pytest.raises(TypeError, match=r"runs a jaxdbg\.protocol\.Request, not dict"):
        run_contained({"not": "a request"})


def test_jaxdbgs_own_error_crosses_as_itself_and_is_the_error_the_user_sees(tmp_path):
    """A subclass with fields of its own (the watch's NonFiniteError) arrives as that class, fields intact."""
    from jaxdbg._errors import TargetFailedError
    from jaxdbg.live.errors import NonFiniteError

    outcome = _run(tmp_path, "from jaxdbg.live.errors import NonFiniteError\n"
                             "raise NonFiniteError('loss became nan', {'found': True}, '/tmp/x')\n")
    error = outcome.error
    assert type(error) is NonFiniteError
    assert (error.report, error.path, error.exit_code) == ({"found": True}, "/tmp/x", 1)
    assert outcome.failure("unused") is error
    with pytest.raises(NonFiniteError, match="loss became nan"):
        outcome.reraise_expected()
    plain = _run(tmp_path, "raise KeyError('step')\n")
    assert plain.error is None
    assert type(plain.failure("the target failed")) is TargetFailedError
    bug = plain.failure("unused", bug="the job failed in its child")
    assert type(bug) is RuntimeError and str(bug).startswith("the job failed in its child: KeyError: 'step'\nTraceback")
