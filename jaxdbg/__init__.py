"""jaxdbg: debugging and profiling for JAX programs.

The command line (``jaxdbg``) is a thin layer over this library. Public names are re-exported here.

Example:
    >>> from jaxdbg import parse_target, run_contained
    >>> spec = parse_target("train.py")   # doctest: +SKIP
"""

from jaxdbg._errors import JaxdbgError as JaxdbgError
from jaxdbg._errors import TargetFailedError as TargetFailedError
from jaxdbg._errors import UsageError as UsageError
from jaxdbg._source import SourceLocation as SourceLocation
from jaxdbg._version import __version__ as __version__
from jaxdbg.report import Report as Report
from jaxdbg.runner import Outcome as Outcome
from jaxdbg.runner import run_contained as run_contained
from jaxdbg.target import TargetSpec as TargetSpec
from jaxdbg.target import load_function as load_function
from jaxdbg.target import load_inputs as load_inputs
from jaxdbg.target import parse_target as parse_target
