"""Calls of jax's multihost utilities, named as the user made them.

``jax.experimental.multihost_utils``'s helpers (``sync_global_devices``, ``process_allgather``,
``broadcast_one_to_all``, ``assert_equal``) jit small functions of their own on every call (``_identity_fn``,
``_psum``): names that mean nothing to the user, the same for every barrier of the program. The jit layer reads
the helper the user called while ``jax.jit`` is applied inside it (:func:`jaxdbg._compat.multihost_call`) and files
the jit under that helper and the user's line that called it, so every command names it the same way: profile's
and memory's tables show ``sync_global_devices('checkpoint saved') at train.py:42``, hang-hunt says a process waits
inside ``sync_global_devices('checkpoint saved')``. This module holds the words (no jax import: the process that
renders a report never imports jax).

Example:
    >>> from jaxdbg._source import SourceLocation
    >>> call = HelperCall("sync_global_devices", "'checkpoint saved'", SourceLocation("/w/train.py", 42, "<module>"))
    >>> call.called_as, call.collective
    ("sync_global_devices('checkpoint saved')", "barrier 'checkpoint saved' over every process")
    >>> shown_name("sync_global_devices", call.called_as, call.site)
    "sync_global_devices('checkpoint saved') at train.py:42"
    >>> called_label("sync_global_devices", "'step 0'", "'step 3'")
    "sync_global_devices('step 0' … 'step 3')"
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from jaxdbg._source import SourceLocation

# The helpers, by their names in jax.experimental.multihost_utils. A call is named by the outermost one on the stack:
# sync_global_devices calls assert_equal, which calls process_allgather.
HELPERS = ("sync_global_devices", "assert_equal", "process_allgather", "broadcast_one_to_all")
MODULE = "jax.experimental.multihost_utils"


@dataclass(frozen=True)
class HelperCall:
    """One call of a multihost helper: ``api`` (``sync_global_devices``), its argument that names it (the
    barrier's name, as ``repr`` writes it; None for the other helpers) and the user's line that called it."""

    api: str
    argument: str | None
    site: SourceLocation | None

    @property
    def called_as(self) -> str:
        """``sync_global_devices('checkpoint saved')``; ``process_allgather`` for a helper without a name."""
        return called_label(self.api, self.argument, self.argument)

    @property
    def collective(self) -> str:
        """What the call waits in, in words, where its program's collectives are not known (a call that never
        returned): the barrier by its name, or the helper, over every process (each helper gathers or broadcasts
        over all of the job's devices)."""
        what = f"barrier {self.argument}" if self.argument is not None else self.api
        return f"{what} over every process"


def called_label(api: str, first: str | None, latest: str | None) -> str:
    """The helper as it was called at one line, from the first and the latest argument that named it: one name,
    ``sync_global_devices('saved')``; names that changed from call to call (an f-string with the step),
    ``sync_global_devices('step 0' … 'step 3')``."""
    if first is None:
        return api
    return f"{api}({first})" if latest in (None, first) else f"{api}({first} … {latest})"


def shown_name(name: str, called_as: str | None, source: SourceLocation | None) -> str:
    """How a table shows a function: its name, or for a helper's jit the call and the user's line that made it
    (two barriers of the same name at two lines are two rows)."""
    if not called_as:
        return name
    return f"{called_as} at {os.path.basename(source.file)}:{source.line}" if source else called_as
