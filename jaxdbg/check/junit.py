"""JUnit XML for CI test reports (Jenkins, GitLab, GitHub test-report actions): one test case per check.

The subset written is the common one those readers share: ``testsuites/testsuite/testcase`` with
``failure`` (the check found something: message = the one-line finding), ``error`` (its command could not
run the target) and ``system-out`` (where the check's report and output log are). tests/data/junit.xsd
describes it.

Example:
    >>> from jaxdbg.check.result import CheckOutcome, CheckSuiteResult
    >>> bad = CheckOutcome("no-nan", "nan-hunt", "train.py", False, 1, "nan first made by log", 1.5, "r.json")
    >>> root = ET.fromstring(junit_xml(CheckSuiteResult(False, (bad,))))
    >>> root.get("failures"), root.find("testsuite/testcase/failure").get("message")
    ('1', 'nan first made by log')
"""

from __future__ import annotations

import datetime
import socket
import xml.etree.ElementTree as ET
from pathlib import Path

from jaxdbg.check.result import CheckOutcome, CheckSuiteResult

EXIT_FOUND = 1  # a check's command that exits 1 found what it looks for; any other failure is an error


def junit_xml(result: CheckSuiteResult, timestamp: str | None = None) -> str:
    """The JUnit XML document of a suite."""
    checks = result.checks
    failures = sum(1 for c in checks if not c.passed and c.exit_code == EXIT_FOUND)
    errors = sum(1 for c in checks if not c.passed and c.exit_code != EXIT_FOUND)
    total = f"{sum(c.duration_s for c in checks):.3f}"
    counts = {"tests": str(len(checks)), "failures": str(failures), "errors": str(errors), "time": total}
    root = ET.Element("testsuites", {"name": "jaxdbg check", **counts})
    suite = ET.SubElement(root, "testsuite", {
        "name": "jaxdbg check", **counts, "skipped": "0",
        "timestamp": timestamp or datetime.datetime.now().isoformat(timespec="seconds"),
        "hostname": socket.gethostname()})
    for check in checks:
        _testcase(suite, check)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _testcase(suite: ET.Element, check: CheckOutcome) -> None:
    case = ET.SubElement(suite, "testcase", {"name": check.name, "classname": f"jaxdbg.check.{check.command}",
                                             "time": f"{check.duration_s:.3f}"})
    if check.location is not None:
        case.set("file", check.location.file)
        case.set("line", str(check.location.line))
    if not check.passed:
        tag = "failure" if check.exit_code == EXIT_FOUND else "error"
        detail = ET.SubElement(case, tag, {"message": check.finding or f"exit code {check.exit_code}",
                                           "type": _kind(check)})
        lines = [check.finding or ""] + [r.describe() for r in check.regressions]
        if check.location is not None:
            lines.append(f"at {check.location}")
        detail.text = "\n".join(line for line in lines if line)
    out = ET.SubElement(case, "system-out")
    out.text = f"jaxdbg {check.command} {check.target} (exit {check.exit_code}); report: {check.report}"


def _kind(check: CheckOutcome) -> str:
    if check.regressions:
        return "regression"
    if check.exit_code != EXIT_FOUND:
        return "crash"
    return {"nan-hunt": "nonfinite", "hang-hunt": "hang"}.get(check.command, "budget")


def write_junit(result: CheckSuiteResult, path: Path) -> None:
    path.write_text(junit_xml(result))
