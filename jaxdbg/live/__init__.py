"""``jaxdbg.watch``: NaN/Inf and recompile checks inside a running program (the library side of nan-hunt and
profile's recompile causes), and the pytest plugin's engine.

Importing this package imports no jax; :class:`watch` imports it when entered.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from jaxdbg.live import NonFiniteError, watch
    >>> try:
    ...     with watch(out="/tmp/jaxdbg-live-doc"):
    ...         _ = jax.jit(jnp.log)(jnp.array(-1.0))
    ... except NonFiniteError as err:
    ...     print(err.report["first"]["primitive"])
    log
"""

from jaxdbg.live.errors import NonFiniteError as NonFiniteError
from jaxdbg.live.errors import RecompileError as RecompileError
from jaxdbg.live.errors import WatchError as WatchError
from jaxdbg.live.watch import watch as watch
