"""Growth of values a program updates eagerly, outside jit: ``w = optax.apply_updates(w, updates)`` in a loop.

A training loop run without jit has no jitted call whose outputs or arguments the watch could measure: its
parameters live in a Python variable that the loop rebinds every step. An eager operation that runs on a line
assigning one name (``w = f(w, ...)``) and takes a leaf of that name's current value as an input is that
leaf's update: its output's magnitude is the leaf's next magnitude. Each run of the line is one call of the
series (the n-th step of the loop is call n), and the leaf is named as the user wrote it (``w``,
``params['b']``).

Example:
    >>> import sys, numpy as np
    >>> from jaxdbg.nan.growth import EAGER_KEY, GrowthTracker
    >>> tracker = GrowthTracker(100.0)
    >>> updates = EagerUpdates(tracker)
    >>> w = np.ones(2)
    >>> for step in range(4):  # as if `w = w * 20.0` ran eagerly: the hook sees it with w's leaf as input
    ...     updates.seen(sys._getframe(), "w", [w, 20.0], [float(np.abs(w * 20.0).max())])
    ...     w = w * 20.0
    >>> [(g.name, g.first_call, g.ratio) for g in tracker.report()]
    [('w', 2, 8000.0)]
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import Any

import numpy as np
from jax.tree_util import tree_flatten_with_path

from jaxdbg._source import SourceLocation
from jaxdbg.nan.calls import readable_keystr
from jaxdbg.nan.growth import EAGER_KEY, GrowthTracker

MAX_LEAVES = 4096  # a value with more leaves is not looked into (flattening it at every eager operation costs)


class EagerUpdates:
    """Feeds ``tracker`` the magnitudes of eager updates of named values (see the module docstring)."""

    def __init__(self, tracker: GrowthTracker):
        self.tracker = tracker
        self._runs: dict[tuple[str, int], int] = {}  # (file, line) -> how many times it has run
        self._last: tuple | None = None  # (frame, file, line, value) of the latest run of an assigning line
        self._leaves: dict[int, str] | None = None  # id of a leaf of that value -> its path

    def seen(self, frame: types.FrameType, target: str, args: Sequence[Any], magnitudes: Sequence[float]) -> None:
        """An eager operation with ``args`` ran in ``frame`` on a line assigning ``target``; ``magnitudes`` are its
        outputs' largest finite ``|x|``."""
        current = frame.f_locals.get(target, frame.f_globals.get(target))
        if current is None or len(magnitudes) != 1:
            return
        code = frame.f_code
        line = (code.co_filename, frame.f_lineno)
        visit = (id(frame), *line, id(current))  # the value is rebound every step: a new one is the next run
        if visit != self._last:
            self._runs[line] = self._runs.get(line, -1) + 1
            self._last, self._leaves = visit, None
        name = self._leaf_name(target, current, args)
        if name is None:
            return
        source = SourceLocation(code.co_filename, frame.f_lineno, code.co_name)
        self.tracker.update(code.co_name, [name], np.array(magnitudes, np.float64), self._runs[line], source,
                            key=f"{EAGER_KEY}{code.co_filename}:{frame.f_lineno}:{name}")

    def _leaf_name(self, target: str, current: Any, args: Sequence[Any]) -> str | None:
        """``target`` plus the path of the leaf of ``current`` among ``args`` (None when none of them is one).
        ``current`` stays bound while its line runs, so the ids of its leaves stay its own."""
        if self._leaves is None:
            leaves, _ = tree_flatten_with_path(current)
            self._leaves = ({id(leaf): readable_keystr(current, path) for path, leaf in leaves}
                            if len(leaves) <= MAX_LEAVES else {})
        names = self._leaves
        for arg in args:
            if id(arg) in names:
                return target + names[id(arg)]
        return None
