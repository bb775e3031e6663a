"""``jaxdbg profile``: where the time goes in a JAX program, per jitted function.

A library first (the command line in :mod:`jaxdbg.cli.profile` only parses and renders):

- :func:`profile` runs a script or one function contained and returns a :class:`ProfileRun`.
- :func:`parse_budget` / :func:`check_budget` gate CI; :func:`compare` diffs against an earlier report.
- :func:`start_xprof` serves a capture on localhost.
- :func:`profile_capture` reads a live job (``attach_to``) or an existing capture (``from_capture``);
  :func:`write_profile_csv` writes a result's flat tables.

Example:
    >>> from jaxdbg.target import parse_target
    >>> run = profile(parse_target("train.py"), ProfileOptions(), "jaxdbg-out/p")   # doctest: +SKIP
    >>> [(f.name, f.compiles, f.execute.median_s) for f in run.result.functions]    # doctest: +SKIP
    [('train_step', 1, 0.0021)]
"""

from typing import Any

from jaxdbg._lazy import attribute

_LAZY = {  # loaded on first use: other commands import single modules of this package (``jaxdbg memory`` reads
    # HLO with profile.hlo, in a child and a parent that never import what a profile needs)
    "check_budget": "jaxdbg.profile.budget", "parse_budget": "jaxdbg.profile.budget",
    "profile_capture": "jaxdbg.profile.capture_report", "compare": "jaxdbg.profile.compare",
    "write_profile_csv": "jaxdbg.profile.csv_export", "FunctionProfile": "jaxdbg.profile.model",
    "ProfileResult": "jaxdbg.profile.model", "ProfileOptions": "jaxdbg.profile.run", "ProfileRun": "jaxdbg.profile.run",
    "profile": "jaxdbg.profile.run", "start_xprof": "jaxdbg.profile.serve",
}


def __getattr__(name: str) -> Any:
    return attribute(__name__, _LAZY, name)
