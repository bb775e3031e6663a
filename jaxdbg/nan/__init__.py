"""``jaxdbg nan-hunt`` as a library: where a NaN/Inf is born, in forward and backward passes, loops and branches.

:func:`hunt` (contained; imports no jax here) is what the command line runs; :func:`hunt_here` does the
same in this process. The pieces are usable alone: :class:`Watch` (catch the first non-finite call),
:func:`localise_call` (replay one call op by op), :func:`bisect_compiled` (when only compiled code fails).

Example:
    >>> from jaxdbg.nan import HuntOptions, hunt
    >>> from jaxdbg.target import parse_target
    >>> run = hunt(parse_target("recipes/nan_forward/train.py"), HuntOptions())   # doctest: +SKIP
    >>> run.result.first.primitive, run.exit_code                              # doctest: +SKIP
    ('log', 1)
"""

from typing import Any

from jaxdbg._lazy import attribute
from jaxdbg.nan.api import HuntOptions as HuntOptions
from jaxdbg.nan.api import HuntRun as HuntRun
from jaxdbg.nan.api import hunt as hunt
from jaxdbg.nan.result import NanHuntResult as NanHuntResult
from jaxdbg.nan.result import Origin as Origin

_LAZY = {  # these import jax: loaded on first use so the command line's parent process stays light
    "hunt_here": "jaxdbg.nan.session", "Watch": "jaxdbg.nan.watch", "Call": "jaxdbg.nan.calls",
    "localise_call": "jaxdbg.nan.localise", "bisect_compiled": "jaxdbg.nan.fidelity",
}


def __getattr__(name: str) -> Any:
    return attribute(__name__, _LAZY, name)
