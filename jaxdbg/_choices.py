"""One value out of a closed set, typed as the set's ``Literal``: where a string read from outside (a config
file, a child's JSON record) becomes a field whose type is a ``Literal``.

Example:
    >>> from typing import Literal, get_args
    >>> Comm = Literal["async", "sync"]
    >>> choice("sync", get_args(Comm)), choice("bulk", get_args(Comm))
    ('sync', None)
"""

from __future__ import annotations

from typing import TypeVar

C = TypeVar("C", bound=str)


def choice(value: object, choices: tuple[C, ...]) -> C | None:
    """The member of ``choices`` equal to ``value``, or None when it is none of them."""
    return next((c for c in choices if c == value), None)
