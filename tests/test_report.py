"""The JSON envelope and its derivation from result dataclasses."""

import json
from dataclasses import dataclass

import numpy as np
import pytest

from jaxdbg._errors import UsageError
from jaxdbg._source import SourceLocation
from jaxdbg.cli._common import Common, NullProgress
from jaxdbg.report import Report, resolve_out_dir, to_jsonable, write_json


@dataclass(frozen=True)
class _Finding:
    source: SourceLocation
    values: tuple
    stats: dict


def test_dataclasses_numpy_and_non_finite_become_json():
    finding = _Finding(SourceLocation("train.py", 12, "loss_fn"), (np.float32(1.5), float("nan")),
                       {"max": np.float64("inf"), "count": np.int64(3), "mask": np.array([True, False])})
    data = to_jsonable(finding)
    assert data == {"source": {"file": "train.py", "line": 12, "function": "loss_fn"},
                    "values": [1.5, "nan"], "stats": {"max": "inf", "count": 3, "mask": [True, False]}}
    json.dumps(data, allow_nan=False)


def test_envelope_fields(capsys):
    report = Report("nan-hunt", "train.py", {"found": False}, 0, {"bundle": "out/b"})
    write_json(report, "-")
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"tool", "version", "command", "target", "environment", "result", "artifacts", "exit_code"}
    assert data["environment"]["backend"] == "cpu" and data["environment"]["python"]
    assert data["artifacts"] == {"bundle": "out/b"}


def test_out_dir_rules(tmp_path, monkeypatch):
    assert resolve_out_dir(str(tmp_path / "new"), "profile").is_dir()
    with pytest.raises(UsageError, match="parent folder"):
        resolve_out_dir(str(tmp_path / "a" / "b"), "profile")
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="is a file"):
        resolve_out_dir(str(tmp_path / "file"), "profile")
    monkeypatch.chdir(tmp_path)
    default = resolve_out_dir(None, "repro")
    assert default.parent.name == "jaxdbg-out" and default.name.startswith("repro-")


def test_no_progress_bar_when_piped_or_in_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    assert isinstance(Common("profile").progress(), NullProgress)


def test_only_process_0_of_a_launched_job_touches_its_json(tmp_path, monkeypatch, capsys):
    """Every process of a job gets the same --json. The others once tested it too (create, then delete when it
    was new): two processes deleting the one file made process 0 fail with an internal FileNotFoundError and
    left process 1 waiting for it in jax.distributed.initialize(). Their error reports go to their own folder."""
    from jaxdbg.cli._common import execute
    from jaxdbg.launch import task_environment

    def fails(common: Common) -> Report:
        raise UsageError("no such target")

    job_json = tmp_path / "job.json"
    job_json.write_text("process 0's")
    for key, value in task_environment(1, 2, 12345, {}).items():
        monkeypatch.setenv(key, value)
    code = execute(Common("profile", json=str(job_json), out=str(tmp_path / "o"), quiet=True), fails,
                   lambda report, console: None)
    assert code == 2 and job_json.read_text() == "process 0's"
    assert json.loads((tmp_path / "o" / "process-1" / "report.json").read_text())["result"]["error"] == "no such target"
    assert not (tmp_path / "o" / "report.json").exists()
    assert capsys.readouterr().err == "jaxdbg profile: process 1: no such target\n"  # each one-liner names its process

    monkeypatch.setenv("SLURM_PROCID", "0")
    assert execute(Common("profile", json=str(job_json), quiet=True), fails, lambda report, console: None) == 2
    assert json.loads(job_json.read_text())["result"]["error"] == "no such target"
    assert capsys.readouterr().err == "jaxdbg profile: process 0: no such target\n"
