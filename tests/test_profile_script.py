"""``jaxdbg profile script.py``: real recipes run contained, one run per module-scoped fixture, many checks each."""

import gzip
import json
import os
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jaxdbg.cli import app, main
from jaxdbg.profile import ProfileOptions, profile
from jaxdbg.profile.instrument import MIN_SAMPLES
from jaxdbg.target import parse_target

RECIPES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "recipes")


def recipe(name: str) -> str:
    return os.path.join(RECIPES, name, "train.py")


def marked_line(path: str, marker: str) -> int:
    with open(path) as handle:
        return next(i for i, line in enumerate(handle, 1) if marker in line)


def by_name(run, name):
    return next(f for f in run.result.functions if f.name == name)


@pytest.fixture(scope="module")
def storm(tmp_path_factory):
    out = tmp_path_factory.mktemp("storm")
    return profile(parse_target(recipe("recompile_storm")), ProfileOptions(budget="recompiles<=0,train_step.calls>=12"),
                   str(out))


def test_recompile_storm_explains_each_recompile(storm):
    step = by_name(storm, "train_step")
    assert step.execute.calls == 12 and step.compiles == 5 and len(step.recompiles) == 4
    reasons = {r.call_index: r.reason for r in step.recompiles}
    assert "argument 'batch' shape changed (8, 32) -> (9, 32)" in reasons[1]
    assert "argument 'batch' shape changed (10, 32) -> (11, 32)" in reasons[3]
    # params start weakly typed (jnp.full with a Python float): the first update makes them strong.
    assert "argument 'params['w']' weak type changed weakly typed f32 -> strongly typed f32" in reasons[1]
    defined = marked_line(recipe("recompile_storm"), "def train_step")
    assert step.source.line in (defined - 1, defined)  # Python's first line of a decorated function: @jax.jit
    assert all(c.times.compile_s > 0 for c in step.compilations)
    assert step.compile.total_s >= step.compile.compile_s > 0
    fresh = by_name(storm, "<lambda>")
    assert fresh.compiles == 12 and all("new Python callable" in r.reason for r in fresh.recompiles)
    assert any("bucketing" in h for h in storm.result.hints) and any("jit once" in h for h in storm.result.hints)


def test_recompile_budget_fails_with_each_violation_named(storm):
    assert storm.exit_code == 1 and not storm.result.budget.ok
    assert storm.result.budget.violations == ("recompiles 15 > 0",)


def test_steady_state_times_exclude_compiles(storm):
    # Which calls the statistics take is tested on given call records (test_profile_units); here, that the
    # recorded intervals nest: the first call's wall time holds its compile, the parts add up to the wall.
    step = by_name(storm, "train_step")
    assert step.execute.first_s > step.compilations[0].times.total_s  # the first call includes its compile
    e = step.execute
    assert 0 < e.min_s <= e.median_s <= e.p90_s <= e.max_s and 0 < e.timed_calls <= e.calls == 12
    totals = storm.result.totals
    parts = totals.compile_s + totals.execute_s + totals.transfer_s + totals.other_s
    assert totals.compile_s >= sum(c.times.total_s for f in storm.result.functions for c in f.compilations) - 1e-9
    assert parts == pytest.approx(totals.wall_s, rel=0.02)


@pytest.fixture(scope="module")
def hot(tmp_path_factory):
    out = tmp_path_factory.mktemp("hot")
    return profile(parse_target(recipe("hot_op")), ProfileOptions(monitor=True, xla_dump=True, top=4), str(out)), out


def test_hot_op_is_in_the_per_op_table_with_its_source_line(hot):
    # Which op is slowest is a measurement (scripts/bench_profile.py); the table's structure is not.
    run, _ = hot
    step = by_name(run, "step")
    assert step.ops_source == "xplane op events" and len(step.ops) == 4
    fractions = [op.fraction for op in step.ops]
    assert fractions == sorted(fractions, reverse=True) and sum(fractions) <= 1.0 + 1e-9
    matmul = next(op for op in step.ops if op.category == "matmul")  # the one dot, once per call
    # once per call but the first: a program's first run pays XLA:CPU's one-time setup, left out of the table
    assert matmul.count == 5 and matmul.fraction > 0
    assert any("first run(s) of a program" in note for note in run.result.notes), run.result.notes
    assert matmul.source.file == recipe("hot_op") and matmul.source.line == marked_line(recipe("hot_op"), "the hot op")
    assert step.cost["flops"] > 5e8 and step.memory["argument_bytes"] == 3 * 1024 * 256 * 4
    assert step.rates.flops_per_s > 0 and step.rates.peak_source.startswith("calibrated")


def test_capture_files_and_one_step_annotation_per_call(hot):
    run, out = hot
    trace = run.result.trace
    assert os.path.exists(trace.xplane) and trace.xplane.endswith(".xplane.pb")
    with gzip.open(trace.trace_json) as handle:
        events = json.load(handle)["traceEvents"]
    steps = sorted(int(e["args"]["step_num"]) for e in events if e.get("name") == "step" and "args" in e)
    assert steps == [0, 1, 2, 3, 4, 5] and trace.calls_traced == 6
    with gzip.open(trace.perfetto) as handle:
        perfetto = json.load(handle)
    assert "metadata" not in perfetto and perfetto["traceEvents"]
    hlo = by_name(run, "step").hlo
    assert Path(hlo["stablehlo"]).read_text().startswith("module @jit_step")
    assert Path(hlo["optimized_hlo"]).read_text().startswith("HloModule jit_step")
    assert all(path.startswith(str(out)) for path in run.artifacts.values())


def test_xla_dump_goes_to_out_only(hot):
    run, _ = hot
    dumped = os.listdir(run.artifacts["xla_dump"])
    assert any("jit_step" in name and name.endswith(".txt") for name in dumped)
    assert "--xla_dump_to" not in os.environ.get("XLA_FLAGS", "")


def test_monitor_series(hot):
    monitor = hot[0].result.monitor
    assert monitor.summary["samples"] == len(monitor.t_s) >= 2
    assert all(rss > 50 * 2**20 for rss in monitor.host_rss_bytes)
    assert monitor.device_bytes_in_use[0] is None  # CPU keeps no device memory count
    assert list(monitor.t_s) == sorted(monitor.t_s)


def test_host_transfer_bottleneck(tmp_path):
    run = profile(parse_target(recipe("host_transfer")), ProfileOptions(trace_calls=0), str(tmp_path))
    # Filed by kind, counted and sized; whether they dominate the wall time is a measurement (the hint's
    # rule is tested on given totals in test_profile_units).
    kinds = {t.kind: t for t in run.result.transfers}
    implicit = kinds["implicit_args"]  # a float64 numpy batch handed to the jitted step on every call
    assert implicit.count == 12 and implicit.bytes == 12 * 1024 * 1024 * 8 and implicit.total_s > 0
    assert kinds["to_host"].count >= 12  # float(loss) on every step
    assert "device_put" not in kinds  # the script never moves data itself
    step = by_name(run, "train_step")
    assert step.execute.calls == 12 and step.compiles == 1  # a fresh host array each call, same signature
    assert run.result.totals.transfer_s == pytest.approx(sum(t.total_s for t in run.result.transfers))


SCRIPTS = {
    "ahead_of_time.py": """
        import functools, jax, jax.numpy as jnp
        def predict(w, x):
            return jnp.tanh(x @ w).sum()
        @functools.partial(jax.jit, static_argnums=1, donate_argnums=0)
        def scale(x, n):
            return x * n
        w, x = jnp.ones((16, 16)), jnp.ones((8, 16))
        compiled = jax.jit(predict).lower(w, x).compile()
        for _ in range(5):
            compiled(w, x).block_until_ready()
        staged = jax.jit(predict).trace(w, jnp.ones((4, 16))).lower().compile()  # the new shape
        staged(w, jnp.ones((4, 16)))
        y = scale.lower(jnp.ones(4), 3).compile()(jnp.ones(4))  # static and donated arguments
        print(float(y.sum()), float(compiled(w, x)))
    """,
    "value_and_grad.py": """
        import jax, jax.numpy as jnp
        def loss(w, x):
            return jnp.mean(jnp.tanh(x @ w) ** 2)
        evaluate, train = jax.jit(loss), jax.jit(jax.value_and_grad(loss))  # both programs are jit_loss
        w, x = jnp.ones((64, 64)) * 0.01, jnp.ones((32, 64))
        print(float(evaluate(w, x)))
        for _ in range(6):
            value, grad = train(w, x)
            w = w - 0.1 * grad
    """,
    "raises.py": """
        import jax, jax.numpy as jnp
        @jax.jit
        def step(x):
            return x * 2 + 1
        x = jnp.ones(8)
        for i in range(5):
            x = step(x)
            if i == 3:
                raise ValueError("data loader exhausted")
    """,
    "nojit.py": """
        import jax.numpy as jnp
        print(float((jnp.arange(10.0) * 2).sum()))
    """,
    "args.py": """
        import sys, jax, jax.numpy as jnp
        print("argv", sys.argv[1:])
        f = jax.jit(lambda x: x + 1)
        for _ in range(int(sys.argv[1])):
            f(jnp.ones(3))
    """,
    "own_trace_and_cache.py": """
        import sys, jax, jax.numpy as jnp
        jax.config.update("jax_compilation_cache_dir", sys.argv[1])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
        f = jax.jit(lambda x: x * 2)
        f(jnp.ones(3))
        with jax.profiler.trace(sys.argv[2]):  # the script's own capture, while jaxdbg's is running
            f(jnp.ones(3))
        jax.clear_caches()
        f(jnp.ones(3))  # compiles again: answered by the persistent cache
        print("done")
    """,
    "own_xla_flags.py": """
        import os
        os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")  # as jax's docs show
        import jax, jax.numpy as jnp
        print("devices", jax.device_count())
        jax.jit(lambda x: x + 1)(jnp.ones(4))
    """,
    "static_branch.py": """
        from functools import partial
        import jax, jax.numpy as jnp

        @partial(jax.jit, static_argnames=("mode",))
        def update(buf, delta, mode="add"):
            if mode == "add":
                return jnp.sin(buf + delta)  # add branch
            return jnp.cos(buf * delta)  # mul branch

        for _ in range(2):
            update(jnp.ones(64), jnp.ones(64)).block_until_ready()
            update(jnp.ones(64), jnp.ones(64), mode="mul").block_until_ready()
    """,
    "callbacks.py": """
        import jax, jax.numpy as jnp, numpy as np
        from jax.experimental import io_callback

        seen = []

        def host_sin(x):
            return np.sin(np.asarray(x)).astype(np.float32)  # in pure_callback

        @jax.jit
        def f(x):
            y = jax.pure_callback(host_sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
            jax.debug.print("mean {m}", m=y.mean())
            io_callback(lambda v: seen.append(float(v)), None, y.sum())  # in io_callback
            return y * 2

        x = jnp.arange(8.0)
        for _ in range(4):
            x = f(x)
        print(float(x.sum()))  # the one sync of the program
    """,
    "crashes.py": """
        import ctypes, time, jax, jax.numpy as jnp
        f = jax.jit(lambda x: x + 1)
        for _ in range(4):
            f(jnp.ones(3))
        time.sleep(3.0)  # the flusher (every 0.5 s) sends the calls before the crash, on a loaded machine too
        ctypes.string_at(0)  # SIGSEGV
    """,
    "hangs.py": """
        import time, jax, jax.numpy as jnp
        f = jax.jit(lambda x: x + 1)
        for _ in range(3):
            f(jnp.ones(3))
        time.sleep(600)
    """,
}


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("scripts")
    for name, text in SCRIPTS.items():
        (folder / name).write_text(textwrap.dedent(text))
    return folder


def test_calls_through_the_ahead_of_time_api_are_profiled_as_the_jitted_function(scripts, tmp_path):
    # jax.jit(f).lower(x).compile() and .trace(x).lower().compile() once escaped the profile: no function, no calls.
    path = str(scripts / "ahead_of_time.py")
    run = profile(parse_target(path), ProfileOptions(calibrate=False, trace_calls=0), str(tmp_path))
    assert run.exit_code == 0, run.result.error
    assert "12.0 " in run.outcome.stdout  # the program's results are its own
    predict, scale = by_name(run, "predict"), by_name(run, "scale")
    assert (predict.compiles, predict.execute.calls, scale.compiles, scale.execute.calls) == (2, 7, 1, 1)
    assert predict.compile.trace_s > 0 and predict.compile.lower_s > 0 and predict.compile.compile_s > 0
    assert predict.cost is not None and predict.memory is not None  # read from the Compiled itself
    why = predict.recompiles[0]
    assert why.call_index == 5 and "shape changed (8, 16) -> (4, 16)" in why.reason
    assert why.source.line == marked_line(path, "# the new shape")


def test_script_that_raises_keeps_partial_profile_and_exits_3(scripts, tmp_path, capsys):
    code = main(["profile", str(scripts / "raises.py"), "--out", str(tmp_path / "o"), "--json",
                 str(tmp_path / "r.json"), "-q"])
    assert code == 3
    err = capsys.readouterr().err
    assert "raised ValueError: data loader exhausted" in err and "raises.py:10" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err  # -q: the one line, said once
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["exit_code"] == 3 and "data loader exhausted" in report["result"]["error"]
    step = report["result"]["functions"][0]
    assert step["name"] == "step" and step["execute"]["calls"] == 4 and step["compiles"] == 1
    assert report["result"]["error_source"]["line"] == 10


def test_script_without_jit_says_so(scripts, tmp_path):
    run = profile(parse_target(str(scripts / "nojit.py")), ProfileOptions(), str(tmp_path))
    assert run.exit_code == 0 and run.result.functions == ()
    assert "ran no jitted function" in run.result.notes[0] and run.result.eager_compile["count"] >= 1


def test_script_args_after_double_dash(scripts, tmp_path):
    result = CliRunner().invoke(app, ["profile", str(scripts / "args.py"), "--out", str(tmp_path / "o"),
                                      "--json", "-", "--trace-calls", "0", "--", "7"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["result"]["functions"][0]["execute"]["calls"] == 7
    assert "argv ['7']" in Path(report["artifacts"]["target_stdout"]).read_text()


def test_script_with_its_own_capture_and_a_persistent_cache(scripts, tmp_path):
    spec = parse_target(str(scripts / "own_trace_and_cache.py"), [str(tmp_path / "cache"), str(tmp_path / "own")])
    run = profile(spec, ProfileOptions(calibrate=False), str(tmp_path / "out"))
    assert run.exit_code == 0, run.result.error
    assert "done" in run.outcome.stdout and os.listdir(tmp_path / "own")  # the script's capture worked
    assert any("started its own jax.profiler capture" in n for n in run.result.notes)
    f = run.result.functions[0]
    assert f.compiles == 2 and f.execute.calls == 3
    assert "caches were cleared" in f.recompiles[0].reason and f.recompiles[0].call_index == 2
    assert [c.cache_hit for c in f.compilations] == [False, True]


def test_script_setting_its_own_xla_flags_gets_them_with_jaxdbgs_added(scripts, tmp_path, monkeypatch):
    # jaxdbg's own flags (command buffers off for the capture) once filled XLA_FLAGS before the script ran,
    # so its setdefault did nothing: one device under jaxdbg, two in a plain run.
    monkeypatch.delenv("XLA_FLAGS")
    run = profile(parse_target(str(scripts / "own_xla_flags.py")), ProfileOptions(calibrate=False), str(tmp_path))
    assert run.exit_code == 0, run.result.error
    assert "devices 2" in run.outcome.stdout and len((run.environment or {})["devices"]) == 2


def test_ops_of_a_later_compile_keep_their_source_line(scripts, tmp_path):
    # The capture names both compiles' ops by one module (jit_update); only the first compile's HLO was read,
    # so the mul branch's ops had no line.
    path = str(scripts / "static_branch.py")
    run = profile(parse_target(path), ProfileOptions(calibrate=False), str(tmp_path))
    update = by_name(run, "update")
    assert update.compiles == 2 and "static argument 'mode'" in update.recompiles[0].reason
    lines = {op.source.line for op in update.ops if op.source is not None}
    assert marked_line(path, "# mul branch") in lines and marked_line(path, "# add branch") in lines


def test_a_function_and_its_gradient_jitted_apart_have_their_own_names_and_ops(scripts, tmp_path):
    # jax.jit(loss) and jax.jit(jax.value_and_grad(loss)): both HLO modules are jit_loss, and both were once
    # named 'loss', each with both programs' ops summed in its table.
    run = profile(parse_target(str(scripts / "value_and_grad.py")), ProfileOptions(calibrate=False), str(tmp_path))
    loss, train = by_name(run, "loss"), by_name(run, "value_and_grad(loss)")
    assert (loss.execute.calls, train.execute.calls) == (1, 6) and loss.module == train.module == "jit_loss"
    assert loss.ops and train.ops and {op.count for op in loss.ops} == {1}  # its one run, not the training's
    assert min(op.count for op in train.ops) >= 2 and len(train.ops) > len(loss.ops)


def test_reads_inside_host_callbacks_are_not_the_programs_syncs(scripts, tmp_path):
    # The computation waits for its callbacks; their np.asarray/float()/print once counted as the program
    # waiting for the device, and jax's copies of their results as transfers at the calling line.
    path = str(scripts / "callbacks.py")
    run = profile(parse_target(path), ProfileOptions(calibrate=False, trace_calls=0), str(tmp_path))
    assert run.exit_code == 0, run.result.error
    assert [(s.kind, s.source.line, s.count) for s in run.result.syncs] == [
        ("float()", marked_line(path, "the one sync"), 1)]
    assert {t.kind for t in run.result.transfers} == {"to_host"}


def test_crash_is_contained_and_reported(scripts, tmp_path):
    run = profile(parse_target(str(scripts / "crashes.py")), ProfileOptions(trace_calls=0), str(tmp_path))
    assert run.exit_code == 3 and "crashed with SIGSEGV" in run.result.error
    assert run.result.error_source.line == 7
    assert run.result.functions[0].execute.calls == 4


SPINS = ("import jax, jax.numpy as jnp\n\n@jax.jit\ndef spin(x):\n"
         "    return jax.lax.while_loop(lambda v: v > 0, lambda v: v + 1.0, x)\n\nspin(jnp.float32(1))\n")


@pytest.fixture(scope="module")
def hung_runs(scripts, tmp_path_factory):
    """The two runs that end only at --timeout, side by side (one sleeps, one spins on one core): one 20 s wait,
    not two. The limit leaves a loaded machine time to import jax and make the three calls before the hang."""
    from concurrent.futures import ThreadPoolExecutor

    (scripts / "spins.py").write_text(SPINS)
    options = ProfileOptions(timeout=20, trace_calls=0, calibrate=False)
    with ThreadPoolExecutor(2) as pool:
        runs = {name: pool.submit(profile, parse_target(str(scripts / name)), options,
                                  str(tmp_path_factory.mktemp(name)))
                for name in ("hangs.py", "spins.py")}
        return {name: run.result() for name, run in runs.items()}


def test_timeout_stops_the_target_and_keeps_what_was_sent(hung_runs):
    run = hung_runs["hangs.py"]
    assert run.exit_code == 3 and "timed out" in run.result.error
    assert run.result.functions[0].execute.calls == 3  # flushed before the hang


def test_a_hang_inside_the_first_jitted_call_is_said_to_be_there(hung_runs):
    run = hung_runs["spins.py"]
    assert run.exit_code == 3 and "timed out" in run.result.error and not run.result.functions
    assert any("before any jitted function returned from its first call (spin)" in n for n in run.result.notes)
    assert not any("ran no jitted function" in n for n in run.result.notes)


def test_compile_heavy_cli_budget_and_compare(tmp_path, capsys):
    first = tmp_path / "first.json"
    assert main(["profile", recipe("compile_heavy"), "--out", str(tmp_path / "a"), "--json", str(first),
                 "--budget", "compile_s<=0.001,unrolled_mlp.execute_median_ms<=60000"]) == 1
    text = capsys.readouterr().out
    assert "budget violated" in text and "unrolled_mlp" in text and "compile" in text
    report = json.loads(first.read_text())
    violations = report["result"]["budget"]["violations"]  # the generous execute budget holds
    assert len(violations) == 1 and violations[0].startswith("compile_s ")
    fn = report["result"]["functions"][0]
    assert fn["name"] == "unrolled_mlp" and fn["compiles"] == 1
    assert set(fn["compile"]) == {"trace_s", "lower_s", "compile_s", "total_s"}
    assert fn["compile"]["total_s"] == pytest.approx(sum(fn["compile"][k] for k in ("trace_s", "lower_s", "compile_s")))
    assert set(report["result"]["totals"]) >= {"wall_s", "compile_s", "execute_s", "transfer_s", "other_s"}
    assert report["environment"]["backend"] == "cpu"
    second = tmp_path / "second.json"
    assert main(["profile", recipe("compile_heavy"), "--out", str(tmp_path / "b"), "--json", str(second),
                 "--compare", str(first), "--trace-calls", "0", "-q"]) == 0
    deltas = {d["name"]: d for d in json.loads(second.read_text())["result"]["comparison"]}
    assert deltas["unrolled_mlp"]["status"] == "changed"
    assert deltas["unrolled_mlp"]["metrics"]["compile_s"]["old"] == fn["compile"]["total_s"]
    assert deltas["unrolled_mlp"]["metrics"]["compile_s"]["ratio"] > 0


@pytest.mark.parametrize("argv, fragment", [
    (["--budget", "compile_s<=fast"], "--budget"),
    (["--compare", "/nonexistent/old.json"], "no such file"),
    (["--args", "f32[2]"], "for a function target"),
])
def test_bad_options_exit_2_before_running(argv, fragment, tmp_path, capsys):
    assert main(["profile", recipe("hot_op"), "--out", str(tmp_path / "o"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err


SAMPLED = textwrap.dedent("""
    import jax, jax.numpy as jnp

    @jax.jit
    def step(x):
        return jnp.tanh(x @ x) * 0.5

    x = jnp.ones((256, 256))
    for i in range(40):
        x = step(x if i != 30 else x[:128, :128])  # call 30 (not one --sync-every 8 times) compiles again

    tick = jax.jit(lambda t: t + 1.0)
    t = jnp.zeros(())
    for i in range(400):
        t = tick(t)
    print(float(x.sum()), float(t))
""")


def test_after_the_first_calls_only_one_in_sync_every_is_waited_for(tmp_path):
    """Waiting on every call takes away a GPU loop's dispatch-ahead: after the first calls only one in
    --sync-every is timed, after the calls queued ahead of it finished (else it would time them too)."""
    script = tmp_path / "loop.py"
    script.write_text(SAMPLED)
    runs = {n: profile(parse_target(str(script)), ProfileOptions(sync_every=n, trace_calls=0), str(tmp_path / f"o{n}"))
            for n in (1, 8)}
    every, sampled = (by_name(runs[n], "step").execute for n in (1, 8))
    assert every.calls == sampled.calls == 40  # the untimed calls were not seen, but counted
    assert every.timed_calls == 40 and sampled.timed_calls == 8  # calls 0, 1, 2, 8, 16, 24, 32, and 30: it compiled
    # (how the 32 untimed calls are estimated is tested on given call records in test_profile_units; that
    # a timed call is not inflated by those queued before it is measured by scripts/bench_profile.py)
    assert any("calls timed (step 8 of 40, <lambda> " in n for n in runs[8].result.notes)
    # After MIN_SAMPLES calls timed one in 8 (calls 8-64), a call is timed no sooner than 100x the latest timed
    # execution later: 400 calls of microseconds would be 3 + 49 timed calls one in 8, are 3 + 8 and a few.
    tick = by_name(runs[8], "<lambda>").execute
    assert tick.calls == 400 and 3 + MIN_SAMPLES <= tick.timed_calls <= 3 + MIN_SAMPLES + 20
    assert by_name(runs[1], "<lambda>").execute.timed_calls == 400
    assert not any("calls timed" in n for n in runs[1].result.notes)
    for run in runs.values():  # the recompile of an unseen call is filed with its cause all the same
        step = by_name(run, "step")
        assert step.compiles == 2 and [r.call_index for r in step.recompiles] == [30]
        assert "shape changed (256, 256) -> (128, 128)" in step.recompiles[0].reason
