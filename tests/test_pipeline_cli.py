"""``jaxdbg pipeline-bench`` from the command line: the contract's JSON, artifacts, and usage errors."""

import json
import subprocess
import sys

import pytest

from jaxdbg.cli import main


def _bench(capsys, *args):
    code = main(["pipeline-bench", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_sim_json_has_the_contract_shape(capsys, tmp_path):
    code, out, err = _bench(
        capsys, "--mode", "sim", "--stages", "4", "--microbatches", "8", "--policy", "fixed,ready",
        "--hint", "1f1b,bfw", "--memory-cap", "1,2", "--comm", "async,sync", "--seeds", "2",
        "--variability", "none,straggler:stage=1,factor=3,prob=0.3", "--json", "-", "--out", str(tmp_path / "out"),
    )
    assert code == 0, err
    report = json.loads(out)
    assert report["command"] == "pipeline-bench" and report["exit_code"] == 0
    result = report["result"]
    assert result["config"]["stages"] == 4 and result["config"]["mode"] == "sim" and result["config"]["seed"] == 0
    # 2 variabilities x 2 seeds x (2 fixed comms + 2 hints x 2 caps x 2 comms) rows.
    assert len(result["runs"]) == 2 * 2 * (2 + 8)
    row = next(r for r in result["runs"] if r["policy"] == "ready")
    for key in ("schedule", "policy", "hint", "comm", "memory_cap", "variability", "seed", "makespan_s",
                "throughput_mb_s", "bubble_fraction", "stage_busy", "peak_inflight", "lower_bound_s",
                "speedup_vs_fixed"):
        assert key in row
    assert len(row["stage_busy"]) == 4 and row["makespan_s"] >= row["lower_bound_s"]
    fixed = [r for r in result["runs"] if r["policy"] == "fixed"]
    assert all(r["speedup_vs_fixed"] == 1.0 and r["hint"] is None for r in fixed)
    assert {s["variability"] for s in result["summary"]} == {"none", "straggler:stage=1,factor=3,prob=0.3"}
    assert all("median_speedup_vs_fixed" in s and "median_makespan_over_lower_bound" in s for s in result["summary"])
    assert result["correctness"] is None
    assert (tmp_path / "out" / "report.json").exists()


def test_trace_and_plots_are_written(capsys, tmp_path):
    trace, plot = tmp_path / "t.json", tmp_path / "timeline.png"
    code, out, err = _bench(
        capsys, "--stages", "3", "--microbatches", "6", "--schedule", "zb-h1", "--hint", "bfw", "--memory-cap", "1,2",
        "--variability", "jitter:cv=0.3", "--trace", str(trace), "--plot", str(plot), "--out", str(tmp_path / "o"),
    )
    assert code == 0, err
    events = json.loads(trace.read_text())["traceEvents"]
    tasks = [e for e in events if e["ph"] == "X"]
    assert len(tasks) == 3 * 3 * 6 * 3  # three runs (fixed, ready 1x, ready 2x) of 54 tasks
    assert {e["tid"] for e in tasks} == {0, 1, 2} and {e["cat"] for e in tasks} == {"F", "I", "W"}
    assert plot.read_bytes()[:4] == b"\x89PNG" and (tmp_path / "timeline-memory.png").read_bytes()[:4] == b"\x89PNG"
    assert "where the time went" in out and "speedup" in out


def test_no_lookahead_is_the_blind_readiness_rule(capsys, tmp_path):
    """ZB-H1 without variability: the look-ahead keeps ready on the fixed order's time; blind readiness lags."""
    speedup = {}
    for flag in ("--lookahead", "--no-lookahead"):
        code, out, err = _bench(capsys, "--stages", "8", "--microbatches", "32", "--schedule", "zb-h1",
                                "--hint", "1f1b", flag, "--json", "-",
                                "--out", str(tmp_path / flag))  # not jaxdbg-out/ in the folder pytest runs from
        assert code == 0, err
        result = json.loads(out)["result"]
        assert result["config"]["lookahead"] is (flag == "--lookahead")
        speedup[flag] = next(r["speedup_vs_fixed"] for r in result["runs"] if r["policy"] == "ready")
    assert speedup["--lookahead"] >= 1.0 - 1e-9 and speedup["--no-lookahead"] < 0.99


@pytest.mark.parametrize("args,message", [
    (["--variability", "jitter:cv=oops"], "is not a float"),
    (["--variability", "straggler:stage=7"], "stages are 0..3"),
    (["--variability", "link:stage=0,factor=inf"], "factor=inf must be a finite number at least"),
    (["--schedule", "pipedream"], "unknown schedule"),
    (["--hint", "lifo"], "--hint 'lifo'"),
    (["--memory-cap", "two"], "is not a number"),
    (["--memory-cap", "0"], "positive multiples"),
    (["--memory-cap", "inf"], "positive multiples"),  # was an internal error (exit 4)
    (["--task-ms", "nan"], "--task-ms must be"),  # nan and inf durations made the simulation run forever
    (["--comm-ms", "inf"], "--comm-ms"),
    (["--seed", "-1"], "--seed -1"),  # was an internal error (exit 4)
    (["--xprof"], "add --mode real"),
    (["--mode", "fast"], "--mode 'fast'"),
    (["--schedule", "interleaved", "--microbatches", "6"], "multiple of --stages"),
    (["--stages", "0"], "jaxdbg pipeline-bench"),
])
def test_bad_options_exit_2_with_one_line(capsys, args, message):
    code, _, err = _bench(capsys, *args)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_real_mode_end_to_end_in_a_child(tmp_path):
    """The CLI needs no XLA_FLAGS: real mode runs in a contained child with one CPU device per stage."""
    env_free = {k: v for k, v in __import__("os").environ.items() if k != "XLA_FLAGS"}
    result = subprocess.run(
        [sys.executable, "-m", "jaxdbg", "pipeline-bench", "--mode", "real", "--stages", "3", "--microbatches", "4",
         "--task-ms", "1", "--variability", "multimodal:heavy=0.5,factor=3+seqlen:mean=512,cv=0.8", "--memory-cap",
         "2", "--xprof",
         "--json", "-", "--out", str(tmp_path / "real")],
        capture_output=True, text=True, env=env_free, timeout=240,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    correctness = report["result"]["correctness"]
    assert correctness["reference"] == "single-device" and correctness["ok"] is True
    assert correctness["max_abs_grad_diff"] <= correctness["tolerance"]
    assert len(report["result"]["devices"]) == 3
    for row in report["result"]["runs"]:
        assert row["sim_makespan_s"] > 0 and row["makespan_s"] >= row["lower_bound_s"] * 0.999
    auto = next(row for row in report["result"]["runs"] if row["hint"] == "auto")  # the default: planned, and why
    assert auto["picked_hint"] and "dry run" in auto["pick_reason"]
    assert report["result"]["config"]["message_auth"] == "full"
    replay = tmp_path / "real" / "durations.json"
    assert json.loads(replay.read_text())["forward"] and (tmp_path / "real" / "xprof").is_dir()
    # The measured durations replay in the simulator.
    code = main(["pipeline-bench", "--stages", "3", "--microbatches", "4", "--variability", f"replay:{replay}",
                 "--json", str(tmp_path / "replay.json"), "--out", str(tmp_path / "sim"), "-q"])
    assert code == 0
    assert json.loads((tmp_path / "replay.json").read_text())["result"]["runs"][0]["makespan_s"] > 0
