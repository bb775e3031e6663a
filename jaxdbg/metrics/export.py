"""``--metrics PATH.prom`` and ``--metrics-push URL``: a finished report's families, written or pushed.

Both go through a private :class:`~prometheus_client.CollectorRegistry` (nothing of the process's default
registry leaks in). A failed export never costs the report: :func:`export` returns one line per failure
and the command keeps its own exit code (the report, its JSON and its exit code say what the command
found; a Pushgateway that is down is the monitoring's trouble, not the program's).

In a multi-process job every process is given the same options: process 0 writes ``PATH`` and process
``k`` writes ``PATH`` with ``.process-k`` before its suffix; each pushes to its own group
(``job="jaxdbg"``, ``command``, ``instance="<host>-process-<k>"``). The grouping key cannot hold the
``process`` label: process 0's series carry the other processes' ``process`` values too, and a
Pushgateway refuses series whose labels contradict their group's.

Example:
    >>> import tempfile, os
    >>> from jaxdbg.check.result import CheckOutcome, CheckSuiteResult
    >>> from jaxdbg.report import Report
    >>> smoke = CheckOutcome("smoke", "nan-hunt", "train.py", True, 0, None, 1.0, "out/smoke/report.json")
    >>> report = Report("check", "pyproject.toml", CheckSuiteResult(True, (smoke,)), 0, {}, {"process_index": 0})
    >>> report = report.to_dict()
    >>> path = os.path.join(tempfile.mkdtemp(), "m.prom")
    >>> export(report, path, None) == ([path], [])
    True
    >>> "jaxdbg_check_passed{check=\\"smoke\\",process=\\"0\\"} 1.0" in open(path).read()
    True
"""

from __future__ import annotations

import socket
import urllib.parse
from collections.abc import Iterable
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest, push_to_gateway, write_to_textfile
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from jaxdbg._errors import UsageError
from jaxdbg.metrics.families import families

PUSH_JOB = "jaxdbg"
PUSH_TIMEOUT_S = 10.0


class _Fixed(Collector):
    """A collector that yields families built once (a finished report does not change)."""

    def __init__(self, built: Iterable[Metric]):
        self._built = list(built)

    def collect(self) -> Iterable[Metric]:
        return iter(self._built)


def registry_of(report: dict) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(families(report)))
    return registry


def text_of(report: dict) -> str:
    """The report's families in the Prometheus text exposition format."""
    return generate_latest(registry_of(report)).decode()


def process_path(path: str, process: int) -> str:
    """Where process ``process`` writes ``--metrics PATH``.

    Example:
        >>> process_path("out/run.prom", 0), process_path("out/run.prom", 2)
        ('out/run.prom', 'out/run.process-2.prom')
    """
    if process == 0:
        return path
    p = Path(path)
    return str(p.with_name(f"{p.stem}.process-{process}{p.suffix}"))


def check_push_url(url: str) -> None:
    """Refuse a URL that is not a Pushgateway address before any work (bad usage, exit 2).

    Example:
        >>> check_push_url("http://127.0.0.1:9091")
        >>> check_push_url("127.0.0.1:9091")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        jaxdbg._errors.UsageError: --metrics-push '127.0.0.1:9091': not an http(s) URL; ...
    """
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise UsageError(f"--metrics-push '{url}': not an http(s) URL; give the Pushgateway's address, "
                         "e.g. http://127.0.0.1:9091")


def grouping_key(report: dict) -> dict[str, str]:
    process = (report.get("environment") or {}).get("process_index", 0)
    return {"command": str(report.get("command")), "instance": f"{socket.gethostname()}-process-{process}"}


def export(report: dict, path: str | None, push_url: str | None) -> tuple[list[str], list[str]]:
    """Write and/or push the report's families; returns (paths written, one line per failure)."""
    written: list[str] = []
    failures: list[str] = []
    process = int((report.get("environment") or {}).get("process_index", 0) or 0)
    try:
        registry = registry_of(report)
    except Exception as err:  # noqa: BLE001 - a report the exporter cannot read must not cost the report
        return [], [f"--metrics: could not build metrics from the report ({type(err).__name__}: {err}); "
                    "the report itself is unaffected"]
    if path:
        destination = process_path(path, process)
        try:
            write_to_textfile(destination, registry)
            written.append(destination)
        except OSError as err:
            failures.append(f"--metrics '{destination}': cannot write there ({err.strerror or err}); the report "
                            "itself is unaffected; pick a writable path")
    if push_url:
        try:
            push_to_gateway(push_url, job=PUSH_JOB, registry=registry, grouping_key=grouping_key(report),
                            timeout=PUSH_TIMEOUT_S)
        except Exception as err:  # noqa: BLE001 - URLError, HTTPError, timeouts: all one line
            failures.append(f"--metrics-push '{push_url}': the Pushgateway did not take the metrics "
                            f"({_reason(err)}); the report itself is unaffected; check that it runs at that address")
    return written, failures


def _reason(err: Exception) -> str:
    reason = getattr(err, "reason", None)
    code = getattr(err, "code", None)
    if code is not None:
        return f"HTTP {code} {reason or ''}".strip()
    if reason is not None:
        return str(getattr(reason, "strerror", None) or reason)
    return f"{type(err).__name__}: {err}"
