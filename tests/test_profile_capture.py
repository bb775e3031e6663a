"""``jaxdbg profile --attach`` and ``--from-capture``: real captures of real jitted code on CPU.

One live training process (jax.profiler.start_server) is attached; the same script profiled by jaxdbg must
name the same hot op and user line. A capture taken with jax.profiler.trace is read back, its folder left
byte for byte as it was, and a second host's file in the same run gives a second process table.
"""

import csv
import gzip
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import jsonschema
import pytest

from jaxdbg.cli import main
from jaxdbg.schema import schema

DATA = Path(__file__).parent / "data" / "capture"
SCRIPT = DATA / "live_train.py"
HOT_LINE = next(i for i, line in enumerate(SCRIPT.read_text().splitlines(), 1) if "# hot" in line)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def folder_hash(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        digest.update(str(path.relative_to(root)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def validate(report: dict) -> None:
    jsonschema.Draft202012Validator(schema()).validate(report)


def top_op(report: dict) -> dict:
    return max((op for f in report["result"]["functions"] for op in f["ops"]), key=lambda op: op["total_s"])


def test_attach_a_live_job_matches_a_profiled_run(tmp_path, capsys):
    port, other = free_port(), free_port()
    jobs = [subprocess.Popen([sys.executable, str(SCRIPT), str(p), "60"], stdout=subprocess.PIPE, text=True)
            for p in (port, other)]
    try:
        assert [job.stdout.readline().strip() for job in jobs] == ["ready", "ready"]
        code = main(["profile", "--attach", f"127.0.0.1:{port},127.0.0.1:{other}", "--duration", "2",
                     "--out", str(tmp_path / "a"), "--json", str(tmp_path / "attach.json"),
                     "--csv", str(tmp_path / "csv")])
    finally:
        for job in jobs:
            job.kill()
            job.wait()
    out = capsys.readouterr().out
    assert code == 0, out
    attached = json.loads((tmp_path / "attach.json").read_text())
    validate(attached)
    result = attached["result"]
    assert result["mode"] == "capture" and result["capture"]["source"] == "attach"
    # both processes, captured at once: a table each
    labels = {f"127.0.0.1_{port}", f"127.0.0.1_{other}"}
    assert sorted(h["label"] for h in result["capture"]["hosts"]) == sorted(labels)
    assert {f["host"] for f in result["functions"] if f["name"] == "train_step" and f["ops"]} == labels
    step = next(f for f in result["functions"] if f["name"] == "train_step" and f["host"] == f"127.0.0.1_{port}")
    assert step["compile"] is None and step["compiles"] is None and step["recompiles"] is None
    assert step["execute"]["calls"] > 10
    hot = top_op(attached)
    assert hot["source"]["file"] == str(SCRIPT) and hot["source"]["line"] == HOT_LINE, hot
    host = result["capture"]["hosts"][0]
    assert host["steps"]["marker"] == "StepTraceAnnotation train" and result["capture"]["steps"] > 10
    assert 0 < host["steps"]["execute_fraction"] <= 1 and result["totals"]["compile_s"] is None
    assert "train_step" in out and f"{SCRIPT.name}:{HOT_LINE}" in out

    # --csv: the same figures as the JSON
    with open(tmp_path / "csv" / "ops.csv", newline="") as handle:
        ops = list(csv.DictReader(handle))
    with open(tmp_path / "csv" / "calls.csv", newline="") as handle:
        calls = list(csv.DictReader(handle))
    assert [(r["op"], float(r["total_s"]), int(r["line"])) for r in ops
            if r["function"] == "train_step" and r["process"] == step["host"]] == \
        [(o["name"], o["total_s"], o["source"]["line"]) for o in step["ops"]]
    row = next(r for r in calls if r["function"] == "train_step" and r["process"] == step["host"])
    assert int(row["calls"]) == step["execute"]["calls"] and row["compile_s"] == "" and row["process"] == step["host"]

    # the same job, profiled by jaxdbg: the same hot line, the hot op among its top ops
    assert main(["profile", str(SCRIPT), "--out", str(tmp_path / "p"), "--json", str(tmp_path / "run.json"),
                 "--csv", str(tmp_path / "csv-run")]) == 0
    profiled = json.loads((tmp_path / "run.json").read_text())
    assert top_op(profiled)["source"]["line"] == HOT_LINE
    names = [op["name"] for f in profiled["result"]["functions"] if f["name"] == "train_step" for op in f["ops"][:3]]
    assert hot["name"] in names, (hot["name"], names)
    with open(tmp_path / "csv-run" / "calls.csv", newline="") as handle:
        row = next(r for r in csv.DictReader(handle) if r["function"] == "train_step")
    assert int(row["compiles"]) == 1 and row["process"] == ""


def _hot(a, b):
    return jnp.tanh(a @ b) @ b  # capture hot


def test_from_capture_leaves_the_folder_unchanged_and_reads_every_host(tmp_path, capsys):
    hot_line = _hot.__code__.co_firstlineno + 1
    step = jax.jit(_hot)
    a = jnp.ones((256, 256))
    step(a, a).block_until_ready()
    logdir = tmp_path / "logdir"
    with jax.profiler.trace(str(logdir)):
        for _ in range(5):
            step(a, a).block_until_ready()
    before = folder_hash(logdir)
    code = main(["profile", "--from-capture", str(logdir), "--out", str(tmp_path / "o"), "--json", "-"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert folder_hash(logdir) == before
    validate(report)
    assert report["result"]["capture"]["source"] == "capture" and report["target"] == f"capture:{logdir}"
    hot = top_op(report)
    assert hot["source"]["file"] == __file__ and hot["source"]["line"] == hot_line and hot["category"] == "matmul"
    assert next(f for f in report["result"]["functions"] if f["name"] == "_hot")["execute"]["calls"] == 5
    # no step markers: the steps are the intervals between the starts of the most-run program
    steps = report["result"]["capture"]["hosts"][0]["steps"]
    assert steps["marker"] == "executions of jit__hot" and steps["count"] == 4

    # a second host's file in the same run: one session, a table per process
    two = tmp_path / "two"
    shutil.copytree(logdir, two)
    run = next((two / "plugins" / "profile").iterdir())
    first = next(run.glob("*.xplane.pb"))
    shutil.copy(first, run / "worker-1.xplane.pb")
    assert main(["profile", "--from-capture", str(two), "--out", str(tmp_path / "o2"), "--json", "-"]) == 0
    report = json.loads(capsys.readouterr().out)
    hosts = {f["host"] for f in report["result"]["functions"] if f["name"] == "_hot" and f["ops"]}
    assert hosts == {first.name[: -len(".xplane.pb")], "worker-1"}
    assert len(report["result"]["capture"]["hosts"]) == 2


BAD = [
    (["--attach", "localhost"], "cannot read 'localhost'", 2),
    (["--attach", "127.0.0.1:{free}", "--duration", "1"], "nothing answers there", 2),
    (["--attach", "127.0.0.1:{free}", "--duration", "0"], "--duration 0", 2),
    (["--attach", "127.0.0.1:{free}", "--duration", "-3"], "--duration -3", 2),
    (["--from-capture", "{empty}"], "no *.xplane.pb files", 2),
    (["--from-capture", "{empty}/missing"], "no such folder", 2),
    (["model.py", "--from-capture", "{empty}"], "TARGET 'model.py' together with", 2),
    ([], "profile needs a TARGET", 2),
    (["--from-capture", "{empty}", "--compare", "old.json", "--monitor"], "--compare, --monitor: only for", 2),
]


@pytest.mark.parametrize("argv, fragment, exit_code", BAD, ids=[b[1] for b in BAD])
def test_bad_capture_input_is_one_line(argv, fragment, exit_code, tmp_path, capsys):
    values = {"free": free_port(), "empty": tmp_path}
    code = main(["profile", *(a.format(**values) for a in argv), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == exit_code, err
    assert fragment in err and err.count("\n") == 1 and "Traceback" not in err and err.startswith("jaxdbg profile")


def test_failed_csv_export_keeps_the_report(tmp_path, capsys):
    logdir = tmp_path / "logdir"
    with jax.profiler.trace(str(logdir)):
        jax.jit(jnp.sin)(jnp.ones(8)).block_until_ready()
    blocker = tmp_path / "file"
    blocker.write_text("")
    code = main(["profile", "--from-capture", str(logdir), "--csv", str(blocker), "--out", str(tmp_path / "o"),
                 "--json", str(tmp_path / "r.json")])
    err = capsys.readouterr().err
    assert code == 0 and "--csv" in err and err.count("\n") == 1
    validate(json.loads((tmp_path / "r.json").read_text()))
    assert os.path.getsize(blocker) == 0


def test_from_capture_of_an_h200_job_uses_xprofs_tables(tmp_path, capsys):
    """The GPU path, read here on CPU: a capture recorded on an NVIDIA H200 (see test_profile_gpu_capture.py)."""
    run = tmp_path / "logdir" / "plugins" / "profile" / "run"
    run.mkdir(parents=True)
    packed = Path(__file__).parent / "data" / "h200_power_iterations" / "command_buffers_off.xplane.pb.gz"
    (run / "gpu-host.xplane.pb").write_bytes(gzip.decompress(packed.read_bytes()))
    code = main(["profile", "--from-capture", str(tmp_path / "logdir"), "--out", str(tmp_path / "o"), "--json", "-"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    validate(report)
    assert report["environment"]["backend"] == "gpu" and report["environment"]["process_count"] == 1
    assert [d["platform"] for d in report["environment"]["devices"]] == ["gpu"]
    function = report["result"]["functions"][0]
    hot = function["ops"][0]
    assert function["ops_source"] == "xprof hlo_stats" and (hot["name"], hot["category"]) == ("custom-call.1", "matmul")
    assert hot["source"]["line"] == 12 and hot["source"]["file"].endswith("run_heavy/train.py")
    # 10 calls: the kernels carry no run id, so the calls are cut at the gaps between them
    steps = report["result"]["capture"]["hosts"][0]["steps"]
    assert function["execute"]["calls"] == steps["count"] == 10
    assert function["execute"]["median_s"] <= steps["median_s"]
    overview = report["result"]["capture"]["hosts"][0]["overview"]  # xprof's own step breakdown
    assert overview["bottleneck"] == "device" and overview["device_compute_ms"] <= overview["step_ms"]

    # a budget checks what a capture knows; compile figures it cannot know are left out, not failed
    code = main(["profile", "--from-capture", str(tmp_path / "logdir"), "--out", str(tmp_path / "o2"), "-q",
                 "--budget", "execute_median_ms<=1,compile_s<=0,recompiles<=0"])
    err = capsys.readouterr().err
    assert code == 1 and "power_iterations.execute_median_ms" in err and "compile_s" not in err.split("broken:")[1]


def test_attach_to_a_job_running_no_jax_work_is_exit_3(tmp_path, capsys):
    port = free_port()
    idle = ("import sys, time, jax; jax.profiler.start_server(int(sys.argv[1])); print('ready', flush=True); "
            "time.sleep(60)")
    job = subprocess.Popen([sys.executable, "-c", idle, str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert job.stdout.readline().strip() == "ready"
        code = main(["profile", "--attach", f"127.0.0.1:{port}", "--duration", "0.5", "--out", str(tmp_path)])
    finally:
        job.kill()
        job.wait()
    err = capsys.readouterr().err
    assert code == 3 and "the capture failed" in err and err.count("\n") == 1 and "Traceback" not in err
