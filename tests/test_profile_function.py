"""``jaxdbg profile file.py::fn``: the AOT split, timed runs, cost/memory/rates, HLO, per-op table, budgets per
function, input errors, and ``--serve`` (xprof on loopback)."""

import json
import os
import textwrap
import urllib.request
from pathlib import Path

import pytest

from jaxdbg.cli import main
from jaxdbg.profile import start_xprof

RECIPES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "recipes")
RUN_HEAVY = os.path.join(RECIPES, "run_heavy", "train.py")


@pytest.fixture(scope="module")
def heavy(tmp_path_factory):
    out = tmp_path_factory.mktemp("fn")
    code = main(["profile", f"{RUN_HEAVY}::power_iterations", "--args", "f32[256,256]", "--runs", "4", "--warmup", "1",
                 "--trace-calls", "2", "--out", str(out / "o"), "--json", str(out / "r.json"), "-q"])
    return code, json.loads((out / "r.json").read_text())


def test_function_mode_aot_split_and_timed_runs(heavy):
    code, report = heavy
    assert code == 0 and report["target"].endswith("::power_iterations")
    result = report["result"]
    assert result["mode"] == "function"
    fn = result["functions"][0]
    assert fn["name"] == "power_iterations" and fn["compiles"] == 1 and fn["recompiles"] == []
    c = fn["compile"]
    assert c["trace_s"] > 0 and c["lower_s"] > 0 and c["compile_s"] > 0
    assert c["total_s"] == pytest.approx(c["trace_s"] + c["lower_s"] + c["compile_s"])
    e = fn["execute"]
    assert e["calls"] == 4 and e["min_s"] <= e["median_s"] <= e["p90_s"] <= e["max_s"] and e["spread"] >= 0
    assert 4 * e["min_s"] * (1 - 1e-9) <= e["total_s"] <= 4 * e["max_s"] * (1 + 1e-9)  # the 4 timed runs, summed


def test_function_mode_cost_memory_and_rates(heavy):
    fn = heavy[1]["result"]["functions"][0]
    assert fn["cost"]["flops"] >= 2 * 256**3 and fn["cost"]["bytes_accessed"] > 0
    assert fn["cost"]["arithmetic_intensity"] == pytest.approx(fn["cost"]["flops"] / fn["cost"]["bytes_accessed"])
    assert fn["memory"]["argument_bytes"] == 256 * 256 * 4 and fn["memory"]["output_bytes"] == 4
    rates = fn["rates"]
    # XLA counts the fori_loop body once; the rates count its 40 matmuls (the elementwise work once).
    executed = rates["flops_per_s"] * fn["execute"]["median_s"]
    assert 40 * 2 * 256**3 <= executed <= fn["cost"]["flops"] + 40 * 2 * 256**3
    assert rates["peak_flops_per_s"] > 0  # calibrated on this CPU: a measurement, so only its use is checked
    assert rates["flops_fraction"] == pytest.approx(rates["flops_per_s"] / rates["peak_flops_per_s"])
    assert "trip counts 40" in rates["note"] and "counted here per iteration" in rates["note"]


def test_function_mode_hlo_and_per_op_table(heavy):
    report = heavy[1]
    fn = report["result"]["functions"][0]
    assert Path(fn["hlo"]["stablehlo"]).read_text().startswith("module @jit_power_iterations")
    assert "while" in Path(fn["hlo"]["optimized_hlo"]).read_text()
    fractions = [op["fraction"] for op in fn["ops"]]
    assert fractions == sorted(fractions, reverse=True)  # which op is slowest is measured (bench_profile.py)
    matmul = next(op for op in fn["ops"] if op["category"] == "matmul")
    assert matmul["count"] == 2 * 40 and matmul["source"]["line"] == 12  # 40 loop iterations, 2 traced calls
    assert report["result"]["trace"]["calls_traced"] == 2


def test_function_inputs_from_make_inputs_and_per_function_budget(tmp_path, capsys):
    # A jitted step as users write it: a static argument (the compiled executable takes only the others) and a
    # donated pytree of jax arrays from make_inputs (each run needs fresh buffers), and a typed PRNG key (whose
    # dtype, key<fry>, numpy cannot read: it once ended the run in an internal error).
    (tmp_path / "model.py").write_text(textwrap.dedent("""
        import functools

        import jax
        import jax.numpy as jnp

        @functools.partial(jax.jit, static_argnames=("power",), donate_argnums=(0,))
        def loss(params, x, power, key):
            x = x + 1e-3 * jax.random.uniform(key, x.shape)
            return {"w": params["w"] * 0.5}, jnp.mean(jnp.tanh(x @ params["w"]) ** power)

        def make_inputs():
            return {"w": jnp.ones((32, 8))}, jnp.ones((16, 32)), 2, jax.random.key(0)
    """))
    code = main(["profile", f"{tmp_path}/model.py::loss", "--inputs", f"{tmp_path}/model.py::make_inputs",
                 "--runs", "2", "--trace-calls", "0", "--out", str(tmp_path / "o"), "--json", "-",
                 "--budget", "loss.compile_s<=0.000001,loss.execute_median_ms<=10000"])
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert code == 1 and report["exit_code"] == 1
    assert report["result"]["budget"]["violations"][0].startswith("loss.compile_s ")
    assert report["result"]["functions"][0]["execute"]["calls"] == 2


def test_function_without_arguments_needs_no_inputs(tmp_path, capsys):
    (tmp_path / "nullary.py").write_text("import jax.numpy as jnp\n\ndef f():\n    return jnp.arange(4.0).sum()\n")
    assert main(["profile", f"{tmp_path}/nullary.py::f", "--runs", "1", "--trace-calls", "0",
                 "--out", str(tmp_path / "o"), "--json", "-"]) == 0
    functions = json.loads(capsys.readouterr().out)["result"]["functions"]
    assert functions[0]["name"] == "f" and functions[0]["execute"]["calls"] == 1


@pytest.mark.parametrize("target_suffix, extra, fragment", [
    ("::missing", ["--args", "f32[2]"], "no function 'missing'"),
    ("::power_iterations", [], "needs inputs"),
    ("::power_iterations", ["--args", "f32[2", "--inputs", "x.npz"], "either --args or --inputs"),
    ("::power_iterations", ["--args", "q8[2]"], "unknown dtype"),
    ("::power_iterations", ["--inputs", "nope.npz"], "no such file"),
    ("::power_iterations", ["--args", "f32[4,4] f32[4]"], "do not fit power_iterations"),
])
def test_function_input_errors_exit_2_one_line(target_suffix, extra, fragment, tmp_path, capsys):
    assert main(["profile", RUN_HEAVY + target_suffix, *extra, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err and "Traceback" not in err


def test_function_that_fails_to_trace_exits_3(tmp_path, capsys):
    (tmp_path / "bad.py").write_text("import jax.numpy as jnp\ndef f(x):\n    return jnp.dot(x, jnp.ones(3))\n")
    assert main(["profile", f"{tmp_path}/bad.py::f", "--args", "f32[5]", "--out", str(tmp_path / "o")]) == 3
    err = capsys.readouterr().err
    assert "TypeError" in err and "bad.py:3" in err


def test_serve_answers_on_loopback_then_stops(heavy):
    logdir = heavy[1]["result"]["trace"]["logdir"]
    server = start_xprof(logdir)
    try:
        assert server.url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(server.url + "data/plugin/profile/runs", timeout=30) as response:
            assert response.status == 200
    finally:
        server.stop()
    assert server.process.poll() is not None


def test_cli_serve_prints_the_address_and_stops_on_ctrl_c(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", "jaxdbg", "profile", f"{RUN_HEAVY}::power_iterations", "--args", "f32[64,64]",
         "--runs", "1", "--trace-calls", "1", "-q", "--serve", "--out", str(tmp_path / "o")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline, url = time.monotonic() + 120, None
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if line.startswith("xprof: "):
                url = line.split()[1]
            elif not line and proc.poll() is not None:
                break
        assert url and url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(url, timeout=30) as response:
            assert response.status == 200
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_xprof_hlo_stats_is_empty_on_cpu_so_thunk_events_are_used(heavy):
    from jaxdbg.profile.ops import thunk_events, xprof_hlo_stats

    xplane = heavy[1]["result"]["trace"]["xplane"]
    assert xprof_hlo_stats(xplane) == {}  # the fact behind the CPU path (see DESIGN.md)
    assert "jit_power_iterations" in thunk_events(xplane)
    assert heavy[1]["result"]["functions"][0]["ops_source"] == "xplane op events"


def test_function_mode_captures_no_more_calls_than_it_timed(tmp_path):
    code = main(["profile", f"{RUN_HEAVY}::power_iterations", "--args", "f32[32,32]", "--runs", "2", "--warmup", "1",
                 "--out", str(tmp_path / "o"), "--json", str(tmp_path / "r.json"), "-q"])
    fn = json.loads((tmp_path / "r.json").read_text())["result"]["functions"][0]
    assert code == 0 and fn["execute"]["calls"] == 2
    assert fn["ops"][0]["count"] == 2 * 40  # two captured calls (not the default ten) of the 40-step loop
