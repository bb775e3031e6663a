"""Every touch of jax internals and every jax version difference lives here, and only here.

jaxdbg supports jax 0.10 (Python 3.11) and jax 0.11 (Python 3.12). jax 0.11 merged ``ClosedJaxpr`` into
``Jaxpr`` (``ClosedJaxpr`` is an alias there and ``.jaxpr`` returns the object itself), so code that
needs "the equations and the constants" asks :func:`open_jaxpr` instead of touching attributes.

Example:
    >>> import jax, jax.numpy as jnp
    >>> closed = jax.make_jaxpr(lambda x: jnp.log(x) * 2)(1.0)
    >>> jaxpr, consts = open_jaxpr(closed)
    >>> [eqn.primitive.name for eqn in jaxpr.eqns]
    ['log', 'mul']
"""

from __future__ import annotations

from typing import Any, Iterator

import jax

from jaxdbg._source import SourceLocation, is_user_file

JAX_VERSION: tuple[int, ...] = tuple(int(p) for p in jax.__version__.split(".")[:3] if p.isdigit())


def open_jaxpr(closed: Any) -> tuple[Any, list]:
    """``(jaxpr, consts)`` of a closed jaxpr on any supported jax version (an open jaxpr gets no consts)."""
    consts = list(getattr(closed, "consts", None) or [])
    inner = getattr(closed, "jaxpr", closed)
    return inner, consts


def source_frames(source_info: Any) -> Iterator[SourceLocation]:
    """User frames of an equation's traceback, innermost first, with jax and jaxdbg frames left out."""
    from jax._src import source_info_util  # internal: the only public route is a private helper

    traceback = getattr(source_info, "traceback", None)
    for frame in source_info_util.user_frames(traceback):
        if is_user_file(frame.file_name):
            yield SourceLocation(frame.file_name, frame.start_line, frame.function_name)


def eqn_source(eqn: Any) -> SourceLocation | None:
    """The innermost user line that created a jaxpr equation, or None if none is known."""
    return next(source_frames(eqn.source_info), None)


def eqn_name_stack(eqn: Any) -> str:
    """The equation's name stack as text, e.g. ``'jvp(loss)'`` or ``'transpose(jvp(loss))'``."""
    return str(getattr(eqn.source_info, "name_stack", ""))


def is_jax_array(value: Any) -> bool:
    return isinstance(value, jax.Array)
