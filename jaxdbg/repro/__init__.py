"""``jaxdbg repro``: minimise a failing JAX program into a small standalone reproducer that fails the same way.

Library first: :func:`reproduce` does the work and returns a :class:`ReproResult` (the CLI renders it).
Pieces usable on their own: :class:`~jaxdbg.repro.cut.Cutter` (cut a jaxpr with recorded values),
:class:`~jaxdbg.repro.source.SourceReducer` (AST delta debugging), :func:`~jaxdbg.jaxpr.emit.emit_jaxpr`.

Example:
    >>> from jaxdbg.repro import ReproOptions, reproduce
    >>> from jaxdbg.target import parse_target
    >>> result, artifacts = reproduce(parse_target("bug.py"), ReproOptions(max_time=60), "out")  # doctest: +SKIP
    >>> result.verified, artifacts["repro"]                                                      # doctest: +SKIP
    (True, 'out/repro.py')
"""

from jaxdbg.repro.core import ReproOptions as ReproOptions
from jaxdbg.repro.core import reproduce as reproduce
from jaxdbg.repro.result import ReproResult as ReproResult
from jaxdbg.repro.signature import FailureSignature as FailureSignature
from jaxdbg.repro.signature import normalise_message as normalise_message
