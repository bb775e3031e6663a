"""What a contained run's outcome means for a command that ran a target in it (``profile``, ``memory``): the
user's bad input found by the child, raised again here; jaxdbg's own failure told apart from the target's; the
target's failure in one line.

Example:
    >>> from jaxdbg.runner import outcome_of
    >>> failure_line(outcome_of(None, True, [], "", "", 5.0))
    ('the target timed out after 5.0s', None)
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Protocol

from jaxdbg._errors import EXIT_USAGE
from jaxdbg._source import SourceLocation, is_jaxdbg_file
from jaxdbg.launch import HANG_MARK, hang_named
from jaxdbg.runner import Outcome, first_line
from jaxdbg.target import TargetSpec


class TargetInputs(Protocol):
    """The options every command with a function target has (profile's and memory's share these checks)."""

    @property
    def args(self) -> str | None: ...

    @property
    def inputs(self) -> str | None: ...


def raise_usage_from_child(outcome: Outcome) -> None:
    """A UsageError raised while the child loaded the target (no such function, ...) is the user's input."""
    if outcome.error is not None and outcome.error.exit_code == EXIT_USAGE:
        raise outcome.error


def raise_internal_failure(outcome: Outcome, spec: TargetSpec, options: TargetInputs) -> None:
    """An exception whose traceback never passed through the user's files is a jaxdbg bug, not the target's."""
    exc = outcome.exception
    if exc is None:
        return
    frames = re.findall(r'File "([^"]+)", line (\d+)', exc.traceback or "")
    if frames and is_jaxdbg_file(frames[-1][0]) and exc.exit_code is None and not _from_users_call(exc.traceback):
        # raised by jaxdbg's own instrumentation (user frames above it only called into it)
        raise RuntimeError(f"jaxdbg's instrumentation failed inside the target's run: {exc.type}: "
                           f"{first_line(exc.message)} [{frames[-1][0]}:{frames[-1][1]}]")
    if exc.user_frame is not None:
        return
    user_files = [p for p in (spec.path, (options.inputs or "").partition("::")[0]) if p]
    if any(os.path.abspath(p) in exc.traceback for p in user_files):
        return
    last = exc.traceback.strip().splitlines()[-3:-1]
    raise RuntimeError(f"the profiling job failed before the target ran: {exc.type}: {first_line(exc.message)} "
                       f"[{' / '.join(line.strip() for line in last)}]")


# The lines where jaxdbg's jit layer runs the user's jitted function: an error raised there with no frame below
# (JAX hides its own) came out of the user's computation as it ran (an XLA runtime error: a collective whose peer
# process left, a failed allocation), not out of jaxdbg.
CALLS_THROUGH = re.compile(r'File "[^"]*jit_layer\.py", line \d+, in \w+\n\s+'
                           r'.*(?:\brun|\.top_level)\(\*(?:self\.)?args')


def _from_users_call(traceback: str) -> bool:
    """Whether the innermost frame of ``traceback`` is the jit layer calling the user's jitted function.

    Example:
        >>> _from_users_call('File "/x/jaxdbg/jit_layer.py", line 253, in run\\n    return run(*self.args)\\n')
        True
        >>> _from_users_call('File "/x/jaxdbg/jit_layer.py", line 240, in run\\n    run = function.checked()\\n')
        False
    """
    frames = list(re.finditer(r'File "[^"]+", line \d+, in \S+\n', traceback))
    return bool(frames) and CALLS_THROUGH.match(traceback, frames[-1].start()) is not None


def failure_line(outcome: Outcome, notes: Sequence[str] = ()) -> tuple[str | None, SourceLocation | None]:
    """The failure in one line; a job that ended on a hang names the process it hung on (its heartbeat's note)."""
    if outcome.ok:
        return None, None
    text = f"the target {outcome.describe()}"
    hung = hang_named(notes, outcome.status)
    if hung:
        text = f"{text}{': ' if HANG_MARK in hung else '; '}{hung}"
    frame = outcome.exception.user_frame if outcome.exception else outcome.crash_frame
    return text, frame
