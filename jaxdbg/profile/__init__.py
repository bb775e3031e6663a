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

from jaxdbg.profile.budget import check_budget as check_budget
from jaxdbg.profile.budget import parse_budget as parse_budget
from jaxdbg.profile.capture_report import profile_capture as profile_capture
from jaxdbg.profile.compare import compare as compare
from jaxdbg.profile.csv_export import write_profile_csv as write_profile_csv
from jaxdbg.profile.model import FunctionProfile as FunctionProfile
from jaxdbg.profile.model import ProfileResult as ProfileResult
from jaxdbg.profile.run import ProfileOptions as ProfileOptions
from jaxdbg.profile.run import ProfileRun as ProfileRun
from jaxdbg.profile.run import profile as profile
from jaxdbg.profile.serve import start_xprof as start_xprof
