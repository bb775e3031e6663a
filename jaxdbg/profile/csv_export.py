"""``--csv DIR``: a profile's figures as flat tables for spreadsheets and BI tools.

- ``calls.csv``: one row per function (per process in a capture): calls, compile and execute figures.
- ``ops.csv``: one row per op of each function's per-op table: time, share, category, user source line, and
  for a collective the sharding that put it there (mesh axes; arguments with their PartitionSpecs).
- ``transfers.csv``: one row per kind of host/device copy and user line: count, time, bytes.
- ``syncs.csv``: one row per forced synchronisation site (kind and user line): count, time waited, device idle
  time after it, bytes copied.

Unknown figures (a capture's compile times) are empty cells.

Example:
    >>> import csv, tempfile
    >>> from jaxdbg.profile.model import BudgetResult, ExecuteStats, FunctionProfile, ProfileResult, Totals
    >>> step = FunctionProfile("step", None, None, None, None, ExecuteStats(calls=3, total_s=0.3), host="host-0")
    >>> result = ProfileResult("capture", (step,), Totals(1.0, None, 0.3, None, 0.7), BudgetResult(True))
    >>> paths = write_profile_csv(result, tempfile.mkdtemp())
    >>> row = next(csv.DictReader(open(paths["calls"])))
    >>> row["process"], row["calls"], row["compile_s"]
    ('host-0', '3', '')
"""

from __future__ import annotations

import csv
import os

from jaxdbg._source import SourceLocation
from jaxdbg.profile.model import ProfileResult

CALL_COLUMNS = ("process", "function", "calls", "compiles", "recompiles", "compile_s", "first_s", "median_s",
                "p90_s", "execute_total_s")
OP_COLUMNS = ("process", "function", "op", "category", "count", "total_s", "fraction", "file", "line",
              "source_function", "sharding_axes", "sharding_arguments")
TRANSFER_COLUMNS = ("kind", "file", "line", "source_function", "count", "total_s", "bytes")
SYNC_COLUMNS = ("kind", "file", "line", "source_function", "count", "wait_s", "device_idle_s", "bytes")


def write_profile_csv(result: ProfileResult, folder: str) -> dict[str, str]:
    """Write the tables into ``folder`` (created); returns ``{"calls": path, "ops": path, ...}``."""
    os.makedirs(folder, exist_ok=True)
    calls, ops = [], []
    for f in result.functions:
        process = f.host or ""
        calls.append((process, f.name, f.execute.calls, f.compiles, None if f.recompiles is None else len(f.recompiles),
                      f.compile.total_s if f.compile else None, f.execute.first_s, f.execute.median_s,
                      f.execute.p90_s, f.execute.total_s))
        for op in f.ops:
            source = op.source
            cause = op.sharding_cause
            ops.append((process, f.name, op.name, op.category, op.count, op.total_s, op.fraction,
                        source.file if source else None, source.line if source else None,
                        source.function if source else None, " ".join(cause.axes) if cause else None,
                        "; ".join(f"{a.argument} {a.sharding}" for a in cause.arguments) if cause else None))
    transfers = [(t.kind, *_where(site.source), site.count, site.total_s, site.bytes)
                 for t in result.transfers for site in t.sources]
    syncs = [(s.kind, *_where(s.source), s.count, s.wait_s, s.device_idle_s, s.bytes) for s in result.syncs]
    return {"calls": _write(os.path.join(folder, "calls.csv"), CALL_COLUMNS, calls),
            "ops": _write(os.path.join(folder, "ops.csv"), OP_COLUMNS, ops),
            "transfers": _write(os.path.join(folder, "transfers.csv"), TRANSFER_COLUMNS, transfers),
            "syncs": _write(os.path.join(folder, "syncs.csv"), SYNC_COLUMNS, syncs)}


def _where(source: SourceLocation | None) -> tuple:
    return (source.file, source.line, source.function) if source is not None else (None, None, None)


def _write(path: str, columns: tuple[str, ...], rows: list[tuple]) -> str:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        writer.writerows(tuple("" if v is None else v for v in row) for row in rows)
    return path
