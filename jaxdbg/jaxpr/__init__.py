"""Shared jaxpr machinery: the hookable equation-by-equation interpreter (and, from repro, the emitter).

Example:
    >>> import jax, jax.numpy as jnp
    >>> from jaxdbg.jaxpr import interpret
    >>> interpret(jax.make_jaxpr(jnp.sin)(0.0), [0.0])
    [Array(0., dtype=float32, weak_type=True)]
"""

from jaxdbg.jaxpr.interpreter import RULES as RULES
from jaxdbg.jaxpr.interpreter import Hooks as Hooks
from jaxdbg.jaxpr.interpreter import Interpreter as Interpreter
from jaxdbg.jaxpr.interpreter import Rule as Rule
from jaxdbg.jaxpr.interpreter import Scope as Scope
from jaxdbg.jaxpr.interpreter import Site as Site
from jaxdbg.jaxpr.interpreter import Stop as Stop
from jaxdbg.jaxpr.interpreter import interpret as interpret
