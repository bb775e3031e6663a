"""jaxdbg: debugging and profiling for JAX programs.

The command line (``jaxdbg``) is a thin layer over this library. Public names are re-exported here;
docs/api.md describes each, and the capability packages (``jaxdbg.nan``, ``jaxdbg.profile``,
``jaxdbg.repro``, ``jaxdbg.pipeline``, ``jaxdbg.doctor``) behind the commands.

Example:
    >>> from jaxdbg import load_function, load_inputs, parse_target
    >>> spec = parse_target("numpy.linalg:norm")       # a module target; file.py::func and script.py also work
    >>> spec.kind, spec.function
    ('function', 'norm')
    >>> (x,) = load_inputs(None, "f32[3]", seed=0)       # what --args "f32[3]" passes
    >>> bool(load_function(spec)(x) > 0)
    True
"""

from jaxdbg._errors import JaxdbgError as JaxdbgError
from jaxdbg._errors import TargetFailedError as TargetFailedError
from jaxdbg._errors import UsageError as UsageError
from jaxdbg._source import SourceLocation as SourceLocation
from jaxdbg._version import __version__ as __version__
from jaxdbg.hang.watch import StallError as StallError
from jaxdbg.live import NonFiniteError as NonFiniteError
from jaxdbg.live import RecompileError as RecompileError
from jaxdbg.live import watch as watch
from jaxdbg.report import Report as Report
from jaxdbg.runner import Outcome as Outcome
from jaxdbg.runner import run_contained as run_contained
from jaxdbg.target import TargetSpec as TargetSpec
from jaxdbg.target import load_function as load_function
from jaxdbg.target import load_inputs as load_inputs
from jaxdbg.target import parse_target as parse_target
