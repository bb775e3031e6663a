"""pipeline-bench ``--csv DIR``: ``runs.csv`` (one row per run: its options and figures) and ``stages.csv``
(one row per run and stage: where the stage's time went and its occupancy), for spreadsheets and BI tools.

The columns are the run rows' own fields (:class:`~jaxdbg.pipeline.bench.RunRow`): scalars go to
``runs.csv``, per-stage lists to ``stages.csv``, so a figure added to the report reaches the tables too.
Both tables start with ``run``, the row's index in the report's ``runs``. Empty cells are null fields.

Example:
    >>> import csv, tempfile
    >>> from jaxdbg.pipeline.bench import BenchOptions, run_bench
    >>> result, _ = run_bench(BenchOptions(stages=2, microbatches=4, policies=("fixed",)))
    >>> folder = tempfile.mkdtemp()
    >>> paths = write_tables(folder, result.runs)
    >>> rows = list(csv.DictReader(open(paths["stages_csv"])))
    >>> [(r["run"], r["stage"]) for r in rows], 0 < float(rows[0]["occupancy"]) <= 1
    ([('0', '0'), ('0', '1')], True)
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from jaxdbg.pipeline.metrics import occupancy

STAGE_PREFIX = "stage_"


def _cell(value: Any) -> Any:
    return "" if value is None else value


def write_tables(folder: str | Path, runs: Sequence[Any]) -> dict[str, str]:
    """Write runs.csv and stages.csv into ``folder`` (created); returns their artifact names and paths."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    found = fields(runs[0]) if runs else ()
    per_stage = [f.name for f in found if str(f.type).startswith("list[")]  # one value per stage
    scalar = [f.name for f in found if f.name not in per_stage]
    runs_path, stages_path = out / "runs.csv", out / "stages.csv"
    with open(runs_path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["run", *scalar])
        for i, row in enumerate(runs):
            writer.writerow([i, *(_cell(getattr(row, n)) for n in scalar)])
    keys = [n for n in scalar if n in ("schedule", "policy", "hint", "comm", "memory_cap", "variability", "seed")]
    columns = [n.removeprefix(STAGE_PREFIX) + ("_s" if n.startswith(STAGE_PREFIX) else "") for n in per_stage]
    with open(stages_path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["run", *keys, "stage", *columns, "occupancy"])
        for i, row in enumerate(runs):
            shares = occupancy(row.stage_busy, row.makespan_s)
            for w in range(len(row.stage_busy)):
                values = [_cell((getattr(row, n) or [None] * len(row.stage_busy))[w]) for n in per_stage]
                writer.writerow([i, *(_cell(getattr(row, n)) for n in keys), w, *values, shares[w]])
    return {"runs_csv": str(runs_path), "stages_csv": str(stages_path)}
