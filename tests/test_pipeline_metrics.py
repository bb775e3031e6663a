"""pipeline-bench --csv (runs.csv, stages.csv against the JSON) and --metrics-port (scraped while the bench
runs, from another process, as Prometheus would)."""

from __future__ import annotations

import csv
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jaxdbg.cli import main

ROOT = Path(__file__).resolve().parent.parent


def _table(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_csv_tables_agree_with_the_json(tmp_path, capsys) -> None:
    code = main(["pipeline-bench", "--stages", "3", "--microbatches", "6", "--hint", "1f1b,bfw", "--memory-cap", "1,2",
                 "--variability", "jitter:cv=0.3", "--seeds", "2", "--csv", str(tmp_path / "csv"),
                 "--json", str(tmp_path / "r.json"), "--out", str(tmp_path / "o"), "-q"])
    assert code == 0, capsys.readouterr().err
    report = json.loads((tmp_path / "r.json").read_text())
    runs = report["result"]["runs"]
    rows = _table(tmp_path / "csv" / "runs.csv")
    assert len(rows) == len(runs) == 2 * (1 + 2 * 2)
    for row, run in zip(rows, runs):
        assert (row["schedule"], row["policy"], row["hint"], row["seed"]) == (
            run["schedule"], run["policy"], run["hint"] or "", str(run["seed"]))
        for key in ("makespan_s", "bubble_fraction", "speedup_vs_fixed", "lower_bound_s", "throughput_mb_s"):
            assert float(row[key]) == pytest.approx(run[key])
    stages = _table(tmp_path / "csv" / "stages.csv")
    assert len(stages) == len(runs) * 3
    for row in stages:
        run = runs[int(row["run"])]
        w = int(row["stage"])
        assert float(row["busy_s"]) == pytest.approx(run["stage_busy"][w])
        assert float(row["idle_s"]) == pytest.approx(run["stage_idle"][w])
        assert int(row["peak_inflight"]) == run["peak_inflight"][w]
        assert float(row["occupancy"]) == pytest.approx(run["stage_busy"][w] / run["makespan_s"])
        parts = sum(float(row[k]) for k in ("busy_s", "wait_s", "blocked_s", "idle_s"))
        assert parts == pytest.approx(run["makespan_s"])  # where every second of the stage went
    assert report["artifacts"]["runs_csv"].endswith("runs.csv")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


SEEDS = 300


def test_live_occupancy_endpoint_while_the_bench_runs(tmp_path) -> None:
    port = _free_port()
    # Enough runs (8 stages x 48 microbatches, 3 runs x 300 seeds) that the runs last seconds, not the ~0.3 s
    # that 25 seeds took: a scraper starved for that long on a loaded CI machine missed every run (CI, stop 17).
    command = [sys.executable, "-m", "jaxdbg", "pipeline-bench", "--stages", "8", "--microbatches", "48",
               "--hint", "1f1b,bfw", "--variability", "jitter:cv=0.3", "--seeds", str(SEEDS),
               "--metrics-port", str(port), "--out", str(tmp_path / "o"), "-q"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = None
    try:
        deadline = time.monotonic() + 60
        while seen is None and proc.poll() is None and time.monotonic() < deadline:
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            except OSError:
                time.sleep(0.05)
                continue
            samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                       for family in text_string_to_metric_families(text) for s in family.samples}
            occupancy = {k: v for k, v in samples.items() if k[0] == "jaxdbg_stage_occupancy"}
            if occupancy:
                seen = samples, occupancy
    finally:
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert seen is not None, "the endpoint never showed a stage's occupancy while the bench ran"
    samples, occupancy = seen
    done = samples["jaxdbg_pipeline_runs_done", (("process", "0"),)]
    total = samples["jaxdbg_pipeline_runs_total", (("process", "0"),)]
    assert total == SEEDS * (1 + 2) and 1 <= done <= total  # per seed: fixed, ready/1f1b, ready/bfw
    assert sorted(dict(k[1])["stage"] for k in occupancy) == [str(w) for w in range(8)]
    assert all(0 < v <= 1 for v in occupancy.values())
    with pytest.raises(OSError):  # the endpoint closes with the bench
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_metrics_port_in_use_is_bad_usage(tmp_path, capsys) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code = main(["pipeline-bench", "--stages", "2", "--microbatches", "2", "--metrics-port", str(port),
                     "--out", str(tmp_path / "o")])
    assert code == 2
    assert f"--metrics-port {port}: cannot listen" in capsys.readouterr().err


def _running_children() -> set[int]:
    """This process's live child processes (Linux /proc: every thread's ``children`` list)."""
    found: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        try:
            found.update(int(pid) for pid in (task / "children").read_text().split())
        except OSError:
            continue
    return found


def test_real_runs_reach_the_live_figures_while_the_child_still_runs() -> None:
    from jaxdbg.pipeline.bench import BenchOptions, run_bench

    heard: list[tuple[int, int, bool]] = []
    options = BenchOptions(mode="real", stages=2, microbatches=4, policies=("fixed", "ready"),
                           variabilities=("jitter:cv=0.3",), seeds=10, timeout=240)
    result, _ = run_bench(options, on_run=lambda done, total, key, record: heard.append(
        (done, total, bool(_running_children()))))
    assert [done for done, _, _ in heard] == list(range(1, 21)) and {total for _, total, _ in heard} == {20}
    # The first run is heard while the child that runs them still has 19 to go (not when it has ended).
    assert heard[0][2], "the first real run reached on_run only after the child process had ended"
    assert len(result.runs) == 20
