"""--metrics / --metrics-push of real profile, nan-hunt and pipeline-bench runs, parsed back with
prometheus_client's own parser and held against the JSON report; a failed export; docs/metrics.md's
table and alerting rules against the names jaxdbg really exports."""

from __future__ import annotations

import copy
import gzip
import http.server
import json
import os
import re
import socket
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jaxdbg.check.result import CheckOutcome, CheckSuiteResult, Regression
from jaxdbg.cli import main
from jaxdbg.metrics import export, families
from jaxdbg.metrics.table import RUN_LABELS, TABLE
from jaxdbg.profile.processes import ProcessFigures
from jaxdbg.report import Report, ReportReadError, to_jsonable

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "recipes"
METRICS_MD = ROOT / "docs" / "metrics.md"

TRAIN = """
import time
import jax, jax.numpy as jnp

@jax.jit
def step(w, x):
    return w - 0.1 * jnp.tanh(w @ x) @ x.T

w = jnp.ones((16, 16))
for i in range(5):
    w = step(w, jnp.ones((16, 4)))
time.sleep(0.3)                  # inside the capture: --monitor samples land in the trace
w = step(w, jnp.ones((16, 5)))   # a new shape: one recompile
"""


def _samples(text: str) -> dict[tuple[str, frozenset], float]:
    """(sample name, labels) -> value, parsed by prometheus_client (the format's reference parser)."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _run(argv: list[str]) -> tuple[int, dict]:
    code = main(argv)
    json_path = argv[argv.index("--json") + 1]
    return code, json.loads(Path(json_path).read_text())


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, tuple[int, dict, str]]:
    """One real run of each command with --metrics: exit code, JSON report, metrics text."""
    tmp = tmp_path_factory.mktemp("metrics")
    (tmp / "train.py").write_text(TRAIN)
    runs = {
        "profile": ["profile", str(tmp / "train.py"), "--monitor"],
        "nan-hunt": ["nan-hunt", str(RECIPES / "nan_forward" / "train.py")],
        "pipeline-bench": ["pipeline-bench", "--stages", "3", "--microbatches", "6", "--hint", "1f1b,bfw"],
    }
    found = {}
    for name, argv in runs.items():
        code, report = _run([*argv, "--out", str(tmp / name), "--json", str(tmp / f"{name}.json"),
                             "--metrics", str(tmp / f"{name}.prom"), "-q"])
        found[name] = (code, report, (tmp / f"{name}.prom").read_text())
    return found


def test_profile_metrics_hold_the_reports_figures(exports) -> None:
    code, report, text = exports["profile"]
    assert code == 0
    samples = _samples(text)
    fn = report["result"]["functions"][0]
    labels = frozenset({"function": fn["name"], "process": "0"}.items())
    assert samples["jaxdbg_calls_total", labels] == fn["execute"]["calls"] == 6
    assert samples["jaxdbg_compiles_total", labels] == fn["compiles"] == 2
    assert samples["jaxdbg_recompiles_total", labels] == len(fn["recompiles"]) == 1
    assert samples["jaxdbg_compile_seconds_total", labels] == pytest.approx(fn["compile"]["total_s"])
    assert samples["jaxdbg_step_seconds", labels] == pytest.approx(fn["execute"]["median_s"])
    assert samples["jaxdbg_execute_median_seconds", labels] == pytest.approx(fn["execute"]["median_s"])
    ops = {dict(k[1])["op"]: v for k, v in samples.items() if k[0] == "jaxdbg_op_seconds"}
    assert ops and ops == pytest.approx({op["name"]: op["total_s"] for op in fn["ops"]})
    assert samples["jaxdbg_run_wall_seconds", frozenset({"process": "0"}.items())] == pytest.approx(
        report["result"]["totals"]["wall_s"])
    # --monitor: the host's I/O over the run (Linux /proc), as rates on the samples' time axis and as totals.
    monitor = report["result"]["monitor"]
    assert len(monitor["disk_read_bytes_per_s"]) == len(monitor["t_s"]) == monitor["summary"]["samples"]
    assert monitor["disk_read_bytes_per_s"][0] is None
    own = frozenset({"process": "0"}.items())
    assert samples["jaxdbg_host_disk_read_bytes_total", own] == monitor["summary"]["disk_read_bytes"] >= 0
    assert samples["jaxdbg_host_network_receive_bytes_total", own] == monitor["summary"]["net_receive_bytes"] >= 0
    assert report["artifacts"]["metrics"].endswith("profile.prom")
    # ... and on the capture's time axis: counter tracks in the Perfetto trace, beside the steps.
    events = json.loads(gzip.decompress(Path(report["artifacts"]["perfetto"]).read_bytes()))["traceEvents"]
    counters = [e for e in events if e.get("ph") == "C" and e["name"] == "host I/O MB since start"]
    steps = [e["ts"] for e in events if e.get("name", "").startswith("step") and e.get("ph") == "X"]
    assert counters and "disk_read_mb" in counters[0]["args"]
    assert any(min(steps) < c["ts"] < max(steps) for c in counters)  # sampled during the sleep between steps


def test_nan_hunt_metrics_name_the_origin(exports) -> None:
    code, report, text = exports["nan-hunt"]
    assert code == 1
    samples = _samples(text)
    first = report["result"]["first"]
    labels = frozenset({"function": first["function"], "process": "0"}.items())
    assert samples["jaxdbg_nonfinite_total", labels] == 1
    assert samples["jaxdbg_nonfinite_first_call", labels] == first["call_index"]
    assert samples["jaxdbg_nonfinite_found", frozenset({"process": "0"}.items())] == 1


def test_pipeline_bench_metrics_one_series_per_run_and_stage(exports) -> None:
    code, report, text = exports["pipeline-bench"]
    assert code == 0
    samples = _samples(text)
    runs = report["result"]["runs"]
    occupancy = {k: v for k, v in samples.items() if k[0] == "jaxdbg_stage_occupancy"}
    assert len(occupancy) == len(runs) * 3
    for row in runs:
        key = {"schedule": row["schedule"], "policy": row["policy"], "hint": row["hint"] or "",
               "admission": row["admission"], "comm": row["comm"],
               "memory_cap": "" if row["memory_cap"] is None else f"{row['memory_cap']:g}",
               "variability": row["variability"], "seed": str(row["seed"]), "process": "0"}
        assert samples["jaxdbg_pipeline_makespan_seconds", frozenset(key.items())] == pytest.approx(row["makespan_s"])
        for w, busy in enumerate(row["stage_busy"]):
            value = occupancy["jaxdbg_stage_occupancy", frozenset({**key, "stage": str(w)}.items())]
            assert value == pytest.approx(busy / row["makespan_s"]) and 0 < value <= 1


def _check_report(*checks: CheckOutcome) -> dict:
    result = CheckSuiteResult(all(c.passed for c in checks), checks)
    return Report("check", "pyproject.toml", result, 0 if result.passed else 1, {}, {"process_index": 0}).to_dict()


def test_check_exporter_from_a_check_report() -> None:
    regression = Regression("matmul", "execute_median_s", 0.001, 0.004, 4.0, "permutation", 0.0005, (3.9, 4.1), 1.3)
    report = _check_report(
        CheckOutcome("no-nan", "nan-hunt", "train.py", False, 1, "nan first made by log", 3.5, "a.json"),
        CheckOutcome("step-budget", "profile", "train.py", True, 0, None, 1.25, "b.json", None, (regression,)))
    samples = {(f.name, s.labels["check"]): s.value for f in families(report) for s in f.samples if "check" in s.labels}
    assert samples == {
        ("jaxdbg_check_passed", "no-nan"): 0.0, ("jaxdbg_check_passed", "step-budget"): 1.0,
        ("jaxdbg_check_duration_seconds", "no-nan"): 3.5, ("jaxdbg_check_duration_seconds", "step-budget"): 1.25,
        ("jaxdbg_check_regressions", "no-nan"): 0.0, ("jaxdbg_check_regressions", "step-budget"): 1.0,
    }


def test_a_report_whose_result_does_not_read_exports_nothing_and_says_which_field(tmp_path) -> None:
    """A renamed field is an error naming it (it used to drop the series silently); the report is unaffected."""
    report = _check_report(CheckOutcome("no-nan", "nan-hunt", "train.py", True, 0, None, 3.5, "a.json"))
    report["result"]["checks"][0]["seconds"] = report["result"]["checks"][0].pop("duration_s")
    with pytest.raises(ReportReadError, match=r"result\.checks\[0\]: missing field 'duration_s' \(found 'seconds'"):
        families(report)
    written, failures = export(report, str(tmp_path / "m.prom"), None)
    assert written == [] and len(failures) == 1 and "missing field 'duration_s'" in failures[0]


def test_process_zero_exports_every_process_under_its_own_label(exports) -> None:
    _, report, _ = exports["profile"]
    row = ProcessFigures(0, 2.0, 0.3, 1.0, 0.0, 0.1, 0.5, 10, 0.1)
    job = copy.deepcopy(report)
    job["result"]["stragglers"] = [1]
    job["result"]["processes"] = to_jsonable((row, replace(row, index=1, collective_s=0.01),
                                              replace(row, index=2, note="died")))
    by_name = {f.name: {s.labels["process"]: s.value for s in f.samples} for f in families(job)}
    assert by_name["jaxdbg_process_collective_seconds"] == {"0": 0.5, "1": 0.01}  # process 2 died: no figures
    assert by_name["jaxdbg_process_straggler"] == {"0": 0.0, "1": 1.0}


class _Recorder(http.server.BaseHTTPRequestHandler):
    requests: ClassVar[list] = []

    def do_PUT(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
        self.requests.append((self.command, self.path, body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_push_to_a_pushgateway_and_a_refused_one(tmp_path, capsys) -> None:
    server = http.server.HTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        argv = ["pipeline-bench", "--stages", "2", "--microbatches", "4", "--out", str(tmp_path / "o"),
                "--json", str(tmp_path / "r.json"), "--metrics", str(tmp_path / "m.prom")]
        code = main([*argv, "--metrics-push", f"http://127.0.0.1:{server.server_port}"])
    finally:
        server.shutdown()
        server.server_close()
    assert code == 0, capsys.readouterr().err
    [(method, path, body)] = _Recorder.requests
    assert method == "PUT"
    assert path == f"/metrics/job/jaxdbg/command/pipeline-bench/instance/{socket.gethostname()}-process-0"
    assert _samples(body) == _samples((tmp_path / "m.prom").read_text()) != {}

    # Nothing listens on a closed port; the folder of --metrics does not exist: one line each, report intact.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    capsys.readouterr()
    code = main(["pipeline-bench", "--stages", "2", "--microbatches", "4", "--out", str(tmp_path / "o2"),
                 "--json", str(tmp_path / "r2.json"), "--metrics", str(tmp_path / "missing" / "m.prom"),
                 "--metrics-push", f"http://127.0.0.1:{closed}", "-q"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 0
    assert len(err) == 2 and err[0].startswith("jaxdbg pipeline-bench: --metrics '") and "cannot write" in err[0]
    assert err[1].startswith("jaxdbg pipeline-bench: --metrics-push") and "refused" in err[1].lower()
    report = json.loads((tmp_path / "r2.json").read_text())
    assert report["exit_code"] == 0 and report["result"]["runs"] and "metrics" not in report["artifacts"]

    assert main(["pipeline-bench", "--metrics-push", "127.0.0.1:9091", "--out", str(tmp_path / "o3")]) == 2
    assert "not an http(s) URL" in capsys.readouterr().err


def _exported_names(exports) -> set[str]:
    names = set()
    for _, _, text in exports.values():
        names |= {s.name for family in text_string_to_metric_families(text) for s in family.samples}
    check = _check_report(CheckOutcome("a", "nan-hunt", "t.py", True, 0, None, 1.0, "r.json"))
    names |= {s.name for f in families(check) for s in f.samples}
    return names


def test_alerting_rules_use_only_exported_names(exports) -> None:
    text = METRICS_MD.read_text()
    block = text.split("## Alerting rules", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    try:
        import yaml

        rules = [rule["expr"] for group in yaml.safe_load(block)["groups"] for rule in group["rules"]]
    except ImportError:  # PyYAML is not a dependency: the expressions are one line each
        rules = [line.split("expr:", 1)[1].strip() for line in block.splitlines() if "expr:" in line]
    assert len(rules) >= 3
    used = {name for expr in rules for name in re.findall(r"\bjaxdbg_\w+", expr)}
    assert used and used <= _exported_names(exports), used - _exported_names(exports)
    assert {"jaxdbg_nonfinite_total", "jaxdbg_step_seconds", "jaxdbg_recompiles_total"} <= used


def test_every_exported_family_is_in_docs_metrics_md(exports) -> None:
    documented = set(re.findall(r"^\| `(jaxdbg_\w+)`", METRICS_MD.read_text(), flags=re.MULTILINE))
    exported = _exported_names(exports)
    assert exported <= documented, sorted(exported - documented)


def test_each_process_of_a_job_exports_its_own_and_process_zero_the_jobs(tmp_path) -> None:
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "jaxdbg", "--processes", "2", "profile",
         str(ROOT / "tests" / "corpus" / "multihost_dp" / "train.py"),
         "--trace-calls", "0", "--out", str(tmp_path / "o"), "-q", "--json", str(tmp_path / "job.json"),
         "--metrics", str(tmp_path / "m.prom")], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    own = {index: _samples((tmp_path / name).read_text()) for index, name in ((0, "m.prom"), (1, "m.process-1.prom"))}
    for index, samples in own.items():
        calls = {dict(labels)["process"] for name, labels in samples if name == "jaxdbg_calls_total"}
        assert calls == {str(index)}  # each file: its own process's functions
    rows = json.loads((tmp_path / "job.json").read_text())["result"]["processes"]
    walls = {dict(labels)["process"]: value for (name, labels), value in own[0].items()
             if name == "jaxdbg_process_wall_seconds"}
    assert walls == pytest.approx({str(r["index"]): r["wall_s"] for r in rows}) and set(walls) == {"0", "1"}
    assert not any(name.startswith("jaxdbg_process_") for name, _ in own[1])


def test_docs_metrics_md_lists_the_table_with_its_types_and_labels() -> None:
    """docs/metrics.md's table and jaxdbg.metrics.table are the same families, types and label names (the export,
    pipeline-bench's live endpoint and jaxdbg.watch all serve the table's)."""
    documented = {}
    for name, kind, labels in re.findall(r"^\| `jaxdbg_(\w+)` \| (\w+) \| ([^|]+) \|", METRICS_MD.read_text(),
                                         flags=re.MULTILINE):
        names = [label.strip() for label in labels.split(",")]
        expanded = [part for label in names for part in (RUN_LABELS if label == "run labels" else (label,))]
        documented[name.removesuffix("_total") if kind == "counter" else name] = (kind, frozenset(expanded))
    table = {family.name: (family.type, frozenset(family.labels)) for family in TABLE}
    assert documented == table
