"""One table of ratios from several benchmarks (``scripts/device_check.sh`` prints it after running them all).

A benchmark records its headline figures with :func:`record` as it prints them; they go, one JSON object a line,
to the file named by ``$JAXDBG_BENCH_SUMMARY`` (nothing happens when it is unset). Run as a script, this prints
the file as one table:

    JAXDBG_BENCH_SUMMARY=/tmp/ratios.jsonl python scripts/bench_profile.py --pairs 2
    python scripts/bench_summary.py /tmp/ratios.jsonl
"""

from __future__ import annotations

import json
import os
import sys
import time

ENV = "JAXDBG_BENCH_SUMMARY"


def record(bench: str, figure: str, value: float | None, target: str = "", spread: str = "", unit: str = "x") -> None:
    """One headline figure: ``value`` (a ratio, or microseconds with ``unit="us"``), its ``target`` as text
    (``"<= 1.10"``), the ``spread`` of the pairs it came from."""
    path = os.environ.get(ENV)
    if not path:
        return
    row = {"bench": bench, "figure": figure, "value": value, "unit": unit, "target": target, "spread": spread,
           "load": round(os.getloadavg()[0], 1), "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    with open(path, "a") as handle:
        handle.write(json.dumps(row) + "\n")


def table(path: str) -> str:
    """The recorded figures as one text table."""
    rows = []
    with open(path) as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    lines = [f"{'benchmark':<14}{'figure':<76}{'value':>10}  {'target':<10}{'spread':<36}load"]
    for row in rows:
        value = row["value"]
        shown = "-" if value is None else (f"{value:.2f}x" if row["unit"] == "x" else f"{value:+.1f}{row['unit']}")
        lines.append(f"{row['bench']:<14}{row['figure'][:75]:<76}{shown:>10}  {row['target']:<10}"
                     f"{row['spread'][:35]:<36}{row['load']}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(sys.argv[1]))
