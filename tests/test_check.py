"""``jaxdbg check`` end to end on a small project: a clean and a NaN nan-hunt check, a profile check whose
target recompiles against ``recompiles<=0``, one that holds its time budget and one over it, run once in
parallel (two of them scripts with ``-- ARGS``, which must reach the script alone); then a baseline written
and compared (a rerun of the same target holds, a bigger matmul is a regression with its test and p-value);
then bad configuration and bad baselines (one line, exit 2; a refused check stops the others at once).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest
import xmlschema

from jaxdbg.cli import main
from jaxdbg.schema import schema

ROOT = Path(__file__).resolve().parent.parent
JUNIT_XSD = ROOT / "tests" / "data" / "junit.xsd"

HEAD = "import jax\nimport jax.numpy as jnp\n\n\n@jax.jit\n"
ARGS_ONLY = "import sys\n\nassert sys.argv[1:] == ['--steps', '3'], sys.argv  # the target's -- ARGS, no more\n"
CLEAN = ARGS_ONLY + HEAD + ("def step(x):\n    return jnp.tanh(x) * 0.5\n\n\nx = step(jnp.ones(8))\n"
                            "print(float(step(x).sum()))\n")
NAN = HEAD + "def loss(x):\n    return jnp.log(x - 2.0).sum()\n\n\nprint(loss(jnp.ones(4)))\n"
RECOMPILE = "import sys\n" + HEAD + ("def step(x):\n    return (x * 2.0).sum()\n\n\n"
                                    "for n in map(int, sys.argv[1:]):\n    step(jnp.ones(n)).block_until_ready()\n")
SLOW = "import time\n\ntime.sleep(90)\n"  # outlives a refused check's few seconds unless it is stopped
WORK = "import jax.numpy as jnp\n\n\ndef matmul(x):\n    return jnp.tanh(x @ x).sum()\n"

SUITE = """
[tool.jaxdbg.check.clean]
command = "nan-hunt"
target = "clean.py -- --steps 3"

[tool.jaxdbg.check.no-nan]
command = "nan-hunt"
target = "nan.py"

[tool.jaxdbg.check.no-recompile]
command = "profile"
target = "recompile.py -- 4 5 6"
budget = "recompiles<=0"

[tool.jaxdbg.check.step-budget]
command = "profile"
target = "work.py::matmul"
budget = "execute_median_ms<=5000"
options = ["--args", "f32[16,16]", "--runs", "3", "--timeout", "120"]

[tool.jaxdbg.check.too-slow]
command = "profile"
target = "work.py::matmul"
budget = "matmul.execute_median_us<=0.001"
options = ["--args", "f32[16,16]", "--runs", "2"]
"""
# A profile check of a matmul whose size the baseline test changes (a 64x bigger one is the regression).
TIMED = """
[tool.jaxdbg.check.matmul]
command = "profile"
target = "work.py::matmul"
options = ["--args", "f32[{n},{n}]", "--runs", "10", "--warmup", "2", "--trace-calls", "0"]
"""
ANNOTATION = re.compile(r"^::error file=(?P<file>[^,:]+),line=(?P<line>\d+),title=(?P<title>[^,:]+)::(?P<msg>.+)$")


def _project(folder: Path, table: str) -> Path:
    folder.mkdir(exist_ok=True)
    files = {"clean.py": CLEAN, "nan.py": NAN, "recompile.py": RECOMPILE, "work.py": WORK, "slow.py": SLOW}
    for name, text in files.items():
        (folder / name).write_text(text)
    (folder / "pyproject.toml").write_text(f"[project]\nname = 'demo'\n{table}")
    return folder


def _check(folder: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    environ.pop("GITHUB_ACTIONS", None) if "GITHUB_ACTIONS" not in (env or {}) else None
    return subprocess.run([sys.executable, "-m", "jaxdbg", "check", *args], cwd=folder, env=environ,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> dict:
    folder = _project(tmp_path_factory.mktemp("suite") / "demo", SUITE)
    summary = folder.parent / "summary.md"
    done = _check(folder, "--junit", str(folder.parent / "junit.xml"), "--json", str(folder.parent / "check.json"),
                  "--out", str(folder.parent / "out"), "--jobs", "2", "--baseline", str(folder.parent / "base.json"),
                  "--update-baseline", "--repeats", "1",
                  env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary), "GITHUB_WORKSPACE": str(folder),
                       "COLUMNS": "200"})
    return {"folder": folder, "done": done, "report": json.loads((folder.parent / "check.json").read_text()),
            "junit": folder.parent / "junit.xml", "summary": summary.read_text()}


def test_suite_exit_code_table_and_findings(suite) -> None:
    done, report = suite["done"], suite["report"]
    assert done.returncode == 1, done.stderr
    jsonschema.validate(report, schema())
    checks = {c["name"]: c for c in report["result"]["checks"]}
    assert report["result"]["passed"] is False and report["command"] == "check"
    verdicts = [checks[n]["passed"] for n in ("clean", "no-nan", "no-recompile", "step-budget", "too-slow")]
    assert verdicts == [True, False, False, True, False]
    assert checks["too-slow"]["finding"].startswith("budget broken: matmul.execute_median_us ")
    slow_at = checks["too-slow"]["location"]  # a time budget points at the function it names
    assert (Path(slow_at["file"]).name, slow_at["line"], slow_at["function"]) == ("work.py", 4, "matmul")
    assert checks["no-nan"]["finding"].startswith("nan first made by log (forward pass) at nan.py:7 in loss")
    assert checks["no-nan"]["location"] == {"file": str(suite["folder"] / "nan.py"), "line": 7, "function": "loss"}
    assert checks["no-recompile"]["finding"] == ("budget broken: recompiles 2 > 0; step recompiled at call 1: "
                                                 "argument 'x' shape changed (4,) -> (5,)")
    recompiled_at = checks["no-recompile"]["location"]  # the call that recompiled, not the definition
    assert (Path(recompiled_at["file"]).name, recompiled_at["line"]) == ("recompile.py", 12)
    assert checks["clean"]["finding"] is None and checks["clean"]["location"] is None
    for check in checks.values():  # each check's own report is the command's, and valid
        jsonschema.validate(json.loads(Path(check["report"]).read_text()), schema())
    for name in checks:  # one table row per check, with its verdict
        assert re.search(rf"{name}\s.*\b(pass|FAIL)\b", done.stdout), done.stdout
    assert "3 of 5 checks failed" in done.stdout
    # A failing run is no baseline: --update-baseline leaves none and says so.
    assert not (suite["folder"].parent / "base.json").exists() and "baseline" not in report["artifacts"]
    assert "baseline '" in done.stderr and "not written: a check failed" in done.stderr


def test_junit_validates_and_says_the_finding(suite) -> None:
    xmlschema.XMLSchema(str(JUNIT_XSD)).validate(str(suite["junit"]))
    root = ET.parse(suite["junit"]).getroot()
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("5", "3", "0")
    cases = {c.get("name"): c for c in root.iter("testcase")}
    failure = cases["no-nan"].find("failure")
    assert failure is not None and failure.get("message") == suite["report"]["result"]["checks"][1]["finding"]
    assert cases["no-nan"].get("line") == "7" and cases["clean"].find("failure") is None


def test_github_annotations_and_summary(suite) -> None:
    lines = [line for line in suite["done"].stdout.splitlines() if line.startswith("::")]
    found = {m["title"]: m for m in (ANNOTATION.match(line) for line in lines) if m}
    assert len(found) == len(lines) == 3, lines
    nan = found["jaxdbg check no-nan (nan-hunt)"]
    assert (nan["file"], nan["line"]) == ("nan.py", "7")  # relative to GITHUB_WORKSPACE, as GitHub wants
    recompile = found["jaxdbg check no-recompile (profile)"]
    assert (recompile["file"], recompile["line"]) == ("recompile.py", "12")
    slow = found["jaxdbg check too-slow (profile)"]
    assert (slow["file"], slow["line"]) == ("work.py", "4") and slow["msg"].startswith("budget broken: matmul.")
    assert "| no-nan | nan-hunt | **FAIL** |" in suite["summary"] and "| clean | nan-hunt | pass |" in suite["summary"]


def test_baseline_holds_on_a_rerun_and_finds_a_bigger_matmul(tmp_path) -> None:
    folder = _project(tmp_path / "demo", TIMED.format(n=256))
    baseline = tmp_path / "baseline.json"
    written = _check(folder, "--baseline", str(baseline), "--update-baseline", "--out", str(tmp_path / "o1"))
    assert written.returncode == 0, written.stderr
    assert f"baseline written: {baseline}" in written.stdout.replace("\n", "")
    stored = json.loads(baseline.read_text())
    series = stored["checks"]["matmul"]["matmul"]
    assert len(series["execute_run_medians_s"]) == 5 and len(series["execute_samples_s"]) == 50
    assert stored["fingerprint"]["backend"] == "cpu" and stored["calibration"]["execute_s"] > 0

    # A rerun of the same target is compared figure by figure. Whether it passes is a timing question (the load
    # of a shared machine drifts between runs), so it is not asserted here: tests never compare wall-clock times.
    same = _check(folder, "--baseline", str(baseline), "--alpha", "0.001", "--json", str(tmp_path / "same.json"),
                  "--out", str(tmp_path / "o2"))
    assert same.returncode in (0, 1), same.stdout + same.stderr
    assert "compared with the baseline: matmul" in same.stdout
    compared = json.loads((tmp_path / "o2" / "matmul" / "baseline-comparison.json").read_text())
    assert {c["metric"] for c in compared} == {"execute_median_s", "compile_s"}
    assert all(0 <= c["p_value"] <= 1 and "calibrated" not in c["test"] for c in compared)

    # Figures from another machine (of the same backend) are compared as ratios to the calibration workload.
    stored["fingerprint"]["cpu"] = "another CPU"
    baseline.write_text(json.dumps(stored))

    # 216x the work: found however loaded the machine (at 64x, a baseline run slowed 3x by a second test worker
    # widened the prediction interval to p=0.002)
    (folder / "pyproject.toml").write_text(f"[project]\nname = 'demo'\n{TIMED.format(n=1536)}")
    slower = _check(folder, "--baseline", str(baseline), "--alpha", "0.01", "--json", str(tmp_path / "slow.json"),
                    "--out", str(tmp_path / "o3"))
    assert slower.returncode == 1, slower.stdout + slower.stderr
    report = json.loads((tmp_path / "slow.json").read_text())
    jsonschema.validate(report, schema())
    check = report["result"]["checks"][0]
    regression = next(r for r in check["regressions"] if r["metric"] == "execute_median_s")
    assert regression["ratio"] > 4 and regression["p_value"] < 0.01 and regression["interval"][0] > 1
    assert "t prediction test on run medians, 5 baseline runs vs 1" in regression["test"]
    assert "calibrated: this machine" in regression["test"]
    assert regression["noise"] > 1 and check["finding"].startswith("regression: execute_median_s")
    assert f"p={regression['p_value']:.2g}" in check["finding"]
    assert Path(check["location"]["file"]).name == "work.py"


BAD = {
    "unknown key": ("[tool.jaxdbg.check.a]\ncommand = 'nan-hunt'\ntarget = 'clean.py'\nbudgett = 'x'\n",
                    "unknown key 'budgett' in [tool.jaxdbg.check.a]"),
    "not a table": ("[tool.jaxdbg]\ncheck = 3\n", "[tool.jaxdbg.check] must hold one sub-table per check"),
    "no target": ("[tool.jaxdbg.check.a]\ncommand = 'profile'\n", "[tool.jaxdbg.check.a] has no 'target'"),
    "bad toml": ("[tool.jaxdbg.check.a\n", "not valid TOML"),
    "unknown budget metric": ("[tool.jaxdbg.check.a]\ncommand = 'profile'\ntarget = 'work.py::matmul'\n"
                              "budget = 'compile_seconds<=2'\n", "unknown metric 'compile_seconds'"),
    "reserved option": ("[tool.jaxdbg.check.a]\ncommand = 'nan-hunt'\ntarget = 'clean.py'\noptions = ['--out=x']\n",
                        "'options' in [tool.jaxdbg.check.a] sets --out"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_config_is_one_line_and_exit_2(case, tmp_path, capsys) -> None:
    table, expected = BAD[case]
    folder = _project(tmp_path / "demo", table)
    code = main(["check", "--config", str(folder / "pyproject.toml"), "--out", str(tmp_path / "out"), "--json",
                 str(tmp_path / "error.json")])
    err = capsys.readouterr().err
    assert code == 2 and expected in err and len(err.strip().splitlines()) == 1, err
    assert str(folder / "pyproject.toml") in err
    report = json.loads((tmp_path / "error.json").read_text())  # CI still gets a report saying why
    jsonschema.validate(report, schema())
    assert report["result"] == {"error": err.strip().removeprefix("jaxdbg check: ")}


def test_a_refused_check_stops_the_suite(tmp_path, capsys) -> None:
    """A typo in one check's budget is exit 2 at once: the slow check running beside it is stopped (if its run had
    started, it reports what it gathered, as at a timeout: exit 3) and the one waiting for a free job never
    starts."""
    table = "".join(f"[tool.jaxdbg.check.{name}]\ncommand = 'profile'\ntarget = '{target}'\n{extra}"
                    for name, target, extra in (("typo", "work.py::matmul", "budget = 'recompile<=0'\n"),
                                                ("slow", "slow.py", ""), ("waiting", "slow.py", "")))
    folder = _project(tmp_path / "demo", table)
    code = main(["check", "--config", str(folder / "pyproject.toml"), "--out", str(tmp_path / "out"), "--jobs", "2"])
    err = capsys.readouterr().err
    assert code == 2 and "[tool.jaxdbg.check.typo]" in err and "unknown metric 'recompile'" in err, err
    assert (tmp_path / "out" / "typo" / "output.log").is_file()
    stopped = tmp_path / "out" / "slow" / "report.json"
    assert not stopped.exists() or json.loads(stopped.read_text())["exit_code"] == 3
    assert not (tmp_path / "out" / "waiting").exists()


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_sigterm_stops_every_target(tmp_path) -> None:
    """A CI job's cancel (SIGTERM) stops jaxdbg check, its checks' commands and their targets, which run in
    sessions of their own (a signal to jaxdbg check's group alone reaches none of them)."""
    pids = [tmp_path / "nan-hunt.pid", tmp_path / "profile.pid"]
    folder = _project(tmp_path / "demo", "".join(
        f"[tool.jaxdbg.check.{p.stem}]\ncommand = '{p.stem}'\ntarget = 'sleeper.py -- {p}'\n" for p in pids))
    (folder / "sleeper.py").write_text("import os, sys, time\n\nopen(sys.argv[1], 'w').write(str(os.getpid()))\n"
                                       "time.sleep(120)\n")
    environ = {**os.environ, "PYTHONPATH": str(ROOT)}
    check = subprocess.Popen([sys.executable, "-m", "jaxdbg", "check", "--jobs", "2", "--out", str(tmp_path / "out")],
                             cwd=folder, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while not all(p.is_file() and p.read_text() for p in pids):  # both targets run
            assert check.poll() is None, check.stderr.read() if check.stderr else ""
            time.sleep(0.1)
        targets = [int(p.read_text()) for p in pids]
        assert all(_alive(pid) for pid in targets)
        check.terminate()
        assert check.wait(timeout=60) == 128 + 15
    finally:
        check.kill()
    for _ in range(100):  # each target was sent SIGKILL before its command exited: it ends in a moment
        if not any(_alive(pid) for pid in targets):
            break
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in targets)


OTHER_BASELINES = {
    "another format": ({"format": 0, "version": "0.0.1"}, "baseline format 0 (jaxdbg 0.0.1)"),
    "another backend": ({"format": 1, "fingerprint": {"backend": "gpu"}, "checks": {}},
                        "measured on backend gpu, this run is on cpu"),
    "damaged": ({"format": 1, "fingerprint": {"backend": "cpu"}, "checks": {"matmul": {"matmul": {
        "execute_samples_s": [0.1, "fast"], "execute_run_medians_s": [0.1], "compile_samples_s": [0.2]}}}},
        "'checks.matmul.matmul.execute_samples_s' is not a list of positive numbers"),
}


@pytest.mark.parametrize("case", sorted(OTHER_BASELINES))
def test_baseline_of_another_format_or_backend_is_refused(case, tmp_path, capsys) -> None:
    folder = _project(tmp_path / "demo", TIMED.format(n=8))
    fields, expected = OTHER_BASELINES[case]
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"tool": "jaxdbg", "kind": "check-baseline", **fields}))
    code = main(["check", "--config", str(folder / "pyproject.toml"), "--baseline", str(old), "--out",
                 str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and f"--baseline '{old}': {expected}" in err and len(err.strip().splitlines()) == 1, err
