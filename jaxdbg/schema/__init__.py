"""The JSON Schema (draft 2020-12) of the report every command writes, shipped with the package.

``report.schema.json`` sits next to this module and is read through :mod:`importlib.resources`, so it is
found in an installed wheel as well as in a source checkout. It describes the envelope and one ``result``
per command (``$defs``: ``doctor_result``, ``profile_result``, ``nan_hunt_result``, ``repro_result``,
``pipeline_bench_result``, ``check_result``, ``memory_result``, ``hang_hunt_result`` (also ``jaxdbg.watch``'s
stall report), ``watch_recompiles_result`` for ``jaxdbg.watch``'s recompile finding, and ``error_result`` for a
command that stopped with an error); every object lists its required keys and allows no others, so a renamed or
missing field fails validation. The fields are explained in ``docs/report.md``. Validating needs a JSON Schema
library such as ``jsonschema``, which jaxdbg itself does not depend on.

Example:
    >>> report_schema = schema()
    >>> report_schema["$schema"]
    'https://json-schema.org/draft/2020-12/schema'
    >>> report_schema["required"]
    ['tool', 'version', 'command', 'target', 'environment', 'result', 'artifacts', 'exit_code']
    >>> sorted(name for name in report_schema["$defs"] if name.endswith("_result"))   # doctest: +NORMALIZE_WHITESPACE
    ['check_result', 'doctor_result', 'error_result', 'hang_hunt_result', 'memory_result', 'nan_hunt_result',
     'pipeline_bench_result', 'profile_result', 'repro_result', 'watch_recompiles_result']
"""

from __future__ import annotations

import json
from importlib import resources

SCHEMA_FILE = "report.schema.json"


def schema() -> dict:
    """The report schema as a fresh dict (callers may change their copy)."""
    text = resources.files(__name__).joinpath(SCHEMA_FILE).read_text(encoding="utf-8")
    return json.loads(text)
